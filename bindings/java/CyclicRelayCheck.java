// RankWorker's check of the ZeRO relay (Cyclic with CYCLIC_PARAMETERS_RELAYED: one
// stage of ELEMENTS parameters under DELAY1, rank r holding shard r): a kDLCUDA
// Tensor refused by set_shard and by parameters on a host handle, plain and with a
// stream, naming options.memory; then a run of STEPS steps in which every full stage
// the relay delivers is the version computed here (version 0, then each update's
// -LR times the average of gradients that do not depend on the parameters), bitwise,
// and the own shard range of every average is ((g_0 + g_1) + ...) * (1/N) computed here. Odd ranks register
// their shard with set_shard(stage, shard, stream) and odd steps take the full stage
// with parameters(full, stream): the stream overloads (ignored for CPU Tensors).
import flatmem.Communicator;
import flatmem.Cyclic;
import flatmem.CyclicAction;
import flatmem.CyclicActionKind;
import flatmem.CyclicMemory;
import flatmem.CyclicRule;
import flatmem.Flatmem;
import flatmem.NonfinitePolicy;
import flatmem.Tensor;
import flatmem.cyclic_parameter_mode;
import java.util.Arrays;

final class CyclicRelayCheck {
  static final int ELEMENTS = 8;  // every rank of 2, 3 or 4 owns a non-empty shard
  static final long STEPS = 3, STREAM = 0x5000L;
  static final double LR = 0.25;

  /** Rank `rank`'s gradient of step `step` (the same whatever the parameters). */
  static double[] gradient(int rank, long step) {
    double[] g = new double[ELEMENTS];
    for (int e = 0; e < ELEMENTS; ++e) g[e] = rank + 0.25 * e + step - 0.5 * (e % 3);
    return g;
  }

  /** The average of step `step`: ((g_0 + g_1) + ...) in rank order, then times 1/N (cyclic.h). */
  static double[] average(int world, long step) {
    double[] sum = gradient(0, step);
    for (int r = 1; r < world; ++r) {
      double[] g = gradient(r, step);
      for (int e = 0; e < ELEMENTS; ++e) sum[e] += g[e];
    }
    for (int e = 0; e < ELEMENTS; ++e) sum[e] *= 1.0 / world;
    return sum;
  }

  /** versions[v]: the full stage after v updates (the owners apply them elementwise, as here). */
  static double[][] versions(int world) {
    double[][] v = new double[(int) STEPS + 1][ELEMENTS];
    for (int e = 0; e < ELEMENTS; ++e) v[0][e] = 0.5 - 0.125 * e;
    for (int s = 0; s < STEPS; ++s) {
      double[] mean = average(world, s);
      for (int e = 0; e < ELEMENTS; ++e) v[s + 1][e] = v[s][e] - LR * mean[e];
    }
    return v;
  }

  static void run(Communicator comm, int rank, int world) {
    double[][] versions = versions(world);
    try (Tensor counts = Tensor.of(new long[] {ELEMENTS});
         Cyclic h = new Cyclic(comm, 1, STEPS, CyclicRule.CYCLIC_DELAY1.swigValue(), null, 0,
                               NonfinitePolicy.NONFINITE_ERROR.swigValue(), 0,
                               cyclic_parameter_mode.CYCLIC_PARAMETERS_RELAYED.swigValue(), counts,
                               CyclicMemory.CYCLIC_MEMORY_HOST.swigValue())) {
      final int begin = (int) h.shard_begin(0, rank), end = (int) h.shard_end(0, rank);
      try (Tensor shard = Tensor.of(Arrays.copyOfRange(versions[0], begin, end));
           Tensor shardOnDevice = Tensor.of(new double[end - begin]); Tensor full = Tensor.of(new double[ELEMENTS]);
           Tensor fullOnDevice = Tensor.of(new double[ELEMENTS]);
           Tensor g0 = Tensor.of(new double[ELEMENTS]); Tensor g1 = Tensor.of(new double[ELEMENTS])) {
        shardOnDevice.set_device(Flatmem.kDLCUDA, 0);
        fullOnDevice.set_device(Flatmem.kDLCUDA, 0);
        RankWorker.refusedOnHost("Cyclic.set_shard", () -> h.set_shard(0, shardOnDevice),
                                 () -> h.set_shard(0, shardOnDevice, STREAM));
        if (rank % 2 == 1) h.set_shard(0, shard, STREAM); else h.set_shard(0, shard);
        train(h, rank, world, versions, begin, end, shard, full, fullOnDevice, new Tensor[] {g0, g1});
      }
    }
  }

  static void train(Cyclic h, int rank, int world, double[][] versions, int begin, int end, Tensor shard, Tensor full,
                    Tensor fullOnDevice, Tensor[] gradients) {
    int mismatches = 0, served = 0, updates = 0;
    for (;;) {
      CyclicAction a = h.next();
      if (a.getKind() == CyclicActionKind.CYCLIC_DONE) break;
      if (a.getUpdate_stage() >= 0) {  // the own shard range of update_step's gradient holds the average
        double[] mean = gradients[(int) (a.getUpdate_step() % 2)].toDoubleArray(), w = shard.toDoubleArray();
        mismatches += Arrays.equals(Arrays.copyOfRange(mean, begin, end),
                                    Arrays.copyOfRange(average(world, a.getUpdate_step()), begin, end)) ? 0 : 1;
        for (int e = begin; e < end; ++e) w[e - begin] -= LR * mean[e];
        shard.copyFrom(w);  // in place: the registered buffer
        updates++;
      }
      if (a.getKind() != CyclicActionKind.CYCLIC_FORWARD && a.getKind() != CyclicActionKind.CYCLIC_BACKWARD) continue;
      final long s = a.getStep();
      if (served == 0)
        RankWorker.refusedOnHost("Cyclic.parameters", () -> h.parameters(fullOnDevice),
                                 () -> h.parameters(fullOnDevice, STREAM));
      if (s % 2 == 1) h.parameters(full, STREAM); else h.parameters(full);
      mismatches += Arrays.equals(full.toDoubleArray(), versions[(int) Math.max(0, s - 1)]) ? 0 : 1;
      served++;
      if (a.getKind() == CyclicActionKind.CYCLIC_BACKWARD) {
        Tensor g = gradients[(int) (s % 2)];
        g.copyFrom(gradient(rank, s));
        h.reduce(0, g);
      }
    }
    RankWorker.check(mismatches == 0 && served == 2 * STEPS && updates == STEPS,
                     "Cyclic relayed DELAY1 rank " + rank + " of " + world + ": " + served + " full stages, " + updates
                         + " updates, each full stage and average as computed here (" + mismatches + " mismatches)");
  }
}
