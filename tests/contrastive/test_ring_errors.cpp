// Errors of the ring contrastive loss: every rank must fail together (no rank
// left waiting in the ring), with messages naming the ranks and values, and
// nothing the caller owns written. Ranks are threads over an in-process group.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "contrastive/ring_case.hpp"
#include "support/contrastive.hpp"

using namespace ring_test;

namespace {

struct Outcome {
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  std::string message;
  bool outputs_untouched = true;
};

// How one rank's call deviates from the well-formed one.
struct Deviation {
  double scale = 10.0;
  Dtype dtype = Dtype::f32;
  std::int64_t d = 12;
  std::int64_t fp32_precision = FLATMEM_FP32_PRECISION_DEFAULT;
  bool nan_in_q = false, give_workspace = false, label_out_of_range = false, skip_call = false;
};

// Runs a forward on 3 ranks (b_r = 5, InfoNCE with global labels); `deviate`
// edits what rank r passes.
std::vector<Outcome> forward_on_ranks(const std::function<void(int, Deviation &)> &deviate,
                                      long timeout_ms = 20000) {
  const int world = 3;
  std::vector<flatmem_comm_t *> comms(static_cast<std::size_t>(world));
  flatmem_comm_options co = FLATMEM_COMM_OPTIONS_INIT;
  co.timeout_ms = timeout_ms;
  REQUIRE(flatmem_comm_create_local(comms.data(), world, &co) == FLATMEM_STATUS_SUCCESS);
  std::vector<Outcome> outcomes(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      Deviation dev;
      deviate(r, dev);
      if (dev.skip_call) return;
      RingCase rc;
      rc.loss = FLATMEM_CONTRASTIVE_INFONCE;
      rc.rows = {5, 5, 5};
      rc.labels = true;
      rc.dtype = dev.dtype;
      rc.d = dev.d;
      rc.scale = dev.scale;
      const GlobalBatch batch = make_batch(rc);
      RankInputs in = slice(rc, batch, r);
      if (dev.nan_in_q) in.q.set(3, 7, std::nan(""));
      if (dev.label_out_of_range) in.labels.set(2, 15.0);  // C = 15 columns: 0 .. 14
      flatmem_contrastive_options o = flatmem_test::make_options(rc.loss);
      o.comm = comms[std::size_t(r)];
      o.fp32_precision = dev.fp32_precision;
      flatmem_test::Handle h = flatmem_test::create_handle(o);
      HostTensor loss = HostTensor::scalar(Dtype::f32, -1.0), row_lse = HostTensor::vector(Dtype::f32, 5);
      row_lse.fill_bytes(0x5A);
      char workspace[256];
      Outcome &out = outcomes[std::size_t(r)];
      out.status = flatmem_contrastive_forward(h.get(), in.q.dl(), in.k.dl(), in.labels_dl(), batch.scale.dl(),
                                               loss.dl(), row_lse.dl(), nullptr,
                                               dev.give_workspace ? workspace : nullptr,
                                               dev.give_workspace ? sizeof workspace : 0, nullptr);
      out.message = flatmem_last_error();
      out.outputs_untouched = loss.get(0) == -1.0 && row_lse.all_bytes_are(0x5A);
    });
  for (auto &t : threads) t.join();
  for (auto *c : comms) flatmem_comm_destroy(c);
  return outcomes;
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// Every rank that called failed with `status`, wrote nothing, and its message contains `part`.
void check_all_fail(const std::vector<Outcome> &outcomes, flatmem_status status, const std::string &part) {
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(outcomes[r].status == status, flatmem_status_string(outcomes[r].status), ": ", outcomes[r].message);
    CHECK_MESSAGE(contains(outcomes[r].message, part), outcomes[r].message);
    CHECK(outcomes[r].outputs_untouched);
  }
}

}  // namespace

TEST_CASE("contrastive/ring/errors/a different logit scale on one rank fails every rank, naming both") {
  const auto outcomes = forward_on_ranks([](int r, Deviation &d) { if (r == 2) d.scale = 20.0; });
  check_all_fail(outcomes, FLATMEM_STATUS_INVALID_ARGUMENT, "logit_scale: rank 0 has 10, rank 2 has 20");
}

TEST_CASE("contrastive/ring/errors/different d or dtype on one rank") {
  check_all_fail(forward_on_ranks([](int r, Deviation &d) { if (r == 1) d.d = 13; }),
                 FLATMEM_STATUS_INVALID_ARGUMENT, "d: rank 0 has 12, rank 1 has 13");
  check_all_fail(forward_on_ranks([](int r, Deviation &d) { if (r == 1) d.dtype = Dtype::bf16; }),
                 FLATMEM_STATUS_INVALID_ARGUMENT, "dtype: rank 0 has float32, rank 1 has bfloat16");
}

TEST_CASE("contrastive/ring/errors/a different fp32_precision on one rank") {
  // It decides how G enters the bf16 kernels' products (avx512bf16): the ranks' parts of one
  // global batch must be computed alike.
  check_all_fail(forward_on_ranks([](int r, Deviation &d) { if (r == 2) d.fp32_precision = FLATMEM_FP32_PRECISION_TF32; }),
                 FLATMEM_STATUS_INVALID_ARGUMENT, "options.fp32_precision: rank 0 has DEFAULT, rank 2 has TF32");
}

