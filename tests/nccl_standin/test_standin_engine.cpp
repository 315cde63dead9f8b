// The NCCL stand-in's matching engine on the CPU (a memcpy executor; ranks are
// threads): NCCL's order semantics, groups, errors by deadline, abort, the
// all-reduce. The CUDA executor and the C entry points run in the GPU tests.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nccl_standin/host_executor.hpp"
#include "nccl_standin/standin_engine.hpp"

using namespace nccl_standin;
using namespace std::chrono_literals;

namespace {

HostExecutor host;

// n comms of one fresh clique.
std::vector<std::unique_ptr<Comm>> clique(int n, std::chrono::milliseconds deadline = 5000ms) {
  static std::atomic<int> serial{0};
  const std::string key = "test clique " + std::to_string(serial++);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r) {
    Status s;
    comms.push_back(Comm::join(key, n, r, host, deadline, s));
    REQUIRE_MESSAGE(s.ok(), s.message);
  }
  return comms;
}

// Runs body(rank) on n threads.
void on_threads(int n, const std::function<void(int)> &body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread &t : threads) t.join();
}

Op send_op(Comm &c, const void *data, std::size_t count, ElementType type, int peer) {
  Op op;
  op.kind = Op::Kind::send;
  op.comm = &c;
  op.send = data;
  op.count = count;
  op.type = type;
  op.peer = peer;
  return op;
}

Op recv_op(Comm &c, void *data, std::size_t count, ElementType type, int peer) {
  Op op = send_op(c, nullptr, count, type, peer);
  op.kind = Op::Kind::recv;
  op.recv = data;
  return op;
}

Op sum_op(Comm &c, const void *send, void *recv, std::size_t count, ElementType type) {
  Op op = send_op(c, send, count, type, -1);
  op.kind = Op::Kind::all_reduce;
  op.recv = recv;
  return op;
}

// As the stand-in library issues a call, but completed on the calling thread.
Status call(const Op &op) {
  Status s;
  return Group::collect(op, s) ? s : run_ops({op});
}
Status end_group() {
  std::vector<Op> ops;
  const Status s = Group::end(ops);
  return s.ok() && !ops.empty() ? run_ops(std::move(ops)) : s;
}

// Message m from rank a to rank b: m + 1 values 1000 a + 100 b + m.
std::vector<std::int32_t> message(int a, int b, int m) {
  return std::vector<std::int32_t>(std::size_t(m + 1), 1000 * a + 100 * b + m);
}

}  // namespace

TEST_CASE("nccl-stand-in/engine: the k-th send from a to b meets the k-th receive on b from a (several pairs)") {
  constexpr int n = 3, messages = 4;
  auto comms = clique(n);
  std::vector<std::vector<std::vector<std::int32_t>>> got(n * n);  // [from * n + to][m]
  std::vector<Status> status(n);
  on_threads(n, [&](int me) {
    // One group per rank: every message to every peer, then every receive in reverse peer order.
    std::vector<std::vector<std::int32_t>> outgoing;
    for (int peer = 0; peer < n; ++peer)
      for (int m = 0; m < messages; ++m) outgoing.push_back(message(me, peer, m));
    for (int peer = 0; peer < n; ++peer) got[std::size_t(peer * n + me)].assign(messages, {});
    Group::start();
    std::size_t i = 0;
    for (int peer = 0; peer < n; ++peer)
      for (int m = 0; m < messages; ++m, ++i)
        if (peer != me) call(send_op(*comms[me], outgoing[i].data(), outgoing[i].size(), ElementType::i32, peer));
    for (int peer = n - 1; peer >= 0; --peer)
      for (int m = 0; m < messages; ++m) {
        if (peer == me) continue;
        std::vector<std::int32_t> &into = got[std::size_t(peer * n + me)][std::size_t(m)];
        into.assign(std::size_t(m + 1), -1);
        call(recv_op(*comms[me], into.data(), into.size(), ElementType::i32, peer));
      }
    status[std::size_t(me)] = end_group();
  });
  for (const Status &s : status) CHECK_MESSAGE(s.ok(), s.message);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      for (int m = 0; a != b && m < messages; ++m) CHECK(got[std::size_t(a * n + b)][std::size_t(m)] == message(a, b, m));
}

