// cyclic_modes_bench: the four layouts of issue 18 side by side in one run,
// for L stages (default 4) and N micro-batches per training step (default 4
// and 8), on the same MLP (tests/support/stage_mlp) and the same data:
//
//   dp x mp (naive)   N pipelines of L stage ranks (N L ranks), every
//                     micro-batch synchronous, a DP all-reduce per stage over
//                     the N ranks of that stage. COMPUTED from its schedule
//                     (each rank busy 2 of 2L time steps), not run: N L = 32
//                     processes on a 2-core machine would measure the
//                     machine's scheduler, not the layout. Its throughput is
//                     the single-process time of one micro-batch's forward
//                     and backward through all stages (measured here, one
//                     core, no communication: the best case for it).
//   stage-parallel    flatmem_cyclic_stages_t on L fork()ed ranks, DELAY1
//                     (and SYNC: the synchronous pipeline with its drain
//                     bubble, the picture's second panel). MEASURED.
//   dp cyclic         flatmem_cyclic_t DELAY1 on N fork()ed ranks. MEASURED.
//   zero relay        flatmem_cyclic_t DELAY1 with RELAYED parameters on N
//                     fork()ed ranks, MEASURED.
//
// Columns (steady window, P = the period: stage-parallel and naive time steps
// [P, P (S-1)) -- every micro-batch's steps 1 .. S-2 and nothing of step 0 or
// S-1; DP cyclic and ZeRO relay [offset(N-1) + P, P (S-1)) -- every rank past
// its first step, rank 0 before its last, as the relay's own tests take it):
//   ranks; peak activation bytes per rank and summed over ranks, from the
//   declared bytes per stage and the schedule (each rank's time-step stats),
//   and the summed peak in wall-clock time (each rank holds its time step's
//   activations from the end of its previous time step to the end of this
//   one; the intervals of all ranks swept); parameter bytes per rank (the
//   whole model when replicated, one stage times the versions it keeps when
//   stage-parallel); bytes sent per time step summed over ranks, max and mean
//   over the steady window (stage-parallel: boundary messages with their
//   32-byte headers; DP cyclic: gradient chains as the protocol assigns them
//   to time steps); samples per second per rank (N rows-sized micro-batches
//   per step, over the window's S - 2 steps, from the median rank's entering
//   the window to the median rank's leaving it, wall clock); busy
//   fraction per rank (time steps with >= 1 action over the window, the
//   least busy rank).
//
// Every measured run is checked against the pure schedule calls: the actions
// each rank ran, activations held and bytes sent per time step (stage-
// parallel: exactly; the busy fraction against the schedule's occupancy). A
// mismatch fails the run (exit 1), which is what the CTest smoke relies on.
//
//   cyclic_modes_bench [--quick] [--micro-batches 4,8] [--stages 4]
//                      [--steps 16] [--rows 128] [--width 256] [--csv FILE]
//                      [--activity FILE]
//
// --activity writes, for the stage-parallel runs (DELAY1 and SYNC), every
// action each stage rank ran: bench/plot_cyclic_modes.py draws it.
#include <flatmem/flatmem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "support/cyclic_train.hpp"
#include "support/ranks.hpp"
#include "support/stage_train.hpp"

namespace {

struct Options {
  std::vector<int> micro_batches{4, 8};
  int stages = 4, rows = 128, width = 256;  // cyclic_bench's sizes
  std::int64_t steps = 16;
  std::string csv, activity;
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
    const auto number = [&](long long lo, long long hi) {
      const std::string v = value();
      char *end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo || n > hi) {
        std::fprintf(stderr, "%s: '%s' is not a number in %lld .. %lld\n", a.c_str(), v.c_str(), lo, hi);
        std::exit(2);
      }
      return n;
    };
    if (a == "--quick") {  // awkward sizes: N = 2 and a prime N that does not divide 2L, L = 3
      o.quick = true;
      o.micro_batches = {2, 5};
      o.stages = 3;
      o.steps = 4;
      o.rows = 3;
      o.width = 5;
    } else if (a == "--micro-batches") {
      o.micro_batches.clear();
      for (const std::string &w : bench::split(value())) {
        const int n = std::atoi(w.c_str());
        if (n < 1 || n > 64) { std::fprintf(stderr, "--micro-batches: %s not in 1 .. 64\n", w.c_str()); std::exit(2); }
        o.micro_batches.push_back(n);
      }
    } else if (a == "--stages") o.stages = int(number(1, 16));
    else if (a == "--steps") o.steps = number(3, 1000);
    else if (a == "--rows") o.rows = int(number(1, 1 << 16));
    else if (a == "--width") o.width = int(number(1, 4096));
    else if (a == "--csv") o.csv = value();
    else if (a == "--activity") o.activity = value();
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); std::exit(2); }
  }
  if (o.micro_batches.empty()) { std::fprintf(stderr, "--micro-batches: none given\n"); std::exit(2); }
  return o;
}

// One rank's run: per time step, then the actions (stage-parallel).
struct TimeStep {
  std::int64_t actions = 0, held = 0, bytes = 0, posted = 0;
  double end = 0;  // wall clock at the end of the time step's last action
};
struct Action {
  std::int64_t time_step, step, version;
  int kind, micro_batch;
};
struct RankTrace {
  std::vector<TimeStep> steps;
  std::vector<Action> actions;
  double start = 0;                 // wall clock before the first action
  std::int64_t parameter_bytes = 0;
  std::int64_t parameter_bytes_measured = -1;  // ZeRO relay: the handle's measured peak (-1: as parameter_bytes)
};

