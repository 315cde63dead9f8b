#include "support/block_case.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "support/random.hpp"

namespace flatmem_test {

// --- shapes and options ---------------------------------------------------------

BlockConfig attention(std::int64_t batch, std::int64_t tokens, std::int64_t width, std::int64_t heads) {
  BlockConfig c;
  c.kind = BlockKind::attention;
  c.batch = batch, c.tokens = tokens, c.width = width, c.heads = heads;
  return c;
}

BlockConfig mlp(std::int64_t batch, std::int64_t tokens, std::int64_t width, std::int64_t hidden) {
  BlockConfig c;
  c.kind = BlockKind::mlp;
  c.batch = batch, c.tokens = tokens, c.width = width, c.hidden = hidden;
  return c;
}

BlockConfig resolved(BlockConfig c) {
  if (c.kind == BlockKind::mlp && c.hidden == 0) c.hidden = 4 * c.width;
  return c;
}

std::string describe(const BlockConfig &c) {
  std::ostringstream s;
  s << (c.kind == BlockKind::attention ? "attention" : "mlp") << " batch " << c.batch << " tokens "
    << c.tokens << " width " << c.width;
  if (c.kind == BlockKind::attention) s << " heads " << c.heads;
  else s << " hidden " << c.hidden;
  return s.str();
}

flatmem_block_options block_options(const BlockConfig &c, flatmem_block_math math) {
  flatmem_block_options o;
  REQUIRE(flatmem_block_options_init(&o, sizeof(flatmem_block_options)) == FLATMEM_STATUS_SUCCESS);
  o.kind = c.kind == BlockKind::attention ? FLATMEM_BLOCK_ATTENTION : FLATMEM_BLOCK_MLP;
  o.width = std::int32_t(c.width);
  o.heads = c.kind == BlockKind::attention ? std::int32_t(c.heads) : 0;
  o.hidden = c.kind == BlockKind::mlp ? std::int32_t(c.hidden) : 0;
  o.layer_norm_eps = float(c.eps);
  o.math = math;
  return o;
}

std::vector<std::int64_t> parameter_shape(const BlockConfig &c, int i) {
  const std::int64_t W = c.width, Hd = resolved(c).hidden;
  if (c.kind == BlockKind::attention) {
    const std::vector<std::int64_t> s[6] = {{W}, {W}, {W, 3 * W}, {3 * W}, {W, W}, {W}};
    return s[i];
  }
  const std::vector<std::int64_t> s[6] = {{W}, {W}, {W, Hd}, {Hd}, {Hd, W}, {W}};
  return s[i];
}

const char *parameter_name(BlockKind kind, int i) {
  static const char *const names[2][6] = {
      {"ln_weight", "ln_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias"},
      {"ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"}};
  return names[kind == BlockKind::mlp][i];
}

std::vector<std::int64_t> state_shape(const BlockConfig &c) {
  if (c.batch == 1) return {c.tokens, c.width};  // (tokens, width) form
  return {c.batch, c.tokens, c.width};
}

std::array<Floats, 6> random_parameters(const BlockConfig &c, std::uint64_t seed) {
  Random rng(seed);
  std::array<Floats, 6> p;
  for (int i = 0; i < 6; ++i) {
    const auto shape = parameter_shape(c, i);
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    p[i].resize(std::size_t(n));
    const double fan_in = double(shape[0]);
    for (auto &v : p[i]) {
      switch (i) {
        case 0: v = float(1.0 + 0.2 * rng.normal()); break;                  // LN weight
        case 2: case 4: v = float(rng.normal() / std::sqrt(fan_in)); break;  // weights
        default: v = float(0.2 * rng.normal());                              // biases
      }
    }
  }
  return p;
}

Floats random_state(const BlockConfig &c, std::uint64_t seed, bool offsets) {
  Floats t(std::size_t(c.rows() * c.width));
  Random rng(seed);
  for (std::int64_t r = 0; r < c.rows(); ++r) {
    const double offset = offsets ? 2.0 * rng.normal() : 0.0;  // LN must remove it
    for (std::int64_t k = 0; k < c.width; ++k) t[std::size_t(r * c.width + k)] = float(offset + rng.normal());
  }
  return t;
}

// --- host memory --------------------------------------------------------------------

DLTensor float_tensor(void *data, const std::vector<std::int64_t> &shape, DLDevice device) {
  DLTensor t{};
  t.data = data;
  t.device = device;
  t.ndim = int(shape.size());
  t.dtype = {kDLFloat, 32, 1};
  t.shape = const_cast<std::int64_t *>(shape.data());
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

FloatTensor::FloatTensor(std::vector<std::int64_t> s, float fill) : shape(std::move(s)) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  data.assign(std::size_t(n), fill);
  refresh();
}

FloatTensor::FloatTensor(std::vector<std::int64_t> s, Floats values) : data(std::move(values)), shape(std::move(s)) {
  refresh();
}

FloatTensor &FloatTensor::operator=(const FloatTensor &o) {
  data = o.data, shape = o.shape, dl = o.dl;
  refresh();
  return *this;
}

void FloatTensor::refresh() { dl = float_tensor(data.data(), shape, {kDLCPU, 0}); }

bool same_bits(const Floats &a, const Floats &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

AlignedBytes::AlignedBytes(std::size_t n) : storage(n + 64, 0x5A) {
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  base = storage.data() + (64 - address % 64) % 64;
}

namespace {

void serial_for(const flatmem_reversible_context *, std::int64_t items,
                void (*body)(void *, std::int64_t, std::int32_t), void *arg) {
  for (std::int64_t i = 0; i < items; ++i) body(arg, i, 0);
}

// Items claimed dynamically by num_threads threads (the caller is thread 0).
void threaded_for(const flatmem_reversible_context *context, std::int64_t items,
                  void (*body)(void *, std::int64_t, std::int32_t), void *arg) {
  std::atomic<std::int64_t> next{0};
  const auto work = [&](std::int32_t thread) {
    for (std::int64_t i; (i = next.fetch_add(1)) < items;) body(arg, i, thread);
  };
  std::vector<std::thread> helpers;
  for (std::int32_t t = 1; t < context->num_threads; ++t) helpers.emplace_back(work, t);
  work(0);
  for (auto &h : helpers) h.join();
}

}  // namespace

flatmem_reversible_context cpu_context(int threads, flatmem_reversible_phase phase) {
  flatmem_reversible_context c{};
  c.struct_size = sizeof c;
  c.block = 0;
  c.part = FLATMEM_REVERSIBLE_F;
  c.phase = phase;
  c.num_threads = threads;
  c.parallel_for = threads == 1 ? serial_for : threaded_for;
  return c;
}

// --- a CPU block with random parameters ------------------------------------------------

HostBlock::HostBlock(const BlockConfig &c, std::uint64_t seed, flatmem_block_math math) : config(c) {
  const flatmem_block_options o = block_options(c, math);
  REQUIRE_MESSAGE(flatmem_block_create(&handle, &o) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
  std::array<Floats, 6> values = random_parameters(c, seed);
  for (int i = 0; i < 6; ++i) {
    params[i] = FloatTensor(parameter_shape(c, i), std::move(values[i]));
    grads[i] = FloatTensor(parameter_shape(c, i));
  }
  set_parameters(true);
  REQUIRE(flatmem_block_function(handle, &fn) == FLATMEM_STATUS_SUCCESS);
}

HostBlock::~HostBlock() { flatmem_block_destroy(handle); }

void HostBlock::set_parameters(bool with_gradients) {
  DLTensor p[6], g[6];
  for (int i = 0; i < 6; ++i) p[i] = params[i].dl, g[i] = grads[i].dl;
  REQUIRE_MESSAGE(flatmem_block_set_parameters(handle, p, with_gradients ? g : nullptr) == FLATMEM_STATUS_SUCCESS,
                  flatmem_last_error());
}

void HostBlock::zero_gradients() {
  for (auto &g : grads) std::fill(g.data.begin(), g.data.end(), 0.0f);
}

FloatTensor HostBlock::random_state(std::uint64_t seed, bool offsets) const {
  return FloatTensor(state_shape(config), flatmem_test::random_state(config, seed, offsets));
}

BlockParameterValues HostBlock::parameter_values() const {
  BlockParameterValues v;
  for (int i = 0; i < 6; ++i) v[i] = params[i].values();
  return v;
}

std::array<Floats, 6> HostBlock::gradient_values() const {
  std::array<Floats, 6> v;
  for (int i = 0; i < 6; ++i) v[i] = grads[i].data;
  return v;
}

std::size_t HostBlock::residual_bytes(const FloatTensor &x) {
  const flatmem_reversible_context c = cpu_context(1, FLATMEM_REVERSIBLE_PHASE_REBUILD);
  DLTensor meta = x.dl;
  meta.data = nullptr;
  std::size_t bytes = 0;
  REQUIRE_MESSAGE(fn.residual_size(fn.user, &c, &meta, &bytes) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
  return bytes;
}

FloatTensor HostBlock::forward(const FloatTensor &x, int threads, std::unique_ptr<AlignedBytes> *residuals) {
  FloatTensor y(x.shape, 7.0f);
  if (residuals) *residuals = std::make_unique<AlignedBytes>(residual_bytes(x));
  const flatmem_reversible_context c =
      cpu_context(threads, residuals ? FLATMEM_REVERSIBLE_PHASE_REBUILD : FLATMEM_REVERSIBLE_PHASE_FORWARD);
  REQUIRE_MESSAGE(fn.forward(fn.user, &c, &x.dl, &y.dl, residuals ? (*residuals)->data() : nullptr) ==
                      FLATMEM_STATUS_SUCCESS,
                  flatmem_last_error());
  return y;
}

void HostBlock::vjp(const FloatTensor &x, AlignedBytes &residuals, const FloatTensor &dy, FloatTensor &dx,
                    int threads) {
  const flatmem_reversible_context c = cpu_context(threads, FLATMEM_REVERSIBLE_PHASE_GRADIENT);
  REQUIRE_MESSAGE(fn.vjp(fn.user, &c, &x.dl, residuals.data(), &dy.dl, &dx.dl) == FLATMEM_STATUS_SUCCESS,
                  flatmem_last_error());
}

BlockResults HostBlock::forward_and_vjp(const FloatTensor &x, const FloatTensor &dy, int threads) {
  std::unique_ptr<AlignedBytes> residuals;
  BlockResults r;
  r.y = forward(x, threads, &residuals).data;
  FloatTensor dx(x.shape, 0.0f);
  vjp(x, *residuals, dy, dx, threads);
  r.dx = std::move(dx.data);
  r.grads = gradient_values();
  return r;
}

bool same_bits(const BlockResults &a, const BlockResults &b, const char *what) {
  bool all = true;
  const auto check = [&](const Floats &p, const Floats &q, const std::string &name) {
    const bool same = same_bits(p, q);
    CHECK_MESSAGE(same, name, " differs bitwise: ", what);
    all = all && same;
  };
  check(a.y, b.y, "y");
  check(a.dx, b.dx, "dx");
  for (int i = 0; i < 6; ++i) check(a.grads[i], b.grads[i], "gradient " + std::to_string(i));
  return all;
}

// --- tolerances ------------------------------------------------------------------------

double forward_reduction(const BlockConfig &c) {
  const BlockConfig r = resolved(c);
  return double(std::max({3 * r.width, r.hidden, r.tokens}));
}

double block_tolerance(double scale, double reduction_length, flatmem_block_math math) {
  double relative = fp32_tolerance_factor * fp32_unit_roundoff * std::sqrt(reduction_length);
  if (math == FLATMEM_BLOCK_MATH_TF32) relative += tf32_tolerance_factor * tf32_unit_roundoff;
  return relative * std::max(scale, 1e-30);
}

double check_close(const std::string &what, const Floats &got, const Values &want, double tolerance) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= worst)) worst = err, at = i;  // NaN becomes the worst
  }
  const double share = worst / tolerance;
  CHECK_MESSAGE(worst <= tolerance, what, ": worst element ", at, " got ", got[at], " want ", want[at],
                ", error ", worst, " > tolerance ", tolerance, " (", share, " of it)");
  if (std::getenv("FLATMEM_TEST_VERBOSE") != nullptr) MESSAGE(what, ": error / tolerance = ", share);
  return share;
}