TEST_CASE("contrastive/ring/errors/a NaN on one rank fails every rank") {
  const auto outcomes = forward_on_ranks([](int r, Deviation &d) { if (r == 1) d.nan_in_q = true; });
  check_all_fail(outcomes, FLATMEM_STATUS_NON_FINITE, "");
  CHECK_MESSAGE(contains(outcomes[1].message, "q: element (3, 7)"), outcomes[1].message);
  CHECK_MESSAGE(contains(outcomes[0].message, "rank 1 found a non-finite input"), outcomes[0].message);
  CHECK_MESSAGE(contains(outcomes[2].message, "rank 1 found a non-finite input"), outcomes[2].message);
}

TEST_CASE("contrastive/ring/errors/a workspace is refused on the rank that passes it, the others name it") {
  const auto outcomes = forward_on_ranks([](int r, Deviation &d) { if (r == 0) d.give_workspace = true; });
  check_all_fail(outcomes, FLATMEM_STATUS_INVALID_ARGUMENT, "");
  CHECK_MESSAGE(contains(outcomes[0].message, "workspace: must be NULL"), outcomes[0].message);
  CHECK_MESSAGE(contains(outcomes[1].message, "rank 0 refused its arguments"), outcomes[1].message);
}

TEST_CASE("contrastive/ring/errors/labels are checked against the global column count") {
  const auto outcomes = forward_on_ranks([](int r, Deviation &d) { if (r == 1) d.label_out_of_range = true; });
  check_all_fail(outcomes, FLATMEM_STATUS_INVALID_ARGUMENT, "labels: rank 1 has a label 15 outside [0, C = 15)");
}

TEST_CASE("contrastive/ring/errors/a rank that never calls: the others fail within the timeout") {
  const auto start = std::chrono::steady_clock::now();
  auto outcomes = forward_on_ranks([](int r, Deviation &d) { if (r == 1) d.skip_call = true; }, 300);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  for (int r : {0, 2}) {
    const Outcome &o = outcomes[std::size_t(r)];
    CHECK_MESSAGE((o.status == FLATMEM_STATUS_TIMEOUT || o.status == FLATMEM_STATUS_PEER_FAILURE), o.message);
    CHECK_MESSAGE(contains(o.message, "contrastive forward"), o.message);
    CHECK(o.outputs_untouched);
  }
}

TEST_CASE("contrastive/ring/errors/workspace queries return 0 with a communicator") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  flatmem_contrastive_options o = flatmem_test::make_options(FLATMEM_CONTRASTIVE_SYMMETRIC);
  o.comm = comm;
  {
    flatmem_test::Handle h = flatmem_test::create_handle(o);
    HostTensor q = HostTensor::matrix(Dtype::f32, 8, 4), k = HostTensor::matrix(Dtype::f32, 8, 4);
    std::size_t bytes = 99;
    CHECK(flatmem_contrastive_forward_workspace_size(h.get(), q.dl(), k.dl(), &bytes) == FLATMEM_STATUS_SUCCESS);
    CHECK(bytes == 0);
    bytes = 99;
    CHECK(flatmem_contrastive_backward_workspace_size(h.get(), q.dl(), k.dl(), q.dl(), k.dl(), &bytes) ==
          FLATMEM_STATUS_SUCCESS);
    CHECK(bytes == 0);
  }
  flatmem_comm_destroy(comm);
}

// kDLCUDA tensors (host memory labelled so) on a communicator without a device
// transport: in a build with the CUDA ring, INVALID_ARGUMENT naming
// options.comm and flatmem_comm_init_device; in any other build UNSUPPORTED
// naming q. Decided before any device pointer is read; nothing is written.
TEST_CASE("contrastive/ring/errors/kDLCUDA tensors on a communicator without a device transport") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  flatmem_contrastive_options o =
      flatmem_test::make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, 1, 0, 0, FLATMEM_NONFINITE_PROPAGATE);
  o.comm = comm;
  {
    flatmem_test::Handle h = flatmem_test::create_handle(o);
    HostTensor q = HostTensor::matrix(Dtype::f32, 8, 4), k = HostTensor::matrix(Dtype::f32, 8, 4);
    HostTensor s = HostTensor::scalar(Dtype::f32, 10.0), loss = HostTensor::scalar(Dtype::f32, 7.0);
    HostTensor row = HostTensor::vector(Dtype::f32, 8), col = HostTensor::vector(Dtype::f32, 8);
    HostTensor dq = HostTensor::matrix(Dtype::f32, 8, 4), dk = HostTensor::matrix(Dtype::f32, 8, 4);
    for (HostTensor *t : {&q, &k, &s, &loss, &row, &col, &dq, &dk}) t->dl()->device = DLDevice{kDLCUDA, 0};
#ifdef FLATMEM_TEST_CUDA_RING
    const flatmem_status expected = FLATMEM_STATUS_INVALID_ARGUMENT;
    const char *const names[] = {"options.comm", "flatmem_comm_init_device"};
#else
    const flatmem_status expected = FLATMEM_STATUS_UNSUPPORTED;
    const char *const names[] = {"q", "kDLCUDA"};
#endif
    CHECK(flatmem_contrastive_forward(h.get(), q.dl(), k.dl(), nullptr, s.dl(), loss.dl(), row.dl(), col.dl(),
                                      nullptr, 0, nullptr) == expected);
    for (const char *name : names) CHECK(std::string(flatmem_last_error()).find(name) != std::string::npos);
    CHECK(loss.get(0) == 7.0);
    CHECK(flatmem_contrastive_backward(h.get(), q.dl(), k.dl(), nullptr, s.dl(), row.dl(), col.dl(), nullptr,
                                       dq.dl(), dk.dl(), nullptr, nullptr, 0, nullptr) == expected);
    for (const char *name : names) CHECK(std::string(flatmem_last_error()).find(name) != std::string::npos);
  }
  flatmem_comm_destroy(comm);
}
