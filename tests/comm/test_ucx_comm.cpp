// Communicators over UCX between processes on this machine: bootstrap,
// point-to-point messages, ring shift, all-reduce, barrier, environment
// launch -- 1 to 4 ranks, over TCP and over shared memory.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/comm_check.hpp"
#include "support/ranks.hpp"

namespace {

using test::RankSetup;

std::string bootstrap_and_barrier(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm));
  int32_t rank = -1, world = -1;
  RANK_OK(flatmem_comm_rank(comm, &rank));
  RANK_OK(flatmem_comm_world_size(comm, &world));
  RANK_EXPECT(rank == s.rank && world == s.world, "rank " << rank << " world " << world);
  for (int i = 0; i < 3; ++i) RANK_OK(flatmem_comm_barrier(comm, 10000));
  RANK_OK(flatmem_comm_health(comm));
  RANK_OK(flatmem_comm_destroy(comm));
  return "";
}

// Every rank sends to every rank (itself included) messages of several sizes;
// two messages with one tag arrive in order; values name their origin.
std::string point_to_point(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 20000));
  for (std::int64_t n : {std::int64_t(1), std::int64_t(1000), std::int64_t(1) << 20}) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(s.world)), in(2 * static_cast<std::size_t>(s.world));
    std::vector<std::int64_t> shape(1, n);
    std::vector<DLTensor> tensors;
    std::vector<flatmem_comm_request_t *> requests;
    tensors.reserve(3 * std::size_t(s.world));
    for (int peer = 0; peer < s.world; ++peer) {
      for (int k = 0; k < 2; ++k) {
        auto &b = in[2 * std::size_t(peer) + std::size_t(k)];
        b.assign(static_cast<std::size_t>(n), -1.0f);
        tensors.push_back(test::host_tensor(b.data(), shape.data(), kDLFloat, 32));
        requests.push_back(nullptr);
        RANK_OK(flatmem_comm_irecv(comm, &tensors.back(), peer, 7, &requests.back(), nullptr));
      }
    }
    for (int peer = 0; peer < s.world; ++peer) {
      auto &b = out[std::size_t(peer)];
      b.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) b[std::size_t(i)] = float(s.rank * 1000 + peer) + float(i % 97);
      tensors.push_back(test::host_tensor(b.data(), shape.data(), kDLFloat, 32));
      for (int k = 0; k < 2; ++k) {  // the same buffer twice; the second one is changed below
        requests.push_back(nullptr);
        RANK_OK(flatmem_comm_isend(comm, &tensors.back(), peer, 7, &requests.back(), nullptr));
        RANK_OK(flatmem_comm_wait(comm, requests.back(), 0));
        requests.pop_back();
        b[0] += 0.5f;
      }
    }
    for (auto *r : requests) RANK_OK(flatmem_comm_wait(comm, r, 0));
    for (int peer = 0; peer < s.world; ++peer)
      for (int k = 0; k < 2; ++k)
        for (std::int64_t i = 0; i < n; ++i) {
          const float expected = float(peer * 1000 + s.rank) + float(i % 97) + (i == 0 ? 0.5f * float(k) : 0.0f);
          const float got = in[2 * std::size_t(peer) + std::size_t(k)][std::size_t(i)];
          RANK_EXPECT(got == expected, "n " << n << " from rank " << peer << " message " << k << " [" << i
                                            << "] = " << got << ", expected " << expected);
        }
  }
  RANK_OK(flatmem_comm_destroy(comm));
  return "";
}

std::string ring_shift(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 20000));
  for (std::int64_t n : {std::int64_t(1), std::int64_t(4099)}) {
    std::vector<std::int64_t> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n), -1), shape(1, n);
    for (std::int64_t i = 0; i < n; ++i) send[std::size_t(i)] = s.rank * 100000 + i;
    DLTensor a = test::host_tensor(send.data(), shape.data(), kDLInt, 64);
    DLTensor b = test::host_tensor(recv.data(), shape.data(), kDLInt, 64);
    RANK_OK(flatmem_comm_ring_shift(comm, &a, &b, 0, nullptr));
    const int from = (s.rank + s.world - 1) % s.world;
    for (std::int64_t i = 0; i < n; ++i)
      RANK_EXPECT(recv[std::size_t(i)] == from * 100000 + i, "n " << n << " [" << i << "] = " << recv[std::size_t(i)]);
  }
  RANK_OK(flatmem_comm_destroy(comm));
  return "";
}

