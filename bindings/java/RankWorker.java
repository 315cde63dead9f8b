// One rank of CommTest's multi-process runs: a JVM that joins a communicator
// over UCX and checks, as this rank, the communicator (messages, all-reduce),
// the ring contrastive loss and the sigmoid ring against ContrastiveReference
// (and its Sigmoid) of the concatenated global batch, the cyclic runtime's
// SYNC rule against plain SGD, the stage-parallel runtime (CyclicStagesCheck) and the
// ZeRO relay (CyclicRelayCheck); with
// FLATMEM_TEST_KILL=1 the last rank then waits to be killed and the others
// check that their next collective fails, naming it, within the timeout.
//
//   java RankWorker env                    FLATMEM_RANK / _WORLD_SIZE / _COORDINATOR
//   java RankWorker id <rank> <n> <hex|->  rank 0 ("-") makes the UniqueId and
//                                          prints "UNIQUE_ID <hex>" for the others
// Prints PASS / FAIL lines; exits 1 when a check failed (2 on an exception).
import flatmem.CommRequest;
import flatmem.Communicator;
import flatmem.Contrastive;
import flatmem.ContrastiveLoss;
import flatmem.ContrastiveOptions;
import flatmem.Cyclic;
import flatmem.CyclicAction;
import flatmem.CyclicActionKind;
import flatmem.CyclicMemory;
import flatmem.CyclicRule;
import flatmem.Flatmem;
import flatmem.FlatmemArgumentException;
import flatmem.FlatmemException;
import flatmem.Status;
import flatmem.Tensor;
import flatmem.UniqueId;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;

public final class RankWorker {
  /** Every wait of the communicator (ms): far above what a healthy run of
   *  these tiny messages needs on a loaded machine, far below CommTest's deadline. */
  static final long TIMEOUT_MS = 10000, CONNECT_TIMEOUT_MS = 20000;
  /** The wait in the killed-peer check (ms): the other ranks must fail within it
   *  (plus 3 s of slack for a loaded machine), whoever they were waiting on. */
  static final long KILL_TIMEOUT_MS = 8000;

  private static int rank, world, failures;

  static void check(boolean ok, String what) {
    System.out.println((ok ? "PASS" : "FAIL") + " rank " + rank + "/" + world + ": " + what);
    if (!ok) failures++;
  }

  /** Deterministic values in [-scale, scale), rounded to float32 (the inputs the library sees). */
  static double[][] matrix(long seed, int rows, int cols, double scale) {
    double[] u = TestData.uniform(seed, rows * cols);
    double[][] m = new double[rows][cols];
    for (int i = 0; i < rows; ++i)
      for (int t = 0; t < cols; ++t) m[i][t] = (float) (scale * u[i * cols + t]);
    return m;
  }

  static float[] flatten(double[][] m, int first, int rows) {
    final int d = m[0].length;
    float[] out = new float[rows * d];
    for (int i = 0; i < rows; ++i)
      for (int t = 0; t < d; ++t) out[i * d + t] = (float) m[first + i][t];
    return out;
  }

  static double[] widen(float[] v) {
    double[] out = new double[v.length];
    for (int i = 0; i < v.length; ++i) out[i] = v[i];
    return out;
  }

  static int prefix(int[] counts, int r) {
    int sum = 0;
    for (int i = 0; i < r; ++i) sum += counts[i];
    return sum;
  }

  /** Whether every rank holds the same bits in values: each compares with
   *  rank - 1's copy (ring_shift), so all agree iff every rank sees its
   *  neighbour agree (the verdicts are summed over ranks). */
  static boolean sameOnAllRanks(Communicator comm, double[] values) {
    boolean same;
    try (Tensor mine = Tensor.of(values); Tensor previous = Tensor.of(new double[values.length])) {
      comm.ring_shift(mine, previous);
      double[] theirs = previous.toDoubleArray();
      same = true;
      for (int i = 0; i < values.length; ++i)
        same &= Double.doubleToRawLongBits(theirs[i]) == Double.doubleToRawLongBits(values[i]);
    }
    return comm.all_reduce(new double[] {same ? 0 : 1})[0] == 0;
  }

