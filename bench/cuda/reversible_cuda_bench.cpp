// reversible_cuda_bench -- the GPU counterpart of reversible_bench: a ViT-like
// reversible segment of flatmem's built-in blocks, forward + backward on one
// CUDA device, in the modes STANDARD (ordinary backprop, the baseline),
// VANILLA (rebuild then gradients), OVERLAPPED (the rebuild of block k-1 on
// the handle's second stream while block k's gradients run on ours) and AUTO,
// side by side in one process.
//
//   reversible_cuda_bench                          depths 12,24; batches 8..128; 197 tokens; TF32
//   reversible_cuda_bench --math fp32 --csv bench/reversible_cuda_bench.csv
//   reversible_cuda_bench --quick                  depths 2,4, batch 2, 16 tokens, 1 round (CTest smoke)
//
// The model is reversible_bench's (bench/reversible_support.hpp): block k is
// F_k = attention block k (pre-LN MHSA, width 384, 6 heads), G_k = MLP block k
// (pre-LN, hidden 1536, exact GELU), the same fixed-seed parameters, uploaded
// once into one device slab of parameters and one of gradients; states
// (batch, tokens, width) fp32 on the device, both residual streams starting as
// the same N(0, 1) token embeddings. --math picks the blocks' product
// precision (default TF32; FP32 is what reversible_bench runs).
//
// For each (depth, batch), on a non-blocking stream created here:
//   1. warm-up: every mode --warmup times on handles that are then destroyed
//      (kernels loaded, cuBLASLt plans made, the memory pool grown);
//   2. memory pass: one forward + backward per mode on a fresh handle (the one
//      then timed; AUTO: its 4 probe backwards V, O, V, O, so that it has made
//      its choice before the timed pass). Peak = the workspace this bench
//      cudaMalloc'ed and passed (the mode's larger workspace query) + the
//      pool's high-water mark of the blocks' scratch (cudaMemPoolAttrUsedMemHigh,
//      reset before the first forward) + device memory taken outside the pool
//      during the calls -- STANDARD's record, cudaMalloc'ed by its first
//      forward (see OutsidePool);
//   3. timed pass: --rounds rounds, each running every mode once (the order
//      rotates per round); cudaEvents on our stream around the forward and the
//      backward, parameter gradients zeroed by one cudaMemsetAsync before the
//      first event; the device is synchronised between steps (the handle's
//      rebuild stream included). Each mode reports its median;
//   4. checks: dX of OVERLAPPED and AUTO bitwise equal to VANILLA's, STANDARD's
//      max relative difference.
// Then the targets: OVERLAPPED >= 1.15x VANILLA at some configuration, AUTO
// >= 0.97x VANILLA in every one, and memory flat in depth (each reversible
// mode's peak at the last depth within 5% of the first's) -- reported, not
// enforced. Every flatmem status and CUDA call is checked: a failure prints
// the call, the status and flatmem_last_error() and exits 1; so does a dX
// that differs from VANILLA's. Without a CUDA device: "no CUDA device" and
// exit 0 (77 with --quick: CTest's SKIP_RETURN_CODE).
#include <cuda_runtime_api.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "reversible_support.hpp"

namespace {

using namespace bench::reversible;

constexpr int device_id = 0;
constexpr int skip_return_code = 77;     // --quick without a device (CTest SKIP_RETURN_CODE)
constexpr std::uint64_t seed = 7, offset = 0;
constexpr std::size_t parameter_alignment = 256;  // each parameter tensor's offset in its slab

// The targets of the issue.
constexpr double target_overlapped_over_vanilla = 1.15;  // at some configuration
constexpr double target_auto_over_vanilla = 0.97;        // in every configuration
constexpr double target_flat_in_depth = 1.05;            // peak(last depth) / peak(first depth)

// ---- CUDA errors -------------------------------------------------------------------------

void cuda_check(cudaError_t status, const char *call, const char *file, int line) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " (" + file + ":" + std::to_string(line) +
                             "): " + cudaGetErrorString(status));
}
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)

// ---- options -----------------------------------------------------------------------------

struct Options : SegmentOptions {
  flatmem_block_math math = FLATMEM_BLOCK_MATH_TF32;
  bool quick = false;
};

const char *math_name(flatmem_block_math m) { return m == FLATMEM_BLOCK_MATH_TF32 ? "TF32" : "FP32"; }

