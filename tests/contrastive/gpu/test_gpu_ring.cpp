// The ring loss on kDLCUDA tensors (options.comm with an NCCL device
// transport): the CUDA kernels per block, NCCL moving the blocks.
//  - One rank on one GPU: every output bitwise equal to the single-device
//    call on the same tensors (CLIP, InfoNCE with and without labels,
//    sigmoid; fp32 TF32 / FULL, bf16; awkward shapes; strided k and outputs;
//    dloss). A one-rank ring still makes every NCCL call of a longer ring
//    once: the relayed column states and partial dk go to the rank itself.
//  - Several ranks (threads, rank r on GPU r, one per visible GPU up to 4;
//    or 2, 3, 4 ranks all on GPU 0 over flatmem's NCCL stand-in when
//    FLATMEM_NCCL_LIBRARY names it, see docs/nccl-stand-in.md;
//    skipped on a machine with one GPU otherwise): uneven shards, equal
//    to the single-device loss of the concatenated batch within the bounds of
//    reordered fp32 sums (CLIP, InfoNCE, sigmoid), and identical scalars on
//    every rank; a rank that leaves makes the others fail within the
//    communicator's deadline.
//  - Refusals: a communicator without a device transport.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "contrastive/gpu/gpu_call.hpp"
#include "contrastive/gpu/gpu_sigmoid.hpp"
#include "support/gpu.hpp"
#include "support/random.hpp"

using namespace flatmem_test;

namespace {

constexpr std::int64_t timeout_ms = 20000;

#define FLATMEM_OK(call)                                                                  \
  do {                                                                                    \
    const flatmem_status status_ = (call);                                                \
    REQUIRE_MESSAGE(status_ == FLATMEM_STATUS_SUCCESS, #call, " -> ",                     \
                    flatmem_status_string(status_), ": ", flatmem_last_error());          \
  } while (0)

// A local group of n ranks, rank r's NCCL transport on device_of_rank(r) (initialised
// collectively, one thread per rank).
struct Ring {
  std::vector<flatmem_comm_t *> comms;
  explicit Ring(int n, bool device = true, std::int64_t deadline_ms = timeout_ms) : comms(std::size_t(n)) {
    flatmem_comm_options o;
    FLATMEM_OK(flatmem_comm_options_init(&o, sizeof o));
    o.timeout_ms = deadline_ms;
    FLATMEM_OK(flatmem_comm_create_local(comms.data(), n, &o));
    if (!device) return;
    std::vector<flatmem_status> status(std::size_t(n), FLATMEM_STATUS_INTERNAL);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        cudaSetDevice(device_of_rank(r));
        status[std::size_t(r)] = flatmem_comm_init_device(comms[std::size_t(r)], device_of_rank(r), timeout_ms);
      });
    for (std::thread &t : threads) t.join();
    for (flatmem_status s : status) REQUIRE(s == FLATMEM_STATUS_SUCCESS);
  }
  ~Ring() {
    for (flatmem_comm_t *c : comms) flatmem_comm_destroy(c);
  }
  Ring(const Ring &) = delete;
  Ring &operator=(const Ring &) = delete;
};

Handle ring_handle(flatmem_contrastive_loss loss, flatmem_fp32_precision precision, flatmem_comm_t *comm) {
  flatmem_contrastive_options o = gpu_options(loss, precision);
  o.comm = comm;
  return create_handle(o);
}

void check_same_bits(const char *what, const HostTensor &got, const HostTensor &want) {
  INFO(what);
  REQUIRE(got.byte_count() == want.byte_count());
  CHECK(std::memcmp(got.bytes(), want.bytes(), got.byte_count()) == 0);
}

struct SoftmaxCase {
  flatmem_contrastive_loss loss = FLATMEM_CONTRASTIVE_SYMMETRIC;
  Dtype dtype = Dtype::f32;
  flatmem_fp32_precision precision = FLATMEM_FP32_PRECISION_DEFAULT;
  std::int64_t b = 1, c = 0, d = 1;  // c = 0: c = b
  bool labels = false;
  std::int64_t k_pad = 0, dq_pad = 0;
  double scale = 10.0, dloss = 1.0;
};

