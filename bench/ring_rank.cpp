#define FLATMEM_EXPERIMENTAL 1  // flatmem_contrastive_ring_stats_get
#include "ring_rank.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ring_bench {
namespace {

struct Failure {
  std::string text;
};

void check(flatmem_status s, const char *what) {
  if (s != FLATMEM_STATUS_SUCCESS)
    throw Failure{std::string(what) + ": " + flatmem_status_string(s) + ": " + flatmem_last_error()};
}

std::uint16_t to_bf16(float f) {  // round to nearest even
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// A compact matrix in fp32 or bf16 over owned bytes.
struct Matrix {
  std::vector<unsigned char> bytes;
  std::int64_t shape[2];
  DLTensor t{};
  Matrix(const float *rows, std::int64_t n, std::int64_t d, bool bf16) : shape{n, d} {
    bytes.resize(std::size_t(n * d) * (bf16 ? 2 : 4));
    if (bf16)
      for (std::int64_t i = 0; i < n * d; ++i) reinterpret_cast<std::uint16_t *>(bytes.data())[i] = to_bf16(rows[i]);
    else
      std::memcpy(bytes.data(), rows, bytes.size());
    t.data = bytes.data();
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {std::uint8_t(bf16 ? kDLBfloat : kDLFloat), std::uint8_t(bf16 ? 16 : 32), 1};
    t.shape = shape;
  }
};

struct Vector {
  std::vector<float> data;
  std::int64_t shape[1];
  DLTensor t{};
  explicit Vector(std::int64_t n, float value = 0.0f) : data(std::size_t(n), value), shape{n} {
    t.data = data.data();
    t.device = {kDLCPU, 0};
    t.ndim = 1;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
  }
};

// Seconds to move `bytes` around the ring alone (no compute), as `messages` ring shifts.
double transfer_alone(flatmem_comm_t *comm, double bytes, double messages) {
  if (bytes <= 0.0 || messages <= 0.0) return 0.0;
  const std::int64_t each = std::int64_t(bytes / messages / 4) + 1;
  Vector send(each, 1.0f), recv(each);
  check(flatmem_comm_barrier(comm, 0), "barrier");
  const double start = bench::now_seconds();
  for (int m = 0; m < int(messages); ++m) check(flatmem_comm_ring_shift(comm, &send.t, &recv.t, 0, nullptr), "ring shift");
  return bench::now_seconds() - start;
}

RankReport run(const RankConfig &c) {
  RankReport report;
  flatmem_comm_options co = FLATMEM_COMM_OPTIONS_INIT;
  co.timeout_ms = 120000;
  flatmem_comm_t *comm = nullptr;
  check(flatmem_comm_create(&comm, c.rank, c.world, &c.id, &co), "flatmem_comm_create");
  const std::int64_t b = c.batch / c.world, first = b * c.rank;  // the parent makes B divisible
  std::vector<float> q(std::size_t(c.batch * c.d)), k(q.size());
  bench::make_features(q.data(), k.data(), c.batch, c.d, 7);
  Matrix qr(q.data() + first * c.d, b, c.d, c.bf16), kr(k.data() + first * c.d, b, c.d, c.bf16);
  std::vector<float>().swap(q), std::vector<float>().swap(k);
  std::vector<float> zeros(std::size_t(b * c.d));
  Matrix dq_out(zeros.data(), b, c.d, false), dk_out(zeros.data(), b, c.d, false);
  Vector scale(1, 20.0f), loss(1), row_lse(b), col_lse(b), ds(1);

  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.num_threads = c.threads;
  o.comm = comm;
  flatmem_contrastive_t *h = nullptr;
  check(flatmem_contrastive_create(&h, &o), "flatmem_contrastive_create");
  bench::malloc_for_peak_measurement();
  bench::PeakRss peak;  // from before the first call: the handle's ring buffers count
  peak.start();
  for (int step = -1; step < c.steps; ++step) {  // step -1: warm-up (not timed)
    check(flatmem_comm_barrier(comm, 0), "barrier");
    const double t0 = bench::now_seconds();
    check(flatmem_contrastive_forward(h, &qr.t, &kr.t, nullptr, &scale.t, &loss.t, &row_lse.t, &col_lse.t,
                                      nullptr, 0, nullptr), "forward");
    const double t1 = bench::now_seconds();
    check(flatmem_contrastive_backward(h, &qr.t, &kr.t, nullptr, &scale.t, &row_lse.t, &col_lse.t, nullptr,
                                       &dq_out.t, &dk_out.t, &ds.t, nullptr, 0, nullptr), "backward");
    const double t2 = bench::now_seconds();
    if (step < 0) continue;
    flatmem_contrastive_ring_stats f{}, g{};
    check(flatmem_contrastive_ring_stats_get(h, 0, &f, sizeof(flatmem_contrastive_ring_stats)), "stats");
    check(flatmem_contrastive_ring_stats_get(h, 1, &g, sizeof(flatmem_contrastive_ring_stats)), "stats");
    report.forward_seconds += (t1 - t0) / c.steps;
    report.backward_seconds += (t2 - t1) / c.steps;
    report.step_seconds += (t2 - t0) / c.steps;
    report.wait_seconds += (f.wait_seconds + g.wait_seconds) / c.steps;
    report.bytes_sent = double(f.bytes_sent + g.bytes_sent);
  }
  report.peak_bytes = peak.bytes();
  report.loss = loss.data[0];
  // The forward sends 2 messages per step (symmetric: block + state), the backward 3 (block, col_lse, dk).
  report.transfer_seconds = transfer_alone(comm, report.bytes_sent, 5.0 * (c.world - 1));
  flatmem_contrastive_destroy(h);
  flatmem_comm_destroy(comm);
  report.ok = 1;
  return report;
}

}  // namespace

RankReport run_rank(const RankConfig &config) {
  try {
    return run(config);
  } catch (const Failure &f) {
    RankReport r;
    std::snprintf(r.error, sizeof r.error, "%s", f.text.c_str());
    return r;
  }
}

}  // namespace ring_bench