void usage() {
  std::printf(
      "usage: reversible_cuda_bench [--depths 12,24] [--batches 8,16,32,64,128] [--tokens T]\n"
      "                             [--math fp32|tf32] [--rounds N] [--warmup N] [--width W]\n"
      "                             [--heads H] [--hidden M] [--csv PATH] [--quick]\n"
      "  A reversible segment of built-in pre-LN attention (F) and MLP (G) blocks, fp32 states,\n"
      "  on CUDA device 0, forward + backward in the modes STANDARD, VANILLA, OVERLAPPED and\n"
      "  AUTO. Defaults: depths 12,24, batches 8,16,32,64,128, 197 tokens, width 384, 6 heads,\n"
      "  hidden 1536, --math tf32 (the blocks' products on TF32 tensor cores, fp32 accumulation;\n"
      "  fp32: full fp32 products, as reversible_bench on the CPU), 3 timed rounds (median\n"
      "  reported) after 1 warm-up.\n"
      "  --quick: depths 2,4, batch 2, 16 tokens, 1 round (a smoke test; explicit options win).\n"
      "  Without a CUDA device: prints \"no CUDA device\" and exits 0 (77 with --quick).\n");
}

Options parse(int argc, char **argv) {
  Options o;
  o.batches = {8, 16, 32, 64, 128};
  const QuickSettings quick{{2, 4}, {2}, 16, 1};  // depths 2 and 4: the rebuild stream waits from 3 blocks on
  o.quick = parse_segment_options(argc, argv, o, quick, usage, [&](const std::string &a, const auto &value) {
    if (a != "--math") return false;
    const std::string v = value();
    if (v == "fp32") o.math = FLATMEM_BLOCK_MATH_FP32;
    else if (v == "tf32") o.math = FLATMEM_BLOCK_MATH_TF32;
    else throw std::runtime_error("--math must be fp32 or tf32, not '" + v + "'");
    return true;
  });
  return o;
}

// ---- device memory -------------------------------------------------------------------------

// cudaMalloc'ed bytes, freed by the destructor.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    CUDA_CHECK(cudaMalloc(&data_, std::max<std::size_t>(bytes, 1)));
  }
  DeviceBuffer(DeviceBuffer &&other) noexcept { *this = std::move(other); }
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  char *data() const { return static_cast<char *>(data_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void *data_ = nullptr;
  std::size_t bytes_ = 0;
};

DLTensor device_tensor(void *data, const std::vector<std::int64_t> &shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCUDA, device_id};
  t.ndim = int(shape.size());
  t.dtype = {kDLFloat, 32, 1};
  t.shape = const_cast<std::int64_t *>(shape.data());
  return t;
}

// A (batch, tokens, width) fp32 state on the device with its DLTensor.
class DeviceState {
 public:
  DeviceState() = default;
  explicit DeviceState(const std::vector<std::int64_t> &shape)
      : shape_(shape), buffer_(std::size_t(bench::reversible::numel(shape)) * sizeof(float)) {
    dl_ = device_tensor(buffer_.data(), shape_);
  }
  DeviceState(DeviceState &&other) noexcept { *this = std::move(other); }
  DeviceState &operator=(DeviceState &&other) noexcept {
    shape_ = std::move(other.shape_);
    buffer_ = std::move(other.buffer_);
    dl_ = device_tensor(buffer_.data(), shape_);  // re-point shape at our own vector
    return *this;
  }
  DLTensor *dl() { return &dl_; }
  std::int64_t numel() const { return bench::reversible::numel(shape_); }
  std::size_t bytes() const { return buffer_.bytes(); }
  void upload(const std::vector<float> &host) {
    CUDA_CHECK(cudaMemcpy(buffer_.data(), host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<float> download() const {
    std::vector<float> host(static_cast<std::size_t>(numel()));
    CUDA_CHECK(cudaMemcpy(host.data(), buffer_.data(), bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  std::vector<std::int64_t> shape_;
  DeviceBuffer buffer_;
  DLTensor dl_{};
};

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// ---- the memory pool the blocks take their scratch from -----------------------------------------

// The device's current pool (cudaDeviceGetMemPool), which the built-in blocks'
// cudaMallocAsync draws from. Its release threshold is raised to UINT64_MAX so
// that memory freed at the end of a step stays reserved for the next one (no
// re-mapping inside timed steps); the blocks' peak is read from its high-water
// mark of memory in use (this bench allocates nothing from the pool itself).
class PoolMeter {
 public:
  explicit PoolMeter(int device) {
    CUDA_CHECK(cudaDeviceGetMemPool(&pool_, device));
    std::uint64_t keep_everything = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  }
  void reset_peak() {
    std::uint64_t zero = 0;  // the only value the high-water mark can be set to
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero));
  }
  double peak_used() const { return double(get(cudaMemPoolAttrUsedMemHigh)); }
  double reserved() const { return double(get(cudaMemPoolAttrReservedMemCurrent)); }
  // Hands the pool's unused memory back (between configurations: room for STANDARD's record).
  void trim() { CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0)); }

 private:
  std::uint64_t get(cudaMemPoolAttr attribute) const {
    std::uint64_t value = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, attribute, &value));
    return value;
  }
  cudaMemPool_t pool_ = nullptr;
};

