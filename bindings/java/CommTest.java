// The multi-process test of the Java communicator, ring loss and cyclic
// runtime: first an in-process CommLocalGroup (2 threads: all-reduce, a
// timeout as STATUS_TIMEOUT, poisoning); then starts 2, 3 and 4 RankWorker JVMs joined over UCX on loopback --
// from the environment (FLATMEM_RANK / _WORLD_SIZE / _COORDINATOR on a free
// port) and from a UniqueId that rank 0 prints as hex -- and in the 4-rank run
// kills the last rank (Process.destroyForcibly) once every rank is ready; the
// others must then fail within their timeout naming it. Every child has a hard
// deadline: one still running after it is killed and the test fails. Exits 1
// on any failure. Built and run by scripts/check-java.sh (the children inherit
// this JVM's java, class path and java.library.path).
import flatmem.CommLocalGroup;
import flatmem.Communicator;
import flatmem.FlatmemArgumentException;
import flatmem.FlatmemException;
import flatmem.Status;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

public final class CommTest {
  /** Hard deadline of one run (all its ranks), seconds: a healthy run takes a
   *  few seconds; the killed-peer check waits at most RankWorker.TIMEOUT_MS. */
  static final long RUN_DEADLINE_S = 45;

  private static int failures = 0, passes = 0;

  private static synchronized void report(boolean ok, String what) {
    System.out.println((ok ? "PASS " : "FAIL ") + what);
    if (ok) passes++;
    else failures++;
  }

  /** One child JVM and the lines it printed (echoed with a prefix). */
  static final class Rank {
    final int rank;
    final Process process;
    final List<String> lines = new ArrayList<>();
    final Thread reader;

    Rank(String label, int rank, List<String> args, Map<String, String> env) throws IOException {
      this.rank = rank;
      List<String> command = new ArrayList<>(List.of(
          System.getProperty("java.home") + "/bin/java", "-Xshare:auto", "-XX:TieredStopAtLevel=1",
          "-XX:+UseSerialGC", "-Djava.library.path=" + System.getProperty("java.library.path"),
          "-cp", System.getProperty("java.class.path"), "RankWorker"));
      command.addAll(args);
      ProcessBuilder pb = new ProcessBuilder(command).redirectErrorStream(true);
      Map<String, String> e = pb.environment();
      // UCX on loopback; the JVM keeps its own signal handlers (UCX's are off).
      e.put("UCX_TLS", "tcp,self,posix");
      e.put("UCX_NET_DEVICES", "lo");
      e.put("UCX_WARN_UNUSED_ENV_VARS", "n");
      e.put("UCX_ERROR_SIGNALS", "");
      e.put("UCX_HANDLE_ERRORS", "none");
      e.remove("FLATMEM_TEST_KILL");
      e.putAll(env);
      process = pb.start();
      final String prefix = "  [" + label + " rank " + rank + "] ";
      reader = new Thread(() -> {
        try (BufferedReader in = new BufferedReader(
                 new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
          for (String line; (line = in.readLine()) != null;) {
            System.out.println(prefix + line);
            synchronized (lines) {
              lines.add(line);
              lines.notifyAll();
            }
          }
        } catch (IOException ignored) {
          // the process was killed
        }
      });
      reader.setDaemon(true);
      reader.start();
    }

    /** The first line starting with `start`, waiting until the deadline (System.nanoTime()); null if none. */
    String await(String start, long deadline) throws InterruptedException {
      synchronized (lines) {
        for (;;) {
          for (String l : lines)
            if (l.startsWith(start)) return l;
          long left = deadline - System.nanoTime();
          if (left <= 0 || (!process.isAlive() && !reader.isAlive())) return null;
          lines.wait(Math.max(1, Math.min(200, left / 1000000)));
        }
      }
    }

    int count(String start) {
      synchronized (lines) {
        return (int) lines.stream().filter(l -> l.startsWith(start)).count();
      }
    }
  }