std::string name_of(const SoftmaxCase &sc) {
  return std::string(sc.loss == FLATMEM_CONTRASTIVE_SYMMETRIC ? "symmetric" : "infonce") + "/" +
         dtype_name(sc.dtype) + (sc.precision == FLATMEM_FP32_PRECISION_FULL ? "/full" : "") + "/b=" +
         std::to_string(sc.b) + ",c=" + std::to_string(sc.c ? sc.c : sc.b) + ",d=" + std::to_string(sc.d) +
         (sc.labels ? ",labels" : "") + (sc.k_pad ? ",strided k" : "");
}

struct SoftmaxInputs {
  HostTensor q, k, labels, scale;
};

SoftmaxInputs make_inputs(const SoftmaxCase &sc, std::uint64_t seed) {
  Random rng(seed);
  SoftmaxInputs in;
  const std::int64_t c = sc.c ? sc.c : sc.b;
  in.q = HostTensor::matrix(sc.dtype, sc.b, sc.d);
  in.k = HostTensor::matrix(sc.dtype, c, sc.d, sc.d + sc.k_pad);
  fill_features(in.q, rng, 1.0, true);
  fill_features(in.k, rng, 1.0, true);
  if (sc.labels) {
    in.labels = HostTensor::vector(Dtype::i64, sc.b);
    for (std::int64_t i = 0; i < sc.b; ++i) in.labels.set(i, double(rng.below(c)));
  }
  in.scale = HostTensor::scalar(Dtype::f32, sc.scale);
  return in;
}

struct SoftmaxRun {
  GpuForward forward;
  GpuBackward backward;
};

SoftmaxRun run_softmax(flatmem_contrastive_t *h, const SoftmaxCase &sc, const SoftmaxInputs &host) {
  const bool symmetric = sc.loss == FLATMEM_CONTRASTIVE_SYMMETRIC;
  DeviceInputs in = upload(host.q, host.k, sc.labels ? &host.labels : nullptr, host.scale);
  SoftmaxRun run;
  const std::int64_t c = host.k.rows();
  run.forward = gpu_forward(h, symmetric, in, sc.b, c);
  GradientRequest want;
  want.dq_type = sc.dtype;
  want.dq_pad = sc.dq_pad;
  want.dloss = sc.dloss;
  run.backward = gpu_backward(h, symmetric, in, run.forward, want, sc.b, c, sc.d);
  return run;
}

}  // namespace

TEST_CASE("gpu/contrastive/ring/one rank equals one device bitwise (CLIP, InfoNCE)") {
  Ring ring(1);
  const SoftmaxCase cases[] = {
      {FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, FLATMEM_FP32_PRECISION_DEFAULT, 1, 0, 1},
      {FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, FLATMEM_FP32_PRECISION_DEFAULT, 97, 0, 33},
      {FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, FLATMEM_FP32_PRECISION_FULL, 300, 0, 129, false, 3, 5, 100.0, 0.75},
      {FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::bf16, FLATMEM_FP32_PRECISION_DEFAULT, 1031, 0, 64, false, 0, 0, 30.0},
      {FLATMEM_CONTRASTIVE_INFONCE, Dtype::f32, FLATMEM_FP32_PRECISION_DEFAULT, 61, 131, 19, true},
      {FLATMEM_CONTRASTIVE_INFONCE, Dtype::bf16, FLATMEM_FP32_PRECISION_DEFAULT, 200, 333, 96, false, 8},
      {FLATMEM_CONTRASTIVE_INFONCE, Dtype::f16, FLATMEM_FP32_PRECISION_DEFAULT, 129, 257, 40, true, 0, 0, 10.0, 2.0},
  };
  for (const SoftmaxCase &sc : cases) {
    CAPTURE(name_of(sc));
    const SoftmaxInputs host = make_inputs(sc, 11);
    Handle single = create_handle(gpu_options(sc.loss, sc.precision));
    Handle ringed = ring_handle(sc.loss, sc.precision, ring.comms[0]);
    const SoftmaxRun want = run_softmax(single.get(), sc, host);
    const SoftmaxRun got = run_softmax(ringed.get(), sc, host);
    CHECK(std::isfinite(want.forward.loss.get(0)));
    check_same_bits("loss", got.forward.loss, want.forward.loss);
    check_same_bits("row_lse", got.forward.row_lse, want.forward.row_lse);
    if (sc.loss == FLATMEM_CONTRASTIVE_SYMMETRIC) check_same_bits("col_lse", got.forward.col_lse, want.forward.col_lse);
    check_same_bits("dq", got.backward.dq, want.backward.dq);
    check_same_bits("dk", got.backward.dk, want.backward.dk);
    check_same_bits("dlogit_scale", got.backward.ds, want.backward.ds);
  }
}

