// The built-in reversible blocks (reversible.h, "Built-in blocks"), called
// through their flatmem_reversible_function callbacks directly, with a
// context built here (support/block_case.hpp: a serial parallel_for, or one
// over std::threads):
//   - the double reference's own gradients against central finite differences;
//   - y, dx and the six parameter gradients against that reference over many
//     shapes (batch 1 as (tokens, width), tokens 1, odd widths, heads 1);
//   - accumulation (+=) of parameter gradients and of dx;
//   - bitwise equality for 1 and 3 threads, and with / without residuals;
//   - FLATMEM_BLOCK_MATH_TF32 on the CPU: bitwise the FP32 result;
//   - every refused argument (options.math, kDLCUDA tensors the CPU blocks
//     cannot use among them): status and a message naming it.
// The same blocks on CUDA states: gpu/test_gpu_blocks.cpp.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/block_case.hpp"
#include "support/random.hpp"

using namespace flatmem_test;

namespace {

// Forward + VJP of one block against the reference.
void check_against_reference(const BlockConfig &c, int threads) {
  INFO(describe(c), ", threads ", threads);
  HostBlock block(c, 11);
  const FloatTensor x = block.random_state(21, true), dy = block.random_state(31, false);
  const BlockResults got = block.forward_and_vjp(x, dy, threads);
  check_block_results(c, block_reference(c, block.parameter_values(), x.values(), dy.values()), got, 1,
                      FLATMEM_BLOCK_MATH_FP32);
}

}  // namespace

// --- the reference itself -------------------------------------------------------------

// The loss L = <dy, F(x)>: its derivative along any input or parameter is what
// block_vjp returns. Central differences in double (step h = 1e-5: truncation
// ~h^2 |F'''| ~ 1e-10, cancellation ~1e-16 / h ~ 1e-11) must agree to 1e-7
// relative to the largest gradient.
static void check_finite_differences(const BlockConfig &c) {
  INFO(describe(c));
  Random rng(5);
  const auto sizes = block_parameter_sizes(c);
  BlockParameterValues p;
  for (int i = 0; i < 6; ++i) {
    p[i].resize(std::size_t(sizes[i]));
    for (auto &v : p[i]) v = (i == 0 ? 1.0 : 0.0) + 0.5 * rng.normal();
  }
  Values x(std::size_t(c.rows() * c.width)), dy(x.size());
  for (auto &v : x) v = rng.normal();
  for (auto &v : dy) v = rng.normal();
  const BlockGradients g = block_vjp(c, p, x, dy);
  const auto loss = [&](const BlockParameterValues &pp, const Values &xx) {
    const Values y = block_forward(c, pp, xx);
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += dy[i] * y[i];
    return s;
  };
  const double h = 1e-5;
  const auto check = [&](const char *what, Values &slot, const Values &analytic,
                         const std::function<double()> &eval) {
    double scale = 0.0, worst = 0.0;
    for (double v : analytic) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < slot.size(); ++i) {
      const double keep = slot[i];
      slot[i] = keep + h;
      const double plus = eval();
      slot[i] = keep - h;
      const double minus = eval();
      slot[i] = keep;
      worst = std::max(worst, std::fabs((plus - minus) / (2 * h) - analytic[i]));
    }
    CHECK_MESSAGE(worst <= 1e-7 * scale, what, ": worst |fd - analytic| ", worst, ", scale ", scale);
  };
  check("dx", x, g.dx, [&] { return loss(p, x); });
  for (int i = 0; i < 6; ++i)
    check(parameter_name(c.kind, i), p[i], g.dparams[i], [&] { return loss(p, x); });
}

TEST_CASE("blocks/reference/attention gradients match central finite differences") {
  check_finite_differences(attention(2, 3, 4, 2));
  check_finite_differences(attention(1, 4, 3, 1));
}

TEST_CASE("blocks/reference/mlp gradients match central finite differences") {
  check_finite_differences(mlp(2, 3, 4, 5));
  check_finite_differences(mlp(1, 1, 3, 2));
}

