// Failures of UCX communicators between processes: a rank killed in the
// middle of an operation, a rank that never arrives, a wrong world size, bad
// and stale ids, a port in use, a wedged peer (timeout), an abort, size
// mismatches, bad arguments -- every live rank gets a clear status naming the
// operation and the peer, within its timeout; nothing hangs.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_check.hpp"
#include "support/ranks.hpp"

namespace {

using test::RankSetup;
using Clock = std::chrono::steady_clock;

bool contains(const char *text, const char *part) { return std::strstr(text, part) != nullptr; }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check_ranks(int world, const test::Scenario &scenario, const test::MakeId &make_id = nullptr) {
  const auto outcomes = test::run_ranks(world, scenario, std::chrono::seconds(60), "tcp,self", make_id);
  const std::string failed = test::failures(outcomes);
  CHECK_MESSAGE(failed.empty(), failed);
}

// Ranks 0 and 1 enter an all-reduce of `count` doubles; rank 2 is killed
// instead. With a 3 s timeout the survivors must fail within it (+ 2 s of
// slack for teardown), naming the operation; the handle is poisoned
// afterwards. A small all-reduce is one direct exchange, in which every
// survivor waits on rank 2 itself: there each must name it too.
test::Scenario killed_rank(std::int64_t count, bool direct) {
  return [count, direct](const RankSetup &s) -> std::string {
    flatmem_comm_t *comm = nullptr;
    RANK_OK(test::create_comm(s, &comm, 3000));
    RANK_OK(flatmem_comm_barrier(comm, 0));
    if (s.rank == 2) {
      // Die once the others are inside the all-reduce (a death poisons every
      // rank at once, so dying during their barrier would fail the barrier).
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::raise(SIGKILL);
    }
    std::vector<double> data(static_cast<std::size_t>(count), 1.0);
    std::int64_t shape = count;
    DLTensor t = test::host_tensor(data.data(), &shape, kDLFloat, 64);
    const auto start = Clock::now();
    const flatmem_status status = flatmem_comm_all_reduce(comm, &t, &t, 0, nullptr);
    const double took = seconds_since(start);
    RANK_EXPECT(status == FLATMEM_STATUS_TIMEOUT || status == FLATMEM_STATUS_PEER_FAILURE,
                flatmem_status_string(status) << ": " << flatmem_last_error());
    RANK_EXPECT(contains(flatmem_last_error(), "flatmem_comm_all_reduce"), flatmem_last_error());
    if (direct) {
      RANK_EXPECT(contains(flatmem_last_error(), "direct exchange"), flatmem_last_error());
      RANK_EXPECT(contains(flatmem_last_error(), "rank 2"), flatmem_last_error());
    }
    RANK_EXPECT(took < 5.0, "failed after " << took << " s, timeout 3 s");
    RANK_EXPECT(flatmem_comm_barrier(comm, 0) == FLATMEM_STATUS_COMM_POISONED, flatmem_last_error());
    RANK_EXPECT(flatmem_comm_health(comm) != FLATMEM_STATUS_SUCCESS, "health after the failure");
    RANK_OK(flatmem_comm_abort(comm));
    return "";
  };
}

// World 3, rank 2 never calls flatmem_comm_create: both others time out
// within the connect timeout and rank 0 names the missing rank.
std::string never_arrives(const RankSetup &s) {
  if (s.rank == 2) return "";
  flatmem_comm_t *comm = nullptr;
  const auto start = Clock::now();
  const flatmem_status status = test::create_comm(s, &comm, 0, 2000);
  const double took = seconds_since(start);
  RANK_EXPECT(status == FLATMEM_STATUS_TIMEOUT, flatmem_status_string(status) << ": " << flatmem_last_error());
  if (s.rank == 0) RANK_EXPECT(contains(flatmem_last_error(), "rank(s) 2 of 3"), flatmem_last_error());
  RANK_EXPECT(took < 4.5, "failed after " << took << " s, connect timeout 2 s");
  RANK_EXPECT(comm == nullptr, "out set on failure");
  return "";
}

// Rank 1 believes the world has 3 ranks: refused on both sides.
std::string wrong_world_size(const RankSetup &s) {
  RankSetup mine = s;
  if (s.rank == 1) mine.world = 3;
  flatmem_comm_t *comm = nullptr;
  const flatmem_status status = test::create_comm(mine, &comm, 0, 10000);
  RANK_EXPECT(status == FLATMEM_STATUS_INVALID_ARGUMENT, flatmem_status_string(status) << ": " << flatmem_last_error());
  RANK_EXPECT(contains(flatmem_last_error(), "world_size 3"), flatmem_last_error());
  return "";
}

// Rank 0 waits for a message rank 1 does not send: TIMEOUT after 500 ms
// naming the peer; rank 1 then learns that rank 0 gave up.
std::string wedged_peer(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 20000));
  std::int64_t shape = 4;
  float data[4] = {};
  DLTensor t = test::host_tensor(data, &shape, kDLFloat, 32);
  if (s.rank == 0) {
    flatmem_comm_request_t *r = nullptr;
    RANK_OK(flatmem_comm_irecv(comm, &t, 1, 3, &r, nullptr));
    const auto start = Clock::now();
    const flatmem_status status = flatmem_comm_wait(comm, r, 500);
    RANK_EXPECT(status == FLATMEM_STATUS_TIMEOUT, flatmem_status_string(status) << ": " << flatmem_last_error());
    RANK_EXPECT(contains(flatmem_last_error(), "timed out after 500 ms") &&
                    contains(flatmem_last_error(), "from rank 1") && contains(flatmem_last_error(), "tag 3"),
                flatmem_last_error());
    RANK_EXPECT(seconds_since(start) < 2.0, "took " << seconds_since(start) << " s");
    RANK_EXPECT(flatmem_comm_health(comm) == FLATMEM_STATUS_TIMEOUT, flatmem_last_error());
    flatmem_comm_request_t *again = nullptr;
    RANK_EXPECT(flatmem_comm_isend(comm, &t, 1, 3, &again, nullptr) == FLATMEM_STATUS_COMM_POISONED,
                flatmem_last_error());
    RANK_EXPECT(again == nullptr, "request set on failure");
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const auto start = Clock::now();
    const flatmem_status status = flatmem_comm_barrier(comm, 0);
    RANK_EXPECT(status == FLATMEM_STATUS_PEER_FAILURE || status == FLATMEM_STATUS_COMM_POISONED,
                flatmem_status_string(status) << ": " << flatmem_last_error());
    RANK_EXPECT(contains(flatmem_last_error(), "rank 0"), flatmem_last_error());
    RANK_EXPECT(seconds_since(start) < 2.0, "the notice did not arrive: took " << seconds_since(start) << " s");
  }
  RANK_OK(flatmem_comm_abort(comm));
  return "";
}