double check_close(const std::string &what, const Floats &got, const Values &want, double reduction_length,
                   flatmem_block_math math) {
  double scale = 0.0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  return check_close(what, got, want, block_tolerance(scale, reduction_length, math));
}

BlockReference block_reference(const BlockConfig &c, const BlockParameterValues &p, const Values &x,
                               const Values &dy) {
  const BlockConfig r = resolved(c);
  return {block_forward(r, p, x), block_vjp(r, p, x, dy)};
}

void check_block_results(const BlockConfig &c, const BlockReference &ref, const BlockResults &got, int vjps,
                         flatmem_block_math math) {
  const auto times = [vjps](Values v) {
    for (double &e : v) e *= vjps;
    return v;
  };
  const double k = forward_reduction(c);
  check_close("y", got.y, ref.y, k, math);
  check_close("dx", got.dx, times(ref.gradients.dx), k, math);
  for (int i = 0; i < 6; ++i)
    check_close(std::string("d") + parameter_name(c.kind, i), got.grads[i], times(ref.gradients.dparams[i]),
                k + double(c.rows()), math);
}

bool last_error_names(const char *needle) {
  const char *text = flatmem_last_error();
  const bool found = std::strstr(text, needle) != nullptr;
  if (!found) MESSAGE("last error: ", std::string(text), " -- does not contain: ", std::string(needle));
  return found;
}

}  // namespace flatmem_test
