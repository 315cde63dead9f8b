// Values of the tiled contrastive loss against the materialised double
// reference (support/reference.hpp): loss, row_lse, col_lse, dq, dk and
// dlogit_scale over many shapes, dtypes, layouts and options. Tolerances are
// the worst-case bounds derived in support/tolerance.hpp; each case's comment
// says what it exercises.
//
// Tile note: the library shrinks tiles so that an extent spans at least four
// tiles (down to 16), so b = 263 with the default tile already walks several
// tiles; tile_rows/tile_cols = 16/24 force many short tiles at small sizes;
// b = 1031 with tile 256 runs full 256-row tiles and a 7-row last one, and
// b = 2053 does the same with the default tile extent (512 at the time of
// writing: 4 * 512 + 5).
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "support/compare.hpp"
#include "support/contrastive.hpp"
#include "support/half.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"
#include "support/saturation.hpp"
#include "support/tensor.hpp"
#include "support/tolerance.hpp"

using namespace flatmem_test;

namespace {

enum class Labels { none, shuffled, duplicates };
enum class Workspace { handle, exact, misaligned };

struct ValueCase {
  flatmem_contrastive_loss loss = FLATMEM_CONTRASTIVE_SYMMETRIC;
  Dtype dtype = Dtype::f32;         // q and k
  std::int64_t b = 1, c = 0, d = 1;  // c = 0: c = b
  int tile_rows = 0, tile_cols = 0;
  double scale = 10.0;
  bool unit_rows = true;  // rows of norm 1 (CLIP features); else N(0, sigma^2) entries
  double sigma = 1.0;
  // >= 0: k's row j is q's row j plus `matched` times a random unit row,
  // renormalised (c = b): well-matched pairs, whose loss is about 0.
  double matched = -1.0;
  // >= 0: saturated pairs (support/saturation.hpp): k's rows pairwise at about
  // this cosine, q_i = k_{y_i} exactly; checked against the saturation bound too.
  double saturated = -1.0;
  Labels labels = Labels::none;
  std::int64_t q_pad = 0, k_pad = 0, dq_pad = 0, dk_pad = 0;  // row stride = d + pad
  Dtype dq_out = Dtype::f32, dk_out = Dtype::f32;
  bool want_dq = true, want_dk = true, want_ds = true;
  std::optional<double> dloss;  // nullopt: pass NULL (g = 1)
  Workspace workspace = Workspace::handle;
  bool scalars_as_shape_1 = false;  // logit_scale, loss, dloss, dlogit_scale as shape (1,) instead of ndim 0
  int threads = 0;
  std::int64_t fp32_precision = FLATMEM_FP32_PRECISION_DEFAULT;  // options.fp32_precision
  std::uint64_t seed = 1;
};

bool is_symmetric(const ValueCase &vc) { return vc.loss != FLATMEM_CONTRASTIVE_INFONCE; }
std::int64_t columns(const ValueCase &vc) { return vc.c ? vc.c : vc.b; }

// The inputs of one case, as the library will see them.
struct Inputs {
  HostTensor q, k, labels, scale;
  bool has_labels = false;
  const DLTensor *labels_dl() const { return has_labels ? labels.dl() : nullptr; }
};

// k_j = (q_j + noise k_j) / |q_j + noise k_j|, with k's random rows as noise.
void match_rows(const HostTensor &q, HostTensor &k, double noise) {
  REQUIRE(q.rows() == k.rows());
  for (std::int64_t r = 0; r < k.rows(); ++r) {
    std::vector<double> row(std::size_t(k.cols()));
    double norm = 0.0;
    for (std::int64_t t = 0; t < k.cols(); ++t) {
      row[std::size_t(t)] = q.get(r, t) + noise * k.get(r, t);
      norm += row[std::size_t(t)] * row[std::size_t(t)];
    }
    for (std::int64_t t = 0; t < k.cols(); ++t) k.set(r, t, row[std::size_t(t)] / std::sqrt(norm));
  }
}

Inputs make_inputs(const ValueCase &vc) {
  Random rng(vc.seed);
  Inputs in;
  const std::int64_t c = columns(vc);
  in.q = HostTensor::matrix(vc.dtype, vc.b, vc.d, vc.d + vc.q_pad);
  in.k = HostTensor::matrix(vc.dtype, c, vc.d, vc.d + vc.k_pad);
  fill_features(in.q, rng, vc.sigma, vc.unit_rows);
  fill_features(in.k, rng, vc.sigma, vc.unit_rows);
  if (vc.matched >= 0.0) match_rows(in.q, in.k, vc.matched);
  if (vc.saturated >= 0.0) fill_saturated(in.k, rng, vc.saturated);
  if (vc.labels != Labels::none) {
    in.has_labels = true;
    in.labels = HostTensor::vector(Dtype::i64, vc.b);
    std::vector<std::int64_t> perm(static_cast<std::size_t>(c));
    std::iota(perm.begin(), perm.end(), 0);
    for (std::int64_t i = c - 1; i > 0; --i) std::swap(perm[std::size_t(i)], perm[std::size_t(rng.below(i + 1))]);
    for (std::int64_t i = 0; i < vc.b; ++i) {
      std::int64_t y = vc.labels == Labels::shuffled ? perm[std::size_t(i % c)] : rng.below(c);
      // duplicates: make sure some rows share a positive column, and the
      // extreme columns 0 and c - 1 are used.
      if (vc.labels == Labels::duplicates && vc.b > 1) {
        if (i == 1) y = std::int64_t(in.labels.get(0));
        if (i == 2) y = 0;
        if (i == 3) y = c - 1;
      }
      in.labels.set(i, double(y));
    }
  }
  if (vc.saturated >= 0.0)  // each row of q is its positive column of k, bit for bit
    for (std::int64_t i = 0; i < vc.b; ++i) {
      const std::int64_t y = in.has_labels ? std::int64_t(in.labels.get(i)) : i;
      for (std::int64_t t = 0; t < vc.d; ++t) in.q.set(i, t, in.k.get(y, t));
    }
  in.scale = HostTensor::scalar(Dtype::f32, vc.scale, vc.scalars_as_shape_1);
  return in;
}

struct ForwardOut {
  HostTensor loss, row_lse, col_lse;
};
struct BackwardOut {
  HostTensor dq, dk, ds;
};

// Outputs start as NaN (padding keeps the sentinel bytes): results must be
// written, never accumulated into what was there ("overwritten, not
// accumulated into").
void fill_nan(HostTensor &t) {
  for (std::int64_t r = 0; r < t.rows(); ++r)
    for (std::int64_t c = 0; c < t.cols(); ++c) t.set(r, c, std::nan(""));
}

std::optional<GuardedBuffer> make_workspace(Workspace w, std::size_t bytes) {
  if (w == Workspace::handle) return std::nullopt;
  // 1 byte past a 64-byte boundary: the worst case for a library that aligns
  // internally (63 bytes of the slack lost).
  return GuardedBuffer(bytes, w == Workspace::misaligned ? 1 : 0);
}

ForwardOut run_forward(flatmem_contrastive_t *h, const ValueCase &vc, const Inputs &in, Workspace w) {
  ForwardOut out;
  out.loss = HostTensor::scalar(Dtype::f32, std::nan(""), vc.scalars_as_shape_1);
  out.row_lse = HostTensor::vector(Dtype::f32, vc.b);
  fill_nan(out.row_lse);
  if (is_symmetric(vc)) {
    out.col_lse = HostTensor::vector(Dtype::f32, columns(vc));
    fill_nan(out.col_lse);
  }
  std::size_t bytes = 0;
  REQUIRE(flatmem_contrastive_forward_workspace_size(h, in.q.dl(), in.k.dl(), &bytes) == FLATMEM_STATUS_SUCCESS);
  std::optional<GuardedBuffer> ws = make_workspace(w, bytes);
  const flatmem_status status = flatmem_contrastive_forward(
      h, in.q.dl(), in.k.dl(), in.labels_dl(), in.scale.dl(), out.loss.dl(), out.row_lse.dl(),
      is_symmetric(vc) ? out.col_lse.dl() : nullptr, ws ? ws->data() : nullptr, ws ? ws->size() : 0, nullptr);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  CHECK(std::string(flatmem_last_error()).empty());
  if (ws) CHECK_MESSAGE(ws->guards_intact(), "forward wrote outside the workspace it was given");
  return out;
}

BackwardOut run_backward(flatmem_contrastive_t *h, const ValueCase &vc, const Inputs &in, const ForwardOut &fwd,
                         const HostTensor *dloss, Workspace w, Dtype dq_out, Dtype dk_out) {
  BackwardOut out;
  if (vc.want_dq) {
    out.dq = HostTensor::matrix(dq_out, vc.b, vc.d, vc.d + vc.dq_pad);
    fill_nan(out.dq);
  }
  if (vc.want_dk) {
    out.dk = HostTensor::matrix(dk_out, columns(vc), vc.d, vc.d + vc.dk_pad);
    fill_nan(out.dk);
  }
  if (vc.want_ds) out.ds = HostTensor::scalar(Dtype::f32, std::nan(""), vc.scalars_as_shape_1);
  DLTensor *dq = vc.want_dq ? out.dq.dl() : nullptr;
  DLTensor *dk = vc.want_dk ? out.dk.dl() : nullptr;
  std::size_t bytes = 0;
  REQUIRE(flatmem_contrastive_backward_workspace_size(h, in.q.dl(), in.k.dl(), dq, dk, &bytes) ==
          FLATMEM_STATUS_SUCCESS);
  std::optional<GuardedBuffer> ws = make_workspace(w, bytes);
  const flatmem_status status = flatmem_contrastive_backward(
      h, in.q.dl(), in.k.dl(), in.labels_dl(), in.scale.dl(), fwd.row_lse.dl(),
      is_symmetric(vc) ? fwd.col_lse.dl() : nullptr, dloss ? dloss->dl() : nullptr, dq, dk,
      vc.want_ds ? out.ds.dl() : nullptr, ws ? ws->data() : nullptr, ws ? ws->size() : 0, nullptr);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  CHECK(std::string(flatmem_last_error()).empty());
  if (ws) CHECK_MESSAGE(ws->guards_intact(), "backward wrote outside the workspace it was given");
  return out;
}

void check_values(const ValueCase &vc) {
  const bool symmetric = is_symmetric(vc);
  const Inputs in = make_inputs(vc);
  const std::vector<double> q_before = in.q.values(), k_before = in.k.values();
  flatmem_contrastive_options options = make_options(vc.loss, vc.threads, vc.tile_rows, vc.tile_cols);
  options.fp32_precision = vc.fp32_precision;
  Handle h = create_handle(options);

  std::optional<HostTensor> dloss;
  if (vc.dloss) dloss = HostTensor::scalar(Dtype::f32, *vc.dloss, vc.scalars_as_shape_1);
  const double g = dloss ? dloss->get(0) : 1.0;  // the fp32 value the library reads

  const ReferenceProblem problem = reference_problem(symmetric, in.q, in.k, in.has_labels ? &in.labels : nullptr,
                                                     in.scale, g);
  const ReferenceResult ref = reference_loss(problem);
  const ForwardTolerance ftol = forward_tolerance(problem, ref);

  // --- forward -------------------------------------------------------------
  const ForwardOut fwd = run_forward(h.get(), vc, in, vc.workspace);
  check_close("loss", fwd.loss, ref.loss, ftol.loss);
  // Every term lse_i - x_{i, y_i} is >= 0 (the positive is one of the summed
  // logits); the library computes x_{i, y_i} by the arithmetic that fed
  // lse_i, so rounding cannot make the loss negative either.
  CHECK_MESSAGE(fwd.loss.get(0) >= 0.0, "loss ", fwd.loss.get(0), " < 0");
  check_close("row_lse", fwd.row_lse, ref.row_lse, ftol.row_lse);
  if (symmetric) check_close("col_lse", fwd.col_lse, ref.col_lse, ftol.col_lse);

  // --- backward ------------------------------------------------------------
  const BackwardOut bwd =
      run_backward(h.get(), vc, in, fwd, dloss ? &*dloss : nullptr, vc.workspace, vc.dq_out, vc.dk_out);
  const BackwardTolerance btol =
      backward_tolerance(problem, ref, ftol, vc.dq_out, vc.dk_out, vc.dtype, vc.fp32_precision);
  if (vc.want_dq) {
    check_close("dq", bwd.dq, ref.dq, btol.dq);
    CHECK_MESSAGE(bwd.dq.padding_untouched(), "dq: bytes between rows (row stride > d) were written");
  }
  if (vc.want_dk) {
    check_close("dk", bwd.dk, ref.dk, btol.dk);
    CHECK_MESSAGE(bwd.dk.padding_untouched(), "dk: bytes between rows (row stride > d) were written");
  }
  if (vc.want_ds) check_close("dlogit_scale", bwd.ds, ref.ds, btol.ds);
  if (vc.saturated >= 0.0) {  // as exact as a materialised fp32 loss (support/saturation.hpp)
    check_close("saturated loss", fwd.loss, ref.loss, saturation_tolerance({ref.loss})[0]);
    if (vc.want_dq) check_close("saturated dq", bwd.dq, ref.dq, saturation_tolerance(ref.dq));
    if (vc.want_dk) check_close("saturated dk", bwd.dk, ref.dk, saturation_tolerance(ref.dk));
    if (vc.want_ds) check_close("saturated dlogit_scale", bwd.ds, ref.ds, saturation_tolerance({ref.ds})[0]);
  }

  // Inputs are read-only.
  CHECK(in.q.values() == q_before);
  CHECK(in.k.values() == k_before);
  CHECK(in.q.padding_untouched());
  CHECK(in.k.padding_untouched());

  // A caller workspace must give exactly what the handle's own buffer gives.
  if (vc.workspace != Workspace::handle) {
    const ForwardOut fwd_own = run_forward(h.get(), vc, in, Workspace::handle);
    CHECK(fwd_own.loss.same_bits(fwd.loss));
    CHECK(fwd_own.row_lse.same_bits(fwd.row_lse));
    if (symmetric) CHECK(fwd_own.col_lse.same_bits(fwd.col_lse));
    const BackwardOut bwd_own =
        run_backward(h.get(), vc, in, fwd, dloss ? &*dloss : nullptr, Workspace::handle, vc.dq_out, vc.dk_out);
    if (vc.want_dq) CHECK(bwd_own.dq.same_bits(bwd.dq));
    if (vc.want_dk) CHECK(bwd_own.dk.same_bits(bwd.dk));
    if (vc.want_ds) CHECK(bwd_own.ds.same_bits(bwd.ds));
  }

  // A 16-bit gradient is the fp32 gradient rounded once (header: accumulated
  // in fp32 and rounded at the end), so it must equal our own rounding of
  // the fp32 output of the same call, bit for bit.
  if (vc.dq_out != Dtype::f32 || vc.dk_out != Dtype::f32) {
    const BackwardOut wide =
        run_backward(h.get(), vc, in, fwd, dloss ? &*dloss : nullptr, Workspace::handle, Dtype::f32, Dtype::f32);
    const auto check_rounded = [](const char *name, const HostTensor &narrow, const HostTensor &fp32) {
      std::int64_t mismatches = 0;
      for (std::int64_t r = 0; r < narrow.rows(); ++r)
        for (std::int64_t c = 0; c < narrow.cols(); ++c) {
          const float v = float(fp32.get(r, c));
          const std::uint16_t expected =
              narrow.dtype() == Dtype::bf16 ? bf16_from_float(v) : f16_from_float(v);
          if (narrow.bits(r, c) != expected) ++mismatches;
        }
      CHECK_MESSAGE(mismatches == 0, name, ": ", mismatches,
                    " elements differ from the fp32 gradient rounded to nearest even");
    };
    if (vc.want_dq && vc.dq_out != Dtype::f32) check_rounded("dq", bwd.dq, wide.dq);
    if (vc.want_dk && vc.dk_out != Dtype::f32) check_rounded("dk", bwd.dk, wide.dk);
  }
}

// dL/ds from the library's backward against a central difference of the
// library's own forward: (L(s + h) - L(s - h)) / (2h).
//
// Error of the difference quotient: the logit products raw_ij = <q_i, k_j>
// do not depend on s, so the forward evaluates a smooth function of s,
// L(s raw), up to the rounding e(s) of s * raw (u s |raw| <= u s A), of the
// exps and sums ((2n + 8) u) and of the fp32 loss (u |L|):
//     |fd - L'(s)| <= h^2 / 6 max|L'''| + max|e| / h.
// L is a mean of log-sum-exps of s a_j (a = <q, k>, minus a linear term), and
// d^3/ds^3 LSE_j(s a_j) is the third central moment of a under softmax(s a),
// at most r^3 / (6 sqrt 3) < r^3 / 8 for values spread over an interval of
// length r (two-point distributions are extremal). h minimises the sum; the
// library's ds itself is within the bound of support/tolerance.hpp.
void check_ds_by_finite_difference(const ValueCase &vc) {
  const bool symmetric = is_symmetric(vc);
  const Inputs in = make_inputs(vc);
  flatmem_contrastive_options options = make_options(vc.loss, vc.threads, vc.tile_rows, vc.tile_cols);
  options.fp32_precision = vc.fp32_precision;
  Handle h = create_handle(options);
  const ReferenceProblem problem =
      reference_problem(symmetric, in.q, in.k, in.has_labels ? &in.labels : nullptr, in.scale, 1.0);
  const ReferenceResult ref = reference_loss(problem);
  const ForwardTolerance ftol = forward_tolerance(problem, ref);
  const BackwardTolerance btol = backward_tolerance(problem, ref, ftol, Dtype::f32, Dtype::f32);

  const double s = in.scale.get(0);
  const double n = double(std::max(problem.b, problem.c));
  const double eval_error =
      slack * (u32 * s * ref.max_abs_dot + (2.0 * n + 8.0) * u32 + 2.0 * u32 * std::fabs(ref.loss));
  const double third = std::pow(ref.max_spread, 3) / 8.0;
  // argmin of h^2/6 * third + eval_error / h, rounded down to a power of two
  double step = std::cbrt(3.0 * eval_error / std::max(third, 1e-30));
  step = std::ldexp(1.0, int(std::floor(std::log2(std::min(step, s / 4.0)))));

  const auto loss_at = [&](float scale_value) {
    Inputs moved = make_inputs(vc);  // same seed: the same q, k and labels
    moved.scale.set(0, scale_value);
    return run_forward(h.get(), vc, moved, Workspace::handle).loss.get(0);
  };
  const float s_plus = float(s + step), s_minus = float(s - step);  // the fp32 values actually used
  const double fd = (loss_at(s_plus) - loss_at(s_minus)) / (double(s_plus) - double(s_minus));
  const double fd_error = step * step / 6.0 * third + eval_error / step * 2.0;  // two evaluations

  ValueCase backward_case = vc;
  backward_case.want_dq = backward_case.want_dk = false;
  backward_case.want_ds = true;
  const ForwardOut fwd = run_forward(h.get(), vc, in, Workspace::handle);
  const BackwardOut bwd = run_backward(h.get(), backward_case, in, fwd, nullptr, Workspace::handle, Dtype::f32,
                                       Dtype::f32);
  INFO("step h = ", step, ", finite difference ", fd, ", reference ", ref.ds);
  check_close("dlogit_scale vs finite difference", bwd.ds, fd, fd_error + btol.ds);
  // and the finite difference agrees with the exact derivative (checks the
  // bound above as much as the library)
  CHECK(std::fabs(fd - ref.ds) <= fd_error + btol.ds);
}

constexpr auto SYM = FLATMEM_CONTRASTIVE_SYMMETRIC;
constexpr auto NCE = FLATMEM_CONTRASTIVE_INFONCE;

ValueCase sym(std::int64_t b, std::int64_t d, int tile_rows = 0, int tile_cols = 0) {
  ValueCase v;
  v.loss = SYM;
  v.b = b;
  v.d = d;
  v.tile_rows = tile_rows;
  v.tile_cols = tile_cols;
  return v;
}
ValueCase nce(std::int64_t b, std::int64_t c, std::int64_t d, Labels labels = Labels::none, int tile_rows = 0,
              int tile_cols = 0) {
  ValueCase v = sym(b, d, tile_rows, tile_cols);
  v.loss = NCE;
  v.c = c;
  v.labels = labels;
  return v;
}
template <typename Edit>
ValueCase with(ValueCase v, Edit edit) {
  edit(v);
  return v;
}

}  // namespace