// Device memory taken outside the pool between construction and bytes():
// the drop of cudaMemGetInfo's free memory minus the growth of the pool's
// reservation over the same interval, both read with the device synchronised.
// This is how STANDARD's record is measured: the forward cudaMalloc's it
// (O(depth): every block's inputs and residuals) and keeps it in the handle,
// so it is the whole of the drop around a fresh handle's first forward that
// the pool does not explain. cudaMemGetInfo is device-wide: another process
// allocating on the GPU at the same time would show up here.
class OutsidePool {
 public:
  explicit OutsidePool(const PoolMeter &pool) : pool_(pool) {
    CUDA_CHECK(cudaDeviceSynchronize());
    free_before_ = free_bytes();
    reserved_before_ = pool_.reserved();
  }
  double bytes() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    return (free_before_ - free_bytes()) - (pool_.reserved() - reserved_before_);
  }

 private:
  static double free_bytes() {
    std::size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return double(free);
  }
  const PoolMeter &pool_;
  double free_before_ = 0, reserved_before_ = 0;
};

// ---- the model: one attention and one MLP block per layer, parameters on the device --------------

// Every layer's 12 parameter tensors (attention's six, then the MLP's) in one
// slab, layer after layer, each at a multiple of 256 bytes; the gradients in a
// second slab laid out the same way, so that the first `depth` layers'
// gradients are one prefix of it, zeroed by one cudaMemsetAsync.
class DeviceModel {
 public:
  DeviceModel(int depth, const Options &o) {
    const std::array<flatmem_block_kind, 2> kinds = {FLATMEM_BLOCK_ATTENTION, FLATMEM_BLOCK_MLP};
    std::size_t offset = 0;
    std::vector<std::size_t> offsets;  // per layer, kind, parameter
    for (int k = 0; k < depth; ++k) {
      for (auto kind : kinds)
        for (const auto &shape : parameter_shapes(kind, o)) {
          offsets.push_back(offset);
          offset += (std::size_t(numel(shape)) * sizeof(float) + parameter_alignment - 1) / parameter_alignment *
                    parameter_alignment;
        }
      layer_end_.push_back(offset);
    }
    parameters_ = DeviceBuffer(offset);
    gradients_ = DeviceBuffer(offset);
    std::size_t next = 0;
    for (int k = 0; k < depth; ++k)
      for (auto kind : kinds) {
        blocks_.push_back(create_block(block_options(kind, o, o.math)));
        set_parameters(blocks_.back().get(), kind, k, o, &offsets[next]);
        next += FLATMEM_BLOCK_NUM_PARAMETERS;
      }
    for (int k = 0; k < depth; ++k) {
      flatmem_reversible_block rb{};
      FM_CHECK(flatmem_block_function(blocks_[std::size_t(2 * k)].get(), &rb.f));
      FM_CHECK(flatmem_block_function(blocks_[std::size_t(2 * k + 1)].get(), &rb.g));
      segment_blocks_.push_back(rb);
    }
  }
  // Block k: F = attention k, G = MLP k (a segment of depth d uses the first d).
  const std::vector<flatmem_reversible_block> &blocks() const { return segment_blocks_; }
  // The blocks accumulate their parameter gradients: zero those of the first `depth` layers.
  void zero_gradients(int depth, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(gradients_.data(), 0, layer_end_[std::size_t(depth - 1)], stream));
  }
  double parameter_bytes(int depth) const { return double(layer_end_[std::size_t(depth - 1)]); }

 private:
  // Uploads the block's initial parameters to `offsets` in the slab and points the block at them.
  void set_parameters(flatmem_block_t *block, flatmem_block_kind kind, int layer, const Options &o,
                      const std::size_t *offsets) {
    const ParameterShapes shapes = parameter_shapes(kind, o);
    std::array<DLTensor, FLATMEM_BLOCK_NUM_PARAMETERS> p{}, g{};
    for (int i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) {
      std::vector<float> host(std::size_t(numel(shapes[i])));
      initial_parameter(i, host.data(), numel(shapes[i]), block_seed(kind, layer));
      char *param = parameters_.data() + offsets[i];
      CUDA_CHECK(cudaMemcpy(param, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
      p[i] = device_tensor(param, shapes[i]);
      g[i] = device_tensor(gradients_.data() + offsets[i], shapes[i]);
    }
    FM_CHECK(flatmem_block_set_parameters(block, p.data(), g.data()));
  }

  DeviceBuffer parameters_, gradients_;
  std::vector<std::size_t> layer_end_;  // slab bytes up to the end of layer k
  std::vector<BlockPtr> blocks_;        // attention 0, MLP 0, attention 1, ...
  std::vector<flatmem_reversible_block> segment_blocks_;
};

// ---- one (depth, batch): inputs, every mode's outputs and handle, the workspace ---------------------

class Config {
 public:
  Config(DeviceModel &model, const Options &o, int depth, std::int64_t batch) : model_(model), depth_(depth) {
    const std::vector<std::int64_t> shape = {batch, o.tokens, o.width};
    for (DeviceState *state : {&x1_, &x2_, &dy1_, &dy2_}) *state = DeviceState(shape);
    std::vector<float> x(std::size_t(x1_.numel())), dy1(x.size()), dy2(x.size());
    initial_inputs(x.data(), dy1.data(), dy2.data(), x1_.numel(), batch);
    x1_.upload(x);
    x2_.upload(x);  // X1 = X2 = the token embeddings
    dy1_.upload(dy1);
    dy2_.upload(dy2);
    for (int m = 0; m < num_modes; ++m)
      for (DeviceState *state : {&y1_[m], &y2_[m], &dx1_[m], &dx2_[m]}) *state = DeviceState(shape);
    std::size_t largest = 0;
    for (int m = 0; m < num_modes; ++m) {
      new_segment(m);
      largest = std::max(largest, workspace_bytes(m));
    }
    workspace_ = DeviceBuffer(largest);
  }

  // A fresh handle for mode m (the previous one destroyed first); queries its workspace.
  void new_segment(int m) {
    segments_[m].reset();
    segments_[m] = make_segment(model_.blocks(), depth_, modes[m], 0);
    FM_CHECK(flatmem_reversible_forward_workspace_size(segments_[m].get(), x1_.dl(), &forward_bytes_[m]));
    FM_CHECK(flatmem_reversible_backward_workspace_size(segments_[m].get(), x1_.dl(), &backward_bytes_[m]));
    if (workspace_.data() && workspace_bytes(m) > workspace_.bytes())
      throw std::runtime_error("workspace query grew for a fresh handle of the same mode");
  }
  void zero_gradients(cudaStream_t stream) { model_.zero_gradients(depth_, stream); }
  void forward(int m, cudaStream_t stream) {
    FM_CHECK(flatmem_reversible_forward(segments_[m].get(), x1_.dl(), x2_.dl(), seed, offset, y1_[m].dl(),
                                        y2_[m].dl(), workspace_.data(), forward_bytes_[m], stream));
  }
  void backward(int m, cudaStream_t stream) {
    FM_CHECK(flatmem_reversible_backward(segments_[m].get(), y1_[m].dl(), y2_[m].dl(), dy1_.dl(), dy2_.dl(), seed,
                                         offset, dx1_[m].dl(), dx2_[m].dl(), nullptr, nullptr, workspace_.data(),
                                         backward_bytes_[m], stream));
  }
  flatmem_reversible_mode last_mode(int m) const {
    flatmem_reversible_mode ran = FLATMEM_REVERSIBLE_AUTO;
    FM_CHECK(flatmem_reversible_last_mode(segments_[m].get(), &ran));
    return ran;
  }
  // The workspace mode m is given: the larger of its two queries.
  std::size_t workspace_bytes(int m) const { return std::max(forward_bytes_[m], backward_bytes_[m]); }
  double state_bytes() const { return double(x1_.bytes()); }
  std::vector<float> dx1(int m) const { return dx1_[m].download(); }
  std::vector<float> dx2(int m) const { return dx2_[m].download(); }

 private:
  DeviceModel &model_;
  int depth_;
  DeviceState x1_, x2_, dy1_, dy2_;
  std::array<DeviceState, num_modes> y1_, y2_, dx1_, dx2_;
  std::array<SegmentPtr, num_modes> segments_;
  std::array<std::size_t, num_modes> forward_bytes_{}, backward_bytes_{};
  DeviceBuffer workspace_;
};

// ---- measurements -------------------------------------------------------------------------------

struct ModeResult {
  std::vector<double> total_s, fwd_s, bwd_s, host_s;  // host_s: host time to enqueue forward + backward
  double workspace_bytes = NAN, pool_peak_bytes = NAN, outside_pool_bytes = NAN;
  double peak_bytes() const { return workspace_bytes + pool_peak_bytes + outside_pool_bytes; }
  double total() const { return median(total_s); }
  double fwd() const { return median(fwd_s); }
  double bwd() const { return median(bwd_s); }
  double host() const { return median(host_s); }
};

struct Row {
  int depth = 0;
  std::int64_t batch = 0;
  std::array<ModeResult, num_modes> r;
  flatmem_reversible_mode auto_ran = FLATMEM_REVERSIBLE_AUTO;  // in the last timed round
  bool auto_switched = false;  // AUTO ran different modes across the timed rounds
  bool overlapped_bitwise = false, auto_bitwise = false;
  double standard_rel_diff = NAN;  // max |dX_std - dX_van| / max |dX_van|
  double state_bytes = NAN;
  double images_per_s(int m) const { return double(batch) / r[m].total(); }
  // Throughput of mode m over that of `base` (> 1: m is faster).
  double speedup(int m, int base) const { return r[base].total() / r[m].total(); }
};

class EventTimer {
 public:
  EventTimer() {
    for (auto *e : {&start_, &mid_, &stop_}) CUDA_CHECK(cudaEventCreate(e));
  }
  ~EventTimer() {
    for (auto e : {start_, mid_, stop_}) cudaEventDestroy(e);
  }
  EventTimer(const EventTimer &) = delete;
  EventTimer &operator=(const EventTimer &) = delete;
  void start(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(start_, s)); }
  void mid(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(mid_, s)); }
  void stop(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(stop_, s)); }
  // Waits for the stop event; seconds start -> mid and mid -> stop.
  std::pair<double, double> seconds() const {
    CUDA_CHECK(cudaEventSynchronize(stop_));
    float first = 0, second = 0;
    CUDA_CHECK(cudaEventElapsedTime(&first, start_, mid_));
    CUDA_CHECK(cudaEventElapsedTime(&second, mid_, stop_));
    return {1e-3 * first, 1e-3 * second};
  }

 private:
  cudaEvent_t start_ = nullptr, mid_ = nullptr, stop_ = nullptr;
};

