// ring_bench: the ring contrastive loss (symmetric, forward + backward) on 1, 2
// and 4 processes of this machine at the SAME global batch, side by side:
// time per step and its ratio to the 1-process run, bytes each rank sends,
// how much of the transfer time the compute hid, and each process's peak
// memory. Ranks are fork()ed children joined by a UCX communicator on
// loopback (UCX_TLS=tcp,self,posix unless set); the parent never touches UCX.
//
// Hidden transfer: each rank records the time it was blocked in waits for
// ring messages (flatmem_contrastive_ring_stats_get), then sends the same
// payload alone as ring shifts (no compute): transfer = that time, blocked =
// the time it waited, hidden = 1 - blocked / transfer (shown as 0 when the
// waits exceed the transfer time). This is a LOWER bound on what overlap
// hides: blocked time also counts waiting for a slower neighbour (ranks
// drift by a few ms per step) and the two transfers no compute can cover
// (the last column states and the last partial dk, sent after the last
// step). Peak memory: VmHWM - VmRSS of each rank process from just before
// its first ring call (handle buffers included; inputs excluded).
//
//   ring_bench [--batch B] [--d D] [--ranks 1,2,4] [--dtypes fp32,bf16] [--steps S] [--quick]
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "ring_rank.hpp"

namespace {

struct Options {
  std::int64_t batch = 4096, d = 512;
  std::vector<int> ranks{1, 2, 4};
  std::vector<std::string> dtypes{"fp32", "bf16"};
  int steps = 3;
};

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--batch") o.batch = std::atoll(value().c_str());
    else if (a == "--d") o.d = std::atoll(value().c_str());
    else if (a == "--steps") o.steps = std::atoi(value().c_str());
    else if (a == "--dtypes") o.dtypes = bench::split(value());
    else if (a == "--ranks") {
      o.ranks.clear();
      for (const auto &r : bench::split(value())) o.ranks.push_back(std::atoi(r.c_str()));
    } else if (a == "--quick") o.batch = 240, o.d = 32, o.steps = 1, o.ranks = {1, 2}, o.dtypes = {"fp32"};
    else {
      std::fprintf(stderr, "usage: ring_bench [--batch B] [--d D] [--ranks 1,2,4] [--dtypes fp32,bf16] "
                           "[--steps S] [--quick]\n");
      std::exit(2);
    }
  }
  return o;
}

// Forks rank `r`; its report comes back through the pipe `fd` (write end).
pid_t spawn(const ring_bench::RankConfig &config, int fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const ring_bench::RankReport report = ring_bench::run_rank(config);
  const ssize_t written = write(fd, &report, sizeof report);
  _exit(written == ssize_t(sizeof report) ? 0 : 1);
}

// Runs `world` ranks. Rank 0 makes the unique id in its own process (the
// listener must live where flatmem_comm_create of rank 0 runs) and hands it to
// the parent, which forks the other ranks with it.
std::vector<ring_bench::RankReport> run_world(const Options &o, int world, bool bf16) {
  ring_bench::RankConfig base;
  base.world = world;
  base.threads = std::max(1, bench::hardware_threads() / world);
  base.steps = o.steps;
  base.batch = o.batch / world * world;
  base.d = o.d;
  base.bf16 = bf16;
  int id_pipe[2];
  if (pipe(id_pipe) != 0) std::exit(1);
  std::vector<int> fds;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (pipe(p) != 0) std::exit(1);
    ring_bench::RankConfig c = base;
    c.rank = r;
    if (r == 0) {
      const pid_t pid = fork();
      if (pid == 0) {  // rank 0: make the id, send it to the parent, run
        flatmem_comm_unique_id id{};
        if (flatmem_comm_unique_id_create("127.0.0.1:0", &id) != FLATMEM_STATUS_SUCCESS) _exit(3);
        if (write(id_pipe[1], &id, sizeof id) != ssize_t(sizeof id)) _exit(3);
        c.id = id;
        const ring_bench::RankReport report = ring_bench::run_rank(c);
        _exit(write(p[1], &report, sizeof report) == ssize_t(sizeof report) ? 0 : 1);
      }
      pids.push_back(pid);
      if (read(id_pipe[0], &base.id, sizeof base.id) != ssize_t(sizeof base.id)) std::exit(1);
    } else {
      c.id = base.id;
      pids.push_back(spawn(c, p[1]));
    }
    close(p[1]);
    fds.push_back(p[0]);
  }
  std::vector<ring_bench::RankReport> reports(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    if (read(fds[std::size_t(r)], &reports[std::size_t(r)], sizeof reports[0]) != ssize_t(sizeof reports[0]))
      std::snprintf(reports[std::size_t(r)].error, sizeof reports[0].error, "rank %d died", r);
    close(fds[std::size_t(r)]);
    waitpid(pids[std::size_t(r)], nullptr, 0);
  }
  close(id_pipe[0]);
  close(id_pipe[1]);
  return reports;
}

}  // namespace

int main(int argc, char **argv) {
  const Options o = parse(argc, argv);
  setenv("UCX_TLS", "tcp,self,posix", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  std::printf("ring_bench: symmetric loss, global batch B = %lld, d = %lld, %d timed steps; %s, %d threads "
              "in all (per rank: threads / ranks, at least 1)\n",
              (long long)o.batch, (long long)o.d, o.steps, bench::cpu_model_name().c_str(), bench::hardware_threads());
  std::printf("%-5s %5s %10s %8s %9s %9s %12s %12s %11s %8s %12s %10s\n", "dtype", "ranks", "step ms", "vs 1",
              "fwd ms", "bwd ms", "MiB sent/rk", "transfer ms", "blocked ms", "hidden", "peak MiB/rk", "loss");
  int status = 0;
  for (const std::string &dtype : o.dtypes) {
    double one_rank = NAN;
    for (int world : o.ranks) {
      const auto reports = run_world(o, world, dtype == "bf16");
      ring_bench::RankReport worst{};  // slowest rank's step; means of the others
      double transfer = 0, waited = 0, sent = 0, peak = 0;
      for (const auto &r : reports) {
        if (!r.ok) {
          std::printf("%-5s %5d  failed: %s\n", dtype.c_str(), world, r.error);
          status = 1;
          continue;
        }
        if (r.step_seconds > worst.step_seconds) worst = r;
        transfer += r.transfer_seconds / world, waited += r.wait_seconds / world;
        sent = std::max(sent, r.bytes_sent), peak = std::max(peak, r.peak_bytes);
      }
      if (!worst.ok) continue;
      if (world == 1) one_rank = worst.step_seconds;
      const double hidden = transfer > 0 ? std::max(0.0, 1.0 - waited / transfer) : NAN;
      std::printf("%-5s %5d %10.1f %8.2f %9.1f %9.1f %12.2f %12.2f %11.2f %7.0f%% %12.1f %10.6f\n", dtype.c_str(),
                  world, 1e3 * worst.step_seconds, worst.step_seconds / one_rank, 1e3 * worst.forward_seconds,
                  1e3 * worst.backward_seconds, sent / 1048576.0, 1e3 * transfer, 1e3 * waited, 100 * hidden,
                  peak / 1048576.0, double(worst.loss));
    }
  }
  return status;
}