  /** Runs body, expecting `type` with a message containing every part. */
  static void expectFailure(String what, Runnable body, Class<? extends RuntimeException> type, String... parts) {
    try {
      body.run();
      check(false, what + ": no exception");
    } catch (RuntimeException e) {
      boolean ok = type.isInstance(e);
      for (String p : parts) ok &= e.getMessage() != null && e.getMessage().contains(p);
      check(ok, what + ": " + e.getClass().getSimpleName() + ": " + e.getMessage());
    }
  }

  /** Each call (a plain one and its stream overload) of a kDLCUDA Tensor on a
   *  host handle is refused naming options.memory. */
  static void refusedOnHost(String what, Runnable... calls) {
    for (Runnable call : calls)
      expectFailure(what + " of a kDLCUDA Tensor on a host handle", call, FlatmemArgumentException.class,
                    "device type 2", "options.memory = HOST takes kDLCPU");
  }

  static Communicator join(String[] args) {
    if (args.length >= 1 && args[0].equals("env")) {
      rank = Integer.parseInt(System.getenv("FLATMEM_RANK"));
      world = Integer.parseInt(System.getenv("FLATMEM_WORLD_SIZE"));
      return Communicator.from_env(TIMEOUT_MS, CONNECT_TIMEOUT_MS);
    }
    if (args.length != 4 || !args[0].equals("id")) throw new IllegalArgumentException("usage: RankWorker env | id <rank> <n> <hex|->");
    rank = Integer.parseInt(args[1]);
    world = Integer.parseInt(args[2]);
    if (args[3].equals("-")) {
      try (UniqueId id = new UniqueId("127.0.0.1:0")) {
        System.out.println("UNIQUE_ID " + id.hex());
        System.out.flush();
        return new Communicator(rank, world, id, TIMEOUT_MS, CONNECT_TIMEOUT_MS);
      }
    }
    try (UniqueId id = UniqueId.from_hex(args[3])) {
      check(id.hex().equals(args[3].toLowerCase()), "UniqueId.from_hex(hex()) round trip");
      return new Communicator(rank, world, id, TIMEOUT_MS, CONNECT_TIMEOUT_MS);
    }
  }

  /** isend / irecv around the ring (a float[] Tensor out, a direct ByteBuffer
   *  in), two tags received in the other order, and refused arguments. */
  static void messages(Communicator comm) {
    final int next = (rank + 1) % world, previous = (rank + world - 1) % world;
    float[] mine = new float[5], second = {rank + 1, -rank - 0.5f};  // never the zeros a receive starts from
    for (int i = 0; i < 5; ++i) mine[i] = rank * 10 + i + 0.25f;
    ByteBuffer inbox = ByteBuffer.allocateDirect(4 * 5 + 8).order(ByteOrder.nativeOrder());
    inbox.position(8);  // the tensor starts at the buffer's position
    try (Tensor out = Tensor.of(mine); Tensor out2 = Tensor.of(second);
         Tensor in = Tensor.wrap(inbox, flatmem.Flatmem.kDLFloat, 32, 5);
         Tensor in2 = Tensor.of(new float[2])) {
      CommRequest r2 = comm.irecv(in2, previous, 9), r1 = comm.irecv(in, previous, 7);
      CommRequest s1 = comm.isend(out, next, 7), s2 = comm.isend(out2, next, 9);
      for (CommRequest r : new CommRequest[] {r1, r2, s1, s2}) r.waitFor();
      check(r1.is_done() && r1.is_receive() && r1.peer() == previous, "CommRequest: done, receive, peer " + previous);
      float[] got = in.toFloatArray(), expected = new float[5];
      for (int i = 0; i < 5; ++i) expected[i] = previous * 10 + i + 0.25f;
      check(Arrays.equals(got, expected) && inbox.getFloat(8) == expected[0],
            "irecv into a direct ByteBuffer from rank " + previous + ": " + Arrays.toString(got));
      check(Arrays.equals(in2.toFloatArray(), new float[] {previous + 1, -previous - 0.5f}),
            "tag 9 received before tag 7 was waited for: " + Arrays.toString(in2.toFloatArray()));
      expectFailure("waitFor twice", () -> r1.waitFor(), FlatmemArgumentException.class,
                    "FLATMEM_STATUS_INVALID_ARGUMENT", "already waited");
      expectFailure("isend(null)", () -> comm.isend(null, next), FlatmemArgumentException.class, "buffer is NULL");
      expectFailure("isend to rank " + world, () -> comm.isend(out, world), FlatmemArgumentException.class,
                    "FLATMEM_STATUS_INVALID_ARGUMENT", "peer");
      expectFailure("Tensor.wrap of a heap ByteBuffer", () -> Tensor.wrap(ByteBuffer.allocate(8), 2, 32, 2),
                    IllegalArgumentException.class, "buffer: not a direct ByteBuffer");
      expectFailure("Tensor.wrap of too few bytes", () -> Tensor.wrap(inbox, 2, 32, 6),
                    IllegalArgumentException.class, "the tensor needs 24");
      comm.check_health();
      check(true, "refused arguments leave the communicator healthy");
    }
  }