// An untimed forward + backward of mode m, waited for.
void plain_step(Config &c, int m, cudaStream_t stream) {
  c.zero_gradients(stream);
  c.forward(m, stream);
  c.backward(m, stream);
  CUDA_CHECK(cudaDeviceSynchronize());
}

// The memory pass of mode m: `steps` forward + backward pairs on a fresh
// handle (see the top of the file).
void measure_memory(Config &c, int m, int steps, PoolMeter &pool, cudaStream_t stream, ModeResult &result) {
  c.zero_gradients(stream);
  const OutsidePool around_forward(pool);  // synchronises: the pool is idle from here
  pool.reset_peak();
  c.forward(m, stream);
  const double first_forward = around_forward.bytes();  // STANDARD: its record; others: nothing expected
  const OutsidePool after_forward(pool);
  c.backward(m, stream);
  for (int i = 1; i < steps; ++i) {
    CUDA_CHECK(cudaDeviceSynchronize());  // as between timed steps (AUTO reads its probe's events)
    c.zero_gradients(stream);
    c.forward(m, stream);
    c.backward(m, stream);
  }
  const double rest = after_forward.bytes();  // kept since: nothing expected
  result.pool_peak_bytes = pool.peak_used();
  result.outside_pool_bytes = std::max(0.0, first_forward) + std::max(0.0, rest);
  result.workspace_bytes = double(c.workspace_bytes(m));
}