// ===========================================================================
// Symmetric (CLIP) loss, fp32
// ===========================================================================

// Degenerate sizes: one row (the loss is exactly 0 and so are the gradients,
// up to rounding), one feature, one row with many features.
TEST_CASE("contrastive/symmetric/fp32/b=1,d=1") { check_values(sym(1, 1)); }
TEST_CASE("contrastive/symmetric/fp32/b=1,d=97") { check_values(sym(1, 97)); }
TEST_CASE("contrastive/symmetric/fp32/b=7,d=1") { check_values(sym(7, 1)); }
TEST_CASE("contrastive/symmetric/fp32/b=2,d=3") { check_values(sym(2, 3)); }

// Primes: tiles never divide the extents.
TEST_CASE("contrastive/symmetric/fp32/b=13,d=7,tile=16x24") { check_values(sym(13, 7, 16, 24)); }
TEST_CASE("contrastive/symmetric/fp32/b=97,d=13,tile=16x24") { check_values(sym(97, 13, 16, 24)); }
TEST_CASE("contrastive/symmetric/fp32/b=263,d=97") { check_values(sym(263, 97)); }
TEST_CASE("contrastive/symmetric/fp32/b=263,d=97,tile=16x24") { check_values(sym(263, 97, 16, 24)); }
TEST_CASE("contrastive/symmetric/fp32/b=257,d=257,tile=24x16") { check_values(sym(257, 257, 24, 16)); }
// Full tiles with a short last one: 256-row tiles (last 7 rows) and the
// default extent (b = 2053 > 4 * 512).
TEST_CASE("contrastive/symmetric/fp32/b=1031,d=16,tile=256") { check_values(sym(1031, 16, 256, 256)); }
TEST_CASE("contrastive/symmetric/fp32/b=2053,d=4") { check_values(sym(2053, 4)); }
TEST_CASE("contrastive/symmetric/fp32/b=1031,d=16") { check_values(sym(1031, 16)); }
// Odd tile extents that are not multiples of the SIMD width.
TEST_CASE("contrastive/symmetric/fp32/b=97,d=13,tile=17x5") { check_values(sym(97, 13, 17, 5)); }
TEST_CASE("contrastive/symmetric/fp32/b=61,d=13,tile=1x1") { check_values(sym(61, 13, 1, 1)); }

