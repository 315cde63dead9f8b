// cyclic_bench: cyclic data parallelism against synchronous data parallelism,
// measured in one run. N fork()ed ranks on this machine (UCX over loopback /
// shared memory) train the same L-stage MLP (tests/support/stage_mlp) under
// SYNC (the baseline: no stagger, ring all-reduce at the end of each step),
// DELAY1 and NEWEST, and the bench prints side by side:
//
//   - summed activation memory of all ranks: from the schedule and the
//     declared bytes per stage (peak and mean over the training time steps),
//     and as measured in wall-clock time (each rank holds its time step's
//     activations from the end of its previous action to the end of this one;
//     the intervals of all ranks are swept for the peak and the time-weighted
//     mean);
//   - gradient bytes sent per time step, summed over ranks: max / mean over
//     the steady window (every rank started, none finished), as the protocol
//     assigns them to time steps (bytes_scheduled) and as posted by the
//     runtime's threads (bytes_sent: adds the jitter of the machine); SYNC
//     sends everything at the end of a step;
//   - steady-state step time per rank (median over ranks of the time from the
//     end of step 1 to the end of step S-1, per step), and its ratio to SYNC.
//
//   cyclic_bench [--quick] [--worlds 2,4,8] [--stages 4] [--steps 16]
//                [--rows 128] [--width 256] [--csv FILE] [--timeline FILE]
//
// --timeline writes, per configuration and global time step, the summed
// activation bytes and bytes sent (bench/plot_cyclic.py draws them).
#include <flatmem/flatmem.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "support/cyclic_train.hpp"
#include "support/ranks.hpp"

namespace {

struct Options {
  std::vector<int> worlds{2, 4, 8};
  int stages = 4, rows = 128, width = 256;
  std::int64_t steps = 16;
  std::string csv, timeline;
  bool quick = false;
};

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--quick") {
      o.quick = true;
      o.worlds = {2};
      o.steps = 4;
      o.rows = 8;
      o.width = 16;
    } else if (a == "--worlds") {
      o.worlds.clear();
      for (const std::string &w : bench::split(value())) o.worlds.push_back(std::atoi(w.c_str()));
    } else if (a == "--stages") o.stages = std::atoi(value().c_str());
    else if (a == "--steps") o.steps = std::atoll(value().c_str());
    else if (a == "--rows") o.rows = std::atoi(value().c_str());
    else if (a == "--width") o.width = std::atoi(value().c_str());
    else if (a == "--csv") o.csv = value();
    else if (a == "--timeline") o.timeline = value();
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); std::exit(2); }
  }
  return o;
}

// What rank 0 sends back to the parent: the figures and the timeline.
struct Figures {
  double peak_schedule = 0, mean_schedule = 0;  // summed activation bytes
  double peak_wall = 0, mean_wall = 0;          // the same in wall-clock time
  double max_bytes = 0, mean_bytes = 0;         // bytes scheduled per time step, summed over ranks (steady window)
  double max_posted = 0, mean_posted = 0;       // the same, as posted
  double step_seconds = 0;                      // steady state, median over ranks
  double wait_seconds = 0;                      // in flatmem_cyclic_next, per step, mean over ranks
  std::int64_t time_steps = 0;
  char error[512] = {};
};
constexpr int max_timeline = 4096;
struct Timeline {
  std::int64_t length = 0;
  double activation[max_timeline] = {}, bytes[max_timeline] = {}, posted[max_timeline] = {};
};

const char *rule_name(flatmem_cyclic_rule r) {
  return r == FLATMEM_CYCLIC_SYNC ? "sync" : r == FLATMEM_CYCLIC_DELAY1 ? "delay1" : "newest";
}