  /** all_reduce of float64 and float32 data whose sums depend on the order:
   *  the same bits on every rank, within the sum's rounding of the exact sum. */
  static void allReduce(Communicator comm) {
    final int m = 7;
    double[][] all = new double[world][m];
    for (int r = 0; r < world; ++r)
      for (int i = 0; i < m; ++i)  // magnitudes 1e-6 .. 1e6: order-dependent rounding
        all[r][i] = TestData.uniform(100 + r, m)[i] * Math.pow(10, (i + r) % 13 - 6);
    double[] sum = comm.all_reduce(all[rank]);
    float[] mine32 = new float[m];
    for (int i = 0; i < m; ++i) mine32[i] = (float) all[rank][i];
    float[] sum32 = comm.all_reduce(mine32);
    // Exact reference: a double-double (TwoSum) accumulation. A sum of n terms in
    // any order is within (n - 1) u sum |x| of it (u = 2^-53 for fp64, 2^-24 for
    // fp32 inputs, which are exact in double); one wrong or missing term is off by far more.
    boolean ok64 = true, ok32 = true;
    for (int i = 0; i < m; ++i) {
      double hi = 0, lo = 0, abs = 0, hi32 = 0, lo32 = 0;
      for (int r = 0; r < world; ++r) {
        double x = all[r][i], x32 = (float) all[r][i];
        double t = hi + x, e = (hi - (t - (t - hi))) + (x - (t - hi));
        hi = t;
        lo += e;
        t = hi32 + x32;
        e = (hi32 - (t - (t - hi32))) + (x32 - (t - hi32));
        hi32 = t;
        lo32 += e;
        abs += Math.abs(x);
      }
      ok64 &= Math.abs(sum[i] - (hi + lo)) <= (world - 1) * 0x1p-53 * abs;
      ok32 &= Math.abs(sum32[i] - (hi32 + lo32)) <= (world - 1) * 0x1p-24 * abs * (1 + 0x1p-20);
    }
    check(ok64, "all_reduce(double[]) within (n-1) u sum|x| of the exact sum: " + Arrays.toString(sum));
    check(ok32, "all_reduce(float[]) within (n-1) u32 sum|x| of the exact sum");
    check(sameOnAllRanks(comm, sum) && sameOnAllRanks(comm, widen(sum32)), "all_reduce: the same bits on every rank");
    comm.barrier();
    check(true, "barrier");
  }

  /** |got - want| &lt;= tolerance, reported with the three numbers. */
  static void checkValue(String what, double got, double want, double tolerance) {
    check(Math.abs(got - want) <= tolerance, what + " " + got + " vs " + want + " (tolerance " + tolerance + ")");
  }

  /** dq (this rank's rows from r0) and dk (its columns from c0) within the
   *  reference's element-wise bounds. */
  static void checkSlices(String what, Tensor dq, Tensor dk, double[][] refDq, double[][] dqTolerance,
                          double[][] refDk, double[][] dkTolerance, int r0, int c0) {
    double dqRatio = ContrastiveReference.worstRatio(widen(dq.toFloatArray()), refDq, dqTolerance, r0);
    double dkRatio = ContrastiveReference.worstRatio(widen(dk.toFloatArray()), refDk, dkTolerance, c0);
    check(dqRatio <= 1, what + ": dq = this rank's rows of the global dL/dq (worst error / tolerance " + dqRatio + ")");
    check(dkRatio <= 1, what + ": dk = this rank's columns of the global dL/dk (worst error / tolerance " + dkRatio + ")");
  }

