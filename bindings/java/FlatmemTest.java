// The Java proof of bindings/swig/flatmem.i: the SWIG module generated for Java
// (package flatmem) computes the symmetric CLIP loss of tiny features and its
// logit-scale gradient, compared with the naive formulas evaluated in double
// precision (ContrastiveReference), and a failing status arrives as a Java
// exception carrying flatmem's message and status (FlatmemArgumentException);
// Tensor's array and ByteBuffer helpers copy and refuse what they should; a reversible segment of built-in attention + MLP blocks
// rebuilds its input in the backward, and OVERLAPPED gives VANILLA's bits;
// blocks made with BLOCK_MATH_TF32 give the FP32 bits on the CPU and a math
// value outside the enum is refused; the cyclic schedule queries follow the
// closed forms of cyclic.h, the stage-parallel ones (structs the library fills
// with the wrapper's sizes, ABI 1) those of cyclic_stages.h; ContrastiveOptions.logit_cache_bytes gives the
// bits of a handle without it; the CPU instruction set can be read and set
// (CpuIsa, avx512bf16 and amx included), those above the processor's best are refused, and
// cpu_isa_engine names the kernels of each; the sigmoid (SigLIP)
// loss's five outputs against ContrastiveReference.Sigmoid, and its refusals.
// Built and run by scripts/check-java.sh; exits 1 on failure.
import flatmem.Block;
import flatmem.BlockKind;
import flatmem.BlockMath;
import flatmem.Contrastive;
import flatmem.ContrastiveLoss;
import flatmem.ContrastiveOptions;
import flatmem.CpuIsa;
import flatmem.CyclicAction;
import flatmem.CyclicActionKind;
import flatmem.CyclicRule;
import flatmem.CyclicSchedule;
import flatmem.CyclicStagesAction;
import flatmem.CyclicStagesOccupancy;
import flatmem.CyclicStagesSchedule;
import flatmem.Flatmem;
import flatmem.FlatmemArgumentException;
import flatmem.Reversible;
import flatmem.ReversibleMode;
import flatmem.ReversiblePart;
import flatmem.Status;
import flatmem.Tensor;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

public final class FlatmemTest {
  private static int failures = 0;