TEST_CASE("nccl-stand-in/engine: calls outside a group keep their order between two threads") {
  auto comms = clique(2);
  std::vector<std::vector<std::int32_t>> got(3);
  Status sent, received;
  on_threads(2, [&](int me) {
    for (int m = 0; m < 3; ++m) {
      if (me == 0) {
        const std::vector<std::int32_t> out = message(0, 1, m);
        if (Status s = call(send_op(*comms[0], out.data(), out.size(), ElementType::i32, 1)); !s.ok()) sent = s;
      } else {
        got[std::size_t(m)].assign(std::size_t(m + 1), -1);
        Status s = call(recv_op(*comms[1], got[std::size_t(m)].data(), std::size_t(m + 1), ElementType::i32, 0));
        if (!s.ok()) received = s;
      }
    }
  });
  CHECK_MESSAGE(sent.ok(), sent.message);
  CHECK_MESSAGE(received.ok(), received.message);
  for (int m = 0; m < 3; ++m) CHECK(got[std::size_t(m)] == message(0, 1, m));
}

TEST_CASE("nccl-stand-in/engine: a ring exchange in one group (receive from previous, send to next) of 2-4 threads") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = clique(n);
    std::vector<double> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n), -1.0);
    std::vector<Status> status(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) out[std::size_t(r)] = 10.0 * r + 0.5;
    for (int round = 0; round < 3; ++round)
      on_threads(n, [&](int me) {
        // The receive first: it completes only because the group posts the send before it waits.
        Group::start();
        call(recv_op(*comms[me], &in[std::size_t(me)], 1, ElementType::f64, (me + n - 1) % n));
        Group::start();  // nested: issued by the outer end
        call(send_op(*comms[me], &out[std::size_t(me)], 1, ElementType::f64, (me + 1) % n));
        CHECK(end_group().ok());
        status[std::size_t(me)] = end_group();
      });
    for (int r = 0; r < n; ++r) {
      CHECK_MESSAGE(status[std::size_t(r)].ok(), status[std::size_t(r)].message);
      CHECK(in[std::size_t(r)] == out[std::size_t((r + n - 1) % n)]);
    }
  }
}

TEST_CASE("nccl-stand-in/engine: a send is done when posted (its bytes staged), the receive may come later") {
  auto comms = clique(2);
  std::int32_t out = 5, in = -1;
  REQUIRE(call(send_op(*comms[0], &out, 1, ElementType::i32, 1)).ok());
  out = 6;  // the sender may reuse its buffer
  REQUIRE(call(recv_op(*comms[1], &in, 1, ElementType::i32, 0)).ok());
  CHECK(in == 5);
}

TEST_CASE("nccl-stand-in/engine: mismatched sizes fail both ranks and poison the clique") {
  auto comms = clique(2);
  std::vector<std::int32_t> out(4, 7), in(3, -1);
  Status sent, received;
  on_threads(2, [&](int me) {
    if (me == 0) sent = call(send_op(*comms[0], out.data(), 4, ElementType::i32, 1));
    else received = call(recv_op(*comms[1], in.data(), 3, ElementType::i32, 0));
  });
  CHECK(received.result == Result::invalid_usage);
  CHECK_MESSAGE(received.message.find("expects 12 bytes but the matching send has 16") != std::string::npos,
                received.message);
  CHECK(sent.ok());  // done when posted; the failure reaches the sender through the clique
  CHECK(in == std::vector<std::int32_t>(3, -1));
  CHECK(comms[0]->health().result == Result::peer_failed);
  CHECK(call(send_op(*comms[0], out.data(), 4, ElementType::i32, 1)).result == Result::peer_failed);
}

TEST_CASE("nccl-stand-in/engine: a peer that never posts is an error at the deadline, not a hang") {
  auto comms = clique(2, 200ms);
  std::int32_t value = 0;
  const auto start = std::chrono::steady_clock::now();
  const Status s = call(recv_op(*comms[1], &value, 1, ElementType::i32, 0));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(s.result == Result::timeout);
  CHECK_MESSAGE(s.message.find("receive #0 on rank 1 from rank 0 (rank 0 has posted 0 sends to it)") != std::string::npos,
                s.message);
  CHECK(waited >= 200ms);
  CHECK(waited < 3000ms);
  CHECK(comms[0]->health().result == Result::peer_failed);  // the peer learns of it
}

