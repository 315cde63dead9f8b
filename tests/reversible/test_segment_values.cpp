// Values of reversible segments of toy callbacks (support/toy_reversible.hpp)
// against an independent double-precision ordinary-backprop reference, in
// every mode; OVERLAPPED against VANILLA bit for bit; dropout replayed from
// (seed, offset); the rebuild-error diagnostic.
//
// Tolerances. Against the reference, the library's results differ by
//  (a) rounding in the callbacks' own arithmetic (dot products of `width`
//      terms: relative error <= gamma_width), and
//  (b) the rebuild: X2 = Y2 - G(Y1), X1 = Y1 - F(X2) recover block inputs up
//      to a few units of roundoff of |Y|, and each block's Jacobian (norm <=
//      about 1 + 0.5 here: tanh' <= 1, weights ~ 0.5 / sqrt(width)) carries
//      earlier errors forward,
// so the error grows at most linearly in depth * (width + 8) * u at these
// weight scales. We allow  tol = 2 * depth * (width + 8) * u * scale, with u
// the unit roundoff of the state dtype (2^-53 or 2^-24) and scale the largest
// |value| of that output (at least 1). Parameter gradients sum rows * width
// products: their bound uses (rows + width + 8). The measured worst ratio
// error / tol is printed with FLATMEM_TEST_VERBOSE=1 (0.06 at the time of
// writing, for the rebuilt fp32 input; a real defect -- a wrong block, a
// wrong sign, a stale residual -- is orders of magnitude outside).
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "support/compare.hpp"
#include "support/segment_run.hpp"
#include "support/toy_reversible.hpp"

using namespace flatmem_test;