  /** The ring loss of this rank's slice (rows[rank] of q, cols[rank] of k) of
   *  a global batch against the reference of the whole batch. */
  static void ringLoss(Communicator comm, String name, boolean symmetric, int[] rows, int[] cols, int d, double s,
                       long seed) {
    final int b = Arrays.stream(rows).sum(), c = Arrays.stream(cols).sum();
    final int r0 = prefix(rows, rank), c0 = prefix(cols, rank), br = rows[rank], cr = cols[rank];
    double[][] q = matrix(seed, b, d, 0.6), k = matrix(seed + 1, c, d, 0.6);
    long[] labels = null;
    if (!symmetric) {
      labels = new long[b];
      for (int g = 0; g < b; ++g) labels[g] = (5L * g + 2) % c;  // positives on other ranks too
    }
    ContrastiveReference ref = new ContrastiveReference(q, k, labels, symmetric, s);
    String what = name + " (B " + b + ", C " + c + ", d " + d + "; rank rows " + br + ", cols " + cr + ")";
    try (ContrastiveOptions options = new ContrastiveOptions()) {
      options.setLoss(symmetric ? ContrastiveLoss.CONTRASTIVE_SYMMETRIC : ContrastiveLoss.CONTRASTIVE_INFONCE);
      options.setTile_rows(2);  // several tiles per block even for these small shards
      options.setTile_cols(2);
      options.setNum_threads(1);
      try (Contrastive h = new Contrastive(options, comm);
           Tensor qr = Tensor.of(flatten(q, r0, br), br, d);
           Tensor kr = Tensor.of(flatten(k, c0, cr), cr, d);
           Tensor lr = labels == null ? null : Tensor.of(Arrays.copyOfRange(labels, r0, r0 + br));
           Tensor scale = Tensor.allocated(flatmem.Flatmem.kDLFloat, 32);
           Tensor loss = Tensor.allocated(flatmem.Flatmem.kDLFloat, 32);
           Tensor rowLse = Tensor.allocated(flatmem.Flatmem.kDLFloat, 32, br);
           Tensor colLse = Tensor.allocated(flatmem.Flatmem.kDLFloat, 32, cr);
           Tensor dq = Tensor.allocated(flatmem.Flatmem.kDLFloat, 32, br, d);
           Tensor dk = Tensor.allocated(flatmem.Flatmem.kDLFloat, 32, cr, d);
           Tensor ds = Tensor.allocated(flatmem.Flatmem.kDLFloat, 32)) {
        scale.set(0, s);
        check(comm.users() == 1, "Contrastive(options, comm) is a user of the communicator");
        h.forward(qr, kr, lr, scale, loss, rowLse, symmetric ? colLse : null);
        h.backward(qr, kr, lr, scale, rowLse, symmetric ? colLse : null, null, dq, dk, ds);
        double gotLoss = loss.get(0), gotDs = ds.get(0);
        checkValue(what + ": loss", gotLoss, ref.loss, ref.lossTolerance);
        checkValue(what + ": dL/ds", gotDs, ref.ds, ref.dsTolerance);
        double rowRatio = ContrastiveReference.worstRatio(widen(rowLse.toFloatArray()), ref.rowLse, ref.rowLseTolerance, r0);
        double colRatio = symmetric
            ? ContrastiveReference.worstRatio(widen(colLse.toFloatArray()), ref.colLse, ref.colLseTolerance, c0) : 0;
        check(rowRatio <= 1 && colRatio <= 1, what + ": global row / column LSEs (worst error / tolerance "
              + Math.max(rowRatio, colRatio) + ")");
        checkSlices(what, dq, dk, ref.dq, ref.dqTolerance, ref.dk, ref.dkTolerance, r0, c0);
        check(sameOnAllRanks(comm, new double[] {gotLoss, gotDs}), what + ": loss and dL/ds: the same bits on every rank");

        expectFailure("Communicator.close() while a Contrastive uses it", comm::close, FlatmemArgumentException.class,
                      "FLATMEM_STATUS_INVALID_ARGUMENT", "still used by 1 handle");
        check(comm.is_open(), "the refused close() left the communicator open");
      }
      check(comm.users() == 0, "closing the Contrastive releases the communicator");
    }
  }