// Unnormalised Gaussian features with s = 1: logits of size ~sqrt(d) = 11.
TEST_CASE("contrastive/symmetric/fp32/gaussian,s=1,b=400,d=128") {
  check_values(with(sym(400, 128), [](ValueCase &v) { v.unit_rows = false, v.scale = 1.0; }));
}

// s = 100 with unit features: logits up to 100, exp(100) overflows fp32, so
// this only passes with the maximum subtracted.
TEST_CASE("contrastive/symmetric/fp32/s=100,unit-norm,b=263,d=97,tile=16x24") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) { v.scale = 100.0; }));
}
// Nearly identical features make logits nearly equal: at s = 100 the row maxima
// sit within a few units of many others.
TEST_CASE("contrastive/symmetric/fp32/s=100,b=97,d=7") {
  check_values(with(sym(97, 7), [](ValueCase &v) { v.scale = 100.0; }));
}
// Matched pairs, where the exact loss is 0 or nearly so (5e-13 and below):
// rounding once made it negative (-4.7e-7 at b = 600, d = 129, s = 100).
TEST_CASE("contrastive/symmetric/fp32/matched,s=100,b=600,d=129") {
  check_values(with(sym(600, 129), [](ValueCase &v) { v.scale = 100.0, v.matched = 0.01; }));
}
TEST_CASE("contrastive/symmetric/fp32/identical,k=q,s=100,b=600,d=129") {
  check_values(with(sym(600, 129), [](ValueCase &v) { v.scale = 100.0, v.matched = 0.0; }));
}
TEST_CASE("contrastive/symmetric/fp32/identical,k=q,s=14.3,b=1,d=512") {
  check_values(with(sym(1, 512), [](ValueCase &v) { v.scale = 14.3, v.matched = 0.0; }));
}
TEST_CASE("contrastive/infonce/fp32/matched,s=100,b=600,d=129,tile=16x24") {
  check_values(with(nce(600, 600, 129, Labels::none, 16, 24), [](ValueCase &v) { v.scale = 100.0, v.matched = 0.01; }));
}
// Saturation: s = 100, q_i = k_{y_i}, every other pair lower by tens (exact
// loss <= ~1e-13). One tile, many short tiles (the shared-shift column path
// and the merges), full default tiles with a short last one; b = 1 and 2.
ValueCase saturated(flatmem_contrastive_loss loss, std::int64_t b, std::int64_t d, int tile = 0,
                    double cos = 0.5) {
  ValueCase vc;
  vc.loss = loss;
  vc.b = b, vc.d = d, vc.tile_rows = tile, vc.tile_cols = tile;
  vc.scale = 100.0;
  vc.saturated = cos;
  return vc;
}
TEST_CASE("contrastive/symmetric/fp32/saturated,s=100,b=263,d=256") {
  check_values(saturated(FLATMEM_CONTRASTIVE_SYMMETRIC, 263, 256));
}
TEST_CASE("contrastive/symmetric/fp32/saturated,s=100,b=263,d=256,tile=16") {
  check_values(saturated(FLATMEM_CONTRASTIVE_SYMMETRIC, 263, 256, 16));
}
TEST_CASE("contrastive/symmetric/fp32/saturated,s=100,b=1031,d=128,cos=0.3") {
  check_values(saturated(FLATMEM_CONTRASTIVE_SYMMETRIC, 1031, 128, 0, 0.3));
}
TEST_CASE("contrastive/symmetric/fp32/saturated,s=100,b=1,2,d=128") {
  check_values(saturated(FLATMEM_CONTRASTIVE_SYMMETRIC, 1, 128));
  check_values(saturated(FLATMEM_CONTRASTIVE_SYMMETRIC, 2, 128));
}
TEST_CASE("contrastive/infonce/fp32/saturated,s=100,b=263,d=256,tile=16") {
  check_values(saturated(FLATMEM_CONTRASTIVE_INFONCE, 263, 256, 16));
}
TEST_CASE("contrastive/infonce/fp32/saturated,shuffled labels,c=389,s=100,b=263,d=256") {
  ValueCase vc = saturated(FLATMEM_CONTRASTIVE_INFONCE, 263, 256);
  vc.c = 389;  // hard negatives beyond the positives, labels a permutation
  vc.labels = Labels::shuffled;
  check_values(vc);
}
TEST_CASE("contrastive/symmetric/fp32/saturated,dloss=-2.5,threads=3,b=263,d=256,tile=24") {
  ValueCase vc = saturated(FLATMEM_CONTRASTIVE_SYMMETRIC, 263, 256, 24);
  vc.dloss = -2.5;
  vc.threads = 3;
  check_values(vc);
}