void timed_step(Config &c, int m, cudaStream_t stream, EventTimer &timer, ModeResult &result) {
  c.zero_gradients(stream);  // before the first event: not timed
  const double host0 = bench::now_seconds();
  timer.start(stream);
  c.forward(m, stream);
  timer.mid(stream);
  c.backward(m, stream);
  timer.stop(stream);
  const double host1 = bench::now_seconds();
  const auto [fwd, bwd] = timer.seconds();
  CUDA_CHECK(cudaDeviceSynchronize());  // the handle's rebuild stream too, before the next step
  result.fwd_s.push_back(fwd);
  result.bwd_s.push_back(bwd);
  result.total_s.push_back(fwd + bwd);
  result.host_s.push_back(host1 - host0);
}

void compare_gradients(const Config &c, Row &row) {
  std::array<std::vector<float>, num_modes> dx1, dx2;
  for (int m = 0; m < num_modes; ++m) dx1[m] = c.dx1(m), dx2[m] = c.dx2(m);
  const std::int64_t n = std::int64_t(dx1[VAN].size());
  auto bitwise = [&](int m) {
    return same_bits(dx1[m].data(), dx1[VAN].data(), n) && same_bits(dx2[m].data(), dx2[VAN].data(), n);
  };
  row.overlapped_bitwise = bitwise(OVL);
  row.auto_bitwise = bitwise(AUT);
  const double scale = std::max(max_abs(dx1[VAN].data(), n), max_abs(dx2[VAN].data(), n));
  const double diff = std::max(max_abs_diff(dx1[STD].data(), dx1[VAN].data(), n),
                               max_abs_diff(dx2[STD].data(), dx2[VAN].data(), n));
  row.standard_rel_diff = diff / std::max(scale, 1e-30);
}