  /** The sigmoid (SigLIP) ring loss of this rank's slice against
   *  ContrastiveReference.Sigmoid of the whole batch (B = the global rows in
   *  the mean): loss, dL/ds and dL/dt (the same bits on every rank), this
   *  rank's rows of dq and columns of dk; labels (global, most on other
   *  ranks' columns) or none (row g's positive is column g, C &gt;= B). */
  static void sigmoidRing(Communicator comm, String name, boolean withLabels, int[] rows, int[] cols, int d,
                          double s, double t, long seed) {
    final int b = Arrays.stream(rows).sum(), c = Arrays.stream(cols).sum();
    final int r0 = prefix(rows, rank), c0 = prefix(cols, rank), br = rows[rank], cr = cols[rank];
    double[][] q = matrix(seed, b, d, 0.6), k = matrix(seed + 1, c, d, 0.6);
    long[] labels = null;
    if (withLabels) {
      labels = new long[b];
      for (int g = 0; g < b; ++g) labels[g] = (5L * g + 2) % c;
    }
    ContrastiveReference.Sigmoid ref = new ContrastiveReference.Sigmoid(q, k, labels, s, t, 1.0);
    String what = name + " (B " + b + ", C " + c + ", d " + d + ", s " + s + ", t " + t + "; rank rows " + br
                  + ", cols " + cr + ")";
    try (ContrastiveOptions options = new ContrastiveOptions()) {
      options.setLoss(ContrastiveLoss.CONTRASTIVE_SIGMOID);
      options.setTile_rows(2);
      options.setTile_cols(2);
      options.setNum_threads(1);
      try (Contrastive handle = new Contrastive(options, comm);
           Tensor qr = Tensor.of(flatten(q, r0, br), br, d);
           Tensor kr = Tensor.of(flatten(k, c0, cr), cr, d);
           Tensor lr = labels == null ? null : Tensor.of(Arrays.copyOfRange(labels, r0, r0 + br));
           Tensor scale = Tensor.of(new float[] {(float) s});
           Tensor bias = Tensor.of(new float[] {(float) t});
           Tensor loss = Tensor.allocated(Flatmem.kDLFloat, 32);
           Tensor dq = Tensor.allocated(Flatmem.kDLFloat, 32, br, d);
           Tensor dk = Tensor.allocated(Flatmem.kDLFloat, 32, cr, d);
           Tensor ds = Tensor.allocated(Flatmem.kDLFloat, 32);
           Tensor dt = Tensor.allocated(Flatmem.kDLFloat, 32)) {
        handle.sigmoid_value_and_grad(qr, kr, lr, scale, bias, loss, dq, dk, ds, dt);
        double gotLoss = loss.get(0), gotDs = ds.get(0), gotDt = dt.get(0);
        checkValue(what + ": loss", gotLoss, ref.loss, ref.lossTolerance);
        checkValue(what + ": dL/ds", gotDs, ref.ds, ref.dsTolerance);
        checkValue(what + ": dL/dt", gotDt, ref.dt, ref.dtTolerance);
        checkSlices(what, dq, dk, ref.dq, ref.dqTolerance, ref.dk, ref.dkTolerance, r0, c0);
        check(sameOnAllRanks(comm, new double[] {gotLoss, gotDs, gotDt}),
              what + ": loss, dL/ds and dL/dt: the same bits on every rank");
      }
    }
  }

  /** The gradient rank r computes for stage j of step `step` at parameters w:
   *  g_e = (1 + r/10) w_e (e + 1) / |w| + sin(r + 3 step + 7 j + e). */
  static double[] gradient(int r, long step, int j, double[] w) {
    double[] g = new double[w.length];
    for (int e = 0; e < w.length; ++e)
      g[e] = (1 + r / 10.0) * w[e] * (e + 1) / w.length + Math.sin(r + 3 * step + 7 * j + e);
    return g;
  }