TEST_CASE("contrastive/symmetric/bf16/matched,s=100,b=97,d=64") {
  check_values(with(sym(97, 64), [](ValueCase &v) { v.dtype = Dtype::bf16, v.scale = 100.0, v.matched = 0.01; }));
}

// s = 10^4 (valid: finite and > 0): logits up to 10^4, softmaxes one-hot;
// only max subtraction keeps this finite.
TEST_CASE("contrastive/symmetric/fp32/s=1e4,b=61,d=13") {
  check_values(with(sym(61, 13), [](ValueCase &v) { v.scale = 1e4; }));
}
// s = 0.01: every softmax is close to uniform.
TEST_CASE("contrastive/symmetric/fp32/s=0.01,b=97,d=13") {
  check_values(with(sym(97, 13), [](ValueCase &v) { v.scale = 0.01; }));
}

// Upstream gradient g != 1, g = 0 and NULL (g = 1, the default of every case).
TEST_CASE("contrastive/symmetric/fp32/dloss=-2.5,b=97,d=31,tile=16x24") {
  check_values(with(sym(97, 31, 16, 24), [](ValueCase &v) { v.dloss = -2.5; }));
}
TEST_CASE("contrastive/symmetric/fp32/dloss=0,b=13,d=7") {
  check_values(with(sym(13, 7), [](ValueCase &v) { v.dloss = 0.0; }));
}
TEST_CASE("contrastive/symmetric/fp32/dloss=1e-3,b=97,d=31") {
  check_values(with(sym(97, 31), [](ValueCase &v) { v.dloss = 1e-3; }));
}