// Rank 1 aborts while rank 0 waits for it (with a long timeout): rank 0
// fails at once with PEER_FAILURE naming rank 1.
std::string abort_wakes_peer(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 30000));
  RANK_OK(flatmem_comm_barrier(comm, 0));
  if (s.rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    RANK_OK(flatmem_comm_abort(comm));
    return "";
  }
  std::int64_t shape = 1;
  float x = 0;
  DLTensor t = test::host_tensor(&x, &shape, kDLFloat, 32);
  flatmem_comm_request_t *r = nullptr;
  RANK_OK(flatmem_comm_irecv(comm, &t, 1, 0, &r, nullptr));
  const auto start = Clock::now();
  const flatmem_status status = flatmem_comm_wait(comm, r, 0);
  RANK_EXPECT(status == FLATMEM_STATUS_PEER_FAILURE, flatmem_status_string(status) << ": " << flatmem_last_error());
  RANK_EXPECT(contains(flatmem_last_error(), "rank 1") && contains(flatmem_last_error(), "flatmem_comm_abort"),
              flatmem_last_error());
  RANK_EXPECT(seconds_since(start) < 3.0, "took " << seconds_since(start) << " s of a 30 s timeout");
  RANK_OK(flatmem_comm_abort(comm));
  return "";
}