TEST_CASE("gpu/contrastive/ring/one rank equals one device bitwise (sigmoid)") {
  Ring ring(1);
  const SigmoidShape shapes[] = {
      {1, 1, 1},
      {97, 131, 33, true},
      {300, 300, 129, false, 100.0, -10.0, Dtype::f32, Dtype::f32},
      {257, 129, 64, true, 10.0, -5.0, Dtype::bf16, Dtype::bf16},
  };
  for (const SigmoidShape &shape : shapes) {
    for (flatmem_fp32_precision precision : {FLATMEM_FP32_PRECISION_DEFAULT, FLATMEM_FP32_PRECISION_FULL}) {
      if (shape.dtype != Dtype::f32 && precision == FLATMEM_FP32_PRECISION_FULL) continue;
      CAPTURE(shape.b);
      CAPTURE(shape.d);
      CAPTURE(int(precision));
      const SigmoidCase c(shape);
      Handle single = gpu_sigmoid_handle(precision);
      Handle ringed = ring_handle(FLATMEM_CONTRASTIVE_SIGMOID, precision, ring.comms[0]);
      for (SigmoidCall call : {SigmoidCall::forward, SigmoidCall::value_and_grad, SigmoidCall::backward}) {
        for (SigmoidRequest want : {SigmoidRequest{}, SigmoidRequest{true, false, true, true, false},
                                    SigmoidRequest{false, true, false, false, true}}) {
          if (call == SigmoidCall::value_and_grad && !want.loss && !want.dq && !want.dk && !want.ds && !want.dt) continue;
          // the single device, as the CUDA suite runs it
          const SigmoidOutputs expected = gpu_sigmoid(single.get(), c, call, want, 0.5);
          // the ring: no workspace
          SigmoidOutputs got = c.outputs();
          DeviceSigmoidInputs in(c);
          DeviceSigmoidOutputs out(got);
          HostTensor g = HostTensor::scalar(Dtype::f32, 0.5);
          DeviceTensor d_g(g);
          const flatmem_status status = gpu_sigmoid_raw(ringed.get(), call, want, d_g.dl(), in, out, nullptr, 0);
          REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
          // the outputs not written keep their bytes in both
          SigmoidOutputs fresh = c.outputs();
          out.download(got);
          const SigmoidRequest written = written_by(call, want);
          check_same_bits("loss", got.loss, written.loss ? expected.loss : fresh.loss);
          check_same_bits("dq", got.dq, written.dq ? expected.dq : fresh.dq);
          check_same_bits("dk", got.dk, written.dk ? expected.dk : fresh.dk);
          check_same_bits("dlogit_scale", got.ds, written.ds ? expected.ds : fresh.ds);
          check_same_bits("dlogit_bias", got.dt, written.dt ? expected.dt : fresh.dt);
        }
      }
    }
  }
}

TEST_CASE("gpu/contrastive/ring/refusals: a communicator without a device transport") {
  Ring ring(1, false);
  Handle h = ring_handle(FLATMEM_CONTRASTIVE_SYMMETRIC, FLATMEM_FP32_PRECISION_DEFAULT, ring.comms[0]);
  SoftmaxCase sc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, FLATMEM_FP32_PRECISION_DEFAULT, 8, 0, 4};
  const SoftmaxInputs host = make_inputs(sc, 3);
  DeviceInputs in = upload(host.q, host.k, nullptr, host.scale);
  HostTensor loss = HostTensor::scalar(Dtype::f32, 7.0), row = HostTensor::vector(Dtype::f32, 8),
             col = HostTensor::vector(Dtype::f32, 8);
  DeviceTensor d_loss(loss), d_row(row), d_col(col);
  const flatmem_status status = flatmem_contrastive_forward(h.get(), in.q.dl(), in.k.dl(), nullptr, in.scale.dl(),
                                                            d_loss.dl(), d_row.dl(), d_col.dl(), nullptr, 0, nullptr);
  CHECK(status == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("options.comm") != std::string::npos);
  CHECK(std::string(flatmem_last_error()).find("flatmem_comm_init_device") != std::string::npos);
  d_loss.download(loss);
  CHECK(loss.get(0) == 7.0);  // nothing written
}