// Only some gradients requested.
TEST_CASE("contrastive/symmetric/fp32/dq-only,b=97,d=31,tile=16x24") {
  check_values(with(sym(97, 31, 16, 24), [](ValueCase &v) { v.want_dk = v.want_ds = false; }));
}
TEST_CASE("contrastive/symmetric/fp32/dk-only,b=97,d=31,tile=16x24") {
  check_values(with(sym(97, 31, 16, 24), [](ValueCase &v) { v.want_dq = v.want_ds = false; }));
}
TEST_CASE("contrastive/symmetric/fp32/ds-only,b=97,d=31,tile=16x24") {
  check_values(with(sym(97, 31, 16, 24), [](ValueCase &v) { v.want_dq = v.want_dk = false; }));
}
TEST_CASE("contrastive/symmetric/fp32/dq-and-dk-no-ds,dloss=0.5,b=97,d=31") {
  check_values(with(sym(97, 31), [](ValueCase &v) { v.want_ds = false, v.dloss = 0.5; }));
}

// Row strides > d on inputs and outputs (padding must stay untouched).
TEST_CASE("contrastive/symmetric/fp32/strided,q+5,k+3,dq+7,dk+1,b=97,d=31,tile=16x24") {
  check_values(with(sym(97, 31, 16, 24), [](ValueCase &v) { v.q_pad = 5, v.k_pad = 3, v.dq_pad = 7, v.dk_pad = 1; }));
}
TEST_CASE("contrastive/symmetric/fp32/strided,q+1000,b=13,d=3") {
  check_values(with(sym(13, 3), [](ValueCase &v) { v.q_pad = 1000, v.dk_pad = 999; }));
}