// Fills `end` of time steps without an action of their own (the rank held on
// through them) and checks that every time step got a time.
void fill_ends(RankTrace &t) {
  double last = t.start;
  for (TimeStep &s : t.steps) {
    if (s.end == 0) s.end = last;
    last = s.end;
  }
}

// Per-rank trace files: the ranks are fork()ed, the parent reads them back.
std::string trace_path(const std::string &dir, int rank) { return dir + "/rank" + std::to_string(rank) + ".txt"; }

std::string write_trace(const std::string &path, const RankTrace &t) {
  std::ofstream out(path);
  out.precision(17);
  out << t.start << ' ' << t.parameter_bytes << ' ' << t.parameter_bytes_measured << ' ' << t.steps.size() << ' '
      << t.actions.size() << '\n';
  for (const TimeStep &s : t.steps) out << s.actions << ' ' << s.held << ' ' << s.bytes << ' ' << s.posted << ' ' << s.end << '\n';
  for (const Action &a : t.actions)
    out << a.time_step << ' ' << a.kind << ' ' << a.micro_batch << ' ' << a.step << ' ' << a.version << '\n';
  out.flush();
  return out ? "" : "cannot write " + path;
}

bool read_trace(const std::string &path, RankTrace &t) {
  std::ifstream in(path);
  std::size_t n = 0, m = 0;
  if (!(in >> t.start >> t.parameter_bytes >> t.parameter_bytes_measured >> n >> m)) return false;
  t.steps.resize(n);
  t.actions.resize(m);
  for (TimeStep &s : t.steps) in >> s.actions >> s.held >> s.bytes >> s.posted >> s.end;
  for (Action &a : t.actions) in >> a.time_step >> a.kind >> a.micro_batch >> a.step >> a.version;
  return bool(in);
}

std::string status_error(const char *what) { return std::string(what) + ": " + flatmem_last_error(); }

// Stage rank j of L: trains through flatmem_cyclic_stages_t and records.
std::string run_stage_rank(const test::RankSetup &rs, const test::TrainSetup &setup, int N, const std::string &dir) {
  flatmem_comm_t *comm = nullptr;
  if (test::create_comm(rs, &comm, 120000) != FLATMEM_STATUS_SUCCESS) return status_error("create_comm");
  test::StageOptions o = test::stage_options(setup, N, sizeof(float), 120000);
  flatmem_cyclic_stages_t *h = nullptr;
  if (flatmem_cyclic_stages_create(&h, comm, &o.options) != FLATMEM_STATUS_SUCCESS) {
    const std::string e = status_error("flatmem_cyclic_stages_create");
    flatmem_comm_destroy(comm);
    return e;
  }
  RankTrace t;
  std::vector<double> ends;
  test::StageRun<float> run;
  t.start = bench::now_seconds();
  const std::string error = test::train_stage<float>(h, setup, N, rs.rank, run,
                                                     [&](const flatmem_cyclic_stages_action &a) {
    if (ends.size() <= std::size_t(a.time_step)) ends.resize(std::size_t(a.time_step) + 1, 0.0);
    ends[std::size_t(a.time_step)] = bench::now_seconds();
    if (a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD)
      t.actions.push_back({a.time_step, a.step, a.version, int(a.kind), a.micro_batch});
  });
  flatmem_cyclic_stages_summary summary{};
  std::vector<flatmem_cyclic_stages_time_step_stats> stats;
  std::int64_t written = 0;
  if (error.empty() && flatmem_cyclic_stages_summary_get(h, &summary, sizeof(flatmem_cyclic_stages_summary)) == FLATMEM_STATUS_SUCCESS) {
    stats.resize(std::size_t(summary.time_steps));
    flatmem_cyclic_stages_stats(h, 0, summary.time_steps, stats.data(), sizeof(flatmem_cyclic_stages_time_step_stats), &written);
  }
  flatmem_cyclic_stages_destroy(h);
  flatmem_comm_destroy(comm);
  if (!error.empty()) return error;
  if (written != summary.time_steps || (written > 0 && stats[0].time_step != 0)) return "stats incomplete";
  ends.resize(std::size_t(written), 0.0);
  for (std::int64_t i = 0; i < written; ++i) {
    const auto &s = stats[std::size_t(i)];
    t.steps.push_back({s.actions, s.activation_bytes, s.bytes_sent, s.bytes_sent, ends[std::size_t(i)]});
  }
  fill_ends(t);
  t.parameter_bytes = std::int64_t(run.params.size() * sizeof(float)) * run.versions_kept;
  return write_trace(trace_path(dir, rs.rank), t);
}