namespace {

struct Shape {
  std::int64_t rows;
  int width, depth;
};

const Shape shapes[] = {{1, 1, 1}, {1, 5, 2}, {3, 7, 3}, {13, 17, 5}, {31, 33, 8}, {2, 64, 16}};

double unit_roundoff(Dtype d) { return d == Dtype::f64 ? 0x1.0p-53 : 0x1.0p-24; }

double max_abs(const std::vector<double> &v) {
  double m = 1;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

void check_vector(const std::string &what, const std::vector<double> &got,
                  const std::vector<double> &want, double tol_factor) {
  REQUIRE(got.size() == want.size());
  const double tol = tol_factor * max_abs(want);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  CHECK_MESSAGE(worst <= tol, what << ": worst error " << worst << " > tolerance " << tol);
  if (std::getenv("FLATMEM_TEST_VERBOSE")) MESSAGE(what, ": error / tol = ", worst / tol);
}

void check_state(const std::string &what, const HostTensor &got, const std::vector<double> &want,
                 double tol_factor) {
  check_vector(what, got.values(), want, tol_factor);
}

std::string name(flatmem_reversible_mode m) {
  switch (m) {
    case FLATMEM_REVERSIBLE_STANDARD: return "standard";
    case FLATMEM_REVERSIBLE_VANILLA: return "vanilla";
    case FLATMEM_REVERSIBLE_OVERLAPPED: return "overlapped";
    default: return "auto";
  }
}

// One mode, one dtype, every shape: all outputs against the reference.
void check_against_reference(Dtype dtype, flatmem_reversible_mode mode, double dropout = 0) {
  for (const Shape &shape : shapes) {
    CAPTURE(shape.rows);
    CAPTURE(shape.width);
    CAPTURE(shape.depth);
    ToySegment segment(shape.depth, shape.width, /*mixing=*/true, 100 + shape.width, dropout);
    const SegmentInputs in(dtype, shape.rows, shape.width, 5 + shape.rows);
    SegmentSettings settings;
    settings.mode = mode;
    settings.backwards = mode == FLATMEM_REVERSIBLE_AUTO ? 6 : 1;  // past AUTO's probes
    const SegmentRun run = run_segment(segment, in, settings);
    REQUIRE(run.forward_status == FLATMEM_STATUS_SUCCESS);
    REQUIRE(run.backward_status == FLATMEM_STATUS_SUCCESS);
    const ReferenceResult ref =
        reference_segment(segment, shape.rows, in.x1.values(), in.x2.values(), in.dy1.values(),
                          in.dy2.values(), settings.seed, settings.offset);
    const double u = unit_roundoff(dtype);
    const double state_tol = 2.0 * shape.depth * (shape.width + 8) * u;
    const double param_tol = 2.0 * shape.depth * (shape.rows + shape.width + 8) * u;
    const std::string m = name(mode) + " ";
    check_state(m + "y1", run.y1, ref.y1, state_tol);
    check_state(m + "y2", run.y2, ref.y2, state_tol);
    check_state(m + "dx1", run.dx1, ref.dx1, state_tol);
    check_state(m + "dx2", run.dx2, ref.dx2, state_tol);
    check_state(m + "rebuilt x1", run.x1, in.x1.values(), state_tol);
    check_state(m + "rebuilt x2", run.x2, in.x2.values(), state_tol);
    for (int k = 0; k < shape.depth; ++k) {
      CAPTURE(k);
      check_vector(m + "dW_F", run.d_weight_f[k], ref.d_weight_f[k], param_tol);
      check_vector(m + "db_F", run.d_bias_f[k], ref.d_bias_f[k], param_tol);
      check_vector(m + "dW_G", run.d_weight_g[k], ref.d_weight_g[k], param_tol);
      check_vector(m + "db_G", run.d_bias_g[k], ref.d_bias_g[k], param_tol);
    }
    if (mode == FLATMEM_REVERSIBLE_AUTO)
      CHECK((run.ran == FLATMEM_REVERSIBLE_VANILLA || run.ran == FLATMEM_REVERSIBLE_OVERLAPPED));
    else
      CHECK(run.ran == mode);
  }
}

}  // namespace

TEST_CASE("reversible/values/fp64/standard") { check_against_reference(Dtype::f64, FLATMEM_REVERSIBLE_STANDARD); }
TEST_CASE("reversible/values/fp64/vanilla") { check_against_reference(Dtype::f64, FLATMEM_REVERSIBLE_VANILLA); }
TEST_CASE("reversible/values/fp64/overlapped") { check_against_reference(Dtype::f64, FLATMEM_REVERSIBLE_OVERLAPPED); }
TEST_CASE("reversible/values/fp64/auto") { check_against_reference(Dtype::f64, FLATMEM_REVERSIBLE_AUTO); }
TEST_CASE("reversible/values/fp32/standard") { check_against_reference(Dtype::f32, FLATMEM_REVERSIBLE_STANDARD); }
TEST_CASE("reversible/values/fp32/vanilla") { check_against_reference(Dtype::f32, FLATMEM_REVERSIBLE_VANILLA); }
TEST_CASE("reversible/values/fp32/overlapped") { check_against_reference(Dtype::f32, FLATMEM_REVERSIBLE_OVERLAPPED); }
TEST_CASE("reversible/values/fp32/auto") { check_against_reference(Dtype::f32, FLATMEM_REVERSIBLE_AUTO); }

// Dropout drawn from the context's (seed, offset): the rebuild replays the
// forward's masks, so every mode matches the reference that uses them.
TEST_CASE("reversible/dropout/fp64/standard") { check_against_reference(Dtype::f64, FLATMEM_REVERSIBLE_STANDARD, 0.3); }
TEST_CASE("reversible/dropout/fp64/vanilla") { check_against_reference(Dtype::f64, FLATMEM_REVERSIBLE_VANILLA, 0.3); }
TEST_CASE("reversible/dropout/fp64/overlapped") { check_against_reference(Dtype::f64, FLATMEM_REVERSIBLE_OVERLAPPED, 0.3); }
TEST_CASE("reversible/dropout/fp32/overlapped") { check_against_reference(Dtype::f32, FLATMEM_REVERSIBLE_OVERLAPPED, 0.3); }

// The control: a backward given another offset than its forward rebuilds
// with other masks, and its gradients leave the tolerance by far.
TEST_CASE("reversible/dropout/mismatched_offset_is_visible") {
  ToySegment segment(4, 9, true, 3, 0.3);
  const SegmentInputs in(Dtype::f64, 6, 9, 1);
  SegmentSettings settings;
  settings.backward_offset_shift = 1;
  const SegmentRun run = run_segment(segment, in, settings);
  REQUIRE(run.backward_status == FLATMEM_STATUS_SUCCESS);
  const ReferenceResult ref = reference_segment(segment, 6, in.x1.values(), in.x2.values(),
                                                in.dy1.values(), in.dy2.values(), settings.seed,
                                                settings.offset);
  const std::vector<double> got = run.dx2.values();
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref.dx2[i]));
  CHECK(worst > 1e-3 * max_abs(ref.dx2));
}

TEST_CASE("reversible/block_seed/matches_the_documented_formula") {
  for (std::uint64_t seed : {0ull, 1ull, 0xDEADBEEFull, ~0ull})
    for (int block : {0, 1, 7, 65535})
      for (int part : {0, 1}) {
        CAPTURE(seed);
        CAPTURE(block);
        CHECK(flatmem_reversible_block_seed(seed, block, part) == documented_block_seed(seed, block, part));
      }
  // Distinct per block and part.
  CHECK(flatmem_reversible_block_seed(5, 0, 0) != flatmem_reversible_block_seed(5, 0, 1));
  CHECK(flatmem_reversible_block_seed(5, 0, 1) != flatmem_reversible_block_seed(5, 1, 0));
}

