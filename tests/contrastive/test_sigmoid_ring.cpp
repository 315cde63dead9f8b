// The sigmoid loss as a ring over an in-process group (one thread per rank)
// against the float64 reference of the concatenated batch
// (sigmoid_ring_case.hpp says why sigmoid_tolerance holds for the ring), plus
// determinism, one rank == no communicator bit for bit, and the errors every
// rank must report together.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <string>
#include <vector>

#include "contrastive/local_ranks.hpp"
#include "contrastive/sigmoid_ring_case.hpp"

using namespace sigmoid_ring;
using flatmem_test::Dtype;
using flatmem_test::HostTensor;
using flatmem_test::SigmoidCase;
using flatmem_test::SigmoidOutputs;

namespace {

std::vector<RankRun> run_ring(const SigmoidRingCase &rc, const SigmoidCase &global) {
  ring_test::LocalGroup group(rc.ranks());
  return ring_test::on_ranks<RankRun>(
      rc.ranks(), [&](int r) { return run_rank(group.comms[std::size_t(r)], rc, global, r); });
}

void check_case(const SigmoidRingCase &rc) {
  const SigmoidCase global = rc.global_batch();
  const std::vector<RankRun> runs = run_ring(rc, global);
  for (int r = 0; r < rc.ranks(); ++r) {
    const std::string report = check_rank(rc, global, runs[std::size_t(r)], r);
    CHECK_MESSAGE(report.empty(), report);
  }
  // loss, ds and dt come out of one all-reduce: the same bits on every rank
  for (int r = 1; r < rc.ranks(); ++r) {
    const SigmoidOutputs &mine = runs[std::size_t(r)].value_and_grad, &first = runs[0].value_and_grad;
    CHECK(mine.loss.same_bits(first.loss));
    CHECK(mine.ds.same_bits(first.ds));
    CHECK(mine.dt.same_bits(first.dt));
  }
}

std::string name_of(const SigmoidRingCase &rc) {
  std::string s = std::string(flatmem_test::dtype_name(rc.shape.dtype)) + "/b=";
  for (std::size_t r = 0; r < rc.rows.size(); ++r) s += (r ? "," : "") + std::to_string(rc.rows[r]);
  s += "/c=";
  for (int r = 0; r < rc.ranks(); ++r) s += (r ? "," : "") + std::to_string(rc.columns(r));
  return s + "/d=" + std::to_string(rc.shape.d) + (rc.shape.labels ? "/labels" : "") +
         "/s=" + std::to_string(int(rc.shape.scale));
}

SigmoidRingCase make(std::vector<std::int64_t> rows, std::vector<std::int64_t> cols, std::int64_t d,
                     bool labels = false) {
  SigmoidRingCase rc;
  rc.rows = std::move(rows);
  rc.cols = std::move(cols);
  rc.shape.d = d;
  rc.shape.labels = labels;
  rc.tile = 16;
  return rc;
}

}  // namespace

TEST_CASE("contrastive/sigmoid/ring/values vs the concatenated batch") {
  std::vector<SigmoidRingCase> cases;
  cases.push_back(make({8, 8}, {}, 16));                        // even, the diagonal
  cases.push_back(make({17, 1, 33}, {}, 29));                   // uneven, one single-row rank
  cases.push_back(make({5, 9, 2, 13}, {7, 3, 11, 8}, 24));      // b_r != c_r, C >= B: global diagonal
  cases.push_back(make({6, 11, 4}, {19, 2, 23}, 31, true));     // global labels on any rank
  cases.push_back(make({1, 1}, {1, 1}, 1));                     // d = 1
  SigmoidRingCase big_scale = make({23, 18, 9}, {}, 40);        // s = 100, t = -10
  big_scale.shape.scale = 100.0;
  big_scale.shape.bias = -10.0;
  cases.push_back(big_scale);
  SigmoidRingCase bf16 = make({12, 20}, {30, 7}, 48, true);     // bf16 in, bf16 gradients
  bf16.shape.dtype = bf16.shape.grad_dtype = Dtype::bf16;
  cases.push_back(bf16);
  SigmoidRingCase fp16 = make({9, 9, 9}, {}, 33);               // fp16 in, fp32 gradients
  fp16.shape.dtype = Dtype::f16;
  cases.push_back(fp16);
  SigmoidRingCase no_dk = make({10, 7}, {}, 20);                // dk NULL on every rank
  no_dk.want_dk = false;
  cases.push_back(no_dk);
  SigmoidRingCase threads = make({40, 31, 26}, {}, 64);         // two threads, default tiles
  threads.threads = 2;
  threads.tile = 0;
  cases.push_back(threads);
  for (const SigmoidRingCase &rc : cases) {
    CAPTURE(name_of(rc));
    check_case(rc);
  }
}

