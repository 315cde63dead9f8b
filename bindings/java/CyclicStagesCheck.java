// RankWorker's check of the stage-parallel runtime (CyclicStages, one stage per
// rank): the CUDA-memory refusal without init_device, a kDLCUDA Tensor refused
// by each of send / receive / accumulate / average on a host handle (plain and
// with a stream), and a DELAY1 run of N = 2 micro-batches over 2 steps whose
// boundary tensors and averages equal the values computed here, bitwise; odd
// (micro-batch + step) go through the stream overloads (ignored for CPU Tensors).
import flatmem.Communicator;
import flatmem.CyclicActionKind;
import flatmem.CyclicMemory;
import flatmem.CyclicRule;
import flatmem.CyclicStages;
import flatmem.CyclicStagesAction;
import flatmem.Flatmem;
import flatmem.Tensor;
import java.util.Arrays;

final class CyclicStagesCheck {
  static final int N = 2, WIDTH = 3, GRADIENT = 2;
  static final long STEPS = 2, STREAM = 0x5000L;

  /** What stage j sends forward (the activation) for micro-batch m of step s. */
  static double[] activation(int j, int m, long s) {
    double[] v = new double[WIDTH];
    for (int e = 0; e < WIDTH; ++e) v[e] = 1000 * j + 10 * m + s + 0.25 * e;
    return v;
  }

  /** What stage j sends backward (the activation's gradient). */
  static double[] backGradient(int j, int m, long s) {
    double[] v = activation(j, m, s);
    for (int e = 0; e < WIDTH; ++e) v[e] = -v[e] - 0.5;
    return v;
  }

  /** Stage j's gradient for (m, s); the average of step s is (g(m 0) + g(m 1)) * 0.5. */
  static double[] gradient(int j, int m, long s) {
    return new double[] {j + 0.25 * m + s, -0.5 * m + s};
  }

  static void refused(String call, Runnable plain, Runnable withStream) {
    RankWorker.refusedOnHost("CyclicStages." + call, plain, withStream);
  }

  static void run(Communicator comm, int rank, int world) {
    long[] bounds = new long[world - 1];
    Arrays.fill(bounds, WIDTH * 8);
    try (Tensor boundaryBytes = world > 1 ? Tensor.of(bounds) : null) {
      RankWorker.expectFailure("CyclicStages CYCLIC_MEMORY_CUDA without init_device",
                               () -> new CyclicStages(comm, world, N, STEPS, CyclicRule.CYCLIC_DELAY1, boundaryBytes, 0,
                                                      CyclicMemory.CYCLIC_MEMORY_CUDA),
                               RuntimeException.class, "options.memory: CUDA");
      try (CyclicStages h = new CyclicStages(comm, world, N, STEPS, CyclicRule.CYCLIC_DELAY1, boundaryBytes, 0,
                                             CyclicMemory.CYCLIC_MEMORY_HOST);
           Tensor boundary = Tensor.of(new double[WIDTH]); Tensor g = Tensor.of(new double[GRADIENT]);
           Tensor onDevice = Tensor.of(new double[WIDTH]); Tensor gradientOnDevice = Tensor.of(new double[GRADIENT])) {
        onDevice.set_device(Flatmem.kDLCUDA, 0);
        gradientOnDevice.set_device(Flatmem.kDLCUDA, 0);
        train(h, rank, world, boundary, g, onDevice, gradientOnDevice);
      }
    }
  }

  static void train(CyclicStages h, int j, int world, Tensor boundary, Tensor g, Tensor onDevice,
                    Tensor gradientOnDevice) {
    int mismatches = 0, averages = 0, calls = 0;
    boolean[] triedOnDevice = new boolean[4];
    for (;;) {
      CyclicStagesAction a = h.next();
      if (a.getKind() == CyclicActionKind.CYCLIC_DONE) break;
      if (a.getUpdate_step() >= 0) {
        long v = a.getUpdate_step();
        if (!triedOnDevice[0]) {
          triedOnDevice[0] = true;
          refused("average", () -> h.average(gradientOnDevice), () -> h.average(gradientOnDevice, STREAM));
        }
        if (v % 2 == 1) h.average(g, STREAM); else h.average(g);
        double[] want = gradient(j, 0, v);
        for (int e = 0; e < GRADIENT; ++e) want[e] = (want[e] + gradient(j, 1, v)[e]) * 0.5;
        mismatches += Arrays.equals(g.toDoubleArray(), want) ? 0 : 1;
        averages++;
      }
      if (a.getKind() != CyclicActionKind.CYCLIC_FORWARD && a.getKind() != CyclicActionKind.CYCLIC_BACKWARD) continue;
      final int m = a.getMicro_batch();
      final long s = a.getStep();
      final boolean forward = a.getKind() == CyclicActionKind.CYCLIC_FORWARD, stream = (m + s) % 2 == 1;
      if (a.getReceives() == 1) {
        if (!triedOnDevice[1]) {
          triedOnDevice[1] = true;
          refused("receive", () -> h.receive(onDevice), () -> h.receive(onDevice, STREAM));
        }
        if (stream) h.receive(boundary, STREAM); else h.receive(boundary);
        double[] want = forward ? activation(j - 1, m, s) : backGradient(j + 1, m, s);
        mismatches += Arrays.equals(boundary.toDoubleArray(), want) ? 0 : 1;
        calls++;
      }
      if (a.getAccumulates() == 1) {
        if (!triedOnDevice[2]) {
          triedOnDevice[2] = true;
          refused("accumulate", () -> h.accumulate(gradientOnDevice), () -> h.accumulate(gradientOnDevice, STREAM));
        }
        g.copyFrom(gradient(j, m, s));
        if (stream) h.accumulate(g, STREAM); else h.accumulate(g);
        calls++;
      }
      if (a.getSends() == 1) {
        if (!triedOnDevice[3]) {
          triedOnDevice[3] = true;
          refused("send", () -> h.send(onDevice), () -> h.send(onDevice, STREAM));
        }
        boundary.copyFrom(forward ? activation(j, m, s) : backGradient(j, m, s));
        if (stream) h.send(boundary, STREAM); else h.send(boundary);
        calls++;
      }
    }
    // Per step and micro-batch: one accumulate, a receive unless at the edge, a send unless at the edge.
    int edges = (j > 0 ? 1 : 0) + (j < world - 1 ? 1 : 0);
    RankWorker.check(mismatches == 0 && averages == STEPS && calls == N * STEPS * (1 + 2 * edges),
                     "CyclicStages DELAY1 stage " + j + ": " + calls + " calls, " + averages + " averages, every "
                         + "boundary tensor and average as computed here (" + mismatches + " mismatches)");
  }
}