// Sums of awkward counts in four dtypes against a double reference; every
// rank must hold the same bits (the report carries a checksum for that).
std::string all_reduce(const RankSetup &s) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 20000));
  // 1, 2, 7 elements: the direct exchange; 100003: the ring; 2048 / 2049 fp64
  // at 4 ranks: the last direct size (4 x 16384 bytes = 64 KiB) and the first ring one.
  for (std::int64_t n : {std::int64_t(1), std::int64_t(2), std::int64_t(7), std::int64_t(2048),
                         std::int64_t(2049), std::int64_t(100003)}) {
    std::vector<std::int64_t> shape(1, n);
    std::vector<float> f(static_cast<std::size_t>(n)), f_out(static_cast<std::size_t>(n));
    std::vector<double> d(static_cast<std::size_t>(n));
    std::vector<std::int32_t> i32(static_cast<std::size_t>(n));
    std::vector<std::int64_t> i64(static_cast<std::size_t>(n));
    const auto value = [&](int rank, std::int64_t i) { return std::sin(double(i) * 0.37 + rank) * (1.0 + rank); };
    for (std::int64_t i = 0; i < n; ++i) {
      f[std::size_t(i)] = float(value(s.rank, i));
      d[std::size_t(i)] = value(s.rank, i);
      i32[std::size_t(i)] = std::int32_t(i % 1000) - s.rank;
      i64[std::size_t(i)] = (std::int64_t(1) << 40) + i * (s.rank + 1);
    }
    DLTensor tf = test::host_tensor(f.data(), shape.data(), kDLFloat, 32);
    DLTensor tf_out = test::host_tensor(f_out.data(), shape.data(), kDLFloat, 32);
    DLTensor td = test::host_tensor(d.data(), shape.data(), kDLFloat, 64);
    DLTensor ti = test::host_tensor(i32.data(), shape.data(), kDLInt, 32);
    DLTensor tl = test::host_tensor(i64.data(), shape.data(), kDLInt, 64);
    RANK_OK(flatmem_comm_all_reduce(comm, &tf, &tf_out, 0, nullptr));  // out of place
    RANK_OK(flatmem_comm_all_reduce(comm, &td, &td, 0, nullptr));      // in place
    RANK_OK(flatmem_comm_all_reduce(comm, &ti, &ti, 0, nullptr));
    RANK_OK(flatmem_comm_all_reduce(comm, &tl, &tl, 0, nullptr));
    std::uint64_t checksum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double expected = 0.0;
      std::int64_t expected_i32 = 0, expected_i64 = 0;
      for (int r = 0; r < s.world; ++r) {
        expected += value(r, i);
        expected_i32 += std::int32_t(i % 1000) - r;
        expected_i64 += (std::int64_t(1) << 40) + i * (r + 1);
      }
      // fp32: s.world - 1 roundings of partial sums of terms bounded by
      // world * (1 + world); 1e-6 relative to that bound covers them.
      const double bound = 1e-6 * s.world * (1.0 + s.world);
      RANK_EXPECT(std::fabs(f_out[std::size_t(i)] - expected) <= bound, "fp32 [" << i << "] " << f_out[std::size_t(i)] << " vs " << expected);
      RANK_EXPECT(std::fabs(d[std::size_t(i)] - expected) <= 1e-13 * s.world * (1.0 + s.world), "fp64 [" << i << "]");
      RANK_EXPECT(i32[std::size_t(i)] == expected_i32 && i64[std::size_t(i)] == expected_i64, "int [" << i << "]");
      std::uint32_t bits;
      std::memcpy(&bits, &f_out[std::size_t(i)], 4);
      checksum = checksum * 1000003u + bits;
      std::uint64_t dbits;
      std::memcpy(&dbits, &d[std::size_t(i)], 8);
      checksum = checksum * 1000003u + dbits;
    }
    // Everyone's checksum to everyone: all ranks must agree bit for bit.
    std::vector<std::int64_t> sums(static_cast<std::size_t>(s.world), 0), one(1, s.world);
    sums[std::size_t(s.rank)] = std::int64_t(checksum & 0x3fffffffffffffffULL);
    DLTensor ts = test::host_tensor(sums.data(), one.data(), kDLInt, 64);
    RANK_OK(flatmem_comm_all_reduce(comm, &ts, &ts, 0, nullptr));
    for (int r = 0; r < s.world; ++r)
      RANK_EXPECT(sums[std::size_t(r)] == sums[0], "n " << n << ": rank " << r << " holds other bits than rank 0");
  }
  RANK_OK(flatmem_comm_destroy(comm));
  return "";
}

void check_all_ranks(int world, const test::Scenario &scenario, const std::string &tls = "tcp,self") {
  const auto outcomes = test::run_ranks(world, scenario, std::chrono::seconds(120), tls);
  const std::string failed = test::failures(outcomes);
  CHECK_MESSAGE(failed.empty(), failed);
}

}  // namespace

TEST_CASE("comm/ucx/bootstrap and barrier, 1 to 4 ranks") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    check_all_ranks(world, bootstrap_and_barrier);
  }
}

TEST_CASE("comm/ucx/point to point (tcp)") {
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    check_all_ranks(world, point_to_point);
  }
}

TEST_CASE("comm/ucx/point to point (shared memory)") {
  check_all_ranks(3, point_to_point, "tcp,self,posix");
}

TEST_CASE("comm/ucx/ring shift") {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    check_all_ranks(world, ring_shift);
  }
}

TEST_CASE("comm/ucx/all-reduce: values and the same bits on every rank") {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    check_all_ranks(world, all_reduce, world == 4 ? "tcp,self,posix" : "tcp,self");
  }
}