// --- values ------------------------------------------------------------------------

TEST_CASE("blocks/attention/fp32/y, dx and parameter gradients match the double reference") {
  for (const BlockConfig &c : {attention(1, 1, 8, 2), attention(1, 7, 12, 3), attention(2, 13, 12, 3),
                               attention(3, 5, 16, 1), attention(2, 1, 6, 6), attention(1, 197, 24, 4),
                               attention(2, 65, 20, 5), attention(4, 50, 33, 3)})
    check_against_reference(c, 1);
  check_against_reference(attention(3, 70, 24, 3), 3);
}

TEST_CASE("blocks/mlp/fp32/y, dx and parameter gradients match the double reference") {
  for (const BlockConfig &c : {mlp(1, 1, 8, 32), mlp(1, 7, 12, 48), mlp(2, 13, 12, 5), mlp(3, 5, 16, 1),
                               mlp(1, 197, 24, 96), mlp(2, 65, 20, 0) /* hidden 0 = 4 width */,
                               mlp(4, 50, 33, 70)})
    check_against_reference(c, 1);
  check_against_reference(mlp(3, 70, 24, 80), 3);
}

TEST_CASE("blocks/mlp/GELU is exact GELU (erf form) across its range") {
  // One token, width 1, hidden 1, fc1 = 1, fc2 = 1, LN weight 0 and LN bias u:
  // y = GELU(u) + b2 exactly up to fp32 rounding of the GELU itself.
  BlockConfig c = mlp(1, 1, 1, 1);
  HostBlock block(c);
  block.params[0].data = {0.0f};
  block.params[2].data = {1.0f};
  block.params[3].data = {0.0f};
  block.params[4].data = {1.0f};
  block.params[5].data = {0.0f};
  double worst = 0.0;
  for (double u = -12.0; u <= 12.0; u += 0.03125) {
    block.params[1].data = {float(u)};
    const FloatTensor x({1, 1}, 0.5f);
    const FloatTensor y = block.forward(x, 1, nullptr);
    const double want = u * 0.5 * std::erfc(-u / std::sqrt(2.0));
    // relative to |GELU(u)|, plus an absolute floor far below any fp32 use
    worst = std::max(worst, std::fabs(y.data[0] - want) / (std::fabs(want) + 1e-30));
  }
  CHECK_MESSAGE(worst < 1e-6, "worst relative GELU error ", worst);
}

// --- accumulation ------------------------------------------------------------------

static void check_accumulation(const BlockConfig &c) {
  INFO(describe(c));
  HostBlock block(c, 3);
  const FloatTensor x = block.random_state(4, true), dy = block.random_state(5, false);
  std::unique_ptr<AlignedBytes> residuals;
  block.forward(x, 2, &residuals);
  FloatTensor dx_once(x.shape, 0.0f);
  block.vjp(x, *residuals, dy, dx_once, 2);
  std::array<FloatTensor, 6> once = block.grads;
  // Second call: parameter gradients add up again (exactly 2x: the same fp32
  // sums added to themselves), and dx adds to what was there.
  FloatTensor dx(x.shape, 0.0f);
  for (std::size_t i = 0; i < dx.data.size(); ++i) dx.data[i] = float(i % 7) - 3.0f;
  const FloatTensor dx_before = dx;
  block.vjp(x, *residuals, dy, dx, 2);
  for (int i = 0; i < 6; ++i) {
    bool doubled = true;
    for (std::size_t k = 0; k < once[i].data.size(); ++k)
      doubled = doubled && block.grads[i].data[k] == 2.0f * once[i].data[k];
    CHECK_MESSAGE(doubled, "parameter gradient ", i, " is not exactly doubled by a second VJP");
  }
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < dx.data.size(); ++i) {
    const double want = double(dx_before.data[i]) + double(dx_once.data[i]);
    worst = std::max(worst, std::fabs(dx.data[i] - want));
    scale = std::max(scale, std::fabs(want));
  }
  CHECK_MESSAGE(worst <= 2 * fp32_unit_roundoff * scale, "dx did not accumulate: worst ", worst);
}

