// The Java proof of bindings/swig/flatmem.i: the SWIG module generated for Java
// (package flatmem) computes the symmetric CLIP loss of tiny features and its
// logit-scale gradient, compared with the naive formulas evaluated here in
// double precision, and a failing status arrives as a Java exception carrying
// flatmem's message. Built and run by scripts/check-java.sh; exits 1 on failure.
import flatmem.Contrastive;
import flatmem.ContrastiveLoss;
import flatmem.ContrastiveOptions;
import flatmem.Flatmem;
import flatmem.Tensor;

public final class FlatmemTest {
  private static int failures = 0;

  private static void check(boolean ok, String what) {
    System.out.println((ok ? "PASS " : "FAIL ") + what);
    if (!ok) failures++;
  }

  /** log(sum_j exp(x_j)) with the maximum subtracted. */
  private static double logSumExp(double[] x) {
    double m = Double.NEGATIVE_INFINITY;
    for (double v : x) m = Math.max(m, v);
    double sum = 0;
    for (double v : x) sum += Math.exp(v - m);
    return m + Math.log(sum);
  }

  /**
   * The symmetric loss and dL/ds by the definitions in flatmem.h:
   * L = 1/2 ((1/b) sum_i [LSE_j x_ij - x_ii] + (1/b) sum_j [LSE_i x_ij - x_jj]),
   * x_ij = s <q_i, k_j>; dL/ds = sum_ij G_ij <q_i, k_j> with
   * G_ij = (P_ij + Q_ij - 2 [i = j]) / (2 b).
   */
  private static double[] naiveSymmetric(double[][] q, double[][] k, double s) {
    int b = q.length;
    double[][] dot = new double[b][b];
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < b; ++j)
        for (int t = 0; t < q[i].length; ++t) dot[i][j] += q[i][t] * k[j][t];
    double[] rowLse = new double[b], colLse = new double[b];
    for (int i = 0; i < b; ++i) {
      double[] row = new double[b], col = new double[b];
      for (int j = 0; j < b; ++j) {
        row[j] = s * dot[i][j];
        col[j] = s * dot[j][i];
      }
      rowLse[i] = logSumExp(row);
      colLse[i] = logSumExp(col);
    }
    double loss = 0, ds = 0;
    for (int i = 0; i < b; ++i) loss += (rowLse[i] - s * dot[i][i]) + (colLse[i] - s * dot[i][i]);
    loss /= 2.0 * b;
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < b; ++j) {
        double x = s * dot[i][j];
        double g = (Math.exp(x - rowLse[i]) + Math.exp(x - colLse[j]) - (i == j ? 2 : 0)) / (2.0 * b);
        ds += g * dot[i][j];
      }
    return new double[] {loss, ds};
  }

  /** Runs `body`, expecting an exception whose message contains every one of `parts`. */
  private static void expectFailure(String what, Runnable body, Class<?> type, String... parts) {
    try {
      body.run();
      check(false, what + ": no exception");
    } catch (RuntimeException e) {
      boolean ok = type.isInstance(e);
      for (String p : parts) ok = ok && e.getMessage() != null && e.getMessage().contains(p);
      check(ok, what + ": " + e.getClass().getName() + ": " + e.getMessage());
    }
  }

  public static void main(String[] args) {
    System.out.println("flatmem " + Flatmem.version_string() + ": header FLATMEM_VERSION "
                       + Flatmem.VERSION + ", library flatmem_version() " + Flatmem.version());
    check(Flatmem.VERSION == Flatmem.version() && Flatmem.version_mismatch().isEmpty(),
          "header and library versions agree");

    final int b = 3, d = 4;
    final double scale = 2.5;
    double[][] q = new double[b][d], k = new double[b][d];
    for (int i = 0; i < b; ++i)
      for (int t = 0; t < d; ++t) {
        // small, exactly representable in fp32, different for q and k
        q[i][t] = ((i * 7 + t * 3) % 11 - 5) / 8.0;
        k[i][t] = ((i * 5 + t * 2) % 9 - 4) / 8.0;
      }
    double[] ref = naiveSymmetric(q, k, scale);

    try (ContrastiveOptions options = new ContrastiveOptions();
         Tensor Q = Tensor.allocated(Flatmem.kDLFloat, 32, b, d);
         Tensor K = Tensor.allocated(Flatmem.kDLFloat, 32, b, d);
         Tensor S = Tensor.allocated(Flatmem.kDLFloat, 32);
         Tensor loss = Tensor.allocated(Flatmem.kDLFloat, 32);
         Tensor rowLse = Tensor.allocated(Flatmem.kDLFloat, 32, b);
         Tensor colLse = Tensor.allocated(Flatmem.kDLFloat, 32, b);
         Tensor dS = Tensor.allocated(Flatmem.kDLFloat, 32);
         Tensor Q64 = Tensor.allocated(Flatmem.kDLFloat, 64, b, d)) {
      options.setLoss(ContrastiveLoss.CONTRASTIVE_SYMMETRIC);
      options.setNum_threads(2);
      options.setTile_rows(2);  // several tiles even at b = 3
      options.setTile_cols(2);
      for (int i = 0; i < b; ++i)
        for (int t = 0; t < d; ++t) {
          Q.set(i * d + t, q[i][t]);
          K.set(i * d + t, k[i][t]);
        }
      S.set(0, scale);

      try (Contrastive h = new Contrastive(options)) {
        h.forward(Q, K, null, S, loss, rowLse, colLse);
        h.backward(Q, K, null, S, rowLse, colLse, null, null, null, dS);
        // fp32 accumulation of 4-term dot products and 3-term sums: errors
        // of a few 1e-7; a wrong term moves the loss by > 1e-2.
        double gotLoss = loss.get(0), gotDs = dS.get(0);
        check(Math.abs(gotLoss - ref[0]) <= 1e-5 * Math.max(1.0, Math.abs(ref[0])),
              "symmetric loss " + gotLoss + " vs naive " + ref[0]);
        check(Math.abs(gotDs - ref[1]) <= 1e-5 * Math.max(1.0, Math.abs(ref[1])),
              "dL/ds " + gotDs + " vs naive " + ref[1]);

        expectFailure("float64 q is refused", () -> h.forward(Q64, K, null, S, loss, rowLse, colLse),
                      IllegalArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT", "q: dtype");
        Q.set(5, Double.NaN);
        expectFailure("NaN in q is refused", () -> h.forward(Q, K, null, S, loss, rowLse, colLse),
                      IllegalArgumentException.class, "FLATMEM_STATUS_NON_FINITE", "q: element (1, 1)");
      }
      expectFailure("a bad Tensor dimension is refused", () -> Q.set_shape(7, 1),
                    IllegalArgumentException.class, "dimension 7 is out of range");
    }

    System.out.println(failures == 0 ? "FlatmemTest: OK" : "FlatmemTest: " + failures + " FAILED");
    System.exit(failures == 0 ? 0 : 1);
  }
}