  /** Cyclic under CYCLIC_SYNC is plain data-parallel SGD: w_j -= lr * mean_r g_r. */
  static void cyclicSync(Communicator comm) {
    final int stages = 2;
    final long steps = 3;
    final double lr = 0.1;
    final int[] sizes = {3, 5};  // uneven stage sizes
    double[][] w = new double[stages][], reference = new double[stages][];
    for (int j = 0; j < stages; ++j) {
      w[j] = new double[sizes[j]];
      for (int e = 0; e < sizes[j]; ++e) w[j][e] = 0.5 - 0.1 * e + j;
      reference[j] = w[j].clone();
    }
    // plain SGD in double, every rank's gradient at the shared parameters
    for (long step = 0; step < steps; ++step)
      for (int j = 0; j < stages; ++j) {
        double[] mean = new double[sizes[j]];
        for (int r = 0; r < world; ++r) {
          double[] g = gradient(r, step, j, reference[j]);
          for (int e = 0; e < sizes[j]; ++e) mean[e] += g[e] / world;
        }
        for (int e = 0; e < sizes[j]; ++e) reference[j][e] -= lr * mean[e];
      }
    // Device gradients need the NCCL transport (init_device, not called here):
    // every rank refuses, naming options.memory (UNSUPPORTED without NCCL).
    expectFailure("Cyclic CYCLIC_MEMORY_CUDA without init_device",
                  () -> new Cyclic(comm, stages, steps, CyclicRule.CYCLIC_SYNC, 0, CyclicMemory.CYCLIC_MEMORY_CUDA),
                  RuntimeException.class, "options.memory: CUDA");
    Tensor[][] buffers = new Tensor[stages][2];
    int forwards = 0, backwards = 0, updates = 0;
    try (Cyclic cyclic = new Cyclic(comm, stages, steps, CyclicRule.CYCLIC_SYNC, 0, CyclicMemory.CYCLIC_MEMORY_HOST);
         Tensor onDevice = Tensor.of(new double[sizes[0]])) {
      onDevice.set_device(Flatmem.kDLCUDA, 0);
      check(comm.users() == 1, "Cyclic is a user of the communicator");
      expectFailure("Communicator.close() while a Cyclic uses it", comm::close, FlatmemArgumentException.class,
                    "still used by 1 handle");
      for (int j = 0; j < stages; ++j)
        for (int p = 0; p < 2; ++p) buffers[j][p] = Tensor.of(new double[sizes[j]]);
      for (;;) {
        CyclicAction a = cyclic.next();
        if (a.getKind() == CyclicActionKind.CYCLIC_DONE) break;
        if (a.getUpdate_stage() >= 0) {
          int j = a.getUpdate_stage();
          double[] mean = buffers[j][(int) (a.getUpdate_step() % 2)].toDoubleArray();
          for (int e = 0; e < sizes[j]; ++e) w[j][e] -= lr * mean[e];
          updates++;
        }
        if (a.getKind() == CyclicActionKind.CYCLIC_FORWARD) forwards++;
        if (a.getKind() == CyclicActionKind.CYCLIC_BACKWARD) {
          backwards++;
          int j = a.getStage();
          Tensor g = buffers[j][(int) (a.getStep() % 2)];
          g.copyFrom(gradient(rank, a.getStep(), j, w[j]));
          if (backwards == 1)
            expectFailure("Cyclic.reduce of a kDLCUDA Tensor on a host handle", () -> cyclic.reduce(j, onDevice, 0),
                          FlatmemArgumentException.class, "options.memory = HOST takes kDLCPU");
          if (a.getStep() % 2 == 1)
            cyclic.reduce(j, g, 0x5000L);  // flatmem_cyclic_reduce_stream: the stream is ignored for CPU gradients
          else
            cyclic.reduce(j, g);
        }
      }
      check(forwards == stages * steps && backwards == stages * steps && updates == stages * steps,
            "Cyclic SYNC: " + forwards + " forwards, " + backwards + " backwards, " + updates + " updates");
      check(cyclic.summary().getTime_steps() > 0 && cyclic.stats().length > 0, "Cyclic: summary() and stats()");
    } finally {
      for (Tensor[] pair : buffers)
        for (Tensor t : pair)
          if (t != null) t.close();
    }
    // Each step's average is within (n + 1) 2^-53 sum|g| (~1e-15 here) of the
    // double mean above, amplified by at most (1 + lr max|dg/dw|)^steps < 2 over
    // the run; 1e-12 leaves a wide margin, while one missing rank's gradient
    // or a skipped update moves w by > 1e-2.
    double worst = 0;
    double[] flat = new double[sizes[0] + sizes[1]];
    for (int j = 0, at = 0; j < stages; ++j)
      for (int e = 0; e < sizes[j]; ++e, ++at) {
        worst = Math.max(worst, Math.abs(w[j][e] - reference[j][e]));
        flat[at] = w[j][e];
      }
    check(worst <= 1e-12, "Cyclic SYNC = plain SGD over " + world + " ranks (max |w - w_sgd| " + worst + ")");
    check(sameOnAllRanks(comm, flat), "Cyclic SYNC: the same parameters on every rank");
    check(comm.users() == 0, "closing the Cyclic releases the communicator");
  }