TEST_CASE("blocks/attention/vjp accumulates parameter gradients and adds into dx") {
  check_accumulation(attention(2, 9, 12, 3));
}
TEST_CASE("blocks/mlp/vjp accumulates parameter gradients and adds into dx") {
  check_accumulation(mlp(2, 9, 12, 20));
}

// --- determinism --------------------------------------------------------------------

static void check_thread_independence(const BlockConfig &c) {
  INFO(describe(c));
  struct Result {
    FloatTensor y, y_no_residuals, dx;
    std::array<FloatTensor, 6> grads;
  };
  const auto run = [&](int threads) {
    HostBlock block(c, 8);
    const FloatTensor x = block.random_state(9, true), dy = block.random_state(10, false);
    Result r;
    std::unique_ptr<AlignedBytes> residuals;
    r.y = block.forward(x, threads, &residuals);
    r.y_no_residuals = block.forward(x, threads, nullptr);
    r.dx = FloatTensor(x.shape, 0.25f);
    block.vjp(x, *residuals, dy, r.dx, threads);
    r.grads = block.grads;
    return r;
  };
  const Result one = run(1), three = run(3), three_again = run(3);
  CHECK_MESSAGE(same_bits(one.y, one.y_no_residuals), "y differs with and without residuals (1 thread)");
  CHECK_MESSAGE(same_bits(three.y, three.y_no_residuals), "y differs with and without residuals (3 threads)");
  CHECK_MESSAGE(same_bits(one.y, three.y), "y differs between 1 and 3 threads");
  CHECK_MESSAGE(same_bits(one.dx, three.dx), "dx differs between 1 and 3 threads");
  for (int i = 0; i < 6; ++i) {
    CHECK_MESSAGE(same_bits(one.grads[i], three.grads[i]), "gradient ", i, " differs between 1 and 3 threads");
    CHECK_MESSAGE(same_bits(three.grads[i], three_again.grads[i]), "gradient ", i, " differs run to run");
  }
}

TEST_CASE("blocks/attention/bitwise identical for 1 and 3 threads and with or without residuals") {
  check_thread_independence(attention(3, 70, 24, 3));   // 4 row slabs, 9 (batch, head) items
  check_thread_independence(attention(1, 130, 200, 5));  // (tokens, width), 4 column slabs
}
TEST_CASE("blocks/mlp/bitwise identical for 1 and 3 threads and with or without residuals") {
  check_thread_independence(mlp(3, 70, 24, 100));
  check_thread_independence(mlp(1, 130, 130, 200));
}

// --- the math option -------------------------------------------------------------------

// "The CPU runs FP32 for either value": a TF32 block on the CPU gives the
// FP32 block's bits (same parameters, same inputs).
static void check_tf32_is_fp32_on_cpu(const BlockConfig &c) {
  INFO(describe(c));
  const auto run = [&](flatmem_block_math math) {
    HostBlock block(c, 12, math);
    return block.forward_and_vjp(block.random_state(13, true), block.random_state(14, false), 2);
  };
  same_bits(run(FLATMEM_BLOCK_MATH_FP32), run(FLATMEM_BLOCK_MATH_TF32), "TF32 vs FP32 on the CPU");
}

TEST_CASE("blocks/math/TF32 on the CPU is bitwise FP32") {
  check_tf32_is_fp32_on_cpu(attention(2, 31, 24, 3));
  check_tf32_is_fp32_on_cpu(attention(1, 7, 96, 6));
  check_tf32_is_fp32_on_cpu(mlp(2, 31, 24, 0));
  check_tf32_is_fp32_on_cpu(mlp(1, 7, 96, 37));
}

// --- residual size -------------------------------------------------------------------