// One rank: train, then gather (held bytes, bytes sent, end time) of every
// time step at rank 0, which works out the figures and writes them to `fd`.
std::string run_rank(const test::RankSetup &s, const test::TrainSetup &setup, int fd) {
  flatmem_comm_t *comm = nullptr;
  if (test::create_comm(s, &comm, 120000) != FLATMEM_STATUS_SUCCESS) return flatmem_last_error();
  test::CyclicOptions o = test::cyclic_options(setup, sizeof(float));
  flatmem_cyclic_t *h = nullptr;
  if (flatmem_cyclic_create(&h, comm, &o.options) != FLATMEM_STATUS_SUCCESS) return flatmem_last_error();
  std::vector<double> ends;        // wall time at the end of each time step's action
  std::vector<double> step_ends;   // ... of each step's last backward
  test::RankRun<float> run{test::StageMlp<float>::make(setup.widths, setup.seed), {}};
  const std::string error = test::train_rank<float>(h, setup, s.rank, s.world, run,
                                                    [&](const flatmem_cyclic_action &a) {
    ends.push_back(bench::now_seconds());
    if (a.kind == FLATMEM_CYCLIC_BACKWARD && a.stage == 0) step_ends.push_back(ends.back());
  });
  if (!error.empty()) return error;
  flatmem_cyclic_summary summary{};
  flatmem_cyclic_summary_get(h, &summary, sizeof(flatmem_cyclic_summary));
  const std::int64_t T = summary.time_steps;
  std::vector<flatmem_cyclic_time_step_stats> stats(static_cast<std::size_t>(T));
  std::int64_t written = 0;
  flatmem_cyclic_stats(h, 0, T, stats.data(), sizeof(flatmem_cyclic_time_step_stats), &written);
  flatmem_cyclic_destroy(h);
  if (written != T || std::int64_t(ends.size()) != T) return "stats incomplete";

  // Per time step: held bytes, bytes scheduled, bytes posted, end time; then per rank: step time, wait.
  constexpr std::size_t F = 4;
  const std::size_t W = std::size_t(s.world), per = std::size_t(T) * F + 2;
  std::vector<double> all(W * per, 0.0);
  double *mine = all.data() + std::size_t(s.rank) * per;
  for (std::int64_t t = 0; t < T; ++t) {
    mine[F * t] = double(stats[std::size_t(t)].activation_bytes);
    mine[F * t + 1] = double(stats[std::size_t(t)].bytes_scheduled);
    mine[F * t + 2] = double(stats[std::size_t(t)].bytes_sent);
    mine[F * t + 3] = ends[std::size_t(t)];
  }
  const std::size_t S = step_ends.size();
  mine[F * T] = S >= 3 ? (step_ends[S - 1] - step_ends[1]) / double(S - 2) : 0.0;
  mine[F * T + 1] = summary.wait_seconds / double(setup.steps);
  std::int64_t shape = std::int64_t(all.size());
  DLTensor tensor{};
  tensor.data = all.data();
  tensor.device = {kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = {kDLFloat, 64, 1};
  tensor.shape = &shape;
  if (flatmem_comm_all_reduce(comm, &tensor, &tensor, 0, nullptr) != FLATMEM_STATUS_SUCCESS)
    return flatmem_last_error();
  flatmem_comm_destroy(comm);
  if (s.rank != 0) return "";

  Figures f;
  Timeline line;
  f.time_steps = T;
  line.length = std::min<std::int64_t>(T, max_timeline);
  // Schedule time: the training window ends with the last rank's last backward.
  flatmem_cyclic_schedule sched = FLATMEM_CYCLIC_SCHEDULE_INIT;
  sched.world_size = s.world;
  sched.stages = setup.stages();
  sched.steps = setup.steps;
  sched.rule = setup.rule;
  std::int64_t last_offset = 0;
  flatmem_cyclic_schedule_offset(&sched, s.world - 1, &last_offset);
  const std::int64_t window = last_offset + setup.steps * 2 * setup.stages();
  // Steady window for traffic: from the last rank's first backward to rank 0's
  // last backward (SYNC: the whole training).
  const std::int64_t from = last_offset + setup.stages(), to = setup.steps * 2 * setup.stages();
  const auto at = [&](std::size_t r, std::int64_t t, std::size_t field) {
    return all[r * per + std::size_t(F * std::size_t(t)) + field];
  };
  for (std::int64_t t = 0; t < T; ++t) {
    double held = 0, bytes = 0, posted = 0;
    for (std::size_t r = 0; r < W; ++r) held += at(r, t, 0), bytes += at(r, t, 1), posted += at(r, t, 2);
    if (t < line.length) line.activation[t] = held, line.bytes[t] = bytes, line.posted[t] = posted;
    f.peak_schedule = std::max(f.peak_schedule, held);
    if (t < window) f.mean_schedule += held / double(window);
    if (t >= from && t < to) {
      f.max_bytes = std::max(f.max_bytes, bytes);
      f.max_posted = std::max(f.max_posted, posted);
      f.mean_bytes += bytes / double(to - from);
      f.mean_posted += posted / double(to - from);
    }
  }
  // Wall clock: rank r holds held[t] from end[t-1] to end[t]; sweep the events.
  std::vector<std::pair<double, double>> events;
  double first = 1e300, last = 0;
  for (std::size_t r = 0; r < W; ++r)
    for (std::int64_t t = 1; t < T; ++t) {
      const double held = at(r, t, 0), a = at(r, t - 1, 3), b = at(r, t, 3);
      first = std::min(first, a);
      last = std::max(last, b);
      if (held > 0) events.push_back({a, held}), events.push_back({b, -held});
    }
  std::sort(events.begin(), events.end(), [](auto x, auto y) {
    return x.first < y.first || (x.first == y.first && x.second < y.second);  // frees first
  });
  double level = 0, area = 0, previous = first;
  for (const auto &[when, change] : events) {
    area += level * (when - previous);
    previous = when;
    level += change;
    f.peak_wall = std::max(f.peak_wall, level);
  }
  f.mean_wall = last > first ? area / (last - first) : 0;
  std::vector<double> steps, waits;
  for (std::size_t r = 0; r < W; ++r) {
    steps.push_back(all[r * per + F * std::size_t(T)]);
    waits.push_back(all[r * per + F * std::size_t(T) + 1]);
  }
  std::sort(steps.begin(), steps.end());
  f.step_seconds = steps[steps.size() / 2];
  for (double w : waits) f.wait_seconds += w / double(W);
  if (write(fd, &f, sizeof f) != ssize_t(sizeof f)) return "write figures";
  if (write(fd, &line, sizeof line) != ssize_t(sizeof line)) return "write timeline";
  return "";
}

// Runs one configuration; reads rank 0's figures from a temporary file (the
// timeline is larger than a pipe's buffer).
bool run_config(const test::TrainSetup &setup, int world, Figures &f, Timeline &line) {
  char path[] = "/tmp/flatmem-cyclic-bench-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return false;
  const auto outcomes = test::run_ranks(world, [&](const test::RankSetup &s) {
    return run_rank(s, setup, fd);
  }, std::chrono::seconds(600), "tcp,self,posix");
  const std::string failed = test::failures(outcomes);
  bool ok = failed.empty();
  if (!ok) std::fprintf(stderr, "world %d, %s: %s\n", world, rule_name(setup.rule), failed.c_str());
  if (ok && (pread(fd, &f, sizeof f, 0) != ssize_t(sizeof f) ||
             pread(fd, &line, sizeof line, sizeof f) != ssize_t(sizeof line)))
    ok = false;
  close(fd);
  unlink(path);
  return ok;
}

}  // namespace

