// The CUDA panel engine's algorithm, proven on the CPU (src/contrastive/panels):
//
// 1. The plan: at b in {1, primes, 65536, 262144} and dials from 1 byte to
//    4 GiB, every region lies inside the workspace, none overlaps another,
//    cuBLASLt's is 256-byte aligned, the whole stays within the dial unless the
//    smallest panel does not fit (then over_budget says so), the panels cover
//    b and c exactly, and the default dial at b = 65536, d = 768 is <= 64 MiB.
// 2. The executor (the CUDA engine's launch sequence with sgemm and loops)
//    against the float64 materialised reference (support/reference.hpp) with
//    support/tolerance.hpp's bounds, over shapes with short last panels and
//    fold tiles (1, primes, 300 with 128-wide panels), symmetric and InfoNCE
//    (labels, c != b), one panel and many, dk in its own sweep and resident,
//    G kept (fp32 / TF32 operands) and rounded to bf16 (bound + 2^-8 |G|).
//    Then: the same bits on a second run and at another workspace alignment,
//    no byte written outside the workspace, NaN in q and a label out of range
//    giving a NaN loss. The fold tile's staging swizzle is a permutation whose
//    warp accesses are free of bank conflicts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "contrastive/panels/cpu_executor.hpp"
#include "contrastive/panels/passes.hpp"
#include "contrastive/panels/plan.hpp"
#include "contrastive/sigmoid_reference.hpp"
#include "support/contrastive.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"
#include "support/tolerance.hpp"

namespace panels = flatmem::contrastive::panels;
using flatmem::contrastive::Loss;
using namespace flatmem_test;

namespace {

std::vector<panels::Region> regions_of(const panels::PanelPlan &p) {
  std::vector<panels::Region> all;
  for (const panels::Region &r : {p.panel, p.row_parts, p.col_parts, p.row_state, p.col_state, p.loss_parts,
                                  p.row_acc, p.col_acc, p.ds_rows, p.lt})
    if (r.bytes != 0) all.push_back(r);
  return all;
}

void check_plan(const panels::PanelPlan &p, std::size_t budget) {
  INFO("b=", p.b, " c=", p.c, " d=", p.d, " budget=", budget, " panel=", p.rows, "x", p.cols);
  const std::size_t dial = budget == 0 ? panels::default_budget : budget;
  CHECK(p.budget == dial);
  if (!p.over_budget) CHECK(p.bytes <= dial);
  CHECK(p.rows >= 1);
  CHECK(p.cols >= 1);
  CHECK(p.rows <= p.b);
  CHECK(p.cols <= p.c);
  CHECK((p.rows == p.b || p.rows % panels::min_extent == 0));
  CHECK((p.cols == p.c || p.cols % panels::min_extent == 0));
  CHECK(p.row_panels * p.rows >= p.b);
  CHECK((p.row_panels - 1) * p.rows < p.b);
  CHECK(p.col_panels * p.cols >= p.c);
  CHECK((p.col_panels - 1) * p.cols < p.c);
  std::int64_t covered = 0;
  for (std::int64_t i = 0; i < p.row_panels; ++i) covered += p.row_count(i);
  CHECK(covered == p.b);
  covered = 0;
  for (std::int64_t j = 0; j < p.col_panels; ++j) covered += p.col_count(j);
  CHECK(covered == p.c);
  const auto all = regions_of(p);
  for (std::size_t a = 0; a < all.size(); ++a) {
    CHECK(all[a].end() + panels::lt_alignment <= p.bytes);  // room to align any base
    CHECK(all[a].offset % panels::lt_alignment == 0);
    for (std::size_t b = a + 1; b < all.size(); ++b)
      CHECK((all[a].end() <= all[b].offset || all[b].end() <= all[a].offset));
  }
  CHECK(p.lt.bytes == panels::lt_workspace_bytes);
  CHECK(p.panel.bytes == std::size_t(p.rows * p.cols * 4));
  if (p.call == panels::Call::forward) {
    CHECK(p.row_state.bytes == std::size_t(p.b) * 8);
    CHECK(p.row_parts.bytes == std::size_t(p.rows * p.col_folds) * 8);
    if (p.loss == Loss::symmetric) CHECK(p.col_parts.bytes == std::size_t(p.cols * p.row_folds) * 8);
  } else {
    if (p.want_dq) CHECK(p.row_acc.bytes == std::size_t(p.rows * p.d) * 4);
    if (p.want_dk) CHECK(p.col_acc.bytes == std::size_t((p.dk_resident ? p.c : p.cols) * p.d) * 4);
    if (p.want_ds) CHECK(p.ds_rows.bytes == std::size_t(p.b) * 8);
    CHECK((p.rows_sweep || p.cols_sweep || !(p.want_dq || p.want_dk || p.want_ds)));
    CHECK(p.cols_sweep == (p.want_dk && !p.dk_resident));
    if (p.want_dq) CHECK(p.rows_sweep);
  }
}

}  // namespace