// Data-parallel rank r of N: trains through flatmem_cyclic_t and records.
std::string run_dp_rank(const test::RankSetup &rs, const test::TrainSetup &setup, const std::string &dir) {
  flatmem_comm_t *comm = nullptr;
  if (test::create_comm(rs, &comm, 120000) != FLATMEM_STATUS_SUCCESS) return status_error("create_comm");
  test::CyclicOptions o = test::cyclic_options(setup, sizeof(float), 120000);
  flatmem_cyclic_t *h = nullptr;
  if (flatmem_cyclic_create(&h, comm, &o.options) != FLATMEM_STATUS_SUCCESS) {
    const std::string e = status_error("flatmem_cyclic_create");
    flatmem_comm_destroy(comm);
    return e;
  }
  RankTrace t;
  std::vector<double> ends;
  test::RankRun<float> run{test::StageMlp<float>::make(setup.widths, setup.seed), {}};
  t.start = bench::now_seconds();
  const std::string error = test::train_rank<float>(h, setup, rs.rank, rs.world, run,
                                                    [&](const flatmem_cyclic_action &a) {
    if (ends.size() <= std::size_t(a.time_step)) ends.resize(std::size_t(a.time_step) + 1, 0.0);
    ends[std::size_t(a.time_step)] = bench::now_seconds();
    if (a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD)
      t.actions.push_back({a.time_step, a.step, -1, int(a.kind), rs.rank});
  });
  flatmem_cyclic_summary summary{};
  std::vector<flatmem_cyclic_time_step_stats> stats;
  std::int64_t written = 0;
  if (error.empty() && flatmem_cyclic_summary_get(h, &summary, sizeof(flatmem_cyclic_summary)) == FLATMEM_STATUS_SUCCESS) {
    stats.resize(std::size_t(summary.time_steps));
    flatmem_cyclic_stats(h, 0, summary.time_steps, stats.data(), sizeof(flatmem_cyclic_time_step_stats), &written);
  }
  flatmem_cyclic_destroy(h);
  flatmem_comm_destroy(comm);
  if (!error.empty()) return error;
  if (written != summary.time_steps || (written > 0 && stats[0].time_step != 0)) return "stats incomplete";
  ends.resize(std::size_t(written), 0.0);
  for (std::int64_t i = 0; i < written; ++i) {
    const auto &s = stats[std::size_t(i)];
    const bool busy = s.kind == FLATMEM_CYCLIC_FORWARD || s.kind == FLATMEM_CYCLIC_BACKWARD;
    t.steps.push_back({busy ? 1 : 0, s.activation_bytes, s.bytes_scheduled, s.bytes_sent, ends[std::size_t(i)]});
  }
  fill_ends(t);
  std::int64_t elements = 0;
  for (const auto &p : run.model.params) elements += std::int64_t(p.size());
  t.parameter_bytes = elements * std::int64_t(sizeof(float));
  return write_trace(trace_path(dir, rs.rank), t);
}

// Data-parallel rank r of N with RELAYED parameters: trains through
// flatmem_cyclic_t (support/cyclic_train's relayed loop) and records. Bytes
// per time step: the gradient chains (as the protocol assigns them) plus the
// relay (full stages passed on and shards sent to rank 0); parameter bytes:
// the largest of the handle's scheduled accounting (own shards + the staged
// stages in use) over the run.
std::string run_relay_rank(const test::RankSetup &rs, const test::TrainSetup &setup, const std::string &dir) {
  flatmem_comm_t *comm = nullptr;
  if (test::create_comm(rs, &comm, 120000) != FLATMEM_STATUS_SUCCESS) return status_error("create_comm");
  test::CyclicOptions o = test::relayed_options(setup, sizeof(float), 120000);
  flatmem_cyclic_t *h = nullptr;
  if (flatmem_cyclic_create(&h, comm, &o.options) != FLATMEM_STATUS_SUCCESS) {
    const std::string e = status_error("flatmem_cyclic_create (relayed)");
    flatmem_comm_destroy(comm);
    return e;
  }
  RankTrace t;
  std::vector<double> ends;
  test::RelayRun<float> run = test::RelayRun<float>::initial(setup, rs.rank, rs.world);
  t.start = bench::now_seconds();
  const std::string error = test::train_rank_relayed<float>(h, setup, rs.rank, rs.world, run,
                                                            [&](const flatmem_cyclic_action &a) {
    if (ends.size() <= std::size_t(a.time_step)) ends.resize(std::size_t(a.time_step) + 1, 0.0);
    ends[std::size_t(a.time_step)] = bench::now_seconds();
    if (a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD)
      t.actions.push_back({a.time_step, a.step, -1, int(a.kind), rs.rank});
  });
  flatmem_cyclic_summary summary{};
  flatmem_cyclic_relay_summary relay{};
  std::vector<flatmem_cyclic_time_step_stats> stats;
  std::vector<flatmem_cyclic_relay_time_step> relay_stats;
  std::int64_t written = 0, relay_written = 0;
  if (error.empty() && flatmem_cyclic_summary_get(h, &summary, sizeof(flatmem_cyclic_summary)) == FLATMEM_STATUS_SUCCESS &&
      flatmem_cyclic_relay_summary_get(h, &relay, sizeof(flatmem_cyclic_relay_summary)) == FLATMEM_STATUS_SUCCESS) {
    stats.resize(std::size_t(summary.time_steps));
    relay_stats.resize(std::size_t(summary.time_steps));
    flatmem_cyclic_stats(h, 0, summary.time_steps, stats.data(), sizeof(flatmem_cyclic_time_step_stats), &written);
    flatmem_cyclic_relay_stats(h, 0, summary.time_steps, relay_stats.data(), sizeof(flatmem_cyclic_relay_time_step),
                               &relay_written);
  }
  flatmem_cyclic_destroy(h);
  flatmem_comm_destroy(comm);
  if (!error.empty()) return error;
  if (written != summary.time_steps || relay_written != written || (written > 0 && stats[0].time_step != 0) ||
      (written > 0 && relay_stats[0].time_step != 0))
    return "stats incomplete";
  ends.resize(std::size_t(written), 0.0);
  for (std::int64_t i = 0; i < written; ++i) {
    const auto &s = stats[std::size_t(i)];
    const auto &r = relay_stats[std::size_t(i)];
    const bool busy = s.kind == FLATMEM_CYCLIC_FORWARD || s.kind == FLATMEM_CYCLIC_BACKWARD;
    t.steps.push_back({busy ? 1 : 0, s.activation_bytes, s.bytes_scheduled + r.relay_bytes_sent,
                       s.bytes_sent + r.relay_bytes_sent, ends[std::size_t(i)]});
  }
  fill_ends(t);
  t.parameter_bytes = relay.peak_parameter_bytes_scheduled;
  t.parameter_bytes_measured = relay.peak_parameter_bytes;
  return write_trace(trace_path(dir, rs.rank), t);
}