int main(int argc, char **argv) {
  const Options o = parse(argc, argv);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  test::TrainSetup base;
  base.widths.assign(std::size_t(o.stages) + 1, o.width);
  base.rows = o.rows;
  base.steps = o.steps;
  base.lr = 0.05;
  const double mib = 1024.0 * 1024.0;
  std::printf("cyclic_bench: L = %d stages of %d -> %d (MLP, fp32), micro-batch %d rows per rank, %lld steps;\n"
              "ranks are processes on this machine (%d hardware threads), UCX over shared memory.\n"
              "activation: summed over ranks (schedule | wall clock), MiB; bytes: sent per time step, summed over ranks\n\n",
              o.stages, o.width, o.width, o.rows, (long long)o.steps, bench::hardware_threads());
  std::printf("%5s %-7s %10s %10s %8s | %10s %10s | %9s %9s %8s %8s | %8s %7s %8s\n", "ranks", "rule",
              "peak act", "mean act", "vs sync", "peak wall", "mean wall", "max KiB", "mean KiB",
              "max/mean", "(posted)", "step ms", "vs sync", "wait ms");
  FILE *csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  FILE *timeline = o.timeline.empty() ? nullptr : std::fopen(o.timeline.c_str(), "w");
  if (csv) std::fprintf(csv, "ranks,rule,peak_schedule_bytes,mean_schedule_bytes,peak_wall_bytes,mean_wall_bytes,max_bytes_per_time_step,mean_bytes_per_time_step,max_posted_per_time_step,mean_posted_per_time_step,step_seconds,wait_seconds_per_step\n");
  if (timeline) std::fprintf(timeline, "ranks,rule,time_step,activation_bytes,bytes_scheduled,bytes_posted\n");
  int failures = 0;
  for (int world : o.worlds) {
    Figures sync{};
    for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_SYNC, FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST}) {
      if (o.quick && rule == FLATMEM_CYCLIC_NEWEST) continue;
      test::TrainSetup setup = base;
      setup.rule = rule;
      Figures f{};
      static Timeline line;
      if (!run_config(setup, world, f, line)) {
        ++failures;
        continue;
      }
      if (rule == FLATMEM_CYCLIC_SYNC) sync = f;
      const double ratio_peak = sync.peak_schedule > 0 ? f.peak_schedule / sync.peak_schedule : 0;
      const double ratio_step = f.step_seconds > 0 ? sync.step_seconds / f.step_seconds : 0;
      std::printf("%5d %-7s %10.2f %10.2f %7.3fx | %10.2f %10.2f | %9.0f %9.0f %8.2f %8.2f | %8.1f %6.2fx %8.1f\n",
                  world, rule_name(rule), f.peak_schedule / mib, f.mean_schedule / mib, ratio_peak,
                  f.peak_wall / mib, f.mean_wall / mib, f.max_bytes / 1024, f.mean_bytes / 1024,
                  f.mean_bytes > 0 ? f.max_bytes / f.mean_bytes : 0.0,
                  f.mean_posted > 0 ? f.max_posted / f.mean_posted : 0.0, f.step_seconds * 1e3,
                  ratio_step, f.wait_seconds * 1e3);
      std::fflush(stdout);
      if (csv)
        std::fprintf(csv, "%d,%s,%.0f,%.0f,%.0f,%.0f,%.0f,%.1f,%.0f,%.1f,%.6f,%.6f\n", world, rule_name(rule),
                     f.peak_schedule, f.mean_schedule, f.peak_wall, f.mean_wall, f.max_bytes,
                     f.mean_bytes, f.max_posted, f.mean_posted, f.step_seconds, f.wait_seconds);
      if (timeline)
        for (std::int64_t t = 0; t < line.length; ++t)
          std::fprintf(timeline, "%d,%s,%lld,%.0f,%.0f,%.0f\n", world, rule_name(rule), (long long)t,
                       line.activation[t], line.bytes[t], line.posted[t]);
    }
  }
  if (csv) std::fclose(csv);
  if (timeline) std::fclose(timeline);
  std::printf("\nact: summed activation by the schedule (peak / mean over training), MiB; wall: the same in wall-clock time.\n"
              "KiB: gradient bytes per time step summed over ranks, steady window, as the protocol assigns them;\n"
              "(posted): max/mean of the same bytes by when the threads posted them. vs sync: peak activation\n"
              "relative to SYNC's; step time as SYNC's / this (> 1 = faster).\n");
  return failures == 0 ? 0 : 1;
}