TEST_CASE("contrastive/panels/plan/every_byte_accounted_for") {
  const std::int64_t sizes[] = {1, 2, 127, 128, 129, 131, 8191, 65536, 262144};
  const std::size_t budgets[] = {0, 1, std::size_t(1) << 20, std::size_t(16) << 20, std::size_t(256) << 20,
                                 std::size_t(4) << 30};
  for (std::int64_t b : sizes)
    for (std::int64_t d : {1, 97, 768})
      for (std::size_t budget : budgets) {
        check_plan(panels::plan_forward(b, b, d, Loss::symmetric, budget), budget);
        check_plan(panels::plan_forward(b, 2 * b + 1, d, Loss::infonce, budget), budget);
        for (int want = 1; want < 8; ++want)
          check_plan(panels::plan_backward(b, b, d, Loss::symmetric, want & 1, want & 2, want & 4, budget), budget);
      }
}

TEST_CASE("contrastive/panels/plan/default_dial_at_65536") {
  const auto f = panels::plan_forward(65536, 65536, 768, Loss::symmetric, 0);
  const auto g = panels::plan_backward(65536, 65536, 768, Loss::symmetric, true, true, true, 0);
  CHECK(!f.over_budget);
  CHECK(!g.over_budget);
  CHECK(f.bytes <= std::size_t(64) << 20);
  CHECK(g.bytes <= std::size_t(64) << 20);
  CHECK(g.rows >= 2048);  // panels large enough for the GEMMs to run at their rate
  CHECK(g.cols >= 1024);
  CHECK(!g.dk_resident);  // c x d fp32 = 192 MiB does not fit 64 MiB
  const auto big = panels::plan_backward(65536, 65536, 768, Loss::symmetric, true, true, true, std::size_t(1) << 30);
  CHECK(big.dk_resident);
  CHECK(!big.cols_sweep);
  // A dial too small for the smallest panel: the smallest panel, reported.
  const auto tiny = panels::plan_backward(65536, 65536, 768, Loss::symmetric, true, true, true, 1);
  CHECK(tiny.over_budget);
  CHECK(tiny.rows == panels::min_extent);
  CHECK(tiny.cols == panels::min_extent);
}

TEST_CASE("contrastive/panels/plan/refusals") {
  CHECK_THROWS(panels::plan_forward(0, 1, 1, Loss::symmetric, 0));
  CHECK_THROWS(panels::plan_forward(1, 1, 0, Loss::symmetric, 0));
  CHECK_THROWS(panels::plan_forward(4, 4, 4, Loss::sigmoid, 0));
  CHECK_THROWS(panels::plan_backward(std::int64_t(1) << 40, std::int64_t(1) << 40, std::int64_t(1) << 30,
                                     Loss::symmetric, true, true, true, 0));
}