  static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      return s.getLocalPort();
    }
  }

  /** world ranks bootstrapped from the environment or from a UniqueId; with
   *  kill, the last rank is killed once all ranks are ready. */
  static void run(int world, boolean fromEnv, boolean kill) throws Exception {
    final String label = world + " ranks, " + (fromEnv ? "env" : "UniqueId") + (kill ? ", kill" : "");
    final long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(RUN_DEADLINE_S);
    final String coordinator = "127.0.0.1:" + freePort();
    List<Rank> ranks = new ArrayList<>();
    try {
      String hex = null;
      for (int r = 0; r < world; ++r) {
        Map<String, String> env = new java.util.HashMap<>();
        if (kill) env.put("FLATMEM_TEST_KILL", "1");
        List<String> args;
        if (fromEnv) {
          env.put("FLATMEM_COORDINATOR", coordinator);
          env.put("FLATMEM_RANK", Integer.toString(r));
          env.put("FLATMEM_WORLD_SIZE", Integer.toString(world));
          args = List.of("env");
        } else {
          args = List.of("id", Integer.toString(r), Integer.toString(world), r == 0 ? "-" : hex);
        }
        ranks.add(new Rank(label, r, args, env));
        if (!fromEnv && r == 0) {
          String line = ranks.get(0).await("UNIQUE_ID ", deadline);
          if (line == null) {
            report(false, label + ": rank 0 printed no UNIQUE_ID");
            return;
          }
          hex = line.substring("UNIQUE_ID ".length()).trim();
        }
      }
      if (kill) {
        Rank victim = ranks.get(world - 1);
        boolean ready = victim.await("READY_TO_DIE", deadline) != null;
        for (int r = 0; r < world - 1; ++r) ready &= ranks.get(r).await("READY", deadline) != null;
        report(ready, label + ": every rank ready before the kill");
        victim.process.destroyForcibly();
        victim.process.waitFor(10, TimeUnit.SECONDS);
      }
      for (Rank r : ranks) {
        long left = deadline - System.nanoTime();
        boolean finished = r.process.waitFor(Math.max(0, left), TimeUnit.NANOSECONDS);
        if (!finished) {
          r.process.destroyForcibly();
          report(false, label + ": rank " + r.rank + " still running after " + RUN_DEADLINE_S + " s: killed");
          continue;
        }
        r.reader.join(5000);
        boolean killed = kill && r.rank == world - 1;
        int passed = r.count("PASS"), failed = r.count("FAIL");
        if (killed) {
          report(failed == 0 && r.count("READY_TO_DIE") == 1, label + ": rank " + r.rank + " killed as planned ("
                 + passed + " checks passed before)");
        } else {
          report(r.process.exitValue() == 0 && failed == 0 && passed > 0 && r.count("RankWorker: OK") == 1,
                 label + ": rank " + r.rank + " exit " + r.process.exitValue() + ", " + passed + " checks passed, "
                 + failed + " failed");
        }
      }
    } finally {
      for (Rank r : ranks)
        if (r.process.isAlive()) {
          r.process.destroyForcibly();
          report(false, label + ": rank " + r.rank + " left running: killed");
        }
    }
  }

  /** Runs body on its own thread; its exception, if any, is returned by the join. */
  static final class Worker extends Thread {
    private final Runnable body;
    volatile RuntimeException error;

    Worker(Runnable body) {
      this.body = body;
      setDaemon(true);
      start();
    }

    @Override public void run() {
      try {
        body.run();
      } catch (RuntimeException e) {
        error = e;
      }
    }

    RuntimeException finish() throws InterruptedException {
      join(TimeUnit.SECONDS.toMillis(RUN_DEADLINE_S));
      if (isAlive()) throw new IllegalStateException("a CommLocalGroup thread ran past its deadline");
      return error;
    }
  }

  /** In this process: a CommLocalGroup of 2 ranks on 2 threads sums with
   *  all_reduce; a barrier rank 1 never joins fails with STATUS_TIMEOUT
   *  (FlatmemException) after its timeout, naming the operation, and poisons
   *  the group; a rank taken twice is refused. */
  static void localGroup() throws InterruptedException {
    try (CommLocalGroup group = new CommLocalGroup(2);
         Communicator c0 = group.take(0);
         Communicator c1 = group.take(1)) {
      try {
        group.take(1);
        report(false, "CommLocalGroup.take(1) twice: no exception");
      } catch (FlatmemArgumentException e) {
        report(e.status() == Status.STATUS_INVALID_ARGUMENT && e.getMessage().contains("already taken"),
               "CommLocalGroup.take(1) twice: " + e.getMessage());
      }
      double[][] sums = new double[2][];
      Worker w1 = new Worker(() -> sums[1] = c1.all_reduce(new double[] {0.5, -2}));
      sums[0] = c0.all_reduce(new double[] {1.25, 3});
      RuntimeException e1 = w1.finish();
      report(e1 == null && java.util.Arrays.equals(sums[0], new double[] {1.75, 1})
             && java.util.Arrays.equals(sums[1], sums[0]),
             "CommLocalGroup: all_reduce on 2 threads: " + java.util.Arrays.toString(sums[0]) + (e1 == null ? "" : " " + e1));
      long start = System.nanoTime();
      try {
        c0.barrier(300);
        report(false, "barrier without rank 1: no exception");
      } catch (FlatmemException e) {
        double ms = (System.nanoTime() - start) * 1e-6;
        report(e.status() == Status.STATUS_TIMEOUT && e.getMessage().startsWith("FLATMEM_STATUS_TIMEOUT: ")
               && e.getMessage().contains("barrier") && ms >= 300 && ms < 5000,
               "barrier without rank 1: " + e.status() + " after " + Math.round(ms) + " ms: " + e.getMessage());
      }
      try {
        c1.barrier(300);
        report(false, "barrier of rank 1 in the poisoned group: no exception");
      } catch (FlatmemException e) {
        report(e.status() == Status.STATUS_COMM_POISONED || e.status() == Status.STATUS_PEER_FAILURE,
               "rank 1 of the poisoned group: " + e.status() + ": " + e.getMessage());
      }
      c0.abort();
      c1.abort();
    }
  }

  public static void main(String[] args) throws Exception {
    localGroup();
    run(2, true, false);
    run(3, false, false);
    run(4, true, true);
    System.out.println(failures == 0 ? "CommTest: OK (" + passes + " runs/ranks passed)"
                                     : "CommTest: " + failures + " FAILED");
    System.exit(failures == 0 ? 0 : 1);
  }
}