// Runs `world` fork()ed ranks that each write a trace; reads them back.
template <typename Rank>
std::string run_traced(int world, std::chrono::seconds limit, const Rank &rank, std::vector<RankTrace> &traces) {
  char dir[] = "/tmp/flatmem-cyclic-modes-XXXXXX";
  if (!mkdtemp(dir)) return "mkdtemp failed";
  const auto outcomes = test::run_ranks(world, [&](const test::RankSetup &s) { return rank(s, std::string(dir)); },
                                        limit, "tcp,self,posix");
  std::string failed = test::failures(outcomes);
  traces.assign(std::size_t(world), RankTrace{});
  for (int r = 0; r < world; ++r) {
    const std::string path = trace_path(dir, r);
    if (failed.empty() && !read_trace(path, traces[std::size_t(r)])) failed = "unreadable trace " + path;
    std::remove(path.c_str());
  }
  rmdir(dir);
  return failed;
}

// What the schedule says one rank does per time step (for the checks and the
// computed naive layout).
struct Expected {
  std::vector<std::int64_t> actions, held, bytes;
  std::vector<Action> list;
};

Expected expected_stage(const flatmem_cyclic_stages_schedule &s, int stage, std::int64_t T,
                        const test::StageOptions &o) {
  Expected e;
  std::vector<flatmem_cyclic_stages_action> buffer(std::size_t(2 * s.micro_batches + 2));
  for (std::int64_t tau = 0; tau < T; ++tau) {
    std::int32_t count = 0;
    flatmem_cyclic_stages_schedule_actions(&s, stage, tau, buffer.data(), sizeof(flatmem_cyclic_stages_action), std::int32_t(buffer.size()), &count);
    std::int64_t bytes = 0, held = 0;
    for (std::int32_t i = 0; i < count; ++i) {
      const auto &a = buffer[std::size_t(i)];
      held = std::int64_t(a.activations_held) * o.activation_bytes[std::size_t(stage)];
      if (a.kind != FLATMEM_CYCLIC_FORWARD && a.kind != FLATMEM_CYCLIC_BACKWARD) continue;
      e.list.push_back({a.time_step, a.step, a.version, int(a.kind), a.micro_batch});
      if (a.sends) {
        const int boundary = a.kind == FLATMEM_CYCLIC_FORWARD ? stage : stage - 1;
        bytes += o.boundary_bytes[std::size_t(boundary)] + 32;
      }
    }
    if (count == 0) {  // no action: the micro-batches between a forward and its backward
      held = 0;
      for (std::int32_t m = 0; m < s.micro_batches; ++m) {
        std::int64_t off = 0, P = 0;
        flatmem_cyclic_stages_schedule_offset(&s, m, &off);
        flatmem_cyclic_stages_schedule_period(&s, &P);
        for (std::int64_t step = 0; step < s.steps; ++step) {
          const std::int64_t f = off + P * step + stage, b = off + P * step + 2 * s.stages - 1 - stage;
          if (f <= tau && tau <= b) held += o.activation_bytes[std::size_t(stage)];
        }
      }
    }
    e.actions.push_back(count);  // update-only IDLE actions count as actions in the stats too
    e.held.push_back(held);
    e.bytes.push_back(bytes);
  }
  return e;
}

// "" or the first difference between a measured stage-parallel run and the schedule.
std::string check_stage_run(const std::vector<RankTrace> &traces, const flatmem_cyclic_stages_schedule &s,
                            const test::StageOptions &o) {
  std::int64_t T = 0;
  flatmem_cyclic_stages_schedule_length(&s, &T);
  for (int j = 0; j < s.stages; ++j) {
    const RankTrace &t = traces[std::size_t(j)];
    const Expected e = expected_stage(s, j, T, o);
    const std::string where = "stage " + std::to_string(j);
    if (std::int64_t(t.steps.size()) != T)
      return where + ": " + std::to_string(t.steps.size()) + " time steps recorded, the schedule has " + std::to_string(T);
    for (std::int64_t tau = 0; tau < T; ++tau) {
      const TimeStep &m = t.steps[std::size_t(tau)];
      const std::size_t i = std::size_t(tau);
      if (m.actions != e.actions[i] || m.held != e.held[i] || m.bytes != e.bytes[i])
        return where + ", time step " + std::to_string(tau) + ": actions / activation bytes / bytes sent " +
               std::to_string(m.actions) + " / " + std::to_string(m.held) + " / " + std::to_string(m.bytes) +
               ", the schedule says " + std::to_string(e.actions[i]) + " / " + std::to_string(e.held[i]) + " / " +
               std::to_string(e.bytes[i]);
    }
    if (t.actions.size() != e.list.size()) return where + ": action count differs from the schedule";
    for (std::size_t i = 0; i < e.list.size(); ++i) {
      const Action &a = t.actions[i], &b = e.list[i];
      if (a.time_step != b.time_step || a.kind != b.kind || a.micro_batch != b.micro_batch || a.step != b.step ||
          a.version != b.version)
        return where + ": action " + std::to_string(i) + " (time step " + std::to_string(a.time_step) +
               ") differs from the schedule's";
    }
  }
  return "";
}