TEST_CASE("contrastive/sigmoid/ring/deterministic, and one rank equals no communicator bit for bit") {
  SigmoidRingCase rc = make({21, 14, 30}, {}, 40, true);
  rc.threads = 2;
  const SigmoidCase global = rc.global_batch();
  const std::vector<RankRun> first = run_ring(rc, global), second = run_ring(rc, global);
  for (int r = 0; r < rc.ranks(); ++r) CHECK(same_bits(first[std::size_t(r)], second[std::size_t(r)]));

  SigmoidRingCase alone = make({65}, {}, 40, true);
  alone.threads = 2;
  const SigmoidCase whole = alone.global_batch();
  const std::vector<RankRun> ring = run_ring(alone, whole);
  const RankRun plain = run_rank(nullptr, alone, whole, 0);
  REQUIRE_MESSAGE(plain.status == FLATMEM_STATUS_SUCCESS, plain.error);
  CHECK(same_bits(ring[0], plain));
}

namespace {

struct Outcome {
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  std::string message;
  bool untouched = true;
};

// How one rank's value_and_grad deviates from the well-formed one.
struct Deviation {
  double bias = -10.0;
  bool no_loss = false, no_dbias = false, label_out_of_range = false, nan_in_k = false;
  bool give_workspace = false, softmax_call = false;
};

// value_and_grad on 3 ranks (b_r = 5, global labels); `deviate` edits rank r's.
std::vector<Outcome> on_three_ranks(const std::function<void(int, Deviation &)> &deviate) {
  SigmoidRingCase rc = make({5, 5, 5}, {}, 12, true);
  const SigmoidCase global = rc.global_batch();
  ring_test::LocalGroup group(3);
  return ring_test::on_ranks<Outcome>(3, [&](int r) {
    Deviation dev;
    deviate(r, dev);
    SigmoidRingCase mine_rc = rc;
    mine_rc.shape.bias = dev.bias;
    SigmoidCase mine = mine_rc.slice(global, r);
    if (dev.label_out_of_range) mine.labels.set(2, 15.0);  // C = 15 columns: 0 .. 14
    if (dev.nan_in_k) mine.k.set(1, 3, std::nan(""));
    flatmem_contrastive_options o = flatmem_test::make_options(
        dev.softmax_call ? FLATMEM_CONTRASTIVE_INFONCE : FLATMEM_CONTRASTIVE_SIGMOID);
    o.comm = group.comms[std::size_t(r)];
    flatmem_test::Handle h = flatmem_test::create_handle(o);
    SigmoidOutputs out = mine.outputs();
    Outcome outcome;
    if (dev.softmax_call) {  // the softmax forward, collective in the same sequence
      HostTensor row_lse = HostTensor::vector(Dtype::f32, 5);
      outcome.status = flatmem_contrastive_forward(h.get(), mine.q.dl(), mine.k.dl(), mine.labels.dl(),
                                                   mine.scale.dl(), out.loss.dl(), row_lse.dl(),
                                                   nullptr, nullptr, 0, nullptr);
    } else {
      char workspace[64];
      outcome.status = flatmem_contrastive_sigmoid_value_and_grad(
          h.get(), mine.q.dl(), mine.k.dl(), mine.labels.dl(), mine.scale.dl(), mine.bias.dl(),
          dev.no_loss ? nullptr : out.loss.dl(), out.dq.dl(), out.dk.dl(), out.ds.dl(),
          dev.no_dbias ? nullptr : out.dt.dl(), dev.give_workspace ? workspace : nullptr,
          dev.give_workspace ? sizeof workspace : 0, nullptr);
    }
    outcome.message = flatmem_last_error();
    for (const HostTensor *t : {&out.loss, &out.dq, &out.dk, &out.ds, &out.dt})
      outcome.untouched = outcome.untouched && t->all_bytes_are(flatmem_test::sentinel_byte);
    return outcome;
  });
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// Every rank failed with `status`, wrote nothing, and its message contains `part`.
void check_all_fail(const std::vector<Outcome> &outcomes, flatmem_status status, const std::string &part) {
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(outcomes[r].status == status, flatmem_status_string(outcomes[r].status), ": ",
                  outcomes[r].message);
    CHECK_MESSAGE(contains(outcomes[r].message, part), outcomes[r].message);
    CHECK(outcomes[r].untouched);
  }
}

}  // namespace