// One-element tensors given as shape (1,) instead of ndim 0.
TEST_CASE("contrastive/symmetric/fp32/scalars-as-shape-(1,),dloss=2,b=13,d=7") {
  check_values(with(sym(13, 7), [](ValueCase &v) { v.scalars_as_shape_1 = true, v.dloss = 2.0; }));
}
TEST_CASE("contrastive/infonce/fp32/scalars-as-shape-(1,),b=13,c=29,d=7") {
  check_values(with(nce(13, 29, 7, Labels::duplicates), [](ValueCase &v) { v.scalars_as_shape_1 = true; }));
}

// Caller workspace of exactly the queried size, 64-byte aligned and not
// (header: any alignment is accepted; the query includes the slack).
TEST_CASE("contrastive/symmetric/fp32/workspace=exact,b=263,d=97,tile=16x24") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) { v.workspace = Workspace::exact; }));
}
TEST_CASE("contrastive/symmetric/fp32/workspace=misaligned,b=263,d=97,tile=16x24") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) { v.workspace = Workspace::misaligned; }));
}

// Thread counts (the workspace depends on them; the values must not).
TEST_CASE("contrastive/symmetric/fp32/threads=1,b=263,d=97") {
  check_values(with(sym(263, 97), [](ValueCase &v) { v.threads = 1; }));
}
// More threads than work items (groups): idle threads must not matter.
TEST_CASE("contrastive/symmetric/fp32/threads=16,b=13,d=7") {
  check_values(with(sym(13, 7), [](ValueCase &v) { v.threads = 16; }));
}
TEST_CASE("contrastive/symmetric/fp32/threads=3,workspace=exact,b=263,d=97,tile=16x24") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) { v.threads = 3, v.workspace = Workspace::exact; }));
}

// ===========================================================================
// InfoNCE, fp32
// ===========================================================================

TEST_CASE("contrastive/infonce/fp32/b=1,c=1,d=1") { check_values(nce(1, 1, 1)); }
// c > b without labels: row i's positive is column i, the extra columns are
// hard negatives.
TEST_CASE("contrastive/infonce/fp32/hard-negatives,b=7,c=13,d=5") { check_values(nce(7, 13, 5)); }
TEST_CASE("contrastive/infonce/fp32/hard-negatives,b=97,c=263,d=31,tile=16x24") {
  check_values(nce(97, 263, 31, Labels::none, 16, 24));
}
TEST_CASE("contrastive/infonce/fp32/b=263,c=263,d=97") { check_values(nce(263, 263, 97)); }
TEST_CASE("contrastive/infonce/fp32/labels=shuffled,b=263,c=263,d=97") {
  check_values(nce(263, 263, 97, Labels::shuffled));
}
// c < b is allowed with labels; duplicates put several positives in one column.
TEST_CASE("contrastive/infonce/fp32/labels=duplicates,b=263,c=97,d=31,tile=16x24") {
  check_values(nce(263, 97, 31, Labels::duplicates, 16, 24));
}
TEST_CASE("contrastive/infonce/fp32/labels=duplicates,b=13,c=1,d=7") { check_values(nce(13, 1, 7, Labels::duplicates)); }
TEST_CASE("contrastive/infonce/fp32/labels=random,b=1,c=257,d=13") { check_values(nce(1, 257, 13, Labels::duplicates)); }
TEST_CASE("contrastive/infonce/fp32/b=300,c=2053,d=8") { check_values(nce(300, 2053, 8)); }
TEST_CASE("contrastive/infonce/fp32/labels=duplicates,b=300,c=1031,d=16") {
  check_values(nce(300, 1031, 16, Labels::duplicates));
}
TEST_CASE("contrastive/infonce/fp32/s=100,labels=duplicates,b=97,c=263,d=97,tile=16x24") {
  check_values(with(nce(97, 263, 97, Labels::duplicates, 16, 24), [](ValueCase &v) { v.scale = 100.0; }));
}
TEST_CASE("contrastive/infonce/fp32/s=0.01,b=13,c=97,d=7") {
  check_values(with(nce(13, 97, 7), [](ValueCase &v) { v.scale = 0.01; }));
}
TEST_CASE("contrastive/infonce/fp32/gaussian,s=1,b=200,c=301,d=64,tile=24x16") {
  check_values(with(nce(200, 301, 64, Labels::shuffled, 24, 16), [](ValueCase &v) { v.unit_rows = false, v.scale = 1.0; }));
}
TEST_CASE("contrastive/infonce/fp32/dloss=3,dk-only,strided,b=61,c=97,d=31,tile=16x24") {
  check_values(with(nce(61, 97, 31, Labels::duplicates, 16, 24), [](ValueCase &v) {
    v.dloss = 3.0, v.want_dq = v.want_ds = false, v.k_pad = 2, v.dk_pad = 9;
  }));
}
TEST_CASE("contrastive/infonce/fp32/dq-only,dloss=-1,b=61,c=97,d=31") {
  check_values(with(nce(61, 97, 31), [](ValueCase &v) { v.dloss = -1.0, v.want_dk = v.want_ds = false, v.dq_pad = 4; }));
}
TEST_CASE("contrastive/infonce/fp32/workspace=exact,labels=duplicates,b=97,c=263,d=31,tile=16x24") {
  check_values(with(nce(97, 263, 31, Labels::duplicates, 16, 24), [](ValueCase &v) { v.workspace = Workspace::exact; }));
}
TEST_CASE("contrastive/infonce/fp32/workspace=misaligned,b=97,c=263,d=31,tile=16x24") {
  check_values(with(nce(97, 263, 31, Labels::none, 16, 24), [](ValueCase &v) { v.workspace = Workspace::misaligned; }));
}
TEST_CASE("contrastive/infonce/fp32/threads=3,b=97,c=263,d=31") {
  check_values(with(nce(97, 263, 31, Labels::duplicates), [](ValueCase &v) { v.threads = 3; }));
}