std::string check_dp_run(const std::vector<RankTrace> &traces, const flatmem_cyclic_schedule &s) {
  std::int64_t T = 0;
  flatmem_cyclic_schedule_length(&s, &T);
  for (int r = 0; r < s.world_size; ++r) {
    const RankTrace &t = traces[std::size_t(r)];
    if (std::int64_t(t.steps.size()) != T) return "rank " + std::to_string(r) + ": time steps differ from the schedule";
    std::size_t k = 0;
    for (std::int64_t tau = 0; tau < T; ++tau) {
      flatmem_cyclic_action a{};
      flatmem_cyclic_schedule_action(&s, r, tau, &a, sizeof(flatmem_cyclic_action));
      const bool busy = a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD;
      if (t.steps[std::size_t(tau)].actions != (busy ? 1 : 0) ||
          (busy && (k >= t.actions.size() || t.actions[k].time_step != tau || t.actions[k++].kind != int(a.kind))))
        return "rank " + std::to_string(r) + ", time step " + std::to_string(tau) + ": the action differs from the schedule";
    }
  }
  return "";
}

// One row of the table.
struct Row {
  std::string layout, how;  // how: measured / computed / n/a
  int ranks = 0;
  double peak_rank = 0, peak_sum = 0, peak_wall = NAN, mean_sum = 0;
  double parameter_bytes = 0, parameter_bytes_measured = NAN;
  double max_bytes = 0, mean_bytes = 0;
  double samples_per_second_rank = NAN;
  double busy_min = 0, busy_mean = 0;
};

// The figures of a traced run over the steady window [from, to).
Row figures(const std::vector<RankTrace> &traces, std::int64_t from, std::int64_t to, double samples, bool wall) {
  Row row;
  row.ranks = int(traces.size());
  std::int64_t T = 0;
  for (const RankTrace &t : traces) T = std::max<std::int64_t>(T, std::int64_t(t.steps.size()));
  const auto at = [&](const RankTrace &t, std::int64_t tau) {
    return tau < std::int64_t(t.steps.size()) ? t.steps[std::size_t(tau)] : TimeStep{};
  };
  for (const RankTrace &t : traces) {
    std::int64_t busy = 0;
    for (std::int64_t tau = 0; tau < T; ++tau) {
      row.peak_rank = std::max(row.peak_rank, double(at(t, tau).held));
      if (tau >= from && tau < to) busy += at(t, tau).actions > 0;
    }
    const double fraction = double(busy) / double(to - from);
    row.busy_min = &t == &traces[0] ? fraction : std::min(row.busy_min, fraction);
    row.busy_mean += fraction / double(traces.size());
    row.parameter_bytes = std::max(row.parameter_bytes, double(t.parameter_bytes));
    if (t.parameter_bytes_measured >= 0)
      row.parameter_bytes_measured = std::isnan(row.parameter_bytes_measured)
                                         ? double(t.parameter_bytes_measured)
                                         : std::max(row.parameter_bytes_measured, double(t.parameter_bytes_measured));
  }
  for (std::int64_t tau = 0; tau < T; ++tau) {
    double held = 0, bytes = 0;
    for (const RankTrace &t : traces) held += double(at(t, tau).held), bytes += double(at(t, tau).bytes);
    row.peak_sum = std::max(row.peak_sum, held);
    if (tau >= from && tau < to) {
      row.max_bytes = std::max(row.max_bytes, bytes);
      row.mean_bytes += bytes / double(to - from);
      row.mean_sum += held / double(to - from);
    }
  }
  if (!wall) return row;
  // Wall clock: rank r holds held[tau] from end[tau-1] to end[tau]; sweep.
  std::vector<std::pair<double, double>> events;
  std::vector<double> starts, ends;
  for (const RankTrace &t : traces) {
    for (std::size_t tau = 1; tau < t.steps.size(); ++tau)
      if (t.steps[tau].held > 0 && t.steps[tau].end > t.steps[tau - 1].end) {
        events.push_back({t.steps[tau - 1].end, double(t.steps[tau].held)});
        events.push_back({t.steps[tau].end, -double(t.steps[tau].held)});
      }
    if (std::int64_t(t.steps.size()) >= to) {
      starts.push_back(t.steps[std::size_t(from - 1)].end);
      ends.push_back(t.steps[std::size_t(to - 1)].end);
    }
  }
  std::sort(events.begin(), events.end(), [](auto x, auto y) {
    return x.first < y.first || (x.first == y.first && x.second < y.second);  // frees first
  });
  double level = 0;
  row.peak_wall = 0;
  for (const auto &e : events) row.peak_wall = std::max(row.peak_wall, level += e.second);
  // The window in wall-clock time: from the median rank's entering it to the
  // median rank's leaving it (ranks that run alone at the window's edges, as
  // staggered ones do, would otherwise count a core of their own).
  if (starts.size() == traces.size()) {
    std::sort(starts.begin(), starts.end());
    std::sort(ends.begin(), ends.end());
    const double seconds = ends[ends.size() / 2] - starts[starts.size() / 2];
    row.samples_per_second_rank = seconds > 0 ? samples / seconds / double(traces.size()) : NAN;
  }
  return row;
}