// A receive larger than the message: INVALID_ARGUMENT naming both sizes; the
// communicator stays usable.
std::string size_mismatch(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 10000));
  std::int64_t two = 2, four = 4;
  float data[4] = {1, 2, 3, 4};
  flatmem_comm_request_t *r = nullptr;
  if (s.rank == 0) {
    DLTensor t = test::host_tensor(data, &two, kDLFloat, 32);
    RANK_OK(flatmem_comm_isend(comm, &t, 1, 9, &r, nullptr));
    RANK_OK(flatmem_comm_wait(comm, r, 0));
  } else {
    DLTensor t = test::host_tensor(data, &four, kDLFloat, 32);
    RANK_OK(flatmem_comm_irecv(comm, &t, 0, 9, &r, nullptr));
    const flatmem_status status = flatmem_comm_wait(comm, r, 0);
    RANK_EXPECT(status == FLATMEM_STATUS_INVALID_ARGUMENT, flatmem_status_string(status));
    RANK_EXPECT(contains(flatmem_last_error(), "sent 8 bytes") && contains(flatmem_last_error(), "expects 16"),
                flatmem_last_error());
    RANK_OK(flatmem_comm_health(comm));
  }
  RANK_OK(flatmem_comm_barrier(comm, 0));
  RANK_OK(flatmem_comm_destroy(comm));
  return "";
}