namespace {

// Rows [begin, end) of m (compact).
HostTensor rows_of(const HostTensor &m, std::int64_t begin, std::int64_t end) {
  HostTensor out = HostTensor::matrix(m.dtype(), end - begin, m.cols());
  for (std::int64_t r = begin; r < end; ++r)
    for (std::int64_t j = 0; j < m.cols(); ++j) out.set(r - begin, j, m.get(r, j));
  return out;
}
HostTensor entries_of(const HostTensor &v, std::int64_t begin, std::int64_t end) {
  HostTensor out = HostTensor::vector(v.dtype(), end - begin);
  for (std::int64_t i = begin; i < end; ++i) out.set(i - begin, v.get(i));
  return out;
}

// |got - want| <= tol * (max |want| + tiny), elementwise over the slice.
void check_slice(const char *what, const HostTensor &got, const HostTensor &whole, std::int64_t first_row,
                 double tol) {
  double scale = 0.0;
  for (std::int64_t r = 0; r < whole.rows(); ++r)
    for (std::int64_t j = 0; j < whole.cols(); ++j) scale = std::max(scale, std::fabs(whole.get(r, j)));
  for (std::int64_t r = 0; r < got.rows(); ++r)
    for (std::int64_t j = 0; j < got.cols(); ++j) {
      const double g = got.get(r, j), w = whole.get(first_row + r, j);
      if (!(std::fabs(g - w) <= tol * scale + 1e-30)) {
        FAIL_CHECK(what, " (", first_row + r, ", ", j, "): ring ", g, ", one device ", w, ", tolerance ", tol * scale);
        return;
      }
    }
}

}  // namespace