TEST_CASE("contrastive/infonce/fp32/labels=identity-is-the-same-as-no-labels") {
  // y_i = i given explicitly must give exactly the default's results.
  ValueCase vc = nce(97, 131, 31, Labels::none, 16, 24);
  vc.threads = 1;
  Inputs in = make_inputs(vc);
  Handle h = create_handle(make_options(NCE, 1, 16, 24));
  const ForwardOut plain = run_forward(h.get(), vc, in, Workspace::handle);
  const BackwardOut plain_grad =
      run_backward(h.get(), vc, in, plain, nullptr, Workspace::handle, Dtype::f32, Dtype::f32);
  in.has_labels = true;
  in.labels = HostTensor::vector(Dtype::i64, vc.b);
  for (std::int64_t i = 0; i < vc.b; ++i) in.labels.set(i, double(i));
  const ForwardOut labelled = run_forward(h.get(), vc, in, Workspace::handle);
  const BackwardOut labelled_grad =
      run_backward(h.get(), vc, in, labelled, nullptr, Workspace::handle, Dtype::f32, Dtype::f32);
  CHECK(plain.loss.same_bits(labelled.loss));
  CHECK(plain.row_lse.same_bits(labelled.row_lse));
  CHECK(plain_grad.dq.same_bits(labelled_grad.dq));
  CHECK(plain_grad.dk.same_bits(labelled_grad.dk));
  CHECK(plain_grad.ds.same_bits(labelled_grad.ds));
}

// ===========================================================================
// 16-bit inputs (gradients in fp32 and in the input dtype)
// ===========================================================================

TEST_CASE("contrastive/symmetric/bf16/b=263,d=97,tile=16x24,grad=bf16") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) { v.dtype = v.dq_out = v.dk_out = Dtype::bf16; }));
}
TEST_CASE("contrastive/symmetric/bf16/b=263,d=97,tile=16x24,grad=fp32") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) { v.dtype = Dtype::bf16; }));
}
// FLATMEM_FP32_PRECISION_TF32: at avx512bf16 G enters dq's and dk's products
// rounded once to bf16 (the bound's 2^-8 term); elsewhere nothing changes.
TEST_CASE("contrastive/symmetric/bf16/precision=tf32,b=263,d=97,tile=16x24") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) {
    v.dtype = Dtype::bf16, v.fp32_precision = FLATMEM_FP32_PRECISION_TF32;
  }));
}
TEST_CASE("contrastive/infonce/bf16/precision=tf32,labels=duplicates,b=97,c=263,d=31") {
  check_values(with(nce(97, 263, 31, Labels::duplicates), [](ValueCase &v) {
    v.dtype = v.dq_out = Dtype::bf16, v.fp32_precision = FLATMEM_FP32_PRECISION_TF32;
  }));
}
TEST_CASE("contrastive/symmetric/bf16/grad=dq-bf16,dk-fp32,b=97,d=31") {
  check_values(with(sym(97, 31), [](ValueCase &v) { v.dtype = v.dq_out = Dtype::bf16; }));
}
TEST_CASE("contrastive/symmetric/bf16/s=100,unit-norm,b=257,d=64,grad=bf16") {
  check_values(with(sym(257, 64), [](ValueCase &v) { v.dtype = v.dq_out = v.dk_out = Dtype::bf16, v.scale = 100.0; }));
}
TEST_CASE("contrastive/symmetric/bf16/b=1,d=1,grad=bf16") {
  check_values(with(sym(1, 1), [](ValueCase &v) { v.dtype = v.dq_out = v.dk_out = Dtype::bf16; }));
}
TEST_CASE("contrastive/symmetric/fp16/b=97,d=64,grad=fp16") {
  check_values(with(sym(97, 64), [](ValueCase &v) { v.dtype = v.dq_out = v.dk_out = Dtype::f16; }));
}
TEST_CASE("contrastive/symmetric/fp16/strided,b=97,d=64,tile=16x24,grad=fp32") {
  check_values(with(sym(97, 64, 16, 24), [](ValueCase &v) {
    v.dtype = Dtype::f16, v.q_pad = 3, v.k_pad = 11, v.dq_pad = 1, v.dk_pad = 2;
  }));
}
TEST_CASE("contrastive/symmetric/fp16/strided,dloss=-0.25,b=61,d=40,grad=fp16") {
  check_values(with(sym(61, 40, 16, 24), [](ValueCase &v) {
    v.dtype = v.dq_out = v.dk_out = Dtype::f16, v.q_pad = 1, v.dq_pad = 5, v.dk_pad = 3, v.dloss = -0.25;
  }));
}
TEST_CASE("contrastive/infonce/bf16/labels=duplicates,b=97,c=263,d=31,tile=16x24,grad=bf16") {
  check_values(with(nce(97, 263, 31, Labels::duplicates, 16, 24), [](ValueCase &v) {
    v.dtype = v.dq_out = v.dk_out = Dtype::bf16;
  }));
}
TEST_CASE("contrastive/infonce/fp16/strided,b=61,c=127,d=40,grad=fp16") {
  check_values(with(nce(61, 127, 40), [](ValueCase &v) {
    v.dtype = v.dq_out = v.dk_out = Dtype::f16, v.q_pad = 7, v.k_pad = 1, v.dq_pad = 2, v.dk_pad = 6;
  }));
}
TEST_CASE("contrastive/infonce/fp16/s=100,labels=shuffled,b=97,c=97,d=48,grad=fp32") {
  check_values(with(nce(97, 97, 48, Labels::shuffled), [](ValueCase &v) { v.dtype = Dtype::f16, v.scale = 100.0; }));
}
// The fp32 accumulators of 16-bit gradients live in the caller's workspace:
// the queried size must cover them, aligned or not.
TEST_CASE("contrastive/symmetric/bf16/workspace=exact,b=263,d=97,tile=16x24,grad=bf16") {
  check_values(with(sym(263, 97, 16, 24), [](ValueCase &v) {
    v.dtype = v.dq_out = v.dk_out = Dtype::bf16, v.workspace = Workspace::exact;
  }));
}
TEST_CASE("contrastive/symmetric/fp16/workspace=misaligned,b=97,d=64,grad=fp16") {
  check_values(with(sym(97, 64), [](ValueCase &v) {
    v.dtype = v.dq_out = v.dk_out = Dtype::f16, v.workspace = Workspace::misaligned;
  }));
}
TEST_CASE("contrastive/infonce/bf16/workspace=misaligned,dk-only,b=61,c=127,d=40,grad=bf16") {
  check_values(with(nce(61, 127, 40, Labels::duplicates), [](ValueCase &v) {
    v.dtype = v.dk_out = Dtype::bf16, v.want_dq = false, v.workspace = Workspace::misaligned;
  }));
}