// Ranks from the environment (two naming schemes), coordinator on a fixed port.
std::string from_environment(const RankSetup &s, int port) {
  const std::string coordinator = "127.0.0.1:" + std::to_string(port);
  flatmem_comm_t *comm = nullptr;
  ::unsetenv("FLATMEM_COORDINATOR");
  RANK_EXPECT(flatmem_comm_create_from_env(&comm, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT &&
                  contains(flatmem_last_error(), "FLATMEM_COORDINATOR"),
              flatmem_last_error());
  ::setenv("FLATMEM_COORDINATOR", coordinator.c_str(), 1);
  if (s.rank % 2 == 0) {  // flatmem's own names
    ::setenv("FLATMEM_RANK", std::to_string(s.rank).c_str(), 1);
    ::setenv("FLATMEM_WORLD_SIZE", std::to_string(s.world).c_str(), 1);
  } else {  // as Open MPI's mpirun sets them
    ::setenv("OMPI_COMM_WORLD_RANK", std::to_string(s.rank).c_str(), 1);
    ::setenv("OMPI_COMM_WORLD_SIZE", std::to_string(s.world).c_str(), 1);
  }
  flatmem_comm_options options = FLATMEM_COMM_OPTIONS_INIT;
  options.connect_timeout_ms = 20000;
  RANK_OK(flatmem_comm_create_from_env(&comm, &options));
  int32_t rank = -1;
  RANK_OK(flatmem_comm_rank(comm, &rank));
  RANK_EXPECT(rank == s.rank, "rank " << rank);
  RANK_OK(flatmem_comm_barrier(comm, 10000));
  RANK_OK(flatmem_comm_destroy(comm));
  return "";
}

std::string expect_invalid(flatmem_status status, const char *part) {
  if (status != FLATMEM_STATUS_INVALID_ARGUMENT)
    return std::string("expected INVALID_ARGUMENT, got ") + flatmem_status_string(status) + ": " + flatmem_last_error();
  if (!contains(flatmem_last_error(), part))
    return std::string("message \"") + flatmem_last_error() + "\" does not name \"" + part + "\"";
  return "";
}

#define RANK_INVALID(call, part)                              \
  do {                                                        \
    const std::string bad = expect_invalid((call), (part));   \
    RANK_EXPECT(bad.empty(), #call << ": " << bad);           \
  } while (0)

// Bad arguments on a healthy world-1 communicator; the handle stays healthy.
std::string bad_arguments(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm));
  std::int64_t shape[2] = {3, 4}, strides[2] = {8, 1};
  float data[24] = {};
  DLTensor t = test::host_tensor(data, shape, kDLFloat, 32);
  t.ndim = 2;
  flatmem_comm_request_t *r = nullptr;
  RANK_INVALID(flatmem_comm_isend(nullptr, &t, 0, 0, &r, nullptr), "comm");
  RANK_INVALID(flatmem_comm_isend(comm, nullptr, 0, 0, &r, nullptr), "buffer");
  RANK_INVALID(flatmem_comm_isend(comm, &t, 1, 0, &r, nullptr), "peer: 1");
  RANK_INVALID(flatmem_comm_isend(comm, &t, -1, 0, &r, nullptr), "peer: -1");
  RANK_INVALID(flatmem_comm_isend(comm, &t, 0, 0, nullptr, nullptr), "request");
  DLTensor strided = t;
  strided.strides = strides;
  RANK_INVALID(flatmem_comm_isend(comm, &strided, 0, 0, &r, nullptr), "compact");
  DLTensor odd_bits = t;
  odd_bits.dtype.bits = 12;
  RANK_INVALID(flatmem_comm_isend(comm, &odd_bits, 0, 0, &r, nullptr), "bits 12");
  DLTensor huge = t;
  std::int64_t huge_shape[2] = {std::int64_t(1) << 40, std::int64_t(1) << 40};
  huge.shape = huge_shape;
  RANK_INVALID(flatmem_comm_isend(comm, &huge, 0, 0, &r, nullptr), "overflow");
  RANK_INVALID(flatmem_comm_wait(comm, nullptr, 0), "request");
  RANK_INVALID(flatmem_comm_barrier(comm, -5), "timeout_ms");
  DLTensor half = t;
  std::int64_t half_shape[2] = {3, 2};
  half.shape = half_shape;
  RANK_INVALID(flatmem_comm_ring_shift(comm, &t, &half, 0, nullptr), "bytes");
  DLTensor shifted = t;
  shifted.byte_offset = 8;
  RANK_INVALID(flatmem_comm_ring_shift(comm, &t, &shifted, 0, nullptr), "overlaps");
  RANK_INVALID(flatmem_comm_all_reduce(comm, &t, &shifted, 0, nullptr), "partially overlaps");
  DLTensor ints = t;
  ints.dtype = {kDLUInt, 8, 1};
  RANK_INVALID(flatmem_comm_all_reduce(comm, &ints, &ints, 0, nullptr), "host all_reduce sums");
  DLTensor misaligned = t;  // fp32 at an odd address: the in-place sum would load it misaligned
  misaligned.byte_offset = 1;
  std::int64_t short_shape[2] = {2, 2};
  misaligned.shape = short_shape;
  RANK_INVALID(flatmem_comm_all_reduce(comm, &misaligned, &misaligned, 0, nullptr), "element size");
  RANK_INVALID(flatmem_comm_rank(comm, nullptr), "rank");
  RANK_OK(flatmem_comm_health(comm));
  // A message to oneself still works.
  float out[12], in[12];
  for (int i = 0; i < 12; ++i) out[i] = float(i);
  std::int64_t n = 12;
  DLTensor a = test::host_tensor(out, &n, kDLFloat, 32), b = test::host_tensor(in, &n, kDLFloat, 32);
  flatmem_comm_request_t *rs = nullptr, *rr = nullptr;
  RANK_OK(flatmem_comm_irecv(comm, &b, 0, 1, &rr, nullptr));
  RANK_OK(flatmem_comm_isend(comm, &a, 0, 1, &rs, nullptr));
  RANK_OK(flatmem_comm_wait(comm, rs, 0));
  RANK_OK(flatmem_comm_wait(comm, rr, 0));
  RANK_EXPECT(std::memcmp(in, out, sizeof in) == 0, "self message");
  RANK_OK(flatmem_comm_destroy(comm));
  return "";
}

}  // namespace