Row run_config(DeviceModel &model, const Options &o, PoolMeter &pool, cudaStream_t stream, int depth,
               std::int64_t batch) {
  Row row;
  row.depth = depth;
  row.batch = batch;
  CUDA_CHECK(cudaDeviceSynchronize());
  pool.trim();  // the previous configuration's scratch: room for this one's STANDARD record
  Config c(model, o, depth, batch);
  row.state_bytes = c.state_bytes();

  // 1. warm-up, then fresh handles (STANDARD's record is allocated by its first forward).
  for (int w = 0; w < o.warmup; ++w)
    for (int m = 0; m < num_modes; ++m) plain_step(c, m, stream);
  for (int m = 0; m < num_modes; ++m) c.new_segment(m);

  // 2. memory pass on the fresh handles (AUTO: its probes, after which it has chosen).
  for (int m = 0; m < num_modes; ++m)
    measure_memory(c, m, m == AUT ? auto_probe_backwards : 1, pool, stream, row.r[m]);

  // 3. timed pass: rounds interleave the modes, starting one further each round.
  EventTimer timer;
  bool auto_seen[num_modes] = {};
  for (int round = 0; round < o.rounds; ++round)
    for (int i = 0; i < num_modes; ++i) {
      const int m = (round + i) % num_modes;
      timed_step(c, m, stream, timer, row.r[m]);
      if (m != AUT) continue;
      row.auto_ran = c.last_mode(AUT);
      for (int k = 0; k < num_modes; ++k) auto_seen[k] = auto_seen[k] || modes[k] == row.auto_ran;
    }
  row.auto_switched = std::count(auto_seen, auto_seen + num_modes, true) > 1;

  // 4. checks: the values do not depend on the mode (the last round's dX).
  compare_gradients(c, row);
  return row;
}

// ---- output ------------------------------------------------------------------------------------

std::string auto_ran(const Row &row) {
  return std::string(", ran ") + mode_name(row.auto_ran) + (row.auto_switched ? " (switched)" : "");
}

void print_progress(const Row &row) {
  for (int m = 0; m < num_modes; ++m) {
    const ModeResult &r = row.r[m];
    std::printf("  %-10s fwd %-10s bwd %-10s fwd+bwd %-10s %8s images/s  peak %-10s (workspace %s, pool %s, "
                "outside pool %s)  host enqueue %s%s\n",
                mode_name(modes[m]), milliseconds(r.fwd()).c_str(), milliseconds(r.bwd()).c_str(),
                milliseconds(r.total()).c_str(), rate_str(row.images_per_s(m)).c_str(),
                bytes_str(r.peak_bytes()).c_str(), bytes_str(r.workspace_bytes).c_str(),
                bytes_str(r.pool_peak_bytes).c_str(), bytes_str(r.outside_pool_bytes).c_str(),
                milliseconds(r.host()).c_str(),
                m == AUT ? auto_ran(row).c_str() : "");
  }
  std::printf("  dX: OVERLAPPED == VANILLA bitwise: %s; AUTO == VANILLA bitwise: %s; STANDARD vs VANILLA max rel. "
              "diff %.1e\n",
              row.overlapped_bitwise ? "yes" : "no", row.auto_bitwise ? "yes" : "no", row.standard_rel_diff);
}

const Row *find(const std::vector<Row> &rows, int depth, std::int64_t batch) {
  for (const auto &r : rows)
    if (r.depth == depth && r.batch == batch) return &r;
  return nullptr;
}

PeakOf peak_of(const std::vector<Row> &rows) {
  return [&rows](int d, std::int64_t b, int m) {
    const Row *r = find(rows, d, b);
    return r ? r->r[m].peak_bytes() : NAN;
  };
}