// OVERLAPPED runs the very same callbacks on the same inputs as VANILLA, on
// two threads: every output and parameter gradient is bitwise equal, for any
// thread count (the toy callbacks split rows over context.parallel_for, whose
// thread count differs between the modes).
TEST_CASE("reversible/bitwise/overlapped_equals_vanilla") {
  for (Dtype dtype : {Dtype::f32, Dtype::f64})
    for (const Shape &shape : shapes) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(shape.rows);
      CAPTURE(shape.depth);
      ToySegment segment(shape.depth, shape.width, true, 9, 0.1);
      const SegmentInputs in(dtype, shape.rows, shape.width, 3);
      SegmentSettings settings;
      settings.threads = 1;
      const SegmentRun vanilla = run_segment(segment, in, settings);
      for (int threads : {1, 2, 3, 5}) {
        CAPTURE(threads);
        settings.threads = threads;
        settings.mode = FLATMEM_REVERSIBLE_OVERLAPPED;
        const SegmentRun overlapped = run_segment(segment, in, settings);
        CHECK(overlapped.ran == FLATMEM_REVERSIBLE_OVERLAPPED);
        CHECK(same_bits(vanilla, overlapped));
        settings.mode = FLATMEM_REVERSIBLE_VANILLA;
        CHECK(same_bits(vanilla, run_segment(segment, in, settings)));
        for (auto &fn : segment.f) CHECK_FALSE(fn->overlapped_itself.load());
        for (auto &fn : segment.g) CHECK_FALSE(fn->overlapped_itself.load());
      }
    }
}

// Repeated overlapped backwards (the two chains hand buffers back and forth
// through the slots) keep giving the same bits.
TEST_CASE("reversible/bitwise/overlapped_repeated") {
  ToySegment segment(12, 16, true, 4);
  const SegmentInputs in(Dtype::f32, 40, 16, 8);
  SegmentSettings settings;
  const SegmentRun vanilla = run_segment(segment, in, settings);
  settings.mode = FLATMEM_REVERSIBLE_OVERLAPPED;
  settings.threads = 3;
  for (int i = 0; i < 50; ++i) {
    CAPTURE(i);
    REQUIRE(same_bits(vanilla, run_segment(segment, in, settings)));
  }
}

// The control for the bitwise checks: same_bits sees a one-ulp change.
TEST_CASE("reversible/bitwise/control") {
  ToySegment segment(2, 4, true, 4);
  const SegmentInputs in(Dtype::f32, 3, 4, 8);
  SegmentRun a = run_segment(segment, in, SegmentSettings{});
  SegmentRun b = run_segment(segment, in, SegmentSettings{});
  REQUIRE(same_bits(a, b));
  b.dx1.set(0, 0, std::nextafter(float(b.dx1.get(0, 0)), INFINITY));
  CHECK_FALSE(same_bits(a, b));
  b = run_segment(segment, in, SegmentSettings{});
  b.d_bias_g[1][2] = std::nextafter(b.d_bias_g[1][2], INFINITY);
  CHECK_FALSE(same_bits(a, b));
}

// The diagnostic: errors[0] is exactly the relative error of the rebuilt
// input a backward returns; fp64 rebuilds are near exact; a block with large
// gains (weights 4 / sqrt(width)) amplifies rebuild error with depth.
TEST_CASE("reversible/rebuild_error") {
  for (Dtype dtype : {Dtype::f32, Dtype::f64}) {
    CAPTURE(dtype_name(dtype));
    const int depth = 10, width = 24;
    const std::int64_t rows = 9;
    ToySegment segment(depth, width, true, 21, 0, /*scale=*/4.0);
    const SegmentInputs in(dtype, rows, width, 2);
    flatmem_reversible_t *h = nullptr;
    REQUIRE(flatmem_reversible_create(&h, segment.blocks.data(), depth, nullptr) == FLATMEM_STATUS_SUCCESS);
    HostTensor errors = HostTensor::vector(Dtype::f64, depth);
    REQUIRE(flatmem_reversible_rebuild_error(h, in.x1.dl(), in.x2.dl(), 7, 11, errors.dl(), nullptr) ==
            FLATMEM_STATUS_SUCCESS);
    flatmem_reversible_destroy(h);
    SegmentSettings settings;
    const SegmentRun run = run_segment(segment, in, settings);
    double difference = 0, magnitude = 0;
    for (auto [rebuilt, truth] : {std::pair{&run.x1, &in.x1}, std::pair{&run.x2, &in.x2}})
      for (std::int64_t r = 0; r < rows; ++r)
        for (int c = 0; c < width; ++c) {
          difference = std::max(difference, std::fabs(rebuilt->get(r, c) - truth->get(r, c)));
          magnitude = std::max(magnitude, std::fabs(truth->get(r, c)));
        }
    CHECK(errors.get(0) == doctest::Approx(difference / magnitude).epsilon(1e-12));
    for (int k = 0; k < depth; ++k) CHECK(errors.get(k) >= 0);
    if (dtype == Dtype::f64) {
      CHECK(errors.get(0) < 1e-9);
    } else {
      CHECK(errors.get(0) > 0);                       // fp32 rebuild is not exact
      CHECK(errors.get(0) > errors.get(depth - 1));   // and grows toward the input
    }
  }
}