TEST_CASE("gpu/contrastive/ring/several ranks equal one device on the concatenated batch") {
  const int gpus = device_ranks(4);
  if (gpus < 2) {
    flatmem_test::skip_this_case(std::to_string(gpus) + " GPU visible; the multi-rank ring needs 2 or more (or the NCCL stand-in)");
  }
  // Tolerance: the ring sums a row's (max, sum) states, dq, dk and ds over
  // blocks in another order than one device does (fp32 additions of at most
  // n + 16 partial terms, each relative 2^-24), and the loss and ds in double
  // over the ranks: 64 * 2^-24 of the largest magnitude bounds it with room.
  const double tol = 64.0 * 0x1p-24;
  for (flatmem_contrastive_loss loss : {FLATMEM_CONTRASTIVE_SYMMETRIC, FLATMEM_CONTRASTIVE_INFONCE}) {
    for (int n = 2; n <= gpus; ++n) {
      CAPTURE(n);
      CAPTURE(int(loss));
      const bool symmetric = loss == FLATMEM_CONTRASTIVE_SYMMETRIC;
      // uneven shards: rank r holds 37 + 29 r rows (and, InfoNCE, 50 + 41 r columns)
      std::vector<std::int64_t> rows, cols;
      for (int r = 0; r < n; ++r) {
        rows.push_back(37 + 29 * r);
        cols.push_back(symmetric ? rows.back() : 50 + 41 * r);
      }
      std::int64_t B = 0, C = 0;
      for (int r = 0; r < n; ++r) B += rows[std::size_t(r)], C += cols[std::size_t(r)];
      SoftmaxCase whole{loss, Dtype::f32, FLATMEM_FP32_PRECISION_FULL, B, symmetric ? 0 : C, 48, !symmetric};
      whole.dloss = 0.5;
      const SoftmaxInputs host = make_inputs(whole, 21);
      cudaSetDevice(0);
      Handle single = create_handle(gpu_options(loss, whole.precision));
      const SoftmaxRun want = run_softmax(single.get(), whole, host);

      Ring ring(n);
      std::vector<SoftmaxRun> got(static_cast<std::size_t>(n));
      std::vector<std::thread> threads;
      std::int64_t row0 = 0, col0 = 0;
      for (int r = 0; r < n; ++r) {
        const std::int64_t rb = row0, cb = col0;
        threads.emplace_back([&, r, rb, cb] {
          cudaSetDevice(device_of_rank(r));
          SoftmaxCase mine = whole;
          mine.b = rows[std::size_t(r)];
          mine.c = symmetric ? 0 : cols[std::size_t(r)];
          SoftmaxInputs shard;
          shard.q = rows_of(host.q, rb, rb + mine.b);
          shard.k = rows_of(host.k, cb, cb + cols[std::size_t(r)]);
          if (mine.labels) shard.labels = entries_of(host.labels, rb, rb + mine.b);
          shard.scale = HostTensor::scalar(Dtype::f32, whole.scale);
          Handle h = ring_handle(loss, whole.precision, ring.comms[std::size_t(r)]);
          got[std::size_t(r)] = run_softmax(h.get(), mine, shard);
        });
        row0 += rows[std::size_t(r)];
        col0 += cols[std::size_t(r)];
      }
      for (std::thread &t : threads) t.join();
      row0 = col0 = 0;
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const SoftmaxRun &g = got[std::size_t(r)];
        check_same_bits("loss (every rank)", g.forward.loss, got[0].forward.loss);
        check_same_bits("dlogit_scale (every rank)", g.backward.ds, got[0].backward.ds);
        CHECK(std::fabs(g.forward.loss.get(0) - want.forward.loss.get(0)) <= tol * std::fabs(want.forward.loss.get(0)));
        CHECK(std::fabs(g.backward.ds.get(0) - want.backward.ds.get(0)) <= tol * std::fabs(want.backward.ds.get(0)) + 1e-7);
        check_slice("dq", g.backward.dq, want.backward.dq, row0, tol);
        check_slice("dk", g.backward.dk, want.backward.dk, col0, tol);
        row0 += rows[std::size_t(r)];
        col0 += cols[std::size_t(r)];
      }
    }
  }
}