void print_time_table(const std::vector<Row> &rows) {
  std::printf("| depth | batch | mode | fwd+bwd | fwd | bwd | images/s | vs VANILLA | vs STANDARD | peak | "
              "workspace | pool scratch | outside pool | host enqueue |\n");
  std::printf("|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto &row : rows)
    for (int m = 0; m < num_modes; ++m) {
      const ModeResult &r = row.r[m];
      const std::string mode = m == AUT ? std::string("AUTO") + auto_ran(row) : mode_name(modes[m]);
      std::printf("| %d | %lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", row.depth,
                  (long long)row.batch, mode.c_str(), milliseconds(r.total()).c_str(), milliseconds(r.fwd()).c_str(),
                  milliseconds(r.bwd()).c_str(), rate_str(row.images_per_s(m)).c_str(),
                  ratio(row.speedup(m, VAN)).c_str(), ratio(row.speedup(m, STD)).c_str(),
                  bytes_str(r.peak_bytes()).c_str(), bytes_str(r.workspace_bytes).c_str(),
                  bytes_str(r.pool_peak_bytes).c_str(), bytes_str(r.outside_pool_bytes).c_str(),
                  milliseconds(r.host()).c_str());
    }
}

void print_check_table(const std::vector<Row> &rows) {
  std::printf("| depth | batch | dX OVERLAPPED == VANILLA (bitwise) | dX AUTO == VANILLA (bitwise) | "
              "STANDARD vs VANILLA, max rel. diff |\n|---:|---:|:---|:---|---:|\n");
  for (const auto &r : rows)
    std::printf("| %d | %lld | %s | %s | %.1e |\n", r.depth, (long long)r.batch, r.overlapped_bitwise ? "yes" : "no",
                r.auto_bitwise ? "yes" : "no", r.standard_rel_diff);
}

// Each target: "met" / "NOT met" with the figure that decides it.
void print_targets(const std::vector<Row> &rows, const Options &o) {
  const Row *best = nullptr, *worst = nullptr;
  for (const auto &r : rows) {
    if (!best || r.speedup(OVL, VAN) > best->speedup(OVL, VAN)) best = &r;
    if (!worst || r.speedup(AUT, VAN) < worst->speedup(AUT, VAN)) worst = &r;
  }
  if (!best) return;
  const double ovl = best->speedup(OVL, VAN), aut = worst->speedup(AUT, VAN);
  std::printf("- OVERLAPPED >= %.2f\u00d7 VANILLA at some configuration: %s (best %s at depth %d, batch %lld)\n",
              target_overlapped_over_vanilla, ovl >= target_overlapped_over_vanilla ? "met" : "NOT met",
              ratio(ovl).c_str(), best->depth, (long long)best->batch);
  std::printf("- AUTO >= %.2f\u00d7 VANILLA in every configuration: %s (worst %s at depth %d, batch %lld)\n",
              target_auto_over_vanilla, aut >= target_auto_over_vanilla ? "met" : "NOT met", ratio(aut).c_str(),
              worst->depth, (long long)worst->batch);
  if (o.depths.size() < 2) {
    std::printf("- memory flat in depth: not measured (one depth; give --depths two or more)\n");
    return;
  }
  const PeakOf peak = peak_of(rows);
  bool flat = true;
  std::string figures;
  for (int m = 0; m < num_modes; ++m) {
    double most = 0;
    for (auto b : o.batches) most = std::max(most, depth_growth(o, peak, b, m));
    if (m != STD) flat = flat && most <= target_flat_in_depth;
    figures += std::string(m ? ", " : "") + mode_name(modes[m]) + " " + ratio(most) + (m == STD ? " (baseline)" : "");
  }
  std::printf("- memory flat in depth (VANILLA, OVERLAPPED, AUTO: peak at depth %d <= %.2f\u00d7 peak at depth %d, "
              "every batch): %s (largest ratio per mode: %s)\n",
              o.depths.back(), target_flat_in_depth, o.depths.front(), flat ? "met" : "NOT met", figures.c_str());
}

void print_tables(const std::vector<Row> &rows, const Options &o, const cudaDeviceProp &prop) {
  std::printf("\n### Reversible ViT-like segment, forward + backward, fp32 states, %s products, %s\n\n",
              math_name(o.math), prop.name);
  std::printf("Width %d, %d heads, MLP hidden %d, %lld tokens; median of %d rounds (cudaEvents on the caller's "
              "stream). vs X: throughput over X's (> 1: faster). Peak = workspace (passed by the bench) + the "
              "blocks' pool scratch at its high-water mark + device memory taken outside the pool (STANDARD's "
              "record). Host enqueue: host time to issue forward + backward.\n\n",
              o.width, o.heads, o.hidden, (long long)o.tokens, o.rounds);
  print_time_table(rows);
  std::printf("\nVANILLA vs STANDARD: the rebuild costs ~4/3 the work, so ~0.75\u00d7 without overlap. AUTO is "
              "timed on a handle that made its choice in %d untimed probe backwards (V, O, V, O: the memory "
              "pass); \"ran\" is the mode of its last timed backward.\n",
              auto_probe_backwards);

  std::printf("\n### Peak device memory by depth\n\n");
  std::printf("As above (parameters, gradients, inputs and outputs not counted). One state (batch x %lld x %d fp32) "
              "is given for scale.\n\n",
              (long long)o.tokens, o.width);
  print_peak_by_depth(o, peak_of(rows), [&](std::int64_t b) {
    const Row *r = find(rows, o.depths.front(), b);
    return r ? r->state_bytes : NAN;
  });

  std::printf("\n### Checks\n\n");
  print_check_table(rows);
  std::printf("\n### Targets (reported, not enforced)\n\n");
  print_targets(rows, o);
}

void write_csv(const std::string &path, const std::vector<Row> &rows, const Options &o) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << "depth,batch,tokens,width,heads,hidden,math,rounds";
  for (const char *m : {"standard", "vanilla", "overlapped", "auto"})
    out << ',' << m << "_images_per_s," << m << "_median_s," << m << "_fwd_median_s," << m << "_bwd_median_s," << m
        << "_host_enqueue_s," << m << "_peak_bytes," << m << "_workspace_bytes," << m << "_pool_peak_bytes," << m
        << "_outside_pool_bytes";
  out << ",overlapped_over_vanilla,auto_over_vanilla,vanilla_over_standard,overlapped_over_standard,auto_ran,"
         "auto_switched,overlapped_bitwise_vanilla,auto_bitwise_vanilla,standard_vs_vanilla_rel_diff,state_bytes\n";
  for (const auto &r : rows) {
    out << r.depth << ',' << r.batch << ',' << o.tokens << ',' << o.width << ',' << o.heads << ',' << o.hidden << ','
        << math_name(o.math) << ',' << o.rounds;
    for (int m = 0; m < num_modes; ++m) {
      const ModeResult &x = r.r[m];
      for (double v : {r.images_per_s(m), x.total(), x.fwd(), x.bwd(), x.host(), x.peak_bytes(), x.workspace_bytes,
                       x.pool_peak_bytes, x.outside_pool_bytes})
        out << ',' << csv_number(v);
    }
    for (double v : {r.speedup(OVL, VAN), r.speedup(AUT, VAN), r.speedup(VAN, STD), r.speedup(OVL, STD)})
      out << ',' << csv_number(v);
    out << ',' << mode_name(r.auto_ran) << ',' << int(r.auto_switched) << ',' << int(r.overlapped_bitwise) << ','
        << int(r.auto_bitwise) << ',' << csv_number(r.standard_rel_diff) << ',' << csv_number(r.state_bytes) << '\n';
  }
  if (!out) throw std::runtime_error("error writing " + path);
}