// ===========================================================================
// dL/ds against central finite differences of the library's forward
// ===========================================================================

TEST_CASE("contrastive/symmetric/fp32/ds-vs-finite-difference,s=10,b=97,d=31,tile=16x24") {
  check_ds_by_finite_difference(sym(97, 31, 16, 24));
}
// Small s: the step is limited to s/4 (s - h must stay > 0), so s = 0.25
// rather than 0.01, where the fp32 loss could not resolve the difference.
TEST_CASE("contrastive/symmetric/fp32/ds-vs-finite-difference,s=0.25,b=61,d=13") {
  check_ds_by_finite_difference(with(sym(61, 13), [](ValueCase &v) { v.scale = 0.25; }));
}
TEST_CASE("contrastive/symmetric/bf16/ds-vs-finite-difference,s=30,b=97,d=64") {
  check_ds_by_finite_difference(with(sym(97, 64), [](ValueCase &v) { v.dtype = Dtype::bf16, v.scale = 30.0; }));
}
TEST_CASE("contrastive/infonce/fp32/ds-vs-finite-difference,labels=duplicates,b=61,c=97,d=31") {
  check_ds_by_finite_difference(nce(61, 97, 31, Labels::duplicates, 16, 24));
}
TEST_CASE("contrastive/infonce/fp16/ds-vs-finite-difference,s=100,b=61,c=97,d=31") {
  check_ds_by_finite_difference(with(nce(61, 97, 31), [](ValueCase &v) { v.dtype = Dtype::f16, v.scale = 100.0; }));
}

// ===========================================================================
// The reference itself, on cases small enough to do by hand
// ===========================================================================

TEST_CASE("contrastive/reference/one-row-is-zero-loss") {
  // b = c = 1: LSE of one logit is the logit, so L = 0 and every gradient is 0.
  ReferenceProblem p;
  p.b = p.c = 1;
  p.d = 2;
  p.q = {0.3, -1.5};
  p.k = {2.0, 0.25};
  p.scale = 7.0;
  const ReferenceResult r = reference_loss(p);
  CHECK(std::fabs(r.loss) < 1e-15);
  CHECK(std::fabs(r.ds) < 1e-15);
  for (double v : r.dq) CHECK(std::fabs(v) < 1e-15);
}

TEST_CASE("contrastive/reference/two-by-two-closed-form") {
  // q = e1, e2; k = e1, e2 (d = 2): x = s I. Every row and column:
  // LSE = log(e^s + 1), positive s, so L = log(1 + e^-s) and
  // dL/ds = -e^-s / (1 + e^-s) = -1 / (1 + e^s).
  ReferenceProblem p;
  p.b = p.c = p.d = 2;
  p.q = {1, 0, 0, 1};
  p.k = {1, 0, 0, 1};
  p.scale = 3.0;
  const ReferenceResult r = reference_loss(p);
  CHECK(r.loss == doctest::Approx(std::log1p(std::exp(-3.0))).epsilon(1e-14));
  CHECK(r.ds == doctest::Approx(-1.0 / (1.0 + std::exp(3.0))).epsilon(1e-14));
  CHECK(r.row_lse[0] == doctest::Approx(std::log(std::exp(3.0) + 1.0)).epsilon(1e-14));
  // dq_0 = s sum_j G_0j k_j with G_00 = (2 P_00 - 2) / 4, G_01 = 2 P_01 / 4
  const double p_off = 1.0 / (1.0 + std::exp(3.0));
  CHECK(r.dq[0] == doctest::Approx(3.0 * (-2.0 * p_off) / 4.0).epsilon(1e-14));
  CHECK(r.dq[1] == doctest::Approx(3.0 * (2.0 * p_off) / 4.0).epsilon(1e-14));
  // InfoNCE on the same data: half the rows' LSE, same per-row value.
  p.symmetric = false;
  const ReferenceResult n = reference_loss(p);
  CHECK(n.loss == doctest::Approx(std::log1p(std::exp(-3.0))).epsilon(1e-14));
  CHECK(n.dq[0] == doctest::Approx(3.0 * (-p_off) / 2.0).epsilon(1e-14));
}
