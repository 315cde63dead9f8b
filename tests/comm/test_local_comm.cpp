// The in-process communicator group (flatmem_comm_create_local) through the
// public API, one thread per rank: point-to-point messages (self included),
// size mismatches, tag matching and order, the collectives, timeouts,
// poisoning and abort, and argument checks.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_check.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string describe(flatmem_status s) { return std::string(flatmem_status_string(s)) + ": " + flatmem_last_error(); }

struct Group {
  std::vector<flatmem_comm_t *> comms;
  explicit Group(int world, long timeout_ms = 10000) : comms(static_cast<std::size_t>(world)) {
    flatmem_comm_options o = FLATMEM_COMM_OPTIONS_INIT;
    o.timeout_ms = timeout_ms;
    const flatmem_status s = flatmem_comm_create_local(comms.data(), world, &o);
    REQUIRE_MESSAGE(s == FLATMEM_STATUS_SUCCESS, describe(s));
  }
  ~Group() {
    for (auto *c : comms) flatmem_comm_destroy(c);
  }
  flatmem_comm_t *operator[](int r) const { return comms[std::size_t(r)]; }
};

// body(rank) on one thread per rank; returns each rank's report ("" = fine).
std::vector<std::string> on_ranks(int world, const std::function<std::string(int)> &body) {
  std::vector<std::string> reports(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { reports[std::size_t(r)] = body(r); });
  for (auto &t : threads) t.join();
  return reports;
}

void check_reports(const std::vector<std::string> &reports) {
  for (std::size_t r = 0; r < reports.size(); ++r) CHECK_MESSAGE(reports[r].empty(), "rank ", r, ": ", reports[r]);
}

// A host vector of n elements of (code, bits).
struct Buffer {
  std::vector<unsigned char> bytes;
  std::int64_t shape[1];
  DLTensor t;
  Buffer(std::int64_t n, DLDataTypeCode code = kDLFloat, int bits = 32)
      : bytes(std::size_t(n) * std::size_t(bits / 8)), shape{n} {
    t = test::host_tensor(bytes.data(), shape, code, bits);
  }
  template <typename T> T *as() { return reinterpret_cast<T *>(bytes.data()); }
};

}  // namespace

TEST_CASE("comm/local/send and receive between ranks and to self, tags matched in order") {
  Group g(3);
  check_reports(on_ranks(3, [&](int r) -> std::string {
    const int next = (r + 1) % 3, prev = (r + 2) % 3;
    Buffer out_a(4), out_b(4), self_out(2), in_a(4), in_b(4), self_in(2);
    for (int i = 0; i < 4; ++i) out_a.as<float>()[i] = float(100 * r + i), out_b.as<float>()[i] = float(-r - i);
    self_out.as<float>()[0] = 7.0f, self_out.as<float>()[1] = float(r);
    flatmem_comm_request_t *rq[6];
    // two messages with one tag (FIFO) and a message to self
    RANK_OK(flatmem_comm_irecv(g[r], &in_a.t, prev, 5, &rq[0], nullptr));
    RANK_OK(flatmem_comm_irecv(g[r], &in_b.t, prev, 5, &rq[1], nullptr));
    RANK_OK(flatmem_comm_isend(g[r], &out_a.t, next, 5, &rq[2], nullptr));
    RANK_OK(flatmem_comm_isend(g[r], &out_b.t, next, 5, &rq[3], nullptr));
    RANK_OK(flatmem_comm_isend(g[r], &self_out.t, r, 9, &rq[4], nullptr));
    RANK_OK(flatmem_comm_irecv(g[r], &self_in.t, r, 9, &rq[5], nullptr));
    int32_t done = 0;
    RANK_OK(flatmem_comm_test(g[r], rq[5], &done));
    RANK_EXPECT(done == 1, "a self message whose send was posted first completes when received");
    for (auto *q : rq) RANK_OK(flatmem_comm_wait(g[r], q, 0));
    for (int i = 0; i < 4; ++i) {
      RANK_EXPECT(in_a.as<float>()[i] == float(100 * prev + i), "first message first");
      RANK_EXPECT(in_b.as<float>()[i] == float(-prev - i), "second message second");
    }
    RANK_EXPECT(self_in.as<float>()[1] == float(r), "self message");
    return "";
  }));
}

TEST_CASE("comm/local/a receive of another size fails, the group stays healthy") {
  Group g(2);
  check_reports(on_ranks(2, [&](int r) -> std::string {
    flatmem_comm_request_t *q = nullptr;
    Buffer sent(25), wanted(50);  // 100 bytes sent, 200 expected
    if (r == 1) {
      RANK_OK(flatmem_comm_isend(g[1], &sent.t, 0, 5, &q, nullptr));
      RANK_OK(flatmem_comm_wait(g[1], q, 0));
    } else {
      RANK_OK(flatmem_comm_irecv(g[0], &wanted.t, 1, 5, &q, nullptr));
      const flatmem_status s = flatmem_comm_wait(g[0], q, 0);
      RANK_EXPECT(s == FLATMEM_STATUS_INVALID_ARGUMENT, describe(s));
      const std::string m = flatmem_last_error();
      RANK_EXPECT(m.find("rank 1 sent 100 bytes with tag 5, this receive expects 200") != std::string::npos, m);
      RANK_EXPECT(flatmem_comm_health(g[0]) == FLATMEM_STATUS_SUCCESS, "still healthy");
    }
    RANK_OK(flatmem_comm_barrier(g[r], 0));
    return "";
  }));
}