// The ring plans once for its widest block and narrows the plan to each step's
// block: same panels and regions, the column panels of the narrower block.
TEST_CASE("contrastive/panels/plan/narrowed_to_a_ring_block") {
  const auto wide = panels::plan_backward(1000, 777, 64, Loss::symmetric, false, false, false, 0, {128, 256});
  REQUIRE(wide.cols == 256);
  REQUIRE(wide.col_panels == 4);
  for (const std::int64_t c : {std::int64_t(1), std::int64_t(255), std::int64_t(256), std::int64_t(257),
                               std::int64_t(513), std::int64_t(777)}) {
    CAPTURE(c);
    const auto p = panels::narrowed(wide, c);
    CHECK(p.c == c);
    CHECK(p.col_panels == (c + 255) / 256);
    CHECK(p.col_count(p.col_panels - 1) == c - (p.col_panels - 1) * 256);
    CHECK(p.rows == wide.rows);
    CHECK(p.cols == wide.cols);
    CHECK(p.row_panels == wide.row_panels);
    CHECK(p.panel.offset == wide.panel.offset);
    CHECK(p.panel.bytes == wide.panel.bytes);
    CHECK(p.lt.offset == wide.lt.offset);
    CHECK(p.bytes == wide.bytes);
  }
  CHECK_THROWS(panels::narrowed(wide, 0));
  CHECK_THROWS(panels::narrowed(wide, 778));
}

// The fold kernel's shared-memory staging (passes.hpp fold_slot): a permutation
// of the 64 x 128 tile, and each warp access pattern of the kernel touches 32
// distinct banks (4-byte words, 32 banks) -- the reason for the swizzle.
TEST_CASE("contrastive/panels/fold_staging_is_a_conflict_free_permutation") {
  using panels::fold_slot;
  const int rows = int(panels::fold_rows), cols = int(panels::fold_cols);
  std::vector<int> seen(std::size_t(rows * cols), 0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int slot = fold_slot(r, c);
      REQUIRE(slot >= 0);
      REQUIRE(slot < rows * cols);
      ++seen[std::size_t(slot)];
      CHECK(slot / cols == r);  // a row stays in its row
    }
  for (int n : seen) REQUIRE(n == 1);
  const auto conflict_free = [](auto &&slot_of_lane) {
    unsigned banks = 0;
    for (int lane = 0; lane < 32; ++lane) banks |= 1u << (slot_of_lane(lane) % 32);
    return banks == 0xffffffffu;
  };
  for (int warp = 0; warp < 8; ++warp) {  // the fold kernel's 256 threads
    // staging: thread e writes entry (e / 128, e % 128), e = 256 k + 32 warp + lane
    for (int k = 0; k < rows * cols / 256; ++k)
      CHECK(conflict_free([&](int lane) {
        const int e = 256 * k + 32 * warp + lane;
        return fold_slot(e / cols, e % cols);
      }));
    for (int i = 0; i < 32; ++i) {
      // row fold: thread t folds row t / 4, quarter t % 4, its i-th entry
      CHECK(conflict_free([&](int lane) {
        const int t = 32 * warp + lane;
        return fold_slot(t / 4, panels::row_quarter * (t % 4) + i);
      }));
      // column fold: thread t folds column t / 2, half t % 2, its i-th entry
      CHECK(conflict_free([&](int lane) {
        const int t = 32 * warp + lane;
        return fold_slot(panels::col_half * (t % 2) + i, t / 2);
      }));
    }
  }
}

TEST_CASE("contrastive/panels/engine_choice") {
  using flatmem::contrastive::CudaEngine;
  const std::int64_t big = panels::auto_min_extent;
  // automatic: bf16, b and c >= auto_min_extent, sm_90 or newer; softmax losses only
  CHECK(panels::use_panels(CudaEngine::automatic, Loss::symmetric, true, big, big, 9));
  CHECK(panels::use_panels(CudaEngine::automatic, Loss::infonce, true, big, 4 * big, 10));
  CHECK(!panels::use_panels(CudaEngine::automatic, Loss::symmetric, false, big, big, 9));  // fp32 / fp16
  CHECK(!panels::use_panels(CudaEngine::automatic, Loss::symmetric, true, big - 1, big, 9));
  CHECK(!panels::use_panels(CudaEngine::automatic, Loss::infonce, true, big, big - 1, 9));
  CHECK(!panels::use_panels(CudaEngine::automatic, Loss::symmetric, true, big, big, 8));  // sm_80
  CHECK(!panels::use_panels(CudaEngine::automatic, Loss::sigmoid, true, big, big, 9));
  // forced
  CHECK(panels::use_panels(CudaEngine::panels, Loss::symmetric, false, 1, 1, 0));
  CHECK(panels::use_panels(CudaEngine::panels, Loss::sigmoid, true, big, big, 9));  // forced: yes
  CHECK(!panels::use_panels(CudaEngine::tiles, Loss::symmetric, true, big, big, 9));
}