// The naive layout's traces from its schedule: pipeline i, stage j is rank
// i L + j; forward of j at 2L s + j, backward at 2L s + 2L-1-j, holding the
// micro-batch's stage activations from one to the other; after a backward it
// sends the input gradient (j > 0) and its share of a ring all-reduce of the
// stage gradient over the N ranks of stage j: 2 (N-1)/N of the gradient.
std::vector<RankTrace> naive_traces(const test::TrainSetup &setup, int N, const test::StageOptions &o,
                                    const std::vector<std::int64_t> &stage_parameter_bytes) {
  const int L = setup.stages();
  const std::int64_t P = 2 * L, T = P * setup.steps;
  std::vector<RankTrace> traces(std::size_t(N) * std::size_t(L));
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < L; ++j) {
      RankTrace &t = traces[std::size_t(i * L + j)];
      t.parameter_bytes = stage_parameter_bytes[std::size_t(j)];
      t.steps.resize(std::size_t(T));
      for (std::int64_t s = 0; s < setup.steps; ++s) {
        const std::int64_t f = P * s + j, b = P * s + P - 1 - j;
        for (std::int64_t tau = f; tau <= b; ++tau) t.steps[std::size_t(tau)].held = o.activation_bytes[std::size_t(j)];
        t.steps[std::size_t(f)].actions = 1;
        t.steps[std::size_t(b)].actions = 1;
        if (j + 1 < L) t.steps[std::size_t(f)].bytes += o.boundary_bytes[std::size_t(j)] + 32;
        if (j > 0) t.steps[std::size_t(b)].bytes += o.boundary_bytes[std::size_t(j) - 1] + 32;
        t.steps[std::size_t(b)].bytes += 2 * (N - 1) * stage_parameter_bytes[std::size_t(j)] / N;
      }
    }
  return traces;
}

// "" or where the naive layout's figures differ from their closed forms: every
// rank busy 1/L of the time steps; peaks max_j a_j per rank and N sum_j a_j
// summed (all pipelines hold every stage at time step L-1); per period of 2L
// time steps the N pipelines send N (L-1) activations, N (L-1) input
// gradients and N ring all-reduce shares of every stage.
std::string check_naive(const Row &r, const test::TrainSetup &setup, int N, const test::StageOptions &o,
                        const std::vector<std::int64_t> &stage_parameter_bytes) {
  const int L = setup.stages();
  double per_period = 0, peak = 0, sum = 0;
  for (int j = 0; j < L; ++j) {
    const double a = double(o.activation_bytes[std::size_t(j)]);
    peak = std::max(peak, a);
    sum += a;
    if (j + 1 < L) per_period += 2.0 * double(o.boundary_bytes[std::size_t(j)] + 32);  // forward and back
    per_period += double(2 * (N - 1) * stage_parameter_bytes[std::size_t(j)] / N);
  }
  const double mean = double(N) * per_period / double(2 * L);
  const auto off = [](double x, double y) { return std::fabs(x - y) > 1e-9 * std::max(1.0, std::fabs(y)); };
  if (off(r.busy_min, 1.0 / L) || off(r.busy_mean, 1.0 / L)) return "busy fraction is not 1/L";
  if (off(r.peak_rank, peak) || off(r.peak_sum, N * sum)) return "activation peaks differ from max_j a_j, N sum_j a_j";
  if (off(r.mean_bytes, mean)) return "mean bytes per time step " + std::to_string(r.mean_bytes) + ", closed form " + std::to_string(mean);
  return "";
}

