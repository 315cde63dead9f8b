// net_rank: one rank of scripts/test-netns.sh, a process in its own network
// namespace (its "host"), joined to the others by flatmem_comm_create_from_env
// (FLATMEM_COORDINATOR, FLATMEM_RANK, FLATMEM_WORLD_SIZE, FLATMEM_COMM_TIMEOUT_MS;
// UCX_TLS / UCX_NET_DEVICES from the harness). Every line it prints starts
// with "rank R" and is key=value after the first words, for the harness.
//
//   net_rank check [--seed S] [--measure BATCH,D,STEPS]...
//     Runs all_reduce, ring_shift, ring_loss (forward + backward) and cyclic
//     (a few DELAY1 training steps) once each, checks each against this rank's
//     own reference and prints "rank R hash OP <16 hex digits>" -- the harness
//     compares these with a loopback run. Then two probes of the network
//     (probe small_all_reduce_ms=.. shift_1MiB_ms=..: medians) and, with
//     each --measure, bench/ring_rank's measurement of the ring loss on a new
//     communicator (step time, time blocked in ring waits, the same payload sent
//     alone), gathered on rank 0: "rank 0 ring_measure step_ms=.. hidden_pct=..".
//     Exit 0, or 1 when a check failed.
//
//   net_rank fault OP [--seconds N]
//     Runs OP (all_reduce | ring_shift | ring_loss | cyclic) over and over for
//     up to N seconds (default 60), printing "rank R running OP" once it runs;
//     the harness then cuts or kills a host. When a call fails it prints
//     "rank R FAILED OP at=<epoch seconds>: <call>: <STATUS>: <message>", then
//     destroys its handles and the communicator and prints "rank R destroyed
//     seconds=..". Exit 3 after such a failure, 4 if nothing failed, 2 on bad usage.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "net/net_ops.hpp"
#include "ring_rank.hpp"

namespace {

struct TimeLimit {};  // fault mode: the limit passed without a failure

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double epoch_seconds() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: net_rank check [--seed S] [--measure BATCH,D,STEPS]...\n"
                       "       net_rank fault all_reduce|ring_shift|ring_loss|cyclic [--seconds N]\n");
  std::exit(2);
}

net::Context join() {
  net::Context c;
  net::check(flatmem_comm_create_from_env(&c.comm, nullptr), "flatmem_comm_create_from_env");
  net::check(flatmem_comm_rank(c.comm, &c.rank), "flatmem_comm_rank");
  net::check(flatmem_comm_world_size(c.comm, &c.world), "flatmem_comm_world_size");
  return c;
}

// A contiguous 1-d host tensor over `data`.
template <typename T>
DLTensor vector_tensor(T *data, std::int64_t *n, std::uint8_t code) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {code, std::uint8_t(8 * sizeof(T)), 1};
  t.shape = n;
  return t;
}

void all_reduce(flatmem_comm_t *comm, std::vector<double> &v) {
  std::int64_t n = std::int64_t(v.size());
  DLTensor t = vector_tensor(v.data(), &n, kDLFloat);
  net::check(flatmem_comm_all_reduce(comm, &t, &t, 0, nullptr), "flatmem_comm_all_reduce");
}

// Median milliseconds of `repeats` calls of `call`.
template <typename Call>
double median_ms(int repeats, Call call) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t = Clock::now();
    call();
    ms.push_back(1e3 * seconds_since(t));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Latency (one-element all-reduce: one direct exchange with every rank) and bandwidth
// (1 MiB ring shift: every link carries 1 MiB at once) of the network.
void probe(const net::Context &c) {
  std::vector<float> one(1, 1.0f), mib_in(1 << 18, 1.0f), mib_out(mib_in.size());
  std::int64_t n1 = 1, nm = std::int64_t(mib_in.size());
  DLTensor t1 = vector_tensor(one.data(), &n1, kDLFloat);
  DLTensor in = vector_tensor(mib_in.data(), &nm, kDLFloat), out = vector_tensor(mib_out.data(), &nm, kDLFloat);
  net::check(flatmem_comm_barrier(c.comm, 0), "flatmem_comm_barrier");
  const double small = median_ms(5, [&] {
    net::check(flatmem_comm_all_reduce(c.comm, &t1, &t1, 0, nullptr), "flatmem_comm_all_reduce");
  });
  const double shift = median_ms(3, [&] {
    net::check(flatmem_comm_ring_shift(c.comm, &in, &out, 0, nullptr), "flatmem_comm_ring_shift");
  });
  std::printf("rank %d probe small_all_reduce_ms=%.2f shift_1MiB_ms=%.2f\n", c.rank, small, shift);
}