TEST_CASE("contrastive/panels/environment") {
  using flatmem::contrastive::CudaEngine;
  const auto with = [](const char *name, const char *value, auto &&body) {
    setenv(name, value, 1);
    body();
    unsetenv(name);
  };
  CHECK(panels::engine_from_environment() == CudaEngine::automatic);
  with("FLATMEM_CUDA_ENGINE", "auto", [] { CHECK(panels::engine_from_environment() == CudaEngine::automatic); });
  with("FLATMEM_CUDA_ENGINE", "tiles", [] { CHECK(panels::engine_from_environment() == CudaEngine::tiles); });
  with("FLATMEM_CUDA_ENGINE", "panels", [] { CHECK(panels::engine_from_environment() == CudaEngine::panels); });
  with("FLATMEM_CUDA_ENGINE", "Panels", [] { CHECK_THROWS_WITH(panels::engine_from_environment(),
                                                              doctest::Contains("FLATMEM_CUDA_ENGINE")); });
  CHECK(panels::budget_from_environment() == 0);
  with("FLATMEM_CUDA_PANEL_BYTES", "1G", [] { CHECK(panels::budget_from_environment() == std::size_t(1) << 30); });
  with("FLATMEM_CUDA_PANEL_BYTES", "96M", [] { CHECK(panels::budget_from_environment() == std::size_t(96) << 20); });
  with("FLATMEM_CUDA_PANEL_BYTES", "12345", [] { CHECK(panels::budget_from_environment() == 12345); });
  for (const char *bad : {"-1", "1T", "M", "1GB", "99999999999999999999"})
    with("FLATMEM_CUDA_PANEL_BYTES", bad, [] { CHECK_THROWS_WITH(panels::budget_from_environment(),
                                                                doctest::Contains("FLATMEM_CUDA_PANEL_BYTES")); });
  with("FLATMEM_CUDA_PANEL_SHAPE", "4096x2048", [] {
    const panels::Shape s = panels::shape_from_environment();
    CHECK(s.rows == 4096);
    CHECK(s.cols == 2048);
  });
  for (const char *bad : {"4096", "x2048", "0x5", "4096x", "4096x99999", "4096x2048x1"})
    with("FLATMEM_CUDA_PANEL_SHAPE", bad, [] { CHECK_THROWS_WITH(panels::shape_from_environment(),
                                                                doctest::Contains("FLATMEM_CUDA_PANEL_SHAPE")); });
  // A forced shape is used as given (clamped to the matrix), over the dial if need be.
  const auto p = panels::plan_backward(65536, 65536, 768, Loss::symmetric, true, true, true, 0, {8192, 8192});
  CHECK(p.rows == 8192);
  CHECK(p.cols == 8192);
  CHECK(p.over_budget);
  const auto q = panels::plan_forward(300, 200, 8, Loss::infonce, 0, {4096, 4096});
  CHECK(q.rows == 300);
  CHECK(q.cols == 200);
}