TEST_CASE("comm/local/ring shift, all-reduce (same bits everywhere, vs a double sum) and barrier") {
  for (int world : {1, 2, 3, 5}) {
    CAPTURE(world);
    Group g(world);
    const std::int64_t n = 1000;
    std::vector<std::vector<float>> sums(static_cast<std::size_t>(world));
    check_reports(on_ranks(world, [&](int r) -> std::string {
      Buffer send(3), recv(3);
      for (int i = 0; i < 3; ++i) send.as<float>()[i] = float(r * 10 + i);
      RANK_OK(flatmem_comm_ring_shift(g[r], &send.t, &recv.t, 0, nullptr));
      const int prev = (r + world - 1) % world;
      for (int i = 0; i < 3; ++i) RANK_EXPECT(recv.as<float>()[i] == float(prev * 10 + i), "ring shift");
      Buffer values(n), total(n);
      for (std::int64_t i = 0; i < n; ++i) values.as<float>()[i] = 1.0f / float(1 + r + i) + 1e-3f * float(r);
      RANK_OK(flatmem_comm_all_reduce(g[r], &values.t, &total.t, 0, nullptr));
      sums[std::size_t(r)].assign(total.as<float>(), total.as<float>() + n);
      for (std::int64_t i = 0; i < n; ++i) {
        double exact = 0.0;
        for (int s = 0; s < world; ++s) exact += double(1.0f / float(1 + s + i) + 1e-3f * float(s));
        // world fp32 additions of positive terms: relative error <= world * 2^-24
        RANK_EXPECT(std::fabs(total.as<float>()[i] - exact) <= world * 0x1p-24 * exact, "sum of element " << i);
      }
      RANK_OK(flatmem_comm_barrier(g[r], 0));
      return "";
    }));
    for (int r = 1; r < world; ++r)
      CHECK(std::memcmp(sums[std::size_t(r)].data(), sums[0].data(), sizeof(float) * n) == 0);
  }
}

TEST_CASE("comm/local/a rank that never calls: the others time out, naming peer and operation, later calls are COMM_POISONED") {
  Group g(3, 300);
  const auto start = Clock::now();
  check_reports(on_ranks(3, [&](int r) -> std::string {
    if (r == 2) return "";  // never arrives
    const flatmem_status s = flatmem_comm_barrier(g[r], 0);
    RANK_EXPECT(s == FLATMEM_STATUS_TIMEOUT || s == FLATMEM_STATUS_PEER_FAILURE, describe(s));
    const std::string m = flatmem_last_error();
    RANK_EXPECT(m.find("rank") != std::string::npos && m.find("barrier") != std::string::npos, m);
    if (s == FLATMEM_STATUS_TIMEOUT) RANK_EXPECT(m.find("300 ms") != std::string::npos, m);
    return "";
  }));
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  for (int r = 0; r < 3; ++r) {
    Buffer b(1);
    flatmem_comm_request_t *q = nullptr;
    const flatmem_status s = flatmem_comm_isend(g[r], &b.t, (r + 1) % 3, 1, &q, nullptr);
    CHECK_MESSAGE(s == FLATMEM_STATUS_COMM_POISONED, describe(s));
    CHECK(flatmem_comm_health(g[r]) != FLATMEM_STATUS_SUCCESS);
  }
}

TEST_CASE("comm/local/abort: peers waiting fail at once with PEER_FAILURE naming the rank") {
  Group g(3, 20000);
  const auto start = Clock::now();
  check_reports(on_ranks(3, [&](int r) -> std::string {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      RANK_OK(flatmem_comm_abort(g[2]));
      g.comms[2] = nullptr;  // released by abort
      return "";
    }
    Buffer in(4);
    flatmem_comm_request_t *q = nullptr;
    RANK_OK(flatmem_comm_irecv(g[r], &in.t, 2, 3, &q, nullptr));
    const flatmem_status s = flatmem_comm_wait(g[r], q, 0);
    RANK_EXPECT(s == FLATMEM_STATUS_PEER_FAILURE, describe(s));
    const std::string m = flatmem_last_error();
    RANK_EXPECT(m.find("rank 2") != std::string::npos, m);
    return "";
  }));
  CHECK(Clock::now() - start < std::chrono::seconds(5));  // not the 20 s deadline
}

TEST_CASE("comm/local/bad arguments") {
  flatmem_comm_t *comms[4] = {};
  CHECK(flatmem_comm_create_local(nullptr, 2, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_comm_create_local(comms, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("world_size") != std::string::npos);
  CHECK(flatmem_comm_create_local(comms, 4097, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  flatmem_comm_options bad = FLATMEM_COMM_OPTIONS_INIT;
  bad.struct_size = 1;
  CHECK(flatmem_comm_create_local(comms, 2, &bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("struct_size") != std::string::npos);
  CHECK(comms[0] == nullptr);  // set on success only

  Group g(2);
  Buffer b(4), ints(4, kDLInt, 16);
  flatmem_comm_request_t *q = nullptr;
  CHECK(flatmem_comm_isend(g[0], &b.t, 2, 0, &q, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("peer") != std::string::npos);
  CHECK(flatmem_comm_isend(g[0], &b.t, -1, 0, &q, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_comm_isend(g[0], nullptr, 1, 0, &q, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_comm_wait(g[0], nullptr, 0) == FLATMEM_STATUS_INVALID_ARGUMENT);
  std::int64_t strided_shape[2] = {2, 2}, strides[2] = {1, 2};  // column-major: not compact
  DLTensor strided = b.t;
  strided.ndim = 2;
  strided.shape = strided_shape;
  strided.strides = strides;
  CHECK(flatmem_comm_isend(g[0], &strided, 1, 0, &q, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  Buffer out(4);
  CHECK(flatmem_comm_all_reduce(g[0], &ints.t, &out.t, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_comm_health(g[0]) == FLATMEM_STATUS_SUCCESS);  // argument errors do not poison
}
