// The contrastive loss of one (global) batch in double precision, materialised
// from the definitions in flatmem.h, with the worst-case error bounds of the
// library's fp32 computation against it (tests/support/tolerance.hpp, the
// same derivation; summarised below). Shared by FlatmemTest (one process)
// and RankWorker (the ring loss: every rank compares its slice with the
// reference of the concatenated batch). ContrastiveReference.Sigmoid: the
// sigmoid (SigLIP) loss, likewise.
//
// Definitions (x_ij = s <q_i, k_j>, P = row softmax, Q = column softmax, dloss = 1):
//   INFONCE    L = (1/B) sum_i [LSE_j x_ij - x_i,pos(i)], pos(i) = labels[i] (global
//              column) or i;  G_ij = (P_ij - [j = pos(i)]) / B
//   SYMMETRIC  L = 1/(2B) sum_i [LSE_j x_ij - x_ii + LSE_j x_ji - x_ii];
//              G_ij = (P_ij + Q_ij - 2 [i = j]) / (2B)
//   dq_i = s sum_j G_ij k_j,  dk_j = s sum_i G_ij q_i,  dL/ds = sum_ij G_ij <q_i, k_j>.
//
// Bounds (u = 2^-24, gamma_n = n u / (1 - n u), slack 2 for second-order terms;
// order-independent, so they hold for the ring's sums as for one process):
//   logits  dx = s gamma_{d+1} max_ij sum_t |q_it k_jt|
//   LSE     2 (dx + (2n + 8) u + 2u |lse|)       (n terms: C for rows, B for columns)
//   loss    2 (dx + (2 max(B, C) + 8) u + 2u |L|)
//   dq_it   2 s [eps_G sum_j W_ij |k_jt| + 2u/N sum_j |k_jt| + (gamma_C + 3u) sum_j |G_ij| |k_jt|]
//           with eps_G = dx + max LSE bound + 8u, W_ij = |G_ij| with + for the
//           positive term, N = B or 2B; dk alike (q, gamma_B); ds with
//           R_ij = sum_t |q_it k_jt| for |k_jt| and gamma_d + gamma_{C+1}, + 2u |ds|.
// A real defect (a dropped block, a wrong scale, a column term missing) moves
// the values by O(1/B), orders of magnitude above these bounds.
final class ContrastiveReference {
  static final double U = 0x1p-24, SLACK = 2.0;

  final double loss, ds, lossTolerance, dsTolerance;
  final double[] rowLse, colLse, rowLseTolerance, colLseTolerance;
  final double[][] dq, dk, dqTolerance, dkTolerance;

  static double gamma(double n) { return n * U / (1 - n * U); }

  /** log(sum_j exp(x_j)) with the maximum subtracted. */
  static double logSumExp(double[] x) {
    double m = Double.NEGATIVE_INFINITY;
    for (double v : x) m = Math.max(m, v);
    double sum = 0;
    for (double v : x) sum += Math.exp(v - m);
    return m + Math.log(sum);
  }

  /** q (B x d), k (C x d); labels: B global column indices or null (INFONCE
   *  only; null = the diagonal); symmetric needs B = C. */
  ContrastiveReference(double[][] q, double[][] k, long[] labels, boolean symmetric, double s) {
    final int b = q.length, c = k.length, d = q[0].length;
    if (symmetric && (b != c || labels != null)) throw new IllegalArgumentException("symmetric: B = C, no labels");
    double[][] dot = new double[b][c], absDot = new double[b][c];
    double maxAbsDot = 0;
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < c; ++j) {
        for (int t = 0; t < d; ++t) {
          dot[i][j] += q[i][t] * k[j][t];
          absDot[i][j] += Math.abs(q[i][t] * k[j][t]);
        }
        maxAbsDot = Math.max(maxAbsDot, absDot[i][j]);
      }
    rowLse = new double[b];
    colLse = new double[c];
    for (int i = 0; i < b; ++i) {
      double[] row = new double[c];
      for (int j = 0; j < c; ++j) row[j] = s * dot[i][j];
      rowLse[i] = logSumExp(row);
    }
    for (int j = 0; j < c; ++j) {
      double[] col = new double[b];
      for (int i = 0; i < b; ++i) col[i] = s * dot[i][j];
      colLse[j] = logSumExp(col);
    }
    int[] pos = new int[b];
    for (int i = 0; i < b; ++i) pos[i] = labels != null ? (int) labels[i] : i;
    double l = 0;
    for (int i = 0; i < b; ++i) l += rowLse[i] - s * dot[i][pos[i]];
    if (symmetric)
      for (int j = 0; j < c; ++j) l += colLse[j] - s * dot[j][j];
    final double n = symmetric ? 2.0 * b : b;
    loss = l / n;