namespace {

struct Case {
  bool symmetric = true;
  std::int64_t b = 1, c = 1, d = 1;
  std::size_t budget = 0;
  int g_bits = 32;
  bool labels = false;
};

struct Outputs {
  float loss = 0.0f, ds = 0.0f;
  std::vector<float> row_lse, col_lse, dq, dk;
};

std::string name_of(const Case &k) {
  return std::string(k.symmetric ? "symmetric" : "infonce") + " b=" + std::to_string(k.b) + " c=" +
         std::to_string(k.c) + " d=" + std::to_string(k.d) + " budget=" + std::to_string(k.budget) +
         " g_bits=" + std::to_string(k.g_bits);
}

Outputs run(const Case &k, const std::vector<float> &q, const std::vector<float> &kk,
            const std::vector<std::int64_t> &labels, float scale, float dloss, std::size_t misalign = 0) {
  const Loss loss = k.symmetric ? Loss::symmetric : Loss::infonce;
  panels::CpuProblem pr;
  pr.q = q.data(), pr.k = kk.data();
  pr.labels = labels.empty() ? nullptr : labels.data();
  pr.scale = scale, pr.g_bits = k.g_bits;
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_BASELINE;
  REQUIRE(flatmem_cpu_isa_get(&in_use, nullptr) == FLATMEM_STATUS_SUCCESS);
  pr.isa = flatmem::cpu_isa::Isa(in_use);
  Outputs o;
  o.row_lse.resize(k.b), o.col_lse.resize(k.symmetric ? k.c : 0), o.dq.resize(k.b * k.d), o.dk.resize(k.c * k.d);
  const auto fp = panels::plan_forward(k.b, k.c, k.d, loss, k.budget);
  {
    GuardedBuffer ws(fp.bytes, misalign);
    panels::cpu_forward(fp, pr, ws.data(), &o.loss, o.row_lse.data(), k.symmetric ? o.col_lse.data() : nullptr);
    CHECK(ws.guards_intact());
  }
  const auto bp = panels::plan_backward(k.b, k.c, k.d, loss, true, true, true, k.budget);
  GuardedBuffer ws(bp.bytes, misalign);
  panels::cpu_backward(bp, pr, o.row_lse.data(), k.symmetric ? o.col_lse.data() : nullptr, dloss, ws.data(),
                       o.dq.data(), o.dk.data(), &o.ds);
  CHECK(ws.guards_intact());
  return o;
}

bool same_bits(const Outputs &a, const Outputs &b) {
  const auto eq = [](const std::vector<float> &x, const std::vector<float> &y) {
    // (an empty vector's data() may be null, which memcmp must not get)
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  return std::memcmp(&a.loss, &b.loss, 4) == 0 && std::memcmp(&a.ds, &b.ds, 4) == 0 && eq(a.row_lse, b.row_lse) &&
         eq(a.col_lse, b.col_lse) && eq(a.dq, b.dq) && eq(a.dk, b.dk);
}

void check_case(const Case &k, std::uint64_t seed) {
  INFO(name_of(k));
  Random rng(seed);
  std::vector<float> q(k.b * k.d), kk(k.c * k.d);
  const auto fill = [&](std::vector<float> &m, std::int64_t rows) {  // unit rows, as CLIP's features
    for (std::int64_t r = 0; r < rows; ++r) {
      double norm = 0.0;
      std::vector<double> row(k.d);
      for (auto &v : row) v = rng.normal(), norm += v * v;
      for (std::int64_t e = 0; e < k.d; ++e) m[r * k.d + e] = float(row[e] / std::sqrt(norm));
    }
  };
  fill(q, k.b), fill(kk, k.c);
  std::vector<std::int64_t> labels;
  if (k.labels)
    for (std::int64_t i = 0; i < k.b; ++i) labels.push_back(rng.below(k.c));
  const float scale = 14.285714f, dloss = 0.75f;

  ReferenceProblem p;
  p.symmetric = k.symmetric, p.b = k.b, p.c = k.c, p.d = k.d;
  p.q.assign(q.begin(), q.end()), p.k.assign(kk.begin(), kk.end());
  p.labels = labels;
  p.scale = scale, p.dloss = dloss;
  const ReferenceResult r = reference_loss(p);
  const ForwardTolerance ft = forward_tolerance(p, r);
  const BackwardTolerance bt = backward_tolerance(p, r, ft, Dtype::f32, Dtype::f32);
  const double g_round = k.g_bits == 16 ? 0x1p-8 * slack * scale : 0.0;  // Gt rounded to bf16

  const Outputs o = run(k, q, kk, labels, scale, dloss);
  CHECK(std::fabs(o.loss - r.loss) <= ft.loss);
  for (std::int64_t i = 0; i < k.b; ++i) CHECK(std::fabs(o.row_lse[i] - r.row_lse[i]) <= ft.row_lse[i]);
  if (k.symmetric)
    for (std::int64_t j = 0; j < k.c; ++j) CHECK(std::fabs(o.col_lse[j] - r.col_lse[j]) <= ft.col_lse[j]);
  int bad = 0;
  for (std::int64_t e = 0; e < k.b * k.d; ++e)
    bad += !(std::fabs(o.dq[e] - r.dq[e]) <= bt.dq[e] + g_round * r.dq_abs[e]);
  for (std::int64_t e = 0; e < k.c * k.d; ++e)
    bad += !(std::fabs(o.dk[e] - r.dk[e]) <= bt.dk[e] + g_round * r.dk_abs[e]);
  CHECK(bad == 0);
  CHECK(std::fabs(o.ds - r.ds) <= bt.ds + g_round * r.ds_abs / scale);
  CHECK(same_bits(o, run(k, q, kk, labels, scale, dloss)));
  CHECK(same_bits(o, run(k, q, kk, labels, scale, dloss, 8)));
}

}  // namespace

TEST_CASE("contrastive/panels/executor/symmetric") {
  for (int g_bits : {32, 16})
    for (Case k : {Case{true, 1, 1, 1}, Case{true, 7, 7, 5}, Case{true, 131, 131, 33},
                   Case{true, 300, 300, 64, 1}, Case{true, 257, 257, 97, 1}})
      k.g_bits = g_bits, check_case(k, 11 + std::uint64_t(k.b));
}

TEST_CASE("contrastive/panels/executor/infonce") {
  for (int g_bits : {32, 16})
    for (Case k : {Case{false, 1, 1, 3, 0, 32, false}, Case{false, 13, 29, 7, 0, 32, true},
                   Case{false, 300, 131, 48, 1, 32, true}, Case{false, 131, 389, 17, 1, 32, true}})
      k.g_bits = g_bits, check_case(k, 5 + std::uint64_t(k.c));
}

TEST_CASE("contrastive/panels/executor/dk_resident_equals_its_own_sweep") {
  // A dial that holds c x d beside the panel: one sweep; the same values as
  // dk's own sweep within the bound (the sums run in another order).
  Case k{true, 300, 300, 64, std::size_t(64) << 20};
  const auto resident = panels::plan_backward(300, 300, 64, Loss::symmetric, true, true, true, k.budget);
  CHECK(resident.dk_resident);
  check_case(k, 3);
}

TEST_CASE("contrastive/panels/executor/nan_and_bad_labels") {
  Case k{false, 140, 150, 8, 1, 32, true};
  std::vector<float> q(k.b * k.d, 0.1f), kk(k.c * k.d, 0.2f);
  std::vector<std::int64_t> labels(k.b, 3);
  const Outputs good = run(k, q, kk, labels, 2.0f, 1.0f);
  CHECK(std::isfinite(good.loss));
  labels[139] = 150;  // out of range, in the second row panel
  CHECK(std::isnan(run(k, q, kk, labels, 2.0f, 1.0f).loss));
  labels[139] = 3;
  q[130 * k.d + 2] = NAN;
  const Outputs nan = run(k, q, kk, labels, 2.0f, 1.0f);
  CHECK(std::isnan(nan.loss));
  CHECK(std::isnan(nan.row_lse[130]));
  CHECK(std::isfinite(nan.row_lse[0]));
}

namespace {

// The sigmoid loss's value_and_grad on the panel walk against its float64
// reference (contrastive/sigmoid_reference.hpp's bounds; + 2^-8 s |G| |x| where
// Gt is rounded to bf16 for the GEMMs).
void check_sigmoid(std::int64_t b, std::int64_t c, std::int64_t d, std::size_t budget, bool labels, int g_bits,
                   std::uint64_t seed) {
  INFO("sigmoid b=", b, " c=", c, " d=", d, " budget=", budget, " labels=", labels, " g_bits=", g_bits);
  Random rng(seed);
  std::vector<float> q(b * d), k(c * d);
  for (auto *m : {&q, &k})
    for (float &x : *m) x = float(rng.normal() / std::sqrt(double(d)));
  std::vector<std::int64_t> y;
  if (labels)
    for (std::int64_t i = 0; i < b; ++i) y.push_back(rng.below(c));
  const float scale = 10.0f, bias = -10.0f, dloss = 0.75f;
  SigmoidProblem sp;
  sp.b = b, sp.c = c, sp.d = d;
  sp.q.assign(q.begin(), q.end()), sp.k.assign(k.begin(), k.end());
  sp.labels = y;
  sp.scale = scale, sp.bias = bias, sp.dloss = dloss;
  const SigmoidResult r = sigmoid_reference(sp);
  const SigmoidTolerance t = sigmoid_tolerance(sp, r, Dtype::f32, Dtype::f32);
  const double g_round = g_bits == 16 ? 0x1p-8 * 2.0 * scale : 0.0;

  panels::CpuProblem pr;
  pr.q = q.data(), pr.k = k.data(), pr.labels = y.empty() ? nullptr : y.data();
  pr.scale = scale, pr.bias = bias, pr.g_bits = g_bits;
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_BASELINE;
  REQUIRE(flatmem_cpu_isa_get(&in_use, nullptr) == FLATMEM_STATUS_SUCCESS);
  pr.isa = flatmem::cpu_isa::Isa(in_use);
  const auto plan = panels::plan_backward(b, c, d, Loss::sigmoid, true, true, true, budget);
  const auto run = [&](std::vector<float> &dq, std::vector<float> &dk, float (&scalars)[3]) {
    dq.assign(b * d, 0.0f), dk.assign(c * d, 0.0f);
    GuardedBuffer ws(plan.bytes);
    panels::cpu_sigmoid(plan, pr, dloss, ws.data(), &scalars[0], dq.data(), dk.data(), &scalars[1], &scalars[2]);
    CHECK(ws.guards_intact());
  };
  std::vector<float> dq, dk, dq2, dk2;
  float scalars[3], again[3];
  run(dq, dk, scalars);
  CHECK(std::fabs(scalars[0] - r.loss) <= t.loss);
  CHECK(std::fabs(scalars[1] - r.ds) <= t.ds + g_round * r.sum_abs_g_r / scale);
  CHECK(std::fabs(scalars[2] - r.dt) <= t.dt + g_round * r.sum_abs_g / scale);
  int bad = 0;
  for (std::int64_t e = 0; e < b * d; ++e) bad += !(std::fabs(dq[e] - r.dq[e]) <= t.dq[e] + g_round * r.dq_abs[e]);
  for (std::int64_t e = 0; e < c * d; ++e) bad += !(std::fabs(dk[e] - r.dk[e]) <= t.dk[e] + g_round * r.dk_abs[e]);
  CHECK(bad == 0);
  run(dq2, dk2, again);  // bitwise repeatable
  CHECK(std::memcmp(scalars, again, sizeof scalars) == 0);
  CHECK(std::memcmp(dq.data(), dq2.data(), dq.size() * 4) == 0);
  CHECK(std::memcmp(dk.data(), dk2.data(), dk.size() * 4) == 0);
}

}  // namespace

TEST_CASE("contrastive/panels/executor/sigmoid") {
  for (int g_bits : {32, 16}) {
    check_sigmoid(1, 1, 1, 0, false, g_bits, 1);
    check_sigmoid(13, 29, 7, 0, true, g_bits, 2);
    check_sigmoid(300, 300, 48, 1, false, g_bits, 3);     // 3 x 3 panels of 128, short edges
    check_sigmoid(131, 389, 17, 1, true, g_bits, 4);      // labels, c != b, dk in its own sweep
    check_sigmoid(300, 257, 33, std::size_t(64) << 20, true, g_bits, 5);  // dk resident
  }
}