// ---- main ----------------------------------------------------------------------------------------

// Whether the CUDA runtime sees a device; *why says why not.
bool have_device(std::string *why) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    *why = cudaGetErrorString(status);
    return false;
  }
  if (devices == 0) *why = "the runtime sees none";
  return devices > 0;
}

void print_header(const Options &o, const cudaDeviceProp &prop) {
  int driver = 0, runtime = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("reversible_cuda_bench: built-in pre-LN attention (F) + MLP (G) blocks, width %d, %d heads, hidden %d, "
              "%lld tokens, fp32 states\n",
              o.width, o.heads, o.hidden, (long long)o.tokens);
  std::printf("math: %s products%s\n", math_name(o.math),
              o.math == FLATMEM_BLOCK_MATH_TF32 ? " (the default; --math fp32 for full fp32 products)"
                                                : " (--math fp32; the default is tf32)");
  std::printf("device %d: %s (sm_%d%d, %d SMs, %.1f GiB); driver %d, runtime %d; flatmem %s\n", device_id, prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, double(prop.totalGlobalMem) / (1024.0 * 1024 * 1024),
              driver, runtime, flatmem_version_string());
}

int run(int argc, char **argv) {
  const Options o = parse(argc, argv);
  std::string why;
  if (!have_device(&why)) {
    std::printf("no CUDA device (%s)\n", why.c_str());
    return o.quick ? skip_return_code : 0;
  }
  CUDA_CHECK(cudaSetDevice(device_id));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_id));
  print_header(o, prop);

  PoolMeter pool(device_id);
  Stream stream;
  const int max_depth = *std::max_element(o.depths.begin(), o.depths.end());
  DeviceModel model(max_depth, o);  // depth d uses layers 0 .. d-1
  std::printf("parameters: %s per layer, %s for depth %d (gradients as much again)\n",
              bytes_str(model.parameter_bytes(1)).c_str(), bytes_str(model.parameter_bytes(max_depth)).c_str(),
              max_depth);

  std::vector<Row> rows;
  const double started = bench::now_seconds();
  for (int depth : o.depths)
    for (auto batch : o.batches) {
      std::printf("\ndepth %d, batch %lld\n", depth, (long long)batch);
      std::fflush(stdout);
      rows.push_back(run_config(model, o, pool, stream.get(), depth, batch));
      print_progress(rows.back());
      std::fflush(stdout);
    }
  print_tables(rows, o, prop);
  std::printf("\ntotal time: %.1f s\n", bench::now_seconds() - started);
  if (!o.csv.empty()) {
    write_csv(o.csv, rows, o);
    std::printf("wrote %s\n", o.csv.c_str());
  }
  return bench::reversible::bitwise_exit_status("reversible_cuda_bench", rows);
}

}  // namespace

int main(int argc, char **argv) { return bench::reversible::guarded_main("reversible_cuda_bench", run, argc, argv); }