TEST_CASE("blocks/residual_size is the documented layout") {
  // attention: (5 width + 2) rows + batch heads tokens^2 floats; MLP:
  // (width + hidden + 2) rows floats; each of the regions 64-byte aligned
  // (at most 63 bytes of padding each, plus 64 for the base).
  const auto check = [](const BlockConfig &c, std::int64_t floats, int regions) {
    INFO(describe(c));
    HostBlock block(c);
    const std::size_t bytes = block.residual_bytes(block.random_state(1, false));
    CHECK(bytes >= std::size_t(floats) * 4);
    CHECK(bytes <= std::size_t(floats) * 4 + 64 * std::size_t(regions + 1));
  };
  check(attention(8, 197, 48, 6), 8 * 197 * (5 * 48 + 2) + 8 * 6 * 197 * 197, 6);
  check(mlp(8, 197, 48, 96), 8 * 197 * (48 + 96 + 2), 4);
}

// --- refused arguments ------------------------------------------------------------------

namespace {

// Creates and destroys a block; the create's error text stays the thread's
// last error (destroy runs only after a success, it would clear it).
flatmem_status create_with(const flatmem_block_options &o) {
  flatmem_block_t *b = nullptr;
  const flatmem_status s = flatmem_block_create(&b, &o);
  if (s == FLATMEM_STATUS_SUCCESS) {
    CHECK(b != nullptr);
    CHECK(flatmem_block_destroy(b) == FLATMEM_STATUS_SUCCESS);
  } else {
    CHECK(b == nullptr);
  }
  return s;
}

// A kDLCUDA tensor the CPU cannot use: UNSUPPORTED in a build without CUDA;
// INVALID_ARGUMENT in a CUDA build (no GPU here, host memory behind the
// pointer, or another device than the rest).
const std::vector<flatmem_status> cuda_refusals = {FLATMEM_STATUS_UNSUPPORTED, FLATMEM_STATUS_INVALID_ARGUMENT};

bool one_of(flatmem_status s, const std::vector<flatmem_status> &allowed) {
  const bool found = std::find(allowed.begin(), allowed.end(), s) != allowed.end();
  if (!found) MESSAGE("status ", flatmem_status_string(s), ": ", std::string(flatmem_last_error()));
  return found;
}

}  // namespace