    // G, W = |terms| and the gradients with their error sums
    double[][] g = new double[b][c], w = new double[b][c];
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < c; ++j) {
        double p = Math.exp(s * dot[i][j] - rowLse[i]);
        double qq = symmetric ? Math.exp(s * dot[i][j] - colLse[j]) : 0.0;
        double positive = symmetric ? (i == j ? 2 : 0) : (j == pos[i] ? 1 : 0);
        g[i][j] = (p + qq - positive) / n;
        w[i][j] = (p + qq + positive) / n;
      }
    rowLseTolerance = new double[b];
    colLseTolerance = new double[c];
    final double dx = s * gamma(d + 1) * maxAbsDot;
    double maxLse = 0;
    for (int i = 0; i < b; ++i) {
      rowLseTolerance[i] = SLACK * (dx + (2.0 * c + 8) * U + 2 * U * Math.abs(rowLse[i]));
      maxLse = Math.max(maxLse, rowLseTolerance[i]);
    }
    for (int j = 0; j < c; ++j) {
      colLseTolerance[j] = SLACK * (dx + (2.0 * b + 8) * U + 2 * U * Math.abs(colLse[j]));
      maxLse = Math.max(maxLse, colLseTolerance[j]);
    }
    lossTolerance = SLACK * (dx + (2.0 * Math.max(b, c) + 8) * U + 2 * U * Math.abs(loss));
    final double epsG = dx + maxLse + 8 * U;

    dq = new double[b][d];
    dqTolerance = new double[b][d];
    for (int i = 0; i < b; ++i)
      for (int t = 0; t < d; ++t) {
        double value = 0, weighted = 0, count = 0, abs = 0;
        for (int j = 0; j < c; ++j) {
          value += g[i][j] * k[j][t];
          weighted += w[i][j] * Math.abs(k[j][t]);
          count += Math.abs(k[j][t]) / n;
          abs += Math.abs(g[i][j] * k[j][t]);
        }
        dq[i][t] = s * value;
        dqTolerance[i][t] = SLACK * s * (epsG * weighted + 2 * U * count + (gamma(c) + 3 * U) * abs);
      }
    dk = new double[c][d];
    dkTolerance = new double[c][d];
    for (int j = 0; j < c; ++j)
      for (int t = 0; t < d; ++t) {
        double value = 0, weighted = 0, count = 0, abs = 0;
        for (int i = 0; i < b; ++i) {
          value += g[i][j] * q[i][t];
          weighted += w[i][j] * Math.abs(q[i][t]);
          count += Math.abs(q[i][t]) / n;
          abs += Math.abs(g[i][j] * q[i][t]);
        }
        dk[j][t] = s * value;
        dkTolerance[j][t] = SLACK * s * (epsG * weighted + 2 * U * count + (gamma(b) + 3 * U) * abs);
      }
    double dsValue = 0, weighted = 0, count = 0, abs = 0;
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < c; ++j) {
        dsValue += g[i][j] * dot[i][j];
        weighted += w[i][j] * absDot[i][j];
        count += absDot[i][j] / n;
        abs += Math.abs(g[i][j]) * absDot[i][j];
      }
    ds = dsValue;
    dsTolerance = SLACK * (epsG * weighted + 2 * U * count + (gamma(d) + gamma(c + 1) + 3 * U) * abs)
                  + 2 * U * Math.abs(ds);
  }

  /**
   * The sigmoid (SigLIP) loss of one (global) batch in double precision, and
   * the bounds of tests/contrastive/sigmoid_reference.hpp (same derivation):
   *   x_ij = s &lt;q_i, k_j&gt; + t, z_ij = +1 for j = pos(i) (labels[i] or i), -1 else,
   *   v = -z x, L = (1/B) sum_ij softplus(v_ij) (mean over the B rows),
   *   G_ij = g (-z_ij) sigmoid(v_ij) / B, dq = s G k, dk = s G^T q,
   *   ds = sum G_ij &lt;q_i, k_j&gt;, dt = sum G_ij   (the gradients of g L).
   * Bounds (fp32 outputs): logits dx = s gamma_{d+2} A + u |t|; loss
   * 2 (dx sum |G| + 4u C + 2u |L|) (sum |G| at g = 1); eps_G = dx + 10u, an
   * exp underflow adds s |g| / B 2^-125 per term; dq_it 2 s (eps_G + gamma_C)
   * sum_j |G_ij| |k_jt| (+ underflow), dk alike (gamma_B); ds 2 (eps_G + gamma_d)
   * sum |G| R + 2u |ds|; dt 2 eps_G sum |G| + 2u |dt|.
   */
  static final class Sigmoid {
    final double loss, ds, dt, lossTolerance, dsTolerance, dtTolerance;
    final double[][] dq, dk, dqTolerance, dkTolerance;

    static double softplus(double v) { return Math.max(v, 0) + Math.log1p(Math.exp(-Math.abs(v))); }

    static double sigmoid(double v) {
      double e = Math.exp(-Math.abs(v));
      return v >= 0 ? 1 / (1 + e) : e / (1 + e);
    }

    /** q (B x d), k (C x d); labels: B global column indices or null (the
     *  diagonal, C &gt;= B); g the upstream gradient. */
    Sigmoid(double[][] q, double[][] k, long[] labels, double s, double t, double g) {
      final int b = q.length, c = k.length, d = q[0].length;
      final double underflowScale = 0x1p-125;
      double[][] gm = new double[b][c], absDot = new double[b][c];
      double l = 0, dsValue = 0, dtValue = 0, maxAbsDot = 0, sumAbsG = 0, sumAbsGR = 0;
      for (int i = 0; i < b; ++i)
        for (int j = 0; j < c; ++j) {
          double dot = 0;
          for (int e = 0; e < d; ++e) {
            dot += q[i][e] * k[j][e];
            absDot[i][j] += Math.abs(q[i][e] * k[j][e]);
          }
          double z = j == (labels != null ? labels[i] : i) ? 1 : -1, v = -z * (s * dot + t);
          l += softplus(v);
          gm[i][j] = g * -z * sigmoid(v) / b;
          dsValue += gm[i][j] * dot;
          dtValue += gm[i][j];
          maxAbsDot = Math.max(maxAbsDot, absDot[i][j]);
          sumAbsG += Math.abs(gm[i][j]);
          sumAbsGR += Math.abs(gm[i][j]) * absDot[i][j];
        }
      loss = l / b;
      ds = dsValue;
      dt = dtValue;
      final double dx = s * gamma(d + 2) * maxAbsDot + U * Math.abs(t);
      final double epsG = dx + 10 * U, underflow = Math.abs(g) / b * underflowScale;
      final double sumAbsG1 = g != 0 ? sumAbsG / Math.abs(g) : c;
      lossTolerance = SLACK * (dx * sumAbsG1 + 4 * U * c + 2 * U * Math.abs(loss));
      dsTolerance = SLACK * ((epsG + gamma(d)) * sumAbsGR + underflow * b * c * maxAbsDot) + 2 * U * Math.abs(ds);
      dtTolerance = SLACK * (epsG * sumAbsG + underflow * b * c) + 2 * U * Math.abs(dt);
      dq = new double[b][d];
      dqTolerance = new double[b][d];
      dk = new double[c][d];
      dkTolerance = new double[c][d];
      for (int i = 0; i < b; ++i)
        for (int j = 0; j < c; ++j)
          for (int e = 0; e < d; ++e) {
            dq[i][e] += s * gm[i][j] * k[j][e];
            dk[j][e] += s * gm[i][j] * q[i][e];
            dqTolerance[i][e] += SLACK * s * ((epsG + gamma(c)) * Math.abs(gm[i][j] * k[j][e]) + underflow * Math.abs(k[j][e]));
            dkTolerance[j][e] += SLACK * s * ((epsG + gamma(b)) * Math.abs(gm[i][j] * q[i][e]) + underflow * Math.abs(q[i][e]));
          }
    }
  }

  /** The largest |got - want| / tolerance over rows [first, first + got.length / d) of want
   *  (got: the row-major values a rank returned); <= 1 passes. */
  static double worstRatio(double[] got, double[][] want, double[][] tolerance, int first) {
    double worst = 0;
    final int d = want[0].length;
    for (int n = 0; n < got.length; ++n) {
      int row = first + n / d, t = n % d;
      worst = Math.max(worst, Math.abs(got[n] - want[row][t]) / tolerance[row][t]);
      if (Double.isNaN(got[n])) return Double.POSITIVE_INFINITY;
    }
    return worst;
  }

  /** The same for a vector (LSEs) from index first. */
  static double worstRatio(double[] got, double[] want, double[] tolerance, int first) {
    double worst = 0;
    for (int n = 0; n < got.length; ++n) {
      worst = Math.max(worst, Math.abs(got[n] - want[first + n]) / tolerance[first + n]);
      if (Double.isNaN(got[n])) return Double.POSITIVE_INFINITY;
    }
    return worst;
  }
}