TEST_CASE("contrastive/sigmoid/ring/errors fail every rank together, naming the argument") {
  SUBCASE("the well-formed call succeeds (the deviations below are what fails)") {
    for (const Outcome &o : on_three_ranks([](int, Deviation &) {}))
      CHECK_MESSAGE(o.status == FLATMEM_STATUS_SUCCESS, o.message);
  }
  SUBCASE("a different logit bias on one rank") {
    check_all_fail(on_three_ranks([](int r, Deviation &d) { if (r == 1) d.bias = -9.0; }),
                   FLATMEM_STATUS_INVALID_ARGUMENT, "logit_bias: rank 0 has -10, rank 1 has -9");
  }
  SUBCASE("loss NULL on one rank only (the loss is summed over the ranks)") {
    check_all_fail(on_three_ranks([](int r, Deviation &d) { if (r == 2) d.no_loss = true; }),
                   FLATMEM_STATUS_INVALID_ARGUMENT, "loss: rank 0 has a tensor, rank 2 has NULL");
  }
  SUBCASE("dlogit_bias NULL on one rank only") {
    check_all_fail(on_three_ranks([](int r, Deviation &d) { if (r == 0) d.no_dbias = true; }),
                   FLATMEM_STATUS_INVALID_ARGUMENT, "dlogit_bias: rank 0 has NULL");
  }
  SUBCASE("a global label past C") {
    check_all_fail(on_three_ranks([](int r, Deviation &d) { if (r == 1) d.label_out_of_range = true; }),
                   FLATMEM_STATUS_INVALID_ARGUMENT, "labels: rank 1 has a label 15 outside [0, C = 15)");
  }
  SUBCASE("a NaN in one rank's k") {
    const auto outcomes = on_three_ranks([](int r, Deviation &d) { if (r == 2) d.nan_in_k = true; });
    check_all_fail(outcomes, FLATMEM_STATUS_NON_FINITE, "");
    CHECK_MESSAGE(contains(outcomes[2].message, "k"), outcomes[2].message);
    CHECK_MESSAGE(contains(outcomes[0].message, "rank 2 found a non-finite input"), outcomes[0].message);
  }
  SUBCASE("a workspace on one rank") {
    const auto outcomes = on_three_ranks([](int r, Deviation &d) { if (r == 0) d.give_workspace = true; });
    check_all_fail(outcomes, FLATMEM_STATUS_INVALID_ARGUMENT, "");
    CHECK_MESSAGE(contains(outcomes[0].message, "workspace: must be NULL"), outcomes[0].message);
    CHECK_MESSAGE(contains(outcomes[1].message, "rank 0 refused its arguments"), outcomes[1].message);
  }
  SUBCASE("a softmax handle's forward against the sigmoid call of the others") {
    check_all_fail(on_three_ranks([](int r, Deviation &d) { if (r == 1) d.softmax_call = true; }),
                   FLATMEM_STATUS_INVALID_ARGUMENT, "options.loss: rank 0 has SIGMOID, rank 1 has INFONCE");
  }
}

TEST_CASE("contrastive/sigmoid/ring/workspace queries return 0 for a handle with a communicator") {
  ring_test::LocalGroup group(1);
  flatmem_contrastive_options o = flatmem_test::make_options(FLATMEM_CONTRASTIVE_SIGMOID);
  o.comm = group.comms[0];
  flatmem_test::Handle h = flatmem_test::create_handle(o);
  const SigmoidCase c(flatmem_test::SigmoidShape{4, 4, 8});
  SigmoidOutputs out = c.outputs();
  size_t bytes = 123;
  REQUIRE(flatmem_contrastive_sigmoid_workspace_size(h.get(), c.q.dl(), c.k.dl(), out.dq.dl(),
                                                     out.dk.dl(), &bytes) == FLATMEM_STATUS_SUCCESS);
  CHECK(bytes == 0);
}