TEST_CASE("nccl-stand-in/engine: abort wakes the waiters of every rank") {
  auto comms = clique(3, 30000ms);
  std::vector<Status> status(2);
  std::vector<double> seconds(2);
  on_threads(3, [&](int me) {
    if (me == 2) {
      std::this_thread::sleep_for(50ms);
      comms[2]->abort();
      return;
    }
    double x = 1.0, sum = 0.0;
    const auto start = std::chrono::steady_clock::now();
    status[std::size_t(me)] = me == 0 ? call(sum_op(*comms[0], &x, &sum, 1, ElementType::f64))
                                      : call(recv_op(*comms[1], &sum, 1, ElementType::f64, 2));
    seconds[std::size_t(me)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(status[std::size_t(r)].result == Result::peer_failed);
    CHECK_MESSAGE(status[std::size_t(r)].message.find("rank 2 aborted") != std::string::npos, status[std::size_t(r)].message);
    CHECK(seconds[std::size_t(r)] < 5.0);
  }
}

TEST_CASE("nccl-stand-in/engine: all-reduce sums in rank order on every rank (in place and not)") {
  constexpr int n = 4;
  auto comms = clique(n);
  std::vector<std::vector<double>> send(n), recv(n);
  std::vector<std::vector<std::int32_t>> counts(n);
  std::vector<Status> status(n);
  on_threads(n, [&](int me) {
    send[std::size_t(me)] = {0.1 * (me + 1), 1e16, -1e16 + me};
    recv[std::size_t(me)].assign(3, -1.0);
    counts[std::size_t(me)] = {me, 1};
    Group::start();  // two collectives in one group, one of them in place
    call(sum_op(*comms[me], send[std::size_t(me)].data(), recv[std::size_t(me)].data(), 3, ElementType::f64));
    call(sum_op(*comms[me], counts[std::size_t(me)].data(), counts[std::size_t(me)].data(), 2, ElementType::i32));
    status[std::size_t(me)] = end_group();
  });
  std::vector<double> want = send[0];
  for (int r = 1; r < n; ++r)
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += send[std::size_t(r)][i];
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(status[std::size_t(r)].ok(), status[std::size_t(r)].message);
    CHECK(std::memcmp(recv[std::size_t(r)].data(), want.data(), sizeof(double) * want.size()) == 0);
    CHECK(counts[std::size_t(r)] == std::vector<std::int32_t>{0 + 1 + 2 + 3, n});
  }
}

TEST_CASE("nccl-stand-in/engine: all-reduces of different lengths fail") {
  auto comms = clique(2);
  double a[2] = {1, 2}, b[2] = {3, 4};
  std::vector<Status> status(2);
  on_threads(2, [&](int me) {
    status[std::size_t(me)] =
        call(sum_op(*comms[me], me ? b : a, me ? b : a, me ? 1 : 2, ElementType::f64));
  });
  CHECK(status[0].result == Result::invalid_usage);
  CHECK_MESSAGE(status[0].message.find("rank 0 reduces 2 fp64, rank 1 1 fp64") != std::string::npos, status[0].message);
  CHECK(status[1].result == Result::peer_failed);
}

TEST_CASE("nccl-stand-in/engine: joining and argument errors") {
  Status s;
  auto first = Comm::join("join test", 2, 0, host, 1000ms, s);
  REQUIRE(s.ok());
  CHECK(Comm::join("join test", 3, 1, host, 1000ms, s) == nullptr);
  CHECK(s.result == Result::invalid_argument);
  CHECK(Comm::join("join test", 2, 0, host, 1000ms, s) == nullptr);
  CHECK(s.result == Result::invalid_usage);
  CHECK(Comm::join("join test", 2, 2, host, 1000ms, s) == nullptr);
  CHECK(s.result == Result::invalid_argument);
  double x = 0;
  CHECK(call(send_op(*first, &x, 1, ElementType::f64, 2)).result == Result::invalid_argument);
  CHECK(end_group().result == Result::invalid_usage);  // no group open
  CHECK(first->health().ok());  // argument errors poison nothing
}

TEST_CASE("nccl-stand-in/engine: a batch posted on the caller's thread completes on another") {
  auto comms = clique(2);
  std::int64_t out[3] = {5, 6, 7}, in[3] = {};
  std::unique_ptr<Batch> send, recv;
  REQUIRE(Batch::post({send_op(*comms[0], out, 3, ElementType::i64, 1)}, send).ok());
  REQUIRE(Batch::post({recv_op(*comms[1], in, 3, ElementType::i64, 0)}, recv).ok());
  Status sent, received;
  std::thread completer([&] { sent = send->complete(); });
  received = recv->complete();
  completer.join();
  CHECK_MESSAGE(sent.ok(), sent.message);
  CHECK_MESSAGE(received.ok(), received.message);
  CHECK(in[2] == 7);
}