// Seconds of one micro-batch's forward and backward through all stages, one
// process, no communication (median of a few): the naive pipeline's step.
double pipeline_step_seconds(const test::TrainSetup &setup) {
  const int L = setup.stages(), rows = setup.rows;
  test::StageMlp<float> model = test::StageMlp<float>::make(setup.widths, setup.seed);
  std::vector<std::vector<float>> acts(std::size_t(L) + 1);
  for (int j = 0; j <= L; ++j) acts[std::size_t(j)].resize(std::size_t(rows) * std::size_t(setup.widths[std::size_t(j)]));
  std::vector<float> target(acts.back().size()), dy(acts.back().size()), dx;
  std::vector<double> times;
  for (int rep = 0; rep < 5; ++rep) {
    test::task_batch<float>(std::int64_t(rep) * rows, rows, setup.widths[0], setup.widths.back(), acts[0].data(), target.data());
    const double t0 = bench::now_seconds();
    for (int j = 0; j < L; ++j) model.forward(j, acts[std::size_t(j)].data(), acts[std::size_t(j) + 1].data(), rows);
    test::mse_loss<float>(acts.back().data(), target.data(), rows, setup.widths.back(), dy.data());
    for (int j = L - 1; j >= 0; --j) {
      std::vector<float> grad(model.param_count(j));
      dx.resize(acts[std::size_t(j)].size());
      model.backward(j, acts[std::size_t(j)].data(), acts[std::size_t(j) + 1].data(), dy.data(),
                     j > 0 ? dx.data() : nullptr, grad.data(), rows);
      dy.swap(dx);
    }
    times.push_back(bench::now_seconds() - t0);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

const char *rule_name(flatmem_cyclic_rule r) {
  return r == FLATMEM_CYCLIC_SYNC ? "sync" : r == FLATMEM_CYCLIC_DELAY1 ? "delay1" : "newest";
}

constexpr double kib = 1024.0;

void print_row(const Row &r, int N, FILE *csv) {
  if (r.how == "n/a") {
    std::printf("%3d %-22s %-8s %s\n", N, r.layout.c_str(), "n/a", "(not built)");
    if (csv) std::fprintf(csv, "%d,%s,n/a,,,,,,,,,,,\n", N, r.layout.c_str());
    return;
  }
  char wall[32] = "-", thr[32] = "-";
  if (!std::isnan(r.peak_wall)) std::snprintf(wall, sizeof wall, "%.0f", r.peak_wall / kib);
  if (!std::isnan(r.samples_per_second_rank)) std::snprintf(thr, sizeof thr, "%.0f", r.samples_per_second_rank);
  char ratio[32] = "-";
  if (r.mean_bytes > 0) std::snprintf(ratio, sizeof ratio, "%.2f", r.max_bytes / r.mean_bytes);
  std::printf("%3d %-22s %-8s %5d | %8.0f %9.0f %9s | %8.0f | %8.1f %8.1f %6s | %9s | %5.2f %5.2f\n", N,
              r.layout.c_str(), r.how.c_str(), r.ranks, r.peak_rank / kib, r.peak_sum / kib, wall,
              r.parameter_bytes / kib, r.max_bytes / kib, r.mean_bytes / kib, ratio, thr, r.busy_min, r.busy_mean);
  std::fflush(stdout);
  if (csv)
    std::fprintf(csv, "%d,%s,%s,%d,%.0f,%.0f,%s,%.0f,%.0f,%.1f,%s,%.4f,%.4f\n", N, r.layout.c_str(), r.how.c_str(),
                 r.ranks, r.peak_rank, r.peak_sum, std::isnan(r.peak_wall) ? "" : std::to_string(std::llround(r.peak_wall)).c_str(),
                 r.parameter_bytes, r.max_bytes, r.mean_bytes,
                 std::isnan(r.samples_per_second_rank) ? "" : std::to_string(r.samples_per_second_rank).c_str(),
                 r.busy_min, r.busy_mean);
}

void write_activity(FILE *f, int N, flatmem_cyclic_rule rule, const std::vector<RankTrace> &traces) {
  if (!f) return;
  for (std::size_t j = 0; j < traces.size(); ++j)
    for (const Action &a : traces[j].actions)
      std::fprintf(f, "%d,%s,%zu,%lld,%s,%d,%lld,%lld\n", N, rule_name(rule), j, (long long)a.time_step,
                   a.kind == FLATMEM_CYCLIC_FORWARD ? "forward" : "backward", a.micro_batch, (long long)a.step,
                   (long long)a.version);
}

}  // namespace

int main(int argc, char **argv) {
  const Options o = parse(argc, argv);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  const std::chrono::seconds limit(o.quick ? 120 : 600);
  test::TrainSetup base;
  base.widths.assign(std::size_t(o.stages) + 1, o.width);
  base.rows = o.rows;
  base.steps = o.steps;
  base.lr = 0.05;
  const int L = o.stages;
  std::vector<std::int64_t> stage_parameter_bytes;
  {
    const test::StageMlp<float> model = test::StageMlp<float>::make(base.widths, base.seed);
    for (int j = 0; j < L; ++j) stage_parameter_bytes.push_back(std::int64_t(model.param_count(j) * sizeof(float)));
  }
  const double pipeline_seconds = pipeline_step_seconds(base);
  std::printf("cyclic_modes_bench: L = %d stages of %d -> %d (MLP, fp32), micro-batches of %d rows, %lld steps;\n"
              "ranks are fork()ed processes on this machine (%d hardware threads), UCX over loopback/shared memory.\n"
              "Steady window: time steps [P, P (S-1)), P the period (DP rows: from offset(N-1) + P). KiB throughout;\n"
              "act = activation bytes held"
              " (declared per stage and micro-batch, schedule time); bytes = sent per time step, summed over ranks.\n\n",
              L, o.width, o.width, o.rows, (long long)o.steps, bench::hardware_threads());
  std::printf("%3s %-22s %-8s %5s | %8s %9s %9s | %8s | %8s %8s %6s | %9s | %5s %5s\n", "N", "layout", "how",
              "ranks", "act/rank", "act sum", "sum wall", "params", "max B/ts", "mean", "ratio", "smp/s/rk",
              "busy", "mean");
  FILE *csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  FILE *activity = o.activity.empty() ? nullptr : std::fopen(o.activity.c_str(), "w");
  if ((!o.csv.empty() && !csv) || (!o.activity.empty() && !activity)) {
    std::fprintf(stderr, "cannot open the output files\n");
    return 2;
  }
  if (csv)
    std::fprintf(csv, "micro_batches,layout,how,ranks,peak_activation_bytes_per_rank,peak_activation_bytes_summed,"
                      "peak_activation_bytes_summed_wall,parameter_bytes_per_rank,max_bytes_per_time_step,"
                      "mean_bytes_per_time_step,samples_per_second_per_rank,busy_fraction_min,busy_fraction_mean\n");
  if (activity) std::fprintf(activity, "micro_batches,rule,stage,time_step,kind,micro_batch,step,version\n");
  int failures = 0;
  std::vector<std::string> targets;
  for (int N : o.micro_batches) {
    const test::StageOptions so = test::stage_options(base, N, sizeof(float));
    const double samples = double(N) * o.rows * double(o.steps - 2);  // the steady window's steps 1 .. S-2

    // DP x MP (naive): computed.
    Row naive = figures(naive_traces(base, N, so, stage_parameter_bytes), 2 * L, 2 * L * (o.steps - 1), samples, false);
    naive.layout = "dp x mp (naive)";
    naive.how = "computed";
    naive.samples_per_second_rank = double(o.rows) / pipeline_seconds / L;  // one micro-batch per 2L steps per pipeline
    if (const std::string e = check_naive(naive, base, N, so, stage_parameter_bytes); !e.empty()) {
      std::fprintf(stderr, "dp x mp, N = %d: %s\n", N, e.c_str());
      ++failures;
    }
    print_row(naive, N, csv);

    // Stage-parallel: DELAY1 (the row) and SYNC (the picture's bubble, a row too).
    Row stage_delay1{};
    for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_SYNC}) {
      test::TrainSetup setup = base;
      setup.rule = rule;
      std::vector<RankTrace> traces;
      std::string failed = run_traced(L, limit, [&](const test::RankSetup &s, const std::string &dir) {
        return run_stage_rank(s, setup, N, dir);
      }, traces);
      flatmem_cyclic_stages_schedule sched = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
      sched.stages = L;
      sched.micro_batches = N;
      sched.steps = o.steps;
      sched.rule = rule;
      if (failed.empty()) failed = check_stage_run(traces, sched, so);
      if (!failed.empty()) {
        std::fprintf(stderr, "stage-parallel %s, N = %d: %s\n", rule_name(rule), N, failed.c_str());
        ++failures;
        continue;
      }
      std::int64_t P = 0;
      flatmem_cyclic_stages_schedule_period(&sched, &P);
      Row row = figures(traces, P, P * (o.steps - 1), samples, true);
      row.layout = std::string("stage-parallel ") + rule_name(rule);
      row.how = "measured";
      // The window's busy fraction is the schedule's steady occupancy, stage by stage.
      for (int j = 0; j < L; ++j) {
        flatmem_cyclic_stages_occupancy occ{};
        flatmem_cyclic_stages_schedule_occupancy(&sched, j, &occ, sizeof(flatmem_cyclic_stages_occupancy));
        std::int64_t busy = 0;
        for (std::int64_t tau = P; tau < P * (o.steps - 1); ++tau) busy += traces[std::size_t(j)].steps[std::size_t(tau)].actions > 0;
        const double measured = double(busy) / double(P * (o.steps - 2));
        if (std::fabs(measured - occ.busy_fraction) > 1e-12) {
          std::fprintf(stderr, "stage-parallel %s, N = %d, stage %d: busy %.6f over the window, the schedule's occupancy %.6f\n",
                       rule_name(rule), N, j, measured, occ.busy_fraction);
          ++failures;
        }
      }
      print_row(row, N, csv);
      write_activity(activity, N, rule, traces);
      if (rule == FLATMEM_CYCLIC_DELAY1) stage_delay1 = row;
    }

    // DP cyclic DELAY1 on N ranks: parameters replicated, then relayed (ZeRO).
    // Steady window: every rank past its first step, rank 0 before its last.
    Row zero;
    for (const bool relayed : {false, true}) {
      const std::string layout = relayed ? "zero relay delay1" : "dp cyclic delay1";
      test::TrainSetup setup = base;
      setup.rule = FLATMEM_CYCLIC_DELAY1;
      flatmem_cyclic_schedule sched = FLATMEM_CYCLIC_SCHEDULE_INIT;
      sched.world_size = N;
      sched.stages = L;
      sched.steps = o.steps;
      sched.rule = FLATMEM_CYCLIC_DELAY1;
      std::vector<RankTrace> traces;
      std::string failed = run_traced(N, limit, [&](const test::RankSetup &s, const std::string &dir) {
        if (relayed) return run_relay_rank(s, setup, dir);
        return run_dp_rank(s, setup, dir);
      }, traces);
      if (failed.empty()) failed = check_dp_run(traces, sched);
      if (!failed.empty()) {
        std::fprintf(stderr, "%s, N = %d: %s\n", layout.c_str(), N, failed.c_str());
        ++failures;
        continue;
      }
      std::int64_t last = 0;
      flatmem_cyclic_schedule_offset(&sched, N - 1, &last);
      const std::int64_t P = 2 * L, from = last + P, to = P * (o.steps - 1);
      Row row = figures(traces, from, to, double(N) * o.rows * double(to - from) / double(P), true);
      row.layout = layout;
      row.how = "measured";
      print_row(row, N, csv);
      if (relayed) zero = row;
    }

    if (stage_delay1.ranks > 0) {
      char line[256];
      std::snprintf(line, sizeof line, "N = %d: stage-parallel uses %d ranks where dp x mp uses %d; least busy rank %.1f%% "
                    "of steady time steps (target >= 90%%): %s", N, stage_delay1.ranks, naive.ranks,
                    100 * stage_delay1.busy_min, stage_delay1.busy_min >= 0.9 ? "met" : "MISSED");
      targets.push_back(line);
    }
    if (zero.how == "measured") {
      char line[256];
      std::snprintf(line, sizeof line, "N = %d: zero relay peak / mean bytes per time step %.3f (target <= 1.25): %s; "
                    "parameter bytes per rank %.0f KiB by the schedule, %.0f KiB measured peak", N,
                    zero.max_bytes / zero.mean_bytes, zero.max_bytes <= 1.25 * zero.mean_bytes ? "met" : "MISSED",
                    zero.parameter_bytes / kib, zero.parameter_bytes_measured / kib);
      targets.push_back(line);
    } else {
      targets.push_back("N = " + std::to_string(N) + ": zero relay peak / mean bytes per time step <= 1.25: n/a (not built)");
    }
  }
  if (csv) std::fclose(csv);
  if (activity) std::fclose(activity);
  std::printf("\nact/rank: the largest activation bytes one rank holds; act sum: summed over ranks, peak by the\n"
              "schedule; sum wall: the same swept in wall-clock time (measured rows). params: parameter bytes per\n"
              "rank (replicated: the whole model; stage-parallel: its stage times the versions it keeps; naive:\n"
              "one stage; zero relay: own shards + the staged stages in use, the handle's scheduled accounting,\n"
              "largest over the run). max B/ts, mean: bytes sent per time step summed over ranks over the steady\n"
              "window (naive: boundary messages + each rank's 2 (N-1)/N share of its stage's ring all-reduce;\n"
              "zero relay: gradient chains + full stages relayed + shards sent to rank 0). smp/s/rk:\n"
              "training samples per second per rank (ranks share %d hardware threads; naive: computed from one\n"
              "micro-batch's forward + backward through all stages, %.3f ms on one core, free communication).\n"
              "busy: least busy rank's fraction of steady time steps with an action, and the mean over ranks.\n\n",
              bench::hardware_threads(), pipeline_seconds * 1e3);
  for (const std::string &t : targets) std::printf("target: %s\n", t.c_str());
  return failures == 0 ? 0 : 1;
}