// bench/ring_rank's measurement on a communicator of its own (rank 0's
// unique id reaches the others as an all-reduce of integers: zeros elsewhere).
void measure(const net::Context &c, const std::string &spec) {
  ring_bench::RankConfig config;
  long long batch = 0, d = 0;
  if (std::sscanf(spec.c_str(), "%lld,%lld,%d", &batch, &d, &config.steps) != 3) usage();
  config.rank = c.rank, config.world = c.world, config.batch = batch / c.world * c.world, config.d = d;
  std::vector<std::int64_t> id(sizeof(flatmem_comm_unique_id) / 8, 0);
  if (c.rank == 0) {
    const char *coordinator = std::getenv("FLATMEM_COORDINATOR");
    std::string host(coordinator ? coordinator : "127.0.0.1");
    host = host.substr(0, host.rfind(':')) + ":0";
    net::check(flatmem_comm_unique_id_create(host.c_str(), &config.id), "flatmem_comm_unique_id_create");
    std::memcpy(id.data(), &config.id, sizeof config.id);
  }
  std::int64_t n = std::int64_t(id.size());
  DLTensor t = vector_tensor(id.data(), &n, kDLInt);
  net::check(flatmem_comm_all_reduce(c.comm, &t, &t, 0, nullptr), "flatmem_comm_all_reduce (the unique id)");
  std::memcpy(&config.id, id.data(), sizeof config.id);

  const ring_bench::RankReport report = ring_bench::run_rank(config);
  if (!report.ok) throw net::Failure(std::string("ring measurement: ") + report.error);
  // Each rank's figures in its own slot; as ring_bench reports them: the
  // slowest rank's step, the mean transfer and blocked times.
  enum { step, forward, backward, transfer, waited, sent, fields };
  std::vector<double> all(std::size_t(fields * c.world), 0.0);
  double *mine = all.data() + fields * c.rank;
  mine[step] = report.step_seconds, mine[forward] = report.forward_seconds,
  mine[backward] = report.backward_seconds, mine[transfer] = report.transfer_seconds,
  mine[waited] = report.wait_seconds, mine[sent] = report.bytes_sent;
  all_reduce(c.comm, all);
  if (c.rank != 0) return;
  const double *slowest = all.data();
  double transfer_mean = 0, waited_mean = 0;
  for (int r = 0; r < c.world; ++r) {
    const double *x = all.data() + fields * r;
    if (x[step] > slowest[step]) slowest = x;
    transfer_mean += x[transfer] / c.world, waited_mean += x[waited] / c.world;
  }
  const double hidden = transfer_mean > 0 ? std::max(0.0, 1.0 - waited_mean / transfer_mean) : 0.0;
  std::printf("rank 0 ring_measure batch=%lld d=%lld steps=%d step_ms=%.1f forward_ms=%.1f backward_ms=%.1f "
              "sent_MiB=%.2f transfer_ms=%.1f blocked_ms=%.1f hidden_pct=%.0f\n",
              (long long)config.batch, (long long)config.d, config.steps, 1e3 * slowest[step],
              1e3 * slowest[forward], 1e3 * slowest[backward], slowest[sent] / 1048576.0, 1e3 * transfer_mean,
              1e3 * waited_mean, 100 * hidden);
}

int check_mode(int argc, char **argv) {
  std::uint64_t seed = 1;
  std::vector<std::string> measure_specs;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    if (a == "--seed") seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--measure") measure_specs.push_back(argv[++i]);
    else usage();
  }
  net::Context c = join();
  c.seed = seed;
  int status = 0;
  {
    const auto ops = net::make_ops(c, net::Sizes{});
    for (const auto &op : ops) {
      const auto start = Clock::now();
      op->run();
      const double took = seconds_since(start);
      const std::string wrong = op->verify();
      if (!wrong.empty()) {
        std::printf("rank %d CHECK FAILED %s: %s\n", c.rank, op->name(), wrong.c_str());
        status = 1;
      }
      std::printf("rank %d hash %s %016llx\n", c.rank, op->name(), (unsigned long long)op->hash());
      std::printf("rank %d took %s seconds=%.3f\n", c.rank, op->name(), took);
      std::fflush(stdout);
    }
  }
  probe(c);
  for (const std::string &spec : measure_specs) measure(c, spec);
  net::check(flatmem_comm_destroy(c.comm), "flatmem_comm_destroy");
  return status;
}

int fault_mode(int argc, char **argv) {
  if (argc < 3) usage();
  const std::string name = argv[2];
  double limit = 60;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") != 0 || i + 1 >= argc) usage();
    limit = std::atof(argv[++i]);
  }
  net::Context c = join();
  bool announced = false;
  const auto announce = [&] {
    if (announced) return;
    announced = true;
    std::printf("rank %d running %s\n", c.rank, name.c_str());
    std::fflush(stdout);
  };
  net::Sizes sizes;
  sizes.cyclic_steps = 1000000;  // one training that runs until the fault (or the limit)
  const auto start = Clock::now();
  auto ops = net::make_ops(c, sizes, [&](const flatmem_cyclic_action &a) {
    if (a.step >= 1) announce();  // a whole step went through
    if (seconds_since(start) > limit) throw TimeLimit{};
  });
  const auto op = std::find_if(ops.begin(), ops.end(), [&](const auto &o) { return name == o->name(); });
  if (op == ops.end()) usage();
  try {
    while (seconds_since(start) < limit) {
      (*op)->run();
      announce();
    }
  } catch (const TimeLimit &) {
  } catch (const net::Failure &f) {
    const double at = epoch_seconds();
    std::printf("rank %d FAILED %s at=%.3f: %s\n", c.rank, name.c_str(), at, f.what());
    std::fflush(stdout);
    const auto destroy = Clock::now();
    ops.clear();
    const flatmem_status s = flatmem_comm_destroy(c.comm);
    std::printf("rank %d destroyed seconds=%.3f comm_destroy=%s\n", c.rank, seconds_since(destroy),
                flatmem_status_string(s));
    return 3;
  }
  std::printf("rank %d NO FAILURE in %.0f s of %s\n", c.rank, limit, name.c_str());
  ops.clear();
  flatmem_comm_destroy(c.comm);
  return 4;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) usage();
  try {
    if (std::strcmp(argv[1], "check") == 0) return check_mode(argc, argv);
    if (std::strcmp(argv[1], "fault") == 0) return fault_mode(argc, argv);
  } catch (const net::Failure &f) {
    std::printf("rank ? ERROR %s\n", f.what());
    return 1;
  }
  usage();
}