  /** The last rank waits to be killed (CommTest kills it); the others' next
   *  collective fails within the timeout naming it, and later calls fail fast. */
  static void killedPeer(Communicator comm) throws InterruptedException {
    final int victim = world - 1;
    comm.barrier();
    if (rank == victim) {
      System.out.println("READY_TO_DIE");
      System.out.flush();
      Thread.sleep(60000);
      check(false, "rank " + victim + " was not killed");
      return;
    }
    System.out.println("READY");
    System.out.flush();
    long start = System.nanoTime();
    try (Tensor one = Tensor.of(new double[] {1.0})) {
      comm.all_reduce(one, one, KILL_TIMEOUT_MS);
      check(false, "all_reduce with a killed rank: no exception");
    } catch (FlatmemException e) {
      double seconds = (System.nanoTime() - start) * 1e-9;
      boolean status = e.status() == Status.STATUS_PEER_FAILURE || e.status() == Status.STATUS_TIMEOUT;
      check(status && e.getMessage().startsWith("FLATMEM_STATUS_" + e.status().name().substring(7))
                && e.getMessage().contains("rank " + victim) && seconds < KILL_TIMEOUT_MS / 1000.0 + 3,
            "all_reduce with rank " + victim + " killed: " + e.status() + " after " + seconds + " s: " + e.getMessage());
    }
    try {
      comm.barrier();
      check(false, "barrier on a poisoned communicator: no exception");
    } catch (FlatmemException e) {
      check(e.status() == Status.STATUS_COMM_POISONED, "a later call: " + e.status() + ": " + e.getMessage());
    }
    comm.abort();
    check(!comm.is_open(), "abort() releases the poisoned communicator");
    expectFailure("barrier on an aborted communicator", comm::barrier, FlatmemArgumentException.class, "is closed");
  }

  public static void main(String[] args) throws Exception {
    Communicator comm = join(args);
    try {
      check(comm.rank() == rank && comm.world_size() == world, "bootstrap: rank " + comm.rank() + " of " + comm.world_size());
      messages(comm);
      allReduce(comm);
      // symmetric: b_r = c_r, uneven, one rank with 1 row; B = 5, 7 (prime), 10
      int[] sym = Arrays.copyOf(new int[] {1, 4, 2, 3}, world);
      ringLoss(comm, "ring symmetric", true, sym, sym, 5, 2.5, 11);
      // infonce with global labels: rows and columns differ per rank and from each other
      int[] rows = Arrays.copyOf(new int[] {3, 1, 2, 1}, world), cols = Arrays.copyOf(new int[] {2, 3, 1, 2}, world);
      ringLoss(comm, "ring infonce, global labels", false, rows, cols, 7, 4.0, 23);
      sigmoidRing(comm, "sigmoid ring, global labels", true, rows, cols, 7, 10.0, -10.0, 31);
      // without labels: C >= B, one rank with more rows than columns
      int[] sigmoidCols = Arrays.copyOf(new int[] {4, 1, 3, 2}, world);
      sigmoidRing(comm, "sigmoid ring, s 100", false, rows, sigmoidCols, 5, 100.0, -10.0, 37);
      cyclicSync(comm);
      CyclicStagesCheck.run(comm, rank, world);
      CyclicRelayCheck.run(comm, rank, world);
      if ("1".equals(System.getenv("FLATMEM_TEST_KILL"))) killedPeer(comm);
      else comm.barrier();
    } finally {
      comm.close();
    }
    System.out.println(failures == 0 ? "RankWorker: OK" : "RankWorker: " + failures + " FAILED");
    System.exit(failures == 0 ? 0 : 1);
  }
}