TEST_CASE("blocks/bad input/options") {
  flatmem_block_options o = block_options(attention(1, 1, 12, 3));
  CHECK(create_with(o) == FLATMEM_STATUS_SUCCESS);
  flatmem_block_t *b = nullptr;
  CHECK(flatmem_block_create(&b, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("options: NULL"));
  CHECK(flatmem_block_create(nullptr, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("out"));
  CHECK(flatmem_block_options_init(nullptr, sizeof(flatmem_block_options)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("options"));

  auto bad = o;
  bad.struct_size = 0;
  CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("struct_size"));
  for (int kind : {0, 3, -1}) {
    bad = o;
    bad.kind = flatmem_block_kind(kind);
    CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_names("options.kind"));
  }
  for (int width : {0, -4}) {
    bad = o;
    bad.width = width;
    CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_names("options.width"));
  }
  bad = o;
  bad.heads = 5;  // does not divide 12
  CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("options.heads"));
  bad.heads = -1;
  CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("options.heads"));
  bad = o;
  bad.kind = FLATMEM_BLOCK_MLP;
  bad.hidden = -3;
  CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("options.hidden"));
  for (float eps : {-1e-5f, NAN, INFINITY}) {
    bad = o;
    bad.layer_norm_eps = eps;
    CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_names("options.layer_norm_eps"));
  }
  // An older caller's shorter struct: the fields it lacks take their defaults
  // (heads 1 here, so width 12 with the heads field cut off is fine).
  bad = o;
  bad.heads = 5;
  bad.struct_size = offsetof(flatmem_block_options, heads);
  CHECK(create_with(bad) == FLATMEM_STATUS_SUCCESS);
  // math: FP32 or TF32, nothing else.
  for (int math : {2, -1}) {
    bad = o;
    bad.math = flatmem_block_math(math);
    CHECK(create_with(bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_names("options.math"));
  }
  bad = o;
  bad.math = FLATMEM_BLOCK_MATH_TF32;
  CHECK(create_with(bad) == FLATMEM_STATUS_SUCCESS);
  // A caller compiled before `math` was appended: its struct ends there, so
  // the library must not read the field (garbage here) and runs FP32 (on the
  // CPU either way; test_gpu_blocks.cu compares it with FP32 on a GPU).
  bad = o;
  bad.math = flatmem_block_math(7);
  bad.struct_size = offsetof(flatmem_block_options, math);
  CHECK(create_with(bad) == FLATMEM_STATUS_SUCCESS);
  // MLP ignores heads, attention ignores hidden.
  bad = o;
  bad.hidden = -7;
  CHECK(create_with(bad) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_block_destroy(nullptr) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("blocks/bad input/set_parameters names the tensor") {
  HostBlock block(attention(1, 3, 12, 3));
  DLTensor p[6], g[6];
  const auto reset = [&] {
    for (int i = 0; i < 6; ++i) p[i] = block.params[i].dl, g[i] = block.grads[i].dl;
  };
  reset();
  CHECK(flatmem_block_set_parameters(nullptr, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("block: NULL"));
  CHECK(flatmem_block_set_parameters(block.handle, nullptr, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters: NULL"));

  std::int64_t wrong[2] = {12, 1000};
  p[2].shape = wrong;
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters[2] (qkv_weight): shape (12, 1000), expected (12, 36)"));
  reset();
  std::int64_t wrong_bias[1] = {35};
  g[3].shape = wrong_bias;
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("gradients[3] (qkv_bias): shape (35,), expected (36,)"));
  reset();
  p[4].ndim = 1;
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters[4] (proj_weight): shape (12,), expected (12, 12)"));
  reset();
  p[5].dtype = {kDLFloat, 64, 1};
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters[5] (proj_bias)"));
  CHECK(last_error_names("dtype"));
  reset();
  p[0].dtype = {kDLBfloat, 16, 1};
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters[0] (ln_weight)"));
  reset();
  g[1].device = {kDLCUDA, 0};  // one CUDA tensor among CPU ones (and host memory)
  CHECK(one_of(flatmem_block_set_parameters(block.handle, p, g), cuda_refusals));
  CHECK(last_error_names("gradients[1] (ln_bias)"));
  reset();
  // All twelve say kDLCUDA, but the pointers are host memory: parameters[0]
  // is the first tensor checked.
  for (int i = 0; i < 6; ++i) p[i].device = g[i].device = {kDLCUDA, 0};
  CHECK(one_of(flatmem_block_set_parameters(block.handle, p, g), cuda_refusals));
  CHECK(last_error_names("parameters[0]"));
  reset();
  g[1].device = {kDLOpenCL, 0};
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("gradients[1] (ln_bias)"));
  reset();
  std::int64_t strides[2] = {40, 1};  // rows padded: not compact
  p[2].strides = strides;
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters[2] (qkv_weight)"));
  reset();
  g[4].data = nullptr;
  CHECK(flatmem_block_set_parameters(block.handle, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("gradients[4] (proj_weight): data is NULL"));
  reset();

  // MLP names.
  HostBlock m(mlp(1, 2, 4, 6));
  DLTensor mp[6];
  for (int i = 0; i < 6; ++i) mp[i] = m.params[i].dl;
  std::int64_t wrong_fc2[2] = {4, 6};
  mp[4].shape = wrong_fc2;
  CHECK(flatmem_block_set_parameters(m.handle, mp, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters[4] (fc2_weight): shape (4, 6), expected (6, 4)"));

  CHECK(flatmem_block_function(nullptr, &block.fn) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("block"));
  CHECK(flatmem_block_function(block.handle, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("function"));
}

TEST_CASE("blocks/bad input/callbacks check state, context, parameters and gradients") {
  // A fresh block: function available, parameters not yet set.
  const BlockConfig c = attention(2, 3, 12, 3);
  flatmem_block_t *raw = nullptr;
  const flatmem_block_options o = block_options(c);
  REQUIRE(flatmem_block_create(&raw, &o) == FLATMEM_STATUS_SUCCESS);
  std::unique_ptr<flatmem_block_t, decltype(&flatmem_block_destroy)> fresh(raw, &flatmem_block_destroy);
  flatmem_reversible_function fn{};
  REQUIRE(flatmem_block_function(raw, &fn) == FLATMEM_STATUS_SUCCESS);
  CHECK(fn.user == raw);
  const flatmem_reversible_context ctx = cpu_context(1, FLATMEM_REVERSIBLE_PHASE_FORWARD);
  FloatTensor x({2, 3, 12}, 1.0f), y({2, 3, 12}, 7.0f);
  CHECK(fn.forward(fn.user, &ctx, &x.dl, &y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("block: parameters not set (call flatmem_block_set_parameters)"));

  HostBlock block(c);  // parameters and gradients set
  const auto forward_fails = [&](FloatTensor &xx, FloatTensor &yy, const char *needle,
                                 const std::vector<flatmem_status> &want = {FLATMEM_STATUS_INVALID_ARGUMENT},
                                 const flatmem_reversible_context *context = nullptr) {
    const FloatTensor y_before = yy;
    CHECK(one_of(block.fn.forward(block.fn.user, context ? context : &ctx, &xx.dl, &yy.dl, nullptr), want));
    CHECK(last_error_names(needle));
    CHECK_MESSAGE(same_bits(yy, y_before), "y written by a refused call");
  };
  {
    FloatTensor xx = x, yy = y;
    xx.dl.dtype = {kDLFloat, 64, 1};
    forward_fails(xx, yy, "x: dtype");
  }
  {
    FloatTensor xx({2, 3, 11}, 1.0f), yy({2, 3, 11}, 7.0f);
    forward_fails(xx, yy, "x: shape (2, 3, 11)");
  }
  {
    FloatTensor xx({1, 2, 3, 12}, 1.0f), yy({1, 2, 3, 12}, 7.0f);
    forward_fails(xx, yy, "x: ndim 4");
  }
  {
    FloatTensor xx({12}, 1.0f), yy({12}, 7.0f);
    forward_fails(xx, yy, "x: ndim 1");
  }
  {
    FloatTensor xx = x, yy = y;
    xx.dl.device = {kDLCUDA, 0};  // not the CPU parameters' device
    forward_fails(xx, yy, "x: ", cuda_refusals);
  }
  {
    FloatTensor xx = x, yy({2, 4, 12}, 7.0f);
    forward_fails(xx, yy, "y: shape (2, 4, 12) differs from x's (2, 3, 12)");
  }
  {
    FloatTensor xx = x, yy = y;
    std::int64_t strides[3] = {72, 12, 2};
    xx.dl.strides = strides;
    forward_fails(xx, yy, "x: strides are not compact");
  }
  {
    FloatTensor xx = x, yy = y;
    xx.dl.data = nullptr;
    forward_fails(xx, yy, "x: data is NULL");
  }
  {
    FloatTensor xx = x, yy = y;
    flatmem_reversible_context bad = ctx;
    bad.num_threads = 0;
    forward_fails(xx, yy, "context.num_threads", {FLATMEM_STATUS_INVALID_ARGUMENT}, &bad);
    bad = ctx;
    bad.struct_size = 8;
    forward_fails(xx, yy, "context: struct_size", {FLATMEM_STATUS_INVALID_ARGUMENT}, &bad);
  }
  CHECK(block.fn.forward(block.fn.user, nullptr, &x.dl, &y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("context: NULL"));
  CHECK(block.fn.forward(nullptr, &ctx, &x.dl, &y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("block"));
  CHECK(block.fn.forward(block.fn.user, &ctx, nullptr, &y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("x: NULL"));

  // VJP: residuals, dy, dx, gradients.
  std::unique_ptr<AlignedBytes> residuals;
  block.forward(x, 1, &residuals);
  FloatTensor dy({2, 3, 12}, 1.0f), dx({2, 3, 12}, 0.0f), dx_bad({2, 3, 13}, 0.0f), dy_bad({3, 12}, 1.0f);
  const flatmem_reversible_context gctx = cpu_context(1, FLATMEM_REVERSIBLE_PHASE_GRADIENT);
  CHECK(block.fn.vjp(block.fn.user, &gctx, &x.dl, nullptr, &dy.dl, &dx.dl) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("residuals: NULL"));
  CHECK(block.fn.vjp(block.fn.user, &gctx, &x.dl, residuals->data(), &dy_bad.dl, &dx.dl) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("dy: shape (3, 12) differs from x's (2, 3, 12)"));
  CHECK(block.fn.vjp(block.fn.user, &gctx, &x.dl, residuals->data(), &dy.dl, &dx_bad.dl) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("dx: shape (2, 3, 13)"));
  CHECK(block.fn.vjp(block.fn.user, &gctx, &x.dl, residuals->data(), &dy.dl, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("dx: NULL"));
  block.set_parameters(false);  // forward-only
  const FloatTensor dx_before = dx;
  CHECK(block.fn.vjp(block.fn.user, &gctx, &x.dl, residuals->data(), &dy.dl, &dx.dl) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("gradients not set"));
  CHECK(same_bits(dx, dx_before));

  // residual_size reads metadata only and needs bytes.
  DLTensor meta = x.dl;
  meta.data = nullptr;
  CHECK(block.fn.residual_size(block.fn.user, &ctx, &meta, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("bytes: NULL"));
  std::size_t bytes = 0;
  std::int64_t huge[3] = {std::int64_t(1) << 20, std::int64_t(1) << 20, 12};
  meta.shape = huge;
  CHECK(block.fn.residual_size(block.fn.user, &ctx, &meta, &bytes) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("too large"));

  // A failed set_parameters leaves the block as it was.
  DLTensor p[6];
  for (int i = 0; i < 6; ++i) p[i] = block.params[i].dl;
  p[3].dtype = {kDLInt, 32, 1};
  CHECK(flatmem_block_set_parameters(raw, p, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(fn.forward(fn.user, &ctx, &x.dl, &y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("parameters not set"));
}

// --- inside a segment ------------------------------------------------------------------

// Two reversible blocks (F = attention, G = MLP) driven by the executor in
// every mode, against the same callbacks composed by hand here (ordinary
// backprop with the true inputs). The rebuilt inputs differ from the true
// ones by rounding only, so the gradients agree to ~1e-6 relative; 1e-4 of
// the largest element leaves room and still catches a missing or doubled
// term (an O(1) change).
TEST_CASE("blocks/segment/attention + MLP blocks in a reversible segment match hand-composed callbacks") {
  const BlockConfig fc = attention(2, 9, 12, 3), gc = mlp(2, 9, 12, 20);
  HostBlock seg_f0(fc, 1), seg_g0(gc, 2), seg_f1(fc, 3), seg_g1(gc, 4);
  HostBlock man_f0(fc, 1), man_g0(gc, 2), man_f1(fc, 3), man_g1(gc, 4);
  HostBlock *seg[2][2] = {{&seg_f0, &seg_g0}, {&seg_f1, &seg_g1}};
  HostBlock *man[2][2] = {{&man_f0, &man_g0}, {&man_f1, &man_g1}};
  const FloatTensor x1 = seg_f0.random_state(50, true), x2 = seg_f0.random_state(51, true);
  const FloatTensor dy1 = seg_f0.random_state(52, false), dy2 = seg_f0.random_state(53, false);
  const auto add = [](const FloatTensor &a, const FloatTensor &b) {
    FloatTensor c = a;
    for (std::size_t i = 0; i < c.data.size(); ++i) c.data[i] += b.data[i];
    return c;
  };

  // By hand: forward keeping every block's input, then backprop.
  FloatTensor h1 = x1, h2 = x2;
  std::vector<FloatTensor> in2, mid1;  // F's input X2 and G's input Y1 per block
  for (int k = 0; k < 2; ++k) {
    in2.push_back(h2);
    h1 = add(h1, man[k][0]->forward(h2, 1, nullptr));
    mid1.push_back(h1);
    h2 = add(h2, man[k][1]->forward(h1, 1, nullptr));
  }
  const FloatTensor y1 = h1, y2 = h2;
  FloatTensor g1 = dy1, g2 = dy2;
  for (int k = 1; k >= 0; --k) {
    std::unique_ptr<AlignedBytes> rg, rf;
    man[k][1]->forward(mid1[k], 1, &rg);
    FloatTensor nx1 = g1;  // dX1 = dY1 + J_G^T dY2
    man[k][1]->vjp(mid1[k], *rg, g2, nx1, 1);
    man[k][0]->forward(in2[k], 1, &rf);
    FloatTensor nx2 = g2;  // dX2 = dY2 + J_F^T dX1
    man[k][0]->vjp(in2[k], *rf, nx1, nx2, 1);
    g1 = nx1, g2 = nx2;
  }

  const auto close = [](const char *what, const FloatTensor &got, const FloatTensor &want) {
    double scale = 0.0, worst = 0.0;
    for (std::size_t i = 0; i < want.data.size(); ++i) {
      scale = std::max(scale, double(std::fabs(want.data[i])));
      worst = std::max(worst, double(std::fabs(got.data[i] - want.data[i])));
    }
    CHECK_MESSAGE(worst <= 1e-4 * scale, what, ": worst ", worst, " scale ", scale);
  };

  flatmem_reversible_block blocks[2];
  for (int k = 0; k < 2; ++k) blocks[k] = {seg[k][0]->fn, seg[k][1]->fn};
  for (auto mode : {FLATMEM_REVERSIBLE_STANDARD, FLATMEM_REVERSIBLE_VANILLA, FLATMEM_REVERSIBLE_OVERLAPPED}) {
    INFO("mode ", int(mode));
    flatmem_reversible_options o;
    REQUIRE(flatmem_reversible_options_init(&o, sizeof(flatmem_reversible_options)) == FLATMEM_STATUS_SUCCESS);
    o.mode = mode;
    o.num_threads = 3;
    flatmem_reversible_t *h = nullptr;
    REQUIRE_MESSAGE(flatmem_reversible_create(&h, blocks, 2, &o) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
    std::unique_ptr<flatmem_reversible_t, decltype(&flatmem_reversible_destroy)> handle(h, &flatmem_reversible_destroy);
    for (auto &row : seg)
      for (HostBlock *b : row)
        for (auto &g : b->grads) std::fill(g.data.begin(), g.data.end(), 0.0f);
    FloatTensor sy1(x1.shape), sy2(x1.shape), dx1(x1.shape), dx2(x1.shape);
    REQUIRE_MESSAGE(flatmem_reversible_forward(h, &x1.dl, &x2.dl, 0, 0, &sy1.dl, &sy2.dl, nullptr, 0, nullptr) ==
                        FLATMEM_STATUS_SUCCESS,
                    flatmem_last_error());
    CHECK_MESSAGE(same_bits(sy1, y1), "segment y1 differs from the hand-composed forward");
    CHECK_MESSAGE(same_bits(sy2, y2), "segment y2 differs from the hand-composed forward");
    REQUIRE_MESSAGE(flatmem_reversible_backward(h, &sy1.dl, &sy2.dl, &dy1.dl, &dy2.dl, 0, 0, &dx1.dl, &dx2.dl,
                                                nullptr, nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS,
                    flatmem_last_error());
    close("dx1", dx1, g1);
    close("dx2", dx2, g2);
    for (int k = 0; k < 2; ++k)
      for (int part = 0; part < 2; ++part)
        for (int i = 0; i < 6; ++i) {
          INFO("block ", k, " part ", part, " parameter ", i);
          close("parameter gradient", seg[k][part]->grads[i], man[k][part]->grads[i]);
        }
    // the hand-composed gradients were accumulated once; the segment's are re-zeroed per mode
  }
}