TEST_CASE("gpu/contrastive/ring/several ranks equal one device on the concatenated batch (sigmoid)") {
  const int gpus = device_ranks(4);
  if (gpus < 2) {
    flatmem_test::skip_this_case(std::to_string(gpus) + " GPU visible; the multi-rank ring needs 2 or more (or the NCCL stand-in)");
  }
  const double tol = 64.0 * 0x1p-24;  // as for the softmax losses above
  for (int n = 2; n <= gpus; ++n) {
    CAPTURE(n);
    std::vector<std::int64_t> rows, cols;  // uneven shards
    std::int64_t B = 0, C = 0;
    for (int r = 0; r < n; ++r) {
      rows.push_back(41 + 23 * r);
      cols.push_back(30 + 37 * r);
      B += rows.back();
      C += cols.back();
    }
    const SigmoidCase whole(SigmoidShape{B, C, 48, true, 10.0, -10.0, Dtype::f32, Dtype::f32});
    cudaSetDevice(0);
    Handle single = gpu_sigmoid_handle(FLATMEM_FP32_PRECISION_FULL);
    const SigmoidOutputs want = gpu_sigmoid(single.get(), whole, SigmoidCall::value_and_grad);

    Ring ring(n);
    std::vector<SigmoidOutputs> got(static_cast<std::size_t>(n));
    std::vector<flatmem_status> status(static_cast<std::size_t>(n), FLATMEM_STATUS_INTERNAL);
    std::vector<std::thread> threads;
    std::int64_t row0 = 0, col0 = 0;
    for (int r = 0; r < n; ++r) {
      const std::int64_t rb = row0, cb = col0;
      threads.emplace_back([&, r, rb, cb] {
        const auto i = std::size_t(r);
        cudaSetDevice(device_of_rank(r));
        SigmoidShape mine = whole.shape;
        mine.b = rows[i];
        mine.c = cols[i];
        const SigmoidCase slice(mine, rows_of(whole.q, rb, rb + rows[i]), rows_of(whole.k, cb, cb + cols[i]),
                                entries_of(whole.labels, rb, rb + rows[i]));
        Handle h = ring_handle(FLATMEM_CONTRASTIVE_SIGMOID, FLATMEM_FP32_PRECISION_FULL, ring.comms[i]);
        got[i] = slice.outputs();
        DeviceSigmoidInputs in(slice);
        DeviceSigmoidOutputs out(got[i]);
        HostTensor g = HostTensor::scalar(Dtype::f32, 1.0);
        DeviceTensor d_g(g);
        status[i] = gpu_sigmoid_raw(h.get(), SigmoidCall::value_and_grad, SigmoidRequest{}, d_g.dl(), in, out, nullptr, 0);
        out.download(got[i]);
      });
      row0 += rows[std::size_t(r)];
      col0 += cols[std::size_t(r)];
    }
    for (std::thread &t : threads) t.join();
    row0 = col0 = 0;
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const SigmoidOutputs &o = got[std::size_t(r)];
      REQUIRE_MESSAGE(status[std::size_t(r)] == FLATMEM_STATUS_SUCCESS, describe(status[std::size_t(r)]));
      check_same_bits("loss (every rank)", o.loss, got[0].loss);
      check_same_bits("dlogit_scale (every rank)", o.ds, got[0].ds);
      check_same_bits("dlogit_bias (every rank)", o.dt, got[0].dt);
      for (const auto &[what, mine, theirs] : {std::tuple{"loss", &o.loss, &want.loss},
                                               std::tuple{"dlogit_scale", &o.ds, &want.ds},
                                               std::tuple{"dlogit_bias", &o.dt, &want.dt}}) {
        INFO(what);
        CHECK(std::fabs(mine->get(0) - theirs->get(0)) <= tol * std::fabs(theirs->get(0)) + 1e-7);
      }
      check_slice("dq", o.dq, want.dq, row0, tol);
      check_slice("dk", o.dk, want.dk, col0, tol);
      row0 += rows[std::size_t(r)];
      col0 += cols[std::size_t(r)];
    }
  }
}

TEST_CASE("gpu/contrastive/ring/a rank that leaves fails the others within the deadline") {
  const int gpus = device_ranks(4);
  if (gpus < 2) {
    flatmem_test::skip_this_case(std::to_string(gpus) + " GPU visible; needs 2 or more (or the NCCL stand-in)");
  }
  const int n = gpus;
  Ring ring(n, true, 3000);
  std::vector<flatmem_status> status(std::size_t(n), FLATMEM_STATUS_SUCCESS);
  std::vector<double> seconds(std::size_t(n), 0.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(device_of_rank(r));
      if (r == n - 1) {  // leaves: aborts its communicator instead of calling
        flatmem_comm_abort(ring.comms[std::size_t(r)]);
        return;
      }
      SoftmaxCase sc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, FLATMEM_FP32_PRECISION_DEFAULT, 64, 0, 32};
      const SoftmaxInputs host = make_inputs(sc, 5 + std::uint64_t(r));
      DeviceInputs in = upload(host.q, host.k, nullptr, host.scale);
      HostTensor loss = HostTensor::scalar(Dtype::f32, 0.0), row = HostTensor::vector(Dtype::f32, 64),
                 col = HostTensor::vector(Dtype::f32, 64);
      DeviceTensor d_loss(loss), d_row(row), d_col(col);
      Handle h = ring_handle(sc.loss, sc.precision, ring.comms[std::size_t(r)]);
      const auto start = std::chrono::steady_clock::now();
      status[std::size_t(r)] = flatmem_contrastive_forward(h.get(), in.q.dl(), in.k.dl(), nullptr, in.scale.dl(),
                                                           d_loss.dl(), d_row.dl(), d_col.dl(), nullptr, 0, nullptr);
      seconds[std::size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  for (std::thread &t : threads) t.join();
  for (int r = 0; r + 1 < n; ++r) {
    CAPTURE(r);
    CHECK(status[std::size_t(r)] != FLATMEM_STATUS_SUCCESS);
    CHECK(seconds[std::size_t(r)] < 3.0 * 3 + 10.0);  // a few deadlines, never a hang
  }
}