TEST_CASE("comm/faults/a rank killed mid-operation: the others fail within the timeout") {
  // 1000 doubles: the direct exchange (3 x 8000 bytes <= 64 KiB); 100000: the ring.
  for (const auto &[count, direct] : {std::pair<std::int64_t, bool>{1000, true}, {100000, false}}) {
    CAPTURE(count);
    auto outcomes = test::run_ranks(3, killed_rank(count, direct), std::chrono::seconds(60));
    CHECK(outcomes[2].signal == SIGKILL);
    outcomes.pop_back();  // rank 2 was meant to die
    const std::string failed = test::failures(outcomes);
    CHECK_MESSAGE(failed.empty(), failed);
  }
}

TEST_CASE("comm/faults/a rank that never arrives") { check_ranks(3, never_arrives); }

TEST_CASE("comm/faults/wrong world size") { check_ranks(2, wrong_world_size); }

TEST_CASE("comm/faults/a wedged peer: timeout, poisoned handle, notice to the peer") {
  check_ranks(2, wedged_peer);
}

TEST_CASE("comm/faults/abort wakes the waiting peer") { check_ranks(2, abort_wakes_peer); }

TEST_CASE("comm/faults/send and receive sizes differ") { check_ranks(2, size_mismatch); }

TEST_CASE("comm/faults/bad arguments") { check_ranks(1, bad_arguments); }

TEST_CASE("comm/faults/bad id, port in use, stale id") {
  // A bad id is refused before any network activity (safe in this process).
  flatmem_comm_unique_id junk;
  std::memset(junk.internal, 0x5a, sizeof junk.internal);
  flatmem_comm_t *comm = nullptr;
  CHECK(flatmem_comm_create(&comm, 1, 2, &junk, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(contains(flatmem_last_error(), "not a flatmem communicator id"));
  CHECK(comm == nullptr);

  const int port = test::free_port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  // Port in use: a second listener on the same address.
  check_ranks(1, [&](const RankSetup &) -> std::string {
    flatmem_comm_unique_id a, b;
    RANK_OK(flatmem_comm_unique_id_create(address.c_str(), &a));
    const flatmem_status status = flatmem_comm_unique_id_create(address.c_str(), &b);
    RANK_EXPECT(status == FLATMEM_STATUS_INVALID_ARGUMENT && contains(flatmem_last_error(), "already in use"),
                flatmem_status_string(status) << ": " << flatmem_last_error());
    return "";
  });
  // Stale id: rank 0 used id1 for an earlier group, then made id2 on the same
  // port; a member still holding id1 is refused by rank 0's new session.
  static flatmem_comm_unique_id fresh;
  const auto make_stale = [&](flatmem_comm_unique_id *stale) -> std::string {
    flatmem_comm_t *old = nullptr;
    if (flatmem_comm_unique_id_create(address.c_str(), stale) != FLATMEM_STATUS_SUCCESS ||
        flatmem_comm_create(&old, 0, 1, stale, nullptr) != FLATMEM_STATUS_SUCCESS)
      return std::string("earlier session: ") + flatmem_last_error();
    flatmem_comm_destroy(old);
    if (flatmem_comm_unique_id_create(address.c_str(), &fresh) != FLATMEM_STATUS_SUCCESS)
      return std::string("second id: ") + flatmem_last_error();
    return "";
  };
  check_ranks(
      2,
      [&](const RankSetup &s) -> std::string {
        flatmem_comm_t *c = nullptr;
        flatmem_comm_options options = FLATMEM_COMM_OPTIONS_INIT;
        options.connect_timeout_ms = 3000;
        const flatmem_status status =
            flatmem_comm_create(&c, s.rank, 2, s.rank == 0 ? &fresh : &s.id, &options);
        if (s.rank == 1)
          RANK_EXPECT(status == FLATMEM_STATUS_INVALID_ARGUMENT && contains(flatmem_last_error(), "another session"),
                      flatmem_status_string(status) << ": " << flatmem_last_error());
        else
          RANK_EXPECT(status == FLATMEM_STATUS_TIMEOUT, flatmem_status_string(status) << ": " << flatmem_last_error());
        return "";
      },
      make_stale);
}

TEST_CASE("comm/faults/launch from the environment") {
  const int port = test::free_port();
  check_ranks(3, [port](const RankSetup &s) { return from_environment(s, port); });
}