  private static void check(boolean ok, String what) {
    System.out.println((ok ? "PASS " : "FAIL ") + what);
    if (!ok) failures++;
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

  /** Deterministic values offset + scale * [-1, 1) into every element of t. */
  private static Tensor fill(Tensor t, long seed, double scale, double offset) {
    double[] u = TestData.uniform(seed, (int) t.numel());
    for (int i = 0; i < u.length; ++i) t.set(i, offset + scale * u[i]);
    return t;
  }

  private static double[] values(Tensor... tensors) {
    int n = 0;
    for (Tensor t : tensors) n += (int) t.numel();
    double[] out = new double[n];
    int at = 0;
    for (Tensor t : tensors)
      for (long i = 0; i < t.numel(); ++i) out[at++] = t.get(i);
    return out;
  }

  private static boolean sameBits(double[] a, double[] b) {
    if (a.length != b.length) return false;
    for (int i = 0; i < a.length; ++i)
      if (Double.doubleToRawLongBits(a[i]) != Double.doubleToRawLongBits(b[i])) return false;
    return true;
  }

  /** A built-in attention block and MLP block of `width` (made with `math`, or
   *  without the math argument when it is null), pointed at filled parameters
   *  (LayerNorm weights near 1, biases and matrices small; attention seeds
   *  seed + k, MLP seed + 10 + k) and zero gradients. Everything it makes is
   *  added to `owned`. */
  private static final class BlockPair {
    final Block attention, mlp;
    final Tensor[] attentionGradients = new Tensor[6], mlpGradients = new Tensor[6];

    BlockPair(int width, int heads, int hidden, int seed, BlockMath math, List<AutoCloseable> owned) {
      final long[][] attentionShapes = {{width}, {width}, {width, 3 * width}, {3 * width}, {width, width}, {width}};
      final long[][] mlpShapes = {{width}, {width}, {width, hidden}, {hidden}, {hidden, width}, {width}};
      Tensor[] ap = new Tensor[6], mp = new Tensor[6];
      for (int k = 0; k < 6; ++k) {
        double scale = k == 0 ? 0.1 : k % 2 == 0 ? 0.35 : 0.05, offset = k == 0 ? 1.0 : 0.0;
        ap[k] = fill(Tensor.allocated(Flatmem.kDLFloat, 32, attentionShapes[k]), seed + k, scale, offset);
        mp[k] = fill(Tensor.allocated(Flatmem.kDLFloat, 32, mlpShapes[k]), seed + 10 + k, scale, offset);
        attentionGradients[k] = Tensor.allocated(Flatmem.kDLFloat, 32, attentionShapes[k]);
        mlpGradients[k] = Tensor.allocated(Flatmem.kDLFloat, 32, mlpShapes[k]);
        owned.addAll(Arrays.asList(ap[k], mp[k], attentionGradients[k], mlpGradients[k]));
      }
      attention = math == null ? new Block(BlockKind.BLOCK_ATTENTION, width, heads, 0)
                               : new Block(BlockKind.BLOCK_ATTENTION, width, heads, 0, math);
      owned.add(attention);
      mlp = math == null ? new Block(BlockKind.BLOCK_MLP, width, 0, hidden)
                         : new Block(BlockKind.BLOCK_MLP, width, 0, hidden, math);
      owned.add(mlp);
      attention.set_parameters(ap, attentionGradients);
      mlp.set_parameters(mp, mlpGradients);
    }
  }

  /**
   * Two reversible blocks (F = built-in pre-LN attention, G = built-in MLP,
   * the same two Block objects in both: weight tying) on a (2, 5, 8) fp32
   * state: VANILLA's backward rebuilds the input, OVERLAPPED's gives the same
   * bits (dx, rebuilt input, parameter gradients).
   */
  private static void reversibleSegment() {
    final int width = 8, heads = 2, hidden = 16;
    final long[] state = {2, 5, width};
    List<AutoCloseable> owned = new ArrayList<>();
    try {
      BlockPair pair = new BlockPair(width, heads, hidden, 10, null, owned);
      Block attention = pair.attention, mlp = pair.mlp;
      Tensor[] ag = pair.attentionGradients, mg = pair.mlpGradients;

      Tensor x1 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 1, 1.0, 0.0);
      Tensor x2 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 2, 1.0, 0.0);
      Tensor dy1 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 3, 0.5, 0.0);
      Tensor dy2 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 4, 0.5, 0.0);
      owned.addAll(Arrays.asList(x1, x2, dy1, dy2));

      double[][] results = new double[2][];
      ReversibleMode[] modes = {ReversibleMode.REVERSIBLE_VANILLA, ReversibleMode.REVERSIBLE_OVERLAPPED};
      for (int m = 0; m < 2; ++m) {
        for (Tensor g : ag) for (long i = 0; i < g.numel(); ++i) g.set(i, 0.0);  // gradients accumulate
        for (Tensor g : mg) for (long i = 0; i < g.numel(); ++i) g.set(i, 0.0);
        try (Reversible segment = new Reversible(2, modes[m], 3);
             Tensor y1 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
             Tensor y2 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
             Tensor dx1 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
             Tensor dx2 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
             Tensor r1 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
             Tensor r2 = Tensor.allocated(Flatmem.kDLFloat, 32, state)) {
          for (int k = 0; k < 2; ++k) {
            segment.set_block(k, ReversiblePart.REVERSIBLE_F, attention);
            segment.set_block(k, ReversiblePart.REVERSIBLE_G, mlp);
          }
          segment.create();
          segment.forward(x1, x2, 7, 0, y1, y2);
          segment.backward(y1, y2, dy1, dy2, 7, 0, dx1, dx2, r1, r2);
          check(segment.lastMode() == modes[m], modes[m] + ": last_mode " + segment.lastMode());

          double[] x = values(x1, x2), rebuilt = values(r1, r2), dx = values(dx1, dx2), dy = values(dy1, dy2);
          double worst = 0, scale = 0, moved = 0;
          boolean finite = true;
          for (int i = 0; i < x.length; ++i) {
            worst = Math.max(worst, Math.abs(rebuilt[i] - x[i]));
            scale = Math.max(scale, Math.abs(x[i]));
            moved = Math.max(moved, Math.abs(dx[i] - dy[i]));
            finite &= Double.isFinite(dx[i]);
          }
          // The rebuild re-runs F and G on the forward's own bits (deterministic blocks), so only
          // the residual add and subtraction (u |Y| each) remain, carried through the blocks'
          // Jacobians: at most one block evaluation's 16 u sqrt(K) (tests/support/block_case.hpp,
          // u = 2^-24, K = max(3 width, hidden, tokens)) per block, 2 depth blocks. A wrong
          // rebuild is an O(1) error, 10^4 times this.
          double tolerance = 2 * 2 * 16 * 0x1p-24 * Math.sqrt(Math.max(3 * width, Math.max(hidden, state[1])));
          check(worst <= tolerance * scale, modes[m] + ": rebuilt input = input (max |diff| / max |x| "
                + worst / scale + ", tolerance " + tolerance + ")");
          check(finite && moved > 1e-3, modes[m] + ": dx finite and not just dy (max |dx - dy| " + moved + ")");
          double[] grads = values(concat(ag, mg));
          boolean someGradient = false;
          for (double g : grads) {
            finite &= Double.isFinite(g);
            someGradient |= g != 0.0;
          }
          check(finite && someGradient, modes[m] + ": parameter gradients finite and non-zero");
          results[m] = concatValues(dx, rebuilt, grads);

          if (m == 1) {
            Tensor wide = Tensor.allocated(Flatmem.kDLFloat, 32, 2, 5, width + 1);
            Tensor out1 = Tensor.allocated(Flatmem.kDLFloat, 32, 2, 5, width + 1);
            Tensor out2 = Tensor.allocated(Flatmem.kDLFloat, 32, 2, 5, width + 1);
            owned.addAll(Arrays.asList(wide, out1, out2));
            expectFailure("a state of the wrong width names the block",
                          () -> segment.forward(wide, wide, 0, 0, out1, out2),
                          IllegalArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT", "block 0, F");
          }
        }
      }
      check(sameBits(results[0], results[1]),
            "OVERLAPPED == VANILLA bitwise (dx, rebuilt input, parameter gradients; " + results[0].length + " values)");
    } finally {
      for (int i = owned.size() - 1; i >= 0; --i) {
        try {
          owned.get(i).close();
        } catch (Exception e) {
          check(false, "close: " + e);
        }
      }
    }
  }

  /** One VANILLA forward + backward of a one-layer segment whose blocks are
   *  made with `math`: y, dx and the parameter gradients. */
  private static double[] blockRun(BlockMath math) {
    final int width = 8, heads = 2, hidden = 12;
    final long[] state = {2, 3, width};
    List<AutoCloseable> owned = new ArrayList<>();
    try {
      BlockPair pair = new BlockPair(width, heads, hidden, 30, math, owned);
      Block attention = pair.attention, mlp = pair.mlp;
      Tensor[] ag = pair.attentionGradients, mg = pair.mlpGradients;
      Tensor x1 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 5, 1.0, 0.0);
      Tensor x2 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 6, 1.0, 0.0);
      Tensor dy1 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 7, 0.5, 0.0);
      Tensor dy2 = fill(Tensor.allocated(Flatmem.kDLFloat, 32, state), 8, 0.5, 0.0);
      Tensor y1 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
      Tensor y2 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
      Tensor dx1 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
      Tensor dx2 = Tensor.allocated(Flatmem.kDLFloat, 32, state);
      owned.addAll(Arrays.asList(x1, x2, dy1, dy2, y1, y2, dx1, dx2));
      try (Reversible segment = new Reversible(1, ReversibleMode.REVERSIBLE_VANILLA, 2)) {
        segment.set_block(0, ReversiblePart.REVERSIBLE_F, attention);
        segment.set_block(0, ReversiblePart.REVERSIBLE_G, mlp);
        segment.create();
        segment.forward(x1, x2, 0, 0, y1, y2);
        segment.backward(y1, y2, dy1, dy2, 0, 0, dx1, dx2, null, null);
      }
      return concatValues(values(y1, y2, dx1, dx2), values(concat(ag, mg)));
    } finally {
      for (int i = owned.size() - 1; i >= 0; --i) {
        try {
          owned.get(i).close();
        } catch (Exception e) {
          check(false, "close: " + e);
        }
      }
    }
  }

  /** BlockMath (flatmem_block_options.math): the CPU runs FP32 for TF32 too;
   *  a value outside the enum is refused naming options.math. */
  private static void blockMath() {
    check(BlockMath.BLOCK_MATH_FP32.swigValue() == 0 && BlockMath.BLOCK_MATH_TF32.swigValue() == 1,
          "BlockMath values 0, 1");
    double[] fp32 = blockRun(BlockMath.BLOCK_MATH_FP32), tf32 = blockRun(BlockMath.BLOCK_MATH_TF32);
    boolean nonzero = false;
    for (double v : fp32) nonzero |= v != 0.0;
    check(nonzero && sameBits(fp32, tf32),
          "CPU blocks made with BLOCK_MATH_TF32 give the FP32 bits (" + fp32.length + " values)");
    expectFailure("math 7 is refused",
                  () -> new Block(BlockKind.BLOCK_MLP.swigValue(), 8, 0, 0, 0.0f, 7),
                  IllegalArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT", "options.math");
  }

  private static Tensor[] concat(Tensor[] a, Tensor[] b) {
    Tensor[] out = Arrays.copyOf(a, a.length + b.length);
    System.arraycopy(b, 0, out, a.length, b.length);
    return out;
  }

  private static double[] concatValues(double[]... parts) {
    int n = 0;
    for (double[] p : parts) n += p.length;
    double[] out = new double[n];
    int at = 0;
    for (double[] p : parts) {
      System.arraycopy(p, 0, out, at, p.length);
      at += p.length;
    }
    return out;
  }

  /** CyclicSchedule (flatmem_cyclic_schedule_*): offsets, every rank's action
   *  at every time step and the delays against the header's closed forms;
   *  errors as IllegalArgumentException naming the argument. */
  private static void cyclicSchedule() {
    final int n = 3, stages = 2;
    final long steps = 2;
    for (CyclicRule rule : new CyclicRule[] {CyclicRule.CYCLIC_DELAY1, CyclicRule.CYCLIC_NEWEST,
                                             CyclicRule.CYCLIC_SYNC}) {
      try (CyclicSchedule s = new CyclicSchedule(n, stages, steps, rule)) {
        boolean sync = rule == CyclicRule.CYCLIC_SYNC, ok = s.getRule() == rule;
        final long period = 2 * stages, length = s.length();
        for (int r = 0; r < n; ++r) {
          long offset = s.offset(r);
          ok = ok && offset == (sync ? 0 : (long) r * 2 * stages / n);
          for (long t = 0; t <= length; ++t) {
            CyclicAction a = s.action(r, t);
            long local = t - offset;
            boolean active = local >= 0 && local / period < steps;
            if (!active) {
              ok = ok && a.getKind() == (t >= length ? CyclicActionKind.CYCLIC_DONE : CyclicActionKind.CYCLIC_IDLE)
                   && a.getStage() == -1 && a.getPhase() == -1;
              continue;
            }
            int p = (int) (local % period);
            boolean forward = p < stages;
            int stage = forward ? p : 2 * stages - 1 - p;
            ok = ok && a.getTime_step() == t && a.getStep() == local / period && a.getPhase() == p
                 && a.getStage() == stage && a.getActivations_held() == stage + 1
                 && a.getKind() == (forward ? CyclicActionKind.CYCLIC_FORWARD : CyclicActionKind.CYCLIC_BACKWARD);
          }
          for (int j = 0; j < stages; ++j) {
            int expected = rule == CyclicRule.CYCLIC_DELAY1 ? 1 : sync ? 0
                         : (s.offset(n - 1) - offset <= 2 * j ? 0 : 1);
            ok = ok && s.delay(r, j) == expected;
          }
        }
        check(ok, "CyclicSchedule " + rule + ": offsets, actions and delays follow cyclic.h (length " + length + ")");
      }
    }
    try (CyclicSchedule s = new CyclicSchedule(4, 2, 3)) {
      check(s.getRule() == CyclicRule.CYCLIC_DELAY1, "CyclicSchedule: CYCLIC_DELAY1 by default");
      expectFailure("CyclicSchedule.offset(4) of 4 ranks", () -> s.offset(4), IllegalArgumentException.class,
                    "FLATMEM_STATUS_INVALID_ARGUMENT", "rank: 4; expected 0 .. 3");
      expectFailure("CyclicSchedule.delay(0, 2) of 2 stages", () -> s.delay(0, 2), IllegalArgumentException.class,
                    "stage: 2");
    }
    expectFailure("CyclicSchedule of 0 ranks", () -> new CyclicSchedule(0, 2, 1), IllegalArgumentException.class,
                  "schedule.world_size: 0");
  }

  /** CyclicStagesSchedule: the actions (an array the library fills with the
   *  wrapper's element size) and the occupancy (a struct it fills with the
   *  wrapper's sizeof) against cyclic_stages.h's closed forms, L = N = 2, one
   *  step: micro-batch m starts at offset m * 2L / N = 2m; stage j runs its
   *  forward at 2m + j and its backward at 2m + 2L - 1 - j, and the update of
   *  step 0 (an IDLE action with update_step 0) one time step after its last
   *  backward. */
  private static void cyclicStagesSchedule() {
    check(Flatmem.ABI_VERSION == 1 && Flatmem.MAX_STRUCT_SIZE == 4096, "ABI_VERSION 1, MAX_STRUCT_SIZE 4096");
    final int stages = 2;
    try (CyclicStagesSchedule s = new CyclicStagesSchedule(stages, 2, 1, CyclicRule.CYCLIC_DELAY1.swigValue())) {
      boolean ok = s.period() == 4 && s.length() == 7;
      for (int j = 0; j < stages; ++j) {
        for (long t = 0; t < s.length(); ++t) {
          final long update = 2 + 2 * stages - j;
          int expected = t == update ? 1 : 0;
          for (int m = 0; m < 2; ++m)
            if (t == 2 * m + j || t == 2 * m + 2 * stages - 1 - j) ++expected;
          ok = ok && s.action_count(j, t) == expected;
          for (int i = 0; i < expected; ++i) {
            CyclicStagesAction a = s.action(j, t, i);
            ok = ok && a.getTime_step() == t && a.getStage() == j && a.getIndex_in_time_step() == i
                 && a.getActions_in_time_step() == expected;
            if (t == update) {
              ok = ok && a.getKind() == CyclicActionKind.CYCLIC_IDLE && a.getUpdate_step() == 0;
              continue;
            }
            boolean forward = a.getKind() == CyclicActionKind.CYCLIC_FORWARD;
            ok = ok && a.getStep() == 0 && a.getVersion() == 0 && a.getUpdate_step() == -1
                 && t == 2L * a.getMicro_batch() + (forward ? j : 2 * stages - 1 - j)
                 && a.getReceives() == (forward == (j > 0) ? 1 : 0) && a.getSends() == (forward == (j == 0) ? 1 : 0)
                 && a.getAccumulates() == (forward ? 0 : 1);
          }
        }
        CyclicStagesOccupancy o = s.occupancy(j);
        // N = L: one action every time step; mean held = N (2L - 2j) / P.
        ok = ok && o.getBusy_fraction() == 1.0 && o.getPeak_actions() == 1
             && o.getMean_activations_held() == 2.0 * (2 * stages - 2 * j) / 4;
      }
      check(ok, "CyclicStagesSchedule: actions and occupancy follow cyclic_stages.h (length " + s.length() + ")");
      expectFailure("CyclicStagesSchedule.action past the count", () -> s.action(0, 0, 1),
                    IllegalArgumentException.class, "index 1; stage 0 has 1 action(s) at time step 0");
    }
  }

  /** Forward + backward (every output) of one handle made with `options`. */
  private static double[] contrastiveRun(ContrastiveOptions options, Tensor q, Tensor k, Tensor s) {
    final long b = q.shape(0), d = q.shape(1);
    try (Contrastive h = new Contrastive(options);
         Tensor loss = Tensor.allocated(Flatmem.kDLFloat, 32);
         Tensor rowLse = Tensor.allocated(Flatmem.kDLFloat, 32, b);
         Tensor colLse = Tensor.allocated(Flatmem.kDLFloat, 32, b);
         Tensor dq = Tensor.allocated(Flatmem.kDLFloat, 32, b, d);
         Tensor dk = Tensor.allocated(Flatmem.kDLFloat, 32, b, d);
         Tensor ds = Tensor.allocated(Flatmem.kDLFloat, 32)) {
      h.forward(q, k, null, s, loss, rowLse, colLse);
      h.backward(q, k, null, s, rowLse, colLse, null, dq, dk, ds);
      return values(loss, rowLse, colLse, dq, dk, ds);
    }
  }

  /** ContrastiveOptions.logit_cache_bytes (0 by default): with every tile
   *  cached, or a few of them, the results are the bits of a handle without
   *  the cache (9 x 9 features in 2 x 2 tiles: 25 tiles of 16 bytes each). */
  private static void logitCache() {
    final int b = 9, d = 5;
    try (ContrastiveOptions options = new ContrastiveOptions();
         Tensor q = fill(Tensor.allocated(Flatmem.kDLFloat, 32, b, d), 41, 0.6, 0.0);
         Tensor k = fill(Tensor.allocated(Flatmem.kDLFloat, 32, b, d), 42, 0.6, 0.0);
         Tensor s = Tensor.allocated(Flatmem.kDLFloat, 32)) {
      s.set(0, 6.0);
      options.setTile_rows(2);
      options.setTile_cols(2);
      check(options.getLogit_cache_bytes() == 0, "ContrastiveOptions: logit_cache_bytes 0 by default");
      double[] reference = contrastiveRun(options, q, k, s);
      for (long budget : new long[] {4L * b * b, 4 * 16 * 3 + 5}) {
        options.setLogit_cache_bytes(budget);
        check(options.getLogit_cache_bytes() == budget, "ContrastiveOptions: logit_cache_bytes " + budget);
        check(sameBits(contrastiveRun(options, q, k, s), reference),
              "logit_cache_bytes " + budget + ": the bits of no cache (" + reference.length + " values)");
      }
    }
  }

  private static double[][] rows(Tensor t) {
    final int n = (int) t.shape(0), d = (int) t.shape(1);
    double[][] out = new double[n][d];
    for (int i = 0; i < n; ++i)
      for (int e = 0; e < d; ++e) out[i][e] = t.get((long) i * d + e);
    return out;
  }

  /**
   * The sigmoid (SigLIP) loss of a CONTRASTIVE_SIGMOID handle against
   * ContrastiveReference.Sigmoid (double precision, derived bounds): the loss
   * of sigmoid_forward and the five outputs of sigmoid_value_and_grad, at
   * b = c = 1, b = 5 &lt; c = 7 with labels (s = 10, t = -10) and b = 6 &gt; c = 3
   * with labels (s = 100, t = -10); sigmoid_backward(g = -2) gives exactly -2
   * times value_and_grad's gradients. Then refused calls: the handle of
   * another loss, a non-finite bias, a label out of range, NaN features, a
   * sigmoid handle given to forward().
   */
  private static void sigmoidLoss() {
    final int[][] shapes = {{1, 1, 1}, {5, 7, 3}, {6, 3, 4}};
    final double[][] scaleBias = {{10, -10}, {10, -10}, {100, -10}};
    for (int n = 0; n < shapes.length; ++n) {
      final int b = shapes[n][0], c = shapes[n][1], d = shapes[n][2];
      final double s = scaleBias[n][0], t = scaleBias[n][1];
      final long[] labels = n == 0 ? null : new long[b];
      for (int i = 0; labels != null && i < b; ++i) labels[i] = (3L * i + 1) % c;  // repeats when b > c
      try (ContrastiveOptions options = new ContrastiveOptions();
           Tensor Q = fill(Tensor.allocated(Flatmem.kDLFloat, 32, b, d), 51 + n, 0.6, 0.0);
           Tensor K = fill(Tensor.allocated(Flatmem.kDLFloat, 32, c, d), 61 + n, 0.6, 0.0);
           Tensor L = labels == null ? null : Tensor.of(labels);
           Tensor S = Tensor.of(new float[] {(float) s});
           Tensor T = Tensor.of(new float[] {(float) t});
           Tensor G = Tensor.of(new float[] {-2f});
           Tensor loss = Tensor.allocated(Flatmem.kDLFloat, 32);
           Tensor loss2 = Tensor.allocated(Flatmem.kDLFloat, 32);
           Tensor dq = Tensor.allocated(Flatmem.kDLFloat, 32, b, d);
           Tensor dk = Tensor.allocated(Flatmem.kDLFloat, 32, c, d);
           Tensor ds = Tensor.allocated(Flatmem.kDLFloat, 32);
           Tensor dt = Tensor.allocated(Flatmem.kDLFloat, 32);
           Tensor gq = Tensor.allocated(Flatmem.kDLFloat, 32, b, d);
           Tensor gk = Tensor.allocated(Flatmem.kDLFloat, 32, c, d);
           Tensor gs = Tensor.allocated(Flatmem.kDLFloat, 32);
           Tensor gt = Tensor.allocated(Flatmem.kDLFloat, 32)) {
        options.setLoss(ContrastiveLoss.CONTRASTIVE_SIGMOID);
        options.setNum_threads(2);
        options.setTile_rows(2);
        options.setTile_cols(3);
        ContrastiveReference.Sigmoid ref = new ContrastiveReference.Sigmoid(rows(Q), rows(K), labels, s, t, 1.0);
        String at = "sigmoid b=" + b + " c=" + c + " d=" + d + " s=" + s + " t=" + t + ": ";
        try (Contrastive h = new Contrastive(options)) {
          h.sigmoid_forward(Q, K, L, S, T, loss);
          h.sigmoid_value_and_grad(Q, K, L, S, T, loss2, dq, dk, ds, dt);
          h.sigmoid_backward(Q, K, L, S, T, G, gq, gk, gs, gt);
          check(Math.abs(loss.get(0) - ref.loss) <= ref.lossTolerance && Math.abs(loss2.get(0) - ref.loss) <= ref.lossTolerance,
                at + "loss " + loss.get(0) + ", " + loss2.get(0) + " vs " + ref.loss + " (tolerance " + ref.lossTolerance + ")");
          double rq = ContrastiveReference.worstRatio(values(dq), ref.dq, ref.dqTolerance, 0);
          double rk = ContrastiveReference.worstRatio(values(dk), ref.dk, ref.dkTolerance, 0);
          check(rq <= 1 && rk <= 1, at + "dq, dk within their bounds (worst " + rq + ", " + rk + " of the bound)");
          check(Math.abs(ds.get(0) - ref.ds) <= ref.dsTolerance,
                at + "dL/ds " + ds.get(0) + " vs " + ref.ds + " (tolerance " + ref.dsTolerance + ")");
          check(Math.abs(dt.get(0) - ref.dt) <= ref.dtTolerance,
                at + "dL/dt " + dt.get(0) + " vs " + ref.dt + " (tolerance " + ref.dtTolerance + ")");
          double[] scaled = values(dq, dk, ds, dt);
          for (int i = 0; i < scaled.length; ++i) scaled[i] = (float) (-2.0 * scaled[i]);
          check(sameBits(values(gq, gk, gs, gt), scaled), at + "sigmoid_backward(g = -2) is -2 x value_and_grad");
        }
      }
    }
    final int b = 4, d = 3;
    try (Tensor Q = fill(Tensor.allocated(Flatmem.kDLFloat, 32, b, d), 71, 0.6, 0.0);
         Tensor K = fill(Tensor.allocated(Flatmem.kDLFloat, 32, b, d), 72, 0.6, 0.0);
         Tensor S = Tensor.of(new float[] {10f});
         Tensor T = Tensor.of(new float[] {-10f});
         Tensor nanT = Tensor.of(new float[] {Float.NaN});
         Tensor bad = Tensor.of(new long[] {0, 1, 4, 2});
         Tensor loss = Tensor.allocated(Flatmem.kDLFloat, 32);
         Tensor rowLse = Tensor.allocated(Flatmem.kDLFloat, 32, b);
         ContrastiveOptions options = new ContrastiveOptions();
         Contrastive softmax = new Contrastive()) {
      options.setLoss(ContrastiveLoss.CONTRASTIVE_SIGMOID);
      try (Contrastive h = new Contrastive(options)) {
        expectFailure("a softmax handle is refused by sigmoid_forward", () -> softmax.sigmoid_forward(Q, K, null, S, T, loss),
                      FlatmemArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT",
                      "flatmem_contrastive_sigmoid_forward needs a handle created with loss = FLATMEM_CONTRASTIVE_SIGMOID");
        expectFailure("a sigmoid handle is refused by forward", () -> h.forward(Q, K, null, S, loss, rowLse, null),
                      FlatmemArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT",
                      "which flatmem_contrastive_forward does not compute");
        expectFailure("a NaN logit bias is refused", () -> h.sigmoid_value_and_grad(Q, K, null, S, nanT, loss, null, null, null, null),
                      FlatmemArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT", "logit_bias: nan; expected a finite value");
        expectFailure("a label out of range is refused", () -> h.sigmoid_backward(Q, K, bad, S, T, null, null, null, null, loss),
                      FlatmemArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT", "labels[2] = 4 is outside [0, c = 4)");
        Q.set(4, Double.NaN);
        expectFailure("NaN features are refused by the sigmoid loss", () -> h.sigmoid_forward(Q, K, null, S, T, loss),
                      FlatmemArgumentException.class, "FLATMEM_STATUS_NON_FINITE", "q: element (1, 1) is nan");
      }
    }
  }

  /** cpu_isa_in_use / _best / _set / _name (flatmem_cpu_isa_*): every
   *  instruction set up to the best can be selected, DEFAULT goes back to
   *  where the process started, those above the best (avx512bf16 and amx on
   *  AVX2-only and AVX-512-without-BF16 processors, amx on those without AMX
   *  tiles) are refused. */
  private static void cpuIsa() {
    CpuIsa start = Flatmem.cpu_isa_in_use(), best = Flatmem.cpu_isa_best();
    check(CpuIsa.CPU_ISA_AMX.swigValue() == 5 && CpuIsa.CPU_ISA_AVX512BF16.swigValue() == 4
              && CpuIsa.CPU_ISA_AVX512.swigValue() == 3,
          "CpuIsa values");
    check(Flatmem.cpu_isa_name(CpuIsa.CPU_ISA_AMX).equals("amx")
              && Flatmem.cpu_isa_name(CpuIsa.CPU_ISA_AVX512BF16).equals("avx512bf16")
              && Flatmem.cpu_isa_name(CpuIsa.CPU_ISA_AVX512).equals("avx512")
              && Flatmem.cpu_isa_name(CpuIsa.CPU_ISA_AVX2).equals("avx2")
              && Flatmem.cpu_isa_name(CpuIsa.CPU_ISA_BASELINE).equals("baseline")
              && Flatmem.cpu_isa_name(CpuIsa.CPU_ISA_DEFAULT).equals("default"),
          "cpu_isa_name");
    check(start.swigValue() >= 1 && start.swigValue() <= best.swigValue(),
          "cpu_isa_in_use " + Flatmem.cpu_isa_name(start) + " <= cpu_isa_best " + Flatmem.cpu_isa_name(best));
    try {
      for (CpuIsa isa : CPU_ISAS) {
        if (isa.swigValue() > best.swigValue()) {
          CpuIsa before = Flatmem.cpu_isa_in_use();
          expectFailure("cpu_isa_set(" + isa + ") above the best is refused", () -> Flatmem.cpu_isa_set(isa),
                        RuntimeException.class, "FLATMEM_STATUS_UNSUPPORTED", Flatmem.cpu_isa_name(isa));
          check(Flatmem.cpu_isa_in_use() == before, "a refused cpu_isa_set changes nothing");
          continue;
        }
        Flatmem.cpu_isa_set(isa);
        check(Flatmem.cpu_isa_in_use() == isa && Flatmem.cpu_isa_best() == best, "cpu_isa_set(" + isa + ")");
      }
    } finally {
      Flatmem.cpu_isa_set(CpuIsa.CPU_ISA_DEFAULT);
    }
    check(Flatmem.cpu_isa_in_use() == start, "cpu_isa_set(CPU_ISA_DEFAULT) goes back to " + start);
  }

  /** The instruction sets, least capable first. */
  private static final CpuIsa[] CPU_ISAS = {CpuIsa.CPU_ISA_BASELINE, CpuIsa.CPU_ISA_AVX2, CpuIsa.CPU_ISA_AVX512,
                                            CpuIsa.CPU_ISA_AVX512BF16, CpuIsa.CPU_ISA_AMX};

  /** cpu_isa_engine (flatmem_cpu_isa_engine): for every level, above the best
   *  too, the library, its version and the level's name lead, then a kernel
   *  per input dtype; at avx512bf16 and amx bf16 inputs are not widened to
   *  fp32; DEFAULT is the level in use. (A non-value, "unknown" in C, cannot
   *  be passed: CpuIsa is a closed Java enum.) Only that much is asserted: the
   *  kernel words are no stable format. */
  private static void cpuIsaEngine() {
    check(Flatmem.cpu_isa_engine(CpuIsa.CPU_ISA_DEFAULT).equals(Flatmem.cpu_isa_engine(Flatmem.cpu_isa_in_use())),
          "cpu_isa_engine(CPU_ISA_DEFAULT) is the level in use's");
    for (CpuIsa isa : CPU_ISAS) {
      String text = Flatmem.cpu_isa_engine(isa);
      String prefix = "flatmem " + Flatmem.version_string() + " own kernels at " + Flatmem.cpu_isa_name(isa) + ": fp32 ";
      check(text.startsWith(prefix) && text.contains("; bf16 "),
            "cpu_isa_engine(" + isa + ") = '" + text + "' starts with '" + prefix + "' and has a bf16 part");
      if (isa.swigValue() >= CpuIsa.CPU_ISA_AVX512BF16.swigValue()) {
        String bf16 = text.split("; bf16 ", 2)[1].split(";", 2)[0];
        check(!bf16.contains("widened to fp32"), "cpu_isa_engine(" + isa + "): bf16 '" + bf16 + "' is no widening");
      }
    }
  }

  /** Tensor.of / toFloatArray / toDoubleArray / copyFrom / bytes / wrap: copies in
   *  and out, the shape given, and clear refusals naming the argument. */
  private static void tensorHelpers() {
    try (Tensor f = Tensor.of(new float[] {1.5f, -2, 3, 4, 5, 6}, 2, 3);
         Tensor d = Tensor.of(new double[] {0.1, 0.2});
         Tensor l = Tensor.of(new long[] {7, -1, 1L << 40})) {
      check(f.ndim() == 2 && f.shape(0) == 2 && f.shape(1) == 3 && f.get(4) == 5 && f.dtype_bits() == 32
                && Arrays.equals(f.toFloatArray(), new float[] {1.5f, -2, 3, 4, 5, 6}),
            "Tensor.of(float[], 2, 3) / toFloatArray");
      d.copyFrom(new double[] {0.3, -0.7});
      check(d.ndim() == 1 && d.shape(0) == 2 && Arrays.equals(d.toDoubleArray(), new double[] {0.3, -0.7}),
            "Tensor.of(double[]) / copyFrom / toDoubleArray");
      check(l.dtype_code() == Flatmem.kDLInt && l.get(2) == (double) (1L << 40), "Tensor.of(long[]) is int64");
      expectFailure("Tensor.of with a shape of another size", () -> Tensor.of(new float[5], 2, 3),
                    IllegalArgumentException.class, "values: 5 elements; shape [2, 3] holds 6");
      expectFailure("toFloatArray of a float64 tensor", d::toFloatArray, IllegalArgumentException.class,
                    "Tensor.toFloatArray: dtype (code 2, bits 64");
      expectFailure("copyFrom of too few values", () -> f.copyFrom(new float[5]), IllegalArgumentException.class,
                    "values: 5 elements");
      java.nio.ByteBuffer direct = java.nio.ByteBuffer.allocateDirect(16).order(java.nio.ByteOrder.nativeOrder());
      try (Tensor w = Tensor.wrap(direct, Flatmem.kDLFloat, 32, 2, 2)) {
        w.set(3, 2.5);
        check(direct.getFloat(12) == 2.5f && w.bytes().capacity() == 16, "Tensor.wrap: the ByteBuffer's memory, no copy");
        w.set_stride(0, 1);
        expectFailure("bytes() of a strided tensor", w::bytes, IllegalArgumentException.class,
                      "FLATMEM_STATUS_INVALID_ARGUMENT", "only compact tensors");
      }
    }
  }

  public static void main(String[] args) {
    System.out.println("flatmem " + Flatmem.version_string() + ": header FLATMEM_VERSION "
                       + Flatmem.VERSION + ", library flatmem_version() " + Flatmem.version());
    check(Flatmem.VERSION == Flatmem.version() && Flatmem.version_mismatch().isEmpty(),
          "header and library versions agree");
    // Every status of the header is a Status constant the library names (the
    // communicator statuses included; failures other than the ones mapped to
    // IllegalArgumentException / OutOfMemoryError are RuntimeException).
    for (Status status : Status.values())
      check(Flatmem.status_string(status.swigValue()).equals("FLATMEM_" + status.name()),
            status + ": status_string " + Flatmem.status_string(status.swigValue()));
    check(Status.STATUS_TIMEOUT.swigValue() == 7 && Status.STATUS_PEER_FAILURE.swigValue() == 8
              && Status.STATUS_COMM_POISONED.swigValue() == 9,
          "communicator statuses 7, 8, 9");

    final int b = 3, d = 4;
    final double scale = 2.5;
    double[][] q = new double[b][d], k = new double[b][d];
    for (int i = 0; i < b; ++i)
      for (int t = 0; t < d; ++t) {
        // small, exactly representable in fp32, different for q and k
        q[i][t] = ((i * 7 + t * 3) % 11 - 5) / 8.0;
        k[i][t] = ((i * 5 + t * 2) % 9 - 4) / 8.0;
      }
    ContrastiveReference ref = new ContrastiveReference(q, k, null, true, scale);

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
        // fp32 accumulation of 4-term dot products and 3-term sums: the
        // worst-case bounds of tests/support/tolerance.hpp (ContrastiveReference;
        // at b = 3, d = 4, s = 2.5 about 3e-6 for the loss), whatever the CPU
        // ISA. A wrong term moves the loss by > 1e-2.
        double gotLoss = loss.get(0), gotDs = dS.get(0);
        check(Math.abs(gotLoss - ref.loss) <= ref.lossTolerance,
              "symmetric loss " + gotLoss + " vs naive " + ref.loss + " (tolerance " + ref.lossTolerance + ")");
        check(Math.abs(gotDs - ref.ds) <= ref.dsTolerance,
              "dL/ds " + gotDs + " vs naive " + ref.ds + " (tolerance " + ref.dsTolerance + ")");

        expectFailure("float64 q is refused", () -> h.forward(Q64, K, null, S, loss, rowLse, colLse),
                      IllegalArgumentException.class, "FLATMEM_STATUS_INVALID_ARGUMENT", "q: dtype");
        try {
          h.forward(Q64, K, null, S, loss, rowLse, colLse);
        } catch (FlatmemArgumentException e) {
          check(e.status() == Status.STATUS_INVALID_ARGUMENT && e.statusCode() == 1,
                "FlatmemArgumentException.status() " + e.status());
        }
        Q.set(5, Double.NaN);
        expectFailure("NaN in q is refused", () -> h.forward(Q, K, null, S, loss, rowLse, colLse),
                      IllegalArgumentException.class, "FLATMEM_STATUS_NON_FINITE", "q: element (1, 1)");
      }
      expectFailure("a bad Tensor dimension is refused", () -> Q.set_shape(7, 1),
                    IllegalArgumentException.class, "dimension 7 is out of range");
    }

    tensorHelpers();
    reversibleSegment();
    blockMath();
    cyclicSchedule();
    cyclicStagesSchedule();
    logitCache();
    sigmoidLoss();
    cpuIsa();
    cpuIsaEngine();

    System.out.println(failures == 0 ? "FlatmemTest: OK" : "FlatmemTest: " + failures + " FAILED");
    System.exit(failures == 0 ? 0 : 1);
  }
}
