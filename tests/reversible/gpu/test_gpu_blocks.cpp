// The built-in reversible blocks on CUDA states (label gpu; skipped without a
// device): reversible.h, "Built-in blocks", CUDA paragraph.
//   - each block's callbacks called directly on a stream of ours: y, dx and
//     the six parameter gradients against the double reference
//     (support/transformer_reference.hpp) for many shapes, FP32 and TF32 math;
//     y bitwise the same without residuals; the VJP adds into dx and
//     accumulates the gradients (called twice); bitwise equal run to run;
//   - options without the `math` field (an old caller) run FP32; TF32 differs;
//   - segments of built-in blocks in every mode: OVERLAPPED and AUTO bitwise
//     VANILLA, STANDARD and the same segment on the CPU blocks close;
//   - states and parameters on different devices, host pointers labelled
//     kDLCUDA: INVALID_ARGUMENT naming the tensor;
//   - peak device memory of a segment flat in depth (VANILLA, OVERLAPPED).
// Everything the tests enqueue goes on a non-blocking stream of their own;
// host-side copies synchronise the device before and after (support below),
// so only the library's own stream ordering is under test.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/block_case.hpp"
#include "support/gpu.hpp"

using namespace flatmem_test;

namespace {

void cuda_ok(cudaError_t status, const char *call) {
  REQUIRE_MESSAGE(status == cudaSuccess, call, ": ", cudaGetErrorString(status));
}
#define CUDA_OK(call) cuda_ok((call), #call)

// std::string, not const char *: doctest prints a char pointer as an address.
std::string math_name(flatmem_block_math math) { return math == FLATMEM_BLOCK_MATH_TF32 ? "TF32" : "FP32"; }
std::string last_error() { return flatmem_last_error(); }

// --- device memory ---------------------------------------------------------------------

// Host-initiated copies and fills wait for all device work first and are
// complete when they return (cudaMemset alone would not be).
void to_device(void *dst, const void *src, std::size_t bytes) {
  device_synchronize();
  CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  device_synchronize();
}
void fill_device(void *dst, int byte, std::size_t bytes) {
  device_synchronize();
  CUDA_OK(cudaMemset(dst, byte, bytes));
  device_synchronize();
}
Floats from_device(const void *src, std::size_t count) {
  device_synchronize();
  Floats v(count);
  CUDA_OK(cudaMemcpy(v.data(), src, count * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

// An fp32 tensor in cudaMalloc'ed memory (256-byte aligned) on device 0.
struct DeviceFloats {
  std::vector<std::int64_t> shape;
  DeviceBuffer buffer;
  DLTensor dl{};

  DeviceFloats(std::vector<std::int64_t> s, const Floats &values)
      : shape(std::move(s)), buffer(values.size() * sizeof(float)) {
    to_device(buffer.data(), values.data(), buffer.size());
    dl = float_tensor(buffer.data(), shape, {kDLCUDA, 0});
  }
  DeviceFloats(DeviceFloats &&o) noexcept : shape(std::move(o.shape)), buffer(std::move(o.buffer)), dl(o.dl) {
    dl.shape = shape.data();
  }
  std::size_t count() const { return buffer.size() / sizeof(float); }
  Floats read() const { return from_device(buffer.data(), count()); }
};

Floats values_of(const FloatTensor &t) { return t.data; }
Floats values_of(const DeviceFloats &t) { return t.read(); }

Floats zeros_like(const Floats &v) { return Floats(v.size(), 0.0f); }

struct Stream {
  cudaStream_t stream = nullptr;
  Stream() { CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream); }
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;
};

// The context a CUDA callback gets: our stream, one thread, no parallel_for.
flatmem_reversible_context device_context(cudaStream_t stream, flatmem_reversible_phase phase) {
  flatmem_reversible_context c{};
  c.struct_size = sizeof c;
  c.block = 0;
  c.part = FLATMEM_REVERSIBLE_F;
  c.phase = phase;
  c.num_threads = 1;
  c.stream = stream;
  c.parallel_for = nullptr;
  return c;
}

// --- a CUDA block ---------------------------------------------------------------------------

// A block on device 0 with a HostBlock's configuration and parameter values;
// its gradients start at zero.
struct DeviceBlock {
  BlockConfig config;
  flatmem_block_t *handle = nullptr;
  std::vector<DeviceFloats> params, grads;
  flatmem_reversible_function fn{};

  DeviceBlock(const HostBlock &host, const flatmem_block_options &options) : config(host.config) {
    REQUIRE_MESSAGE(flatmem_block_create(&handle, &options) == FLATMEM_STATUS_SUCCESS, last_error());
    for (int i = 0; i < 6; ++i) {
      params.emplace_back(host.params[i].shape, host.params[i].data);
      grads.emplace_back(host.params[i].shape, zeros_like(host.params[i].data));
    }
    set_parameters(true);
    REQUIRE(flatmem_block_function(handle, &fn) == FLATMEM_STATUS_SUCCESS);
  }
  DeviceBlock(const HostBlock &host, flatmem_block_math math) : DeviceBlock(host, block_options(host.config, math)) {}
  ~DeviceBlock() { flatmem_block_destroy(handle); }
  DeviceBlock(const DeviceBlock &) = delete;
  DeviceBlock &operator=(const DeviceBlock &) = delete;

  void set_parameters(bool with_gradients) {
    DLTensor p[6], g[6];
    for (int i = 0; i < 6; ++i) p[i] = params[i].dl, g[i] = grads[i].dl;
    REQUIRE_MESSAGE(flatmem_block_set_parameters(handle, p, with_gradients ? g : nullptr) == FLATMEM_STATUS_SUCCESS,
                    last_error());
  }
  void zero_gradients() {
    for (auto &g : grads) fill_device(g.buffer.data(), 0, g.buffer.size());
  }
  std::array<Floats, 6> gradient_values() const {
    std::array<Floats, 6> v;
    for (int i = 0; i < 6; ++i) v[i] = grads[i].read();
    return v;
  }
};

// One block's callbacks on `stream`, enqueued back to back without a host
// wait: residual_size; forward keeping residuals (a 64-byte aligned device
// buffer of garbage); forward without; the VJP into a zero dx; after reading
// the results, the VJP again (adding into that dx, accumulating the gradients).
struct DeviceBlockRun {
  Floats y_without_residuals;
  BlockResults once, twice;  // after one and two VJPs; y is the forward's
};

DeviceBlockRun run_device_block(DeviceBlock &block, const Floats &x, const Floats &dy, cudaStream_t stream) {
  const auto shape = state_shape(block.config);
  const flatmem_reversible_function &fn = block.fn;
  block.zero_gradients();
  const DeviceFloats xd(shape, x), dyd(shape, dy);
  DeviceFloats y(shape, Floats(x.size(), 7.0f)), y_plain(shape, Floats(x.size(), 7.0f)), dx(shape, zeros_like(x));
  const flatmem_reversible_context rebuild = device_context(stream, FLATMEM_REVERSIBLE_PHASE_REBUILD);
  const flatmem_reversible_context forward = device_context(stream, FLATMEM_REVERSIBLE_PHASE_FORWARD);
  const flatmem_reversible_context gradient = device_context(stream, FLATMEM_REVERSIBLE_PHASE_GRADIENT);

  DLTensor meta = xd.dl;
  meta.data = nullptr;
  std::size_t bytes = 0;
  REQUIRE_MESSAGE(fn.residual_size(fn.user, &rebuild, &meta, &bytes) == FLATMEM_STATUS_SUCCESS, last_error());
  DeviceBuffer residuals(bytes);
  fill_device(residuals.data(), 0x5A, bytes);
  REQUIRE(reinterpret_cast<std::uintptr_t>(residuals.data()) % 64 == 0);

  REQUIRE_MESSAGE(fn.forward(fn.user, &rebuild, &xd.dl, &y.dl, residuals.data()) == FLATMEM_STATUS_SUCCESS,
                  last_error());
  REQUIRE_MESSAGE(fn.forward(fn.user, &forward, &xd.dl, &y_plain.dl, nullptr) == FLATMEM_STATUS_SUCCESS,
                  last_error());
  REQUIRE_MESSAGE(fn.vjp(fn.user, &gradient, &xd.dl, residuals.data(), &dyd.dl, &dx.dl) == FLATMEM_STATUS_SUCCESS,
                  last_error());
  DeviceBlockRun run;
  run.once = {y.read(), dx.read(), block.gradient_values()};
  run.y_without_residuals = y_plain.read();
  REQUIRE_MESSAGE(fn.vjp(fn.user, &gradient, &xd.dl, residuals.data(), &dyd.dl, &dx.dl) == FLATMEM_STATUS_SUCCESS,
                  last_error());
  run.twice = {run.once.y, dx.read(), block.gradient_values()};
  return run;
}

// Every check of one shape, for FP32 and TF32 math against one reference.
void check_device_block(const BlockConfig &c, cudaStream_t stream) {
  INFO(describe(c));
  const HostBlock host(c, 11);
  const Floats x = random_state(c, 21, true), dy = random_state(c, 31, false);
  const BlockReference ref =
      block_reference(c, host.parameter_values(), Values(x.begin(), x.end()), Values(dy.begin(), dy.end()));
  for (flatmem_block_math math : {FLATMEM_BLOCK_MATH_FP32, FLATMEM_BLOCK_MATH_TF32}) {
    INFO("math ", math_name(math));
    DeviceBlock block(host, math);
    const DeviceBlockRun a = run_device_block(block, x, dy, stream);
    const DeviceBlockRun b = run_device_block(block, x, dy, stream);
    CHECK_MESSAGE(same_bits(a.once.y, a.y_without_residuals), "y differs with and without residuals");
    check_block_results(c, ref, a.once, 1, math);
    // dx held the first VJP's result, so the second makes it 2 J^T dy; the
    // gradients likewise hold twice the reference's.
    check_block_results(c, ref, a.twice, 2, math);
    same_bits(a.once, b.once, "run to run");
    same_bits(a.twice, b.twice, "run to run, after the second VJP");
  }
}

// tokens 1, 2, 7, 31, 197 x width 8, 24, 96, 384 x batch 1 (the (tokens,
// width) form) and 2, with heads 1, 3, 6 where they divide the width (MLP:
// hidden 4 width and 37).
std::vector<BlockConfig> shapes(BlockKind kind) {
  std::vector<BlockConfig> out;
  for (std::int64_t tokens : {1, 2, 7, 31, 197})
    for (std::int64_t width : {8, 24, 96, 384})
      for (std::int64_t batch : {1, 2}) {
        if (kind == BlockKind::attention) {
          for (std::int64_t heads : {1, 3, 6})
            if (width % heads == 0) out.push_back(attention(batch, tokens, width, heads));
        } else {
          for (std::int64_t hidden : {0, 37}) out.push_back(mlp(batch, tokens, width, hidden));
        }
      }
  return out;
}

}  // namespace

// --- one block, callbacks called directly ------------------------------------------------------

TEST_CASE("gpu/blocks/attention/y, dx and gradients match the double reference (FP32, TF32), accumulate, repeat bitwise") {
  Stream s;
  for (const BlockConfig &c : shapes(BlockKind::attention)) check_device_block(c, s.stream);
}

TEST_CASE("gpu/blocks/mlp/y, dx and gradients match the double reference (FP32, TF32), accumulate, repeat bitwise") {
  Stream s;
  for (const BlockConfig &c : shapes(BlockKind::mlp)) check_device_block(c, s.stream);
}

// "Appended after 0.1.0: a caller compiled without it (smaller struct_size)
// gets FP32": such a block (garbage where `math` would be) gives the FP32
// block's bits; and TF32 really changes the products.
TEST_CASE("gpu/blocks/math/options without the math field run FP32, and TF32 differs from FP32") {
  Stream s;
  for (const BlockConfig &c : {attention(2, 31, 96, 3), mlp(2, 31, 96, 0)}) {
    INFO(describe(c));
    const HostBlock host(c, 5);
    const Floats x = random_state(c, 6, true), dy = random_state(c, 7, false);
    flatmem_block_options old = block_options(c, flatmem_block_math(7));
    old.struct_size = offsetof(flatmem_block_options, math);
    DeviceBlock fp32(host, FLATMEM_BLOCK_MATH_FP32), tf32(host, FLATMEM_BLOCK_MATH_TF32), legacy(host, old);
    const DeviceBlockRun a = run_device_block(fp32, x, dy, s.stream);
    const DeviceBlockRun b = run_device_block(legacy, x, dy, s.stream);
    const DeviceBlockRun t = run_device_block(tf32, x, dy, s.stream);
    same_bits(a.once, b.once, "an old caller's block vs FP32");
    CHECK_MESSAGE(!same_bits(a.once.y, t.once.y), "TF32 gives FP32's bits: are the products run in TF32?");
  }
}

// --- segments of built-in blocks ---------------------------------------------------------------

namespace {

struct SegmentData {
  Floats x1, x2, dy1, dy2;
};

struct SegmentResults {
  Floats y1, y2, dx1, dx2;
  std::vector<std::array<Floats, 6>> grads;  // block k: F at 2k, G at 2k + 1
  flatmem_reversible_mode ran = FLATMEM_REVERSIBLE_AUTO;
};

// The forward of the segment (F = f[k], G = g[k]) in `mode`, then
// `backwards` backwards of its output, the gradients zeroed before each (on
// the GPU that waits for the device, so an AUTO measurement has completed
// before the next backward); the results of each. Tensor = FloatTensor and
// HostBlock on the CPU, DeviceFloats and DeviceBlock on `stream`.
template <typename Tensor, typename Block>
std::vector<SegmentResults> run_segment(const std::vector<std::unique_ptr<Block>> &f,
                                        const std::vector<std::unique_ptr<Block>> &g,
                                        const std::vector<std::int64_t> &shape, const SegmentData &in,
                                        flatmem_reversible_mode mode, cudaStream_t stream, int backwards = 1) {
  std::vector<flatmem_reversible_block> blocks;
  for (std::size_t k = 0; k < f.size(); ++k) blocks.push_back({f[k]->fn, g[k]->fn});
  flatmem_reversible_options o;
  REQUIRE(flatmem_reversible_options_init(&o, sizeof(flatmem_reversible_options)) == FLATMEM_STATUS_SUCCESS);
  o.mode = mode;
  o.num_threads = 2;
  flatmem_reversible_t *h = nullptr;
  REQUIRE_MESSAGE(flatmem_reversible_create(&h, blocks.data(), std::int32_t(blocks.size()), &o) ==
                      FLATMEM_STATUS_SUCCESS,
                  last_error());
  const std::unique_ptr<flatmem_reversible_t, decltype(&flatmem_reversible_destroy)> handle(
      h, &flatmem_reversible_destroy);
  const Tensor x1(shape, in.x1), x2(shape, in.x2), dy1(shape, in.dy1), dy2(shape, in.dy2);
  Tensor y1(shape, zeros_like(in.x1)), y2(shape, zeros_like(in.x1)), dx1(shape, zeros_like(in.x1)),
      dx2(shape, zeros_like(in.x1));
  REQUIRE_MESSAGE(flatmem_reversible_forward(h, &x1.dl, &x2.dl, 5, 9, &y1.dl, &y2.dl, nullptr, 0, stream) ==
                      FLATMEM_STATUS_SUCCESS,
                  last_error());
  std::vector<SegmentResults> all;
  for (int b = 0; b < backwards; ++b) {
    for (std::size_t k = 0; k < f.size(); ++k) {
      f[k]->zero_gradients();
      g[k]->zero_gradients();
    }
    REQUIRE_MESSAGE(flatmem_reversible_backward(h, &y1.dl, &y2.dl, &dy1.dl, &dy2.dl, 5, 9, &dx1.dl, &dx2.dl, nullptr,
                                                nullptr, nullptr, 0, stream) == FLATMEM_STATUS_SUCCESS,
                    last_error());
    SegmentResults r;
    REQUIRE(flatmem_reversible_last_mode(h, &r.ran) == FLATMEM_STATUS_SUCCESS);
    r.y1 = values_of(y1), r.y2 = values_of(y2), r.dx1 = values_of(dx1), r.dx2 = values_of(dx2);
    for (std::size_t k = 0; k < f.size(); ++k) {
      r.grads.push_back(f[k]->gradient_values());
      r.grads.push_back(g[k]->gradient_values());
    }
    all.push_back(std::move(r));
  }
  return all;
}

void same_segment_bits(const SegmentResults &got, const SegmentResults &want, const char *what) {
  CHECK_MESSAGE(same_bits(got.y1, want.y1), "y1 differs bitwise: ", what);
  CHECK_MESSAGE(same_bits(got.y2, want.y2), "y2 differs bitwise: ", what);
  CHECK_MESSAGE(same_bits(got.dx1, want.dx1), "dx1 differs bitwise: ", what);
  CHECK_MESSAGE(same_bits(got.dx2, want.dx2), "dx2 differs bitwise: ", what);
  for (std::size_t b = 0; b < want.grads.size(); ++b)
    for (int i = 0; i < 6; ++i)
      CHECK_MESSAGE(same_bits(got.grads[b][i], want.grads[b][i]), "block ", b / 2, (b % 2 ? " G" : " F"),
                    " gradient ", i, " differs bitwise: ", what);
}

// Two fp32 runs of an n-block segment (the GPU and the CPU, or STANDARD's
// true inputs and VANILLA's rebuilt ones). Each is within the block tolerance
// of exact arithmetic per block, and a block's error reaches the output
// through the residual connections with a gain of about one (LayerNorm
// divides by the stream's own spread): each run is within n block tolerances
// of the exact segment, the two within 2 n. Measured on the CPU against a
// double-precision composition of the reference blocks, both segments below
// stay under 0.1 block tolerance at depth 3 to 12 (the errors are relative to
// max|output|, which grows with depth as well), so 2 n is ample; an O(1)
// defect still exceeds it 50-fold at depth 6. TF32 products enter through
// block_tolerance.
void close_segments(const SegmentResults &got, const SegmentResults &want, const BlockConfig &fc,
                    const BlockConfig &gc, flatmem_block_math math, const char *what) {
  INFO(what);
  const double blocks = double(want.grads.size() / 2);
  const double k = std::max(forward_reduction(fc), forward_reduction(gc));
  const auto close = [&](const std::string &name, const Floats &g, const Floats &w, double reduction) {
    const Values reference(w.begin(), w.end());
    double scale = 0.0;
    for (double v : reference) scale = std::max(scale, std::fabs(v));
    check_close(name, g, reference, 2.0 * blocks * block_tolerance(scale, reduction, math));
  };
  close("y1", got.y1, want.y1, k);
  close("y2", got.y2, want.y2, k);
  close("dx1", got.dx1, want.dx1, k);
  close("dx2", got.dx2, want.dx2, k);
  for (std::size_t b = 0; b < want.grads.size(); ++b)
    for (int i = 0; i < 6; ++i)
      close("block " + std::to_string(b / 2) + (b % 2 ? " G d" : " F d") +
                parameter_name(b % 2 ? BlockKind::mlp : BlockKind::attention, i),
            got.grads[b][i], want.grads[b][i], k + double(fc.rows()));
}

}  // namespace

TEST_CASE("gpu/blocks/segment/every mode: overlapped and auto == vanilla bitwise, standard and the CPU close") {
  Stream s;
  struct Family {
    BlockConfig f, g;
  };
  // (tokens, width) states with 6 heads and an odd hidden; (batch, tokens, width) with the default hidden.
  for (const Family &family : {Family{attention(1, 197, 24, 6), mlp(1, 197, 24, 37)},
                               Family{attention(2, 31, 96, 3), mlp(2, 31, 96, 0)}})
    for (int depth : {3, 6}) {
      INFO(describe(family.f), ", ", describe(family.g), ", depth ", depth);
      std::vector<std::unique_ptr<HostBlock>> host_f, host_g;
      for (int k = 0; k < depth; ++k) {
        host_f.push_back(std::make_unique<HostBlock>(family.f, 100 + 2 * k));
        host_g.push_back(std::make_unique<HostBlock>(family.g, 101 + 2 * k));
      }
      const auto shape = state_shape(family.f);
      const SegmentData in{random_state(family.f, 1, true), random_state(family.f, 2, true),
                           random_state(family.f, 3, false), random_state(family.f, 4, false)};
      const SegmentResults cpu_standard =
          run_segment<FloatTensor>(host_f, host_g, shape, in, FLATMEM_REVERSIBLE_STANDARD, nullptr).front();
      const SegmentResults cpu_vanilla =
          run_segment<FloatTensor>(host_f, host_g, shape, in, FLATMEM_REVERSIBLE_VANILLA, nullptr).front();

      for (flatmem_block_math math : {FLATMEM_BLOCK_MATH_FP32, FLATMEM_BLOCK_MATH_TF32}) {
        INFO("math ", math_name(math));
        std::vector<std::unique_ptr<DeviceBlock>> f, g;
        for (int k = 0; k < depth; ++k) {
          f.push_back(std::make_unique<DeviceBlock>(*host_f[k], math));
          g.push_back(std::make_unique<DeviceBlock>(*host_g[k], math));
        }
        const auto run = [&](flatmem_reversible_mode mode) {
          return run_segment<DeviceFloats>(f, g, shape, in, mode, s.stream).front();
        };
        const SegmentResults vanilla = run(FLATMEM_REVERSIBLE_VANILLA);
        const SegmentResults overlapped = run(FLATMEM_REVERSIBLE_OVERLAPPED);
        const SegmentResults standard = run(FLATMEM_REVERSIBLE_STANDARD);
        CHECK(vanilla.ran == FLATMEM_REVERSIBLE_VANILLA);
        CHECK(overlapped.ran == FLATMEM_REVERSIBLE_OVERLAPPED);
        CHECK(standard.ran == FLATMEM_REVERSIBLE_STANDARD);
        same_segment_bits(overlapped, vanilla, "OVERLAPPED vs VANILLA");
        same_segment_bits(run(FLATMEM_REVERSIBLE_VANILLA), vanilla, "VANILLA run to run");
        // AUTO probes VANILLA, OVERLAPPED, VANILLA, OVERLAPPED (timed by events
        // that the next backward reads; each measurement is complete by then,
        // run_segment having waited for the device), then keeps the faster:
        // both modes run within six backwards, every one bitwise VANILLA.
        bool auto_ran[2] = {false, false};
        const auto automatic = run_segment<DeviceFloats>(f, g, shape, in, FLATMEM_REVERSIBLE_AUTO, s.stream, 6);
        for (const SegmentResults &r : automatic) {
          CHECK((r.ran == FLATMEM_REVERSIBLE_VANILLA || r.ran == FLATMEM_REVERSIBLE_OVERLAPPED));
          auto_ran[r.ran == FLATMEM_REVERSIBLE_OVERLAPPED] = true;
          same_segment_bits(r, vanilla, "AUTO vs VANILLA");
        }
        CHECK_MESSAGE(auto_ran[0], "AUTO never ran VANILLA in six backwards");
        CHECK_MESSAGE(auto_ran[1], "AUTO never ran OVERLAPPED in six backwards");
        // The forward is the same calls in every mode (STANDARD's keep residuals).
        CHECK(same_bits(standard.y1, vanilla.y1));
        CHECK(same_bits(standard.y2, vanilla.y2));
        close_segments(standard, vanilla, family.f, family.g, math, "GPU STANDARD vs GPU VANILLA");
        close_segments(vanilla, cpu_vanilla, family.f, family.g, math, "GPU VANILLA vs CPU VANILLA");
        close_segments(standard, cpu_standard, family.f, family.g, math, "GPU STANDARD vs CPU STANDARD");
      }
    }
}

// --- refused arguments --------------------------------------------------------------------------

TEST_CASE("gpu/blocks/bad input/states and parameters on different devices name the state") {
  Stream s;
  const BlockConfig c = attention(2, 5, 12, 3);
  const HostBlock host(c, 1);                      // CPU parameters
  DeviceBlock device(host, FLATMEM_BLOCK_MATH_FP32);  // the same on the GPU
  const flatmem_reversible_function &fn = device.fn;
  const auto shape = state_shape(c);
  const Floats values = random_state(c, 2, true), sevens(values.size(), 7.0f);
  FloatTensor cpu_x(shape, values), cpu_y(shape, sevens), cpu_dx(shape, zeros_like(values));
  DeviceFloats gpu_x(shape, values), gpu_y(shape, sevens), gpu_dy(shape, values), gpu_dx(shape, zeros_like(values));
  const flatmem_reversible_context forward = device_context(s.stream, FLATMEM_REVERSIBLE_PHASE_FORWARD);
  const flatmem_reversible_context rebuild = device_context(s.stream, FLATMEM_REVERSIBLE_PHASE_REBUILD);
  const flatmem_reversible_context gradient = device_context(s.stream, FLATMEM_REVERSIBLE_PHASE_GRADIENT);

  // CUDA parameters, CPU state.
  CHECK(fn.forward(fn.user, &forward, &cpu_x.dl, &cpu_y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("x: "));
  CHECK_MESSAGE(same_bits(cpu_y.data, sevens), "y written by a refused call");
  CHECK(fn.forward(fn.user, &forward, &gpu_x.dl, &cpu_y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("y: "));
  DLTensor meta = cpu_x.dl;
  meta.data = nullptr;
  std::size_t bytes = 0;
  CHECK(fn.residual_size(fn.user, &rebuild, &meta, &bytes) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("x: "));
  meta = gpu_x.dl;
  meta.data = nullptr;
  REQUIRE_MESSAGE(fn.residual_size(fn.user, &rebuild, &meta, &bytes) == FLATMEM_STATUS_SUCCESS, last_error());
  DeviceBuffer residuals(bytes);
  REQUIRE_MESSAGE(fn.forward(fn.user, &rebuild, &gpu_x.dl, &gpu_y.dl, residuals.data()) == FLATMEM_STATUS_SUCCESS,
                  last_error());
  CHECK(fn.vjp(fn.user, &gradient, &gpu_x.dl, residuals.data(), &gpu_dy.dl, &cpu_dx.dl) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("dx: "));
  CHECK_MESSAGE(same_bits(cpu_dx.data, zeros_like(values)), "dx written by a refused call");
  device_synchronize();  // the accepted forward finishes before its buffers go

  // CPU parameters, CUDA state.
  const flatmem_reversible_context cpu = cpu_context(1, FLATMEM_REVERSIBLE_PHASE_FORWARD);
  CHECK(host.fn.forward(host.fn.user, &cpu, &gpu_x.dl, &gpu_y.dl, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("x: "));

  // Through a segment: CPU states reach the CUDA blocks' callback, whose
  // refusal the executor reports for block 0's F.
  const flatmem_reversible_block blocks[1] = {{device.fn, device.fn}};
  flatmem_reversible_t *h = nullptr;
  REQUIRE(flatmem_reversible_create(&h, blocks, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  const std::unique_ptr<flatmem_reversible_t, decltype(&flatmem_reversible_destroy)> handle(
      h, &flatmem_reversible_destroy);
  FloatTensor cpu_x2 = cpu_x, cpu_y2 = cpu_y;
  CHECK(flatmem_reversible_forward(h, &cpu_x.dl, &cpu_x2.dl, 0, 0, &cpu_y.dl, &cpu_y2.dl, nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("block 0, F forward"));
  CHECK(last_error_names("x: "));
  // A kDLCUDA state whose data is host memory: the executor refuses it.
  FloatTensor host_memory(shape, values);
  host_memory.dl.device = {kDLCUDA, 0};
  DeviceFloats gpu_x2(shape, values), gpu_y2(shape, sevens);
  CHECK(flatmem_reversible_forward(h, &host_memory.dl, &gpu_x2.dl, 0, 0, &gpu_y.dl, &gpu_y2.dl, nullptr, 0,
                                   s.stream) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(last_error_names("x1"));
}

TEST_CASE("gpu/blocks/bad input/set_parameters: mixed devices and host pointers name the tensor") {
  const BlockConfig c = mlp(1, 3, 8, 0);
  HostBlock host(c, 1);
  DeviceBlock device(host, FLATMEM_BLOCK_MATH_FP32);
  DLTensor p[6], g[6];
  const auto on_device = [&] {
    for (int i = 0; i < 6; ++i) p[i] = device.params[i].dl, g[i] = device.grads[i].dl;
  };
  const auto refused = [&](flatmem_block_t *block, const char *needle) {
    CHECK(flatmem_block_set_parameters(block, p, g) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_names(needle));
  };
  on_device();
  g[3] = host.grads[3].dl;  // one CPU gradient among CUDA tensors
  refused(device.handle, "gradients[3]");
  for (int i = 0; i < 6; ++i) p[i] = host.params[i].dl, g[i] = host.grads[i].dl;
  p[2] = device.params[2].dl;  // one CUDA parameter among CPU tensors
  refused(host.handle, "parameters[2]");
  on_device();
  g[5].device.device_id = 1;  // another device id than the rest
  refused(device.handle, "gradients[5]");
  on_device();
  p[0] = host.params[0].dl;  // host memory labelled kDLCUDA
  p[0].device = {kDLCUDA, 0};
  refused(device.handle, "parameters[0]");
  on_device();
  g[4] = host.grads[4].dl;
  g[4].device = {kDLCUDA, 0};
  refused(device.handle, "gradients[4]");
  // The refusals left the block as it was: it still runs on its CUDA tensors.
  Stream s;
  const Floats x = random_state(c, 2, true);
  const DeviceBlockRun run = run_device_block(device, x, x, s.stream);
  CHECK(run.once.y.size() == x.size());
}

// --- memory --------------------------------------------------------------------------------------

// A VANILLA or OVERLAPPED segment keeps one or two blocks' residuals and a
// few states, whatever its depth: its peak device memory -- the per-call
// scratch the blocks take from the device's current memory pool (its
// cudaMemPoolAttrUsedMemHigh after a reset) plus the workspace we pass, sized
// by the workspace queries -- is the same at depth 4, 16 and 64 (within 10%).
// Weights are tied (one F and one G serve every block): parameters are not
// activation memory, and they live outside the pool anyway.
TEST_CASE("gpu/blocks/memory/peak device memory is flat in depth (vanilla, overlapped)") {
  Stream s;
  const BlockConfig fc = attention(4, 197, 192, 3), gc = mlp(4, 197, 192, 0);
  const HostBlock host_f(fc, 1), host_g(gc, 2);
  DeviceBlock f(host_f, FLATMEM_BLOCK_MATH_FP32), g(host_g, FLATMEM_BLOCK_MATH_FP32);
  const auto shape = state_shape(fc);
  const Floats zero(std::size_t(fc.rows() * fc.width), 0.0f);
  const DeviceFloats x1(shape, random_state(fc, 3, true)), x2(shape, random_state(fc, 4, true)),
      dy1(shape, random_state(fc, 5, false)), dy2(shape, random_state(fc, 6, false));
  DeviceFloats y1(shape, zero), y2(shape, zero), dx1(shape, zero), dx2(shape, zero);
  cudaMemPool_t pool = nullptr;
  CUDA_OK(cudaDeviceGetMemPool(&pool, 0));

  for (flatmem_reversible_mode mode : {FLATMEM_REVERSIBLE_VANILLA, FLATMEM_REVERSIBLE_OVERLAPPED}) {
    INFO("mode ", int(mode));
    std::vector<double> peaks;
    for (int depth : {4, 16, 64}) {
      const std::vector<flatmem_reversible_block> blocks(std::size_t(depth), flatmem_reversible_block{f.fn, g.fn});
      flatmem_reversible_options o;
      REQUIRE(flatmem_reversible_options_init(&o, sizeof(flatmem_reversible_options)) == FLATMEM_STATUS_SUCCESS);
      o.mode = mode;
      flatmem_reversible_t *h = nullptr;
      REQUIRE(flatmem_reversible_create(&h, blocks.data(), depth, &o) == FLATMEM_STATUS_SUCCESS);
      const std::unique_ptr<flatmem_reversible_t, decltype(&flatmem_reversible_destroy)> handle(
          h, &flatmem_reversible_destroy);
      std::size_t forward_bytes = 0, backward_bytes = 0;
      REQUIRE(flatmem_reversible_forward_workspace_size(h, &x1.dl, &forward_bytes) == FLATMEM_STATUS_SUCCESS);
      REQUIRE(flatmem_reversible_backward_workspace_size(h, &x1.dl, &backward_bytes) == FLATMEM_STATUS_SUCCESS);
      const DeviceBuffer workspace(std::max(forward_bytes, backward_bytes));
      f.zero_gradients();
      g.zero_gradients();

      device_synchronize();
      std::uint64_t high = 0;  // writing 0 resets the high-water mark to the memory in use now
      CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
      REQUIRE_MESSAGE(flatmem_reversible_forward(h, &x1.dl, &x2.dl, 0, 0, &y1.dl, &y2.dl, workspace.data(),
                                                 workspace.size(), s.stream) == FLATMEM_STATUS_SUCCESS,
                      last_error());
      REQUIRE_MESSAGE(flatmem_reversible_backward(h, &y1.dl, &y2.dl, &dy1.dl, &dy2.dl, 0, 0, &dx1.dl, &dx2.dl,
                                                  nullptr, nullptr, workspace.data(), workspace.size(),
                                                  s.stream) == FLATMEM_STATUS_SUCCESS,
                      last_error());
      device_synchronize();
      CUDA_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
      CHECK_MESSAGE(high > 0, "the blocks took no scratch from the device's current memory pool");
      const double peak = double(high) + double(workspace.size());
      MESSAGE("depth ", depth, ": pool high ", double(high) / (1 << 20), " MiB + workspace ",
              double(workspace.size()) / (1 << 20), " MiB = ", peak / (1 << 20), " MiB");
      peaks.push_back(peak);
    }
    const auto [low, top] = std::minmax_element(peaks.begin(), peaks.end());
    CHECK_MESSAGE(*top <= 1.10 * *low, "peak device memory grows with depth: ", *low / (1 << 20), " to ",
                  *top / (1 << 20), " MiB");
  }
}
