// The shared body of the reversible-segment handlers (reversible_call.hpp)
// and the trace-time workspace query.
//
// Handles: a flatmem_reversible_t with its 2 * depth flatmem_block_t is made
// once per configuration (depth, width, heads, hidden, eps, math, mode,
// threads, device) and kept in a process-wide cache, lent to one call at a
// time (flatmem's thread rule; XLA may run two calls at once, then a second
// one is made). Each call only points the blocks at its parameter buffers
// (flatmem_block_set_parameters) before running. Like the contrastive pool
// (handle_pool.hpp), cached handles live until the process exits.
//
// The device is part of the configuration because a segment handle keeps
// per-device resources once it has run there (CUDA: the rebuild stream and
// its events of OVERLAPPED). On CUDA a call returns once its work is
// enqueued and gives the handle back at once: what the enqueued work uses
// is the call's own (its buffers, its workspace, block scratch taken and
// freed stream-ordered by flatmem), and the handle's rebuild stream orders
// the rebuild chains of successive calls; the next borrower only changes
// host-side pointers, which enqueued work no longer reads.
#include "reversible_call.hpp"

#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "dlpack_view.hpp"
#include "flatmem_jax.h"
#include "handle_pool.hpp"  // pool_num_threads

namespace flatmem_jax {
namespace {

constexpr int kParams = FLATMEM_BLOCK_NUM_PARAMETERS;  // per block
constexpr int kPerLayer = 2 * kParams;                 // attention, then MLP
using Buffer = ffi::AnyBuffer;

struct Config {
  int depth, width, heads, hidden;
  float eps;
  int math, mode, num_threads;
  int device_type, device_id;
  auto tie() const {
    return std::tie(depth, width, heads, hidden, eps, math, mode, num_threads, device_type,
                    device_id);
  }
  bool operator<(const Config &o) const { return tie() < o.tie(); }
};

struct Segment {
  flatmem_reversible_t *handle = nullptr;
  std::vector<flatmem_block_t *> blocks;  // attention 0, MLP 0, attention 1, ...

  ~Segment() {
    flatmem_reversible_destroy(handle);
    for (flatmem_block_t *b : blocks) flatmem_block_destroy(b);
  }
};

struct Cache {
  std::mutex mutex;
  std::map<Config, std::vector<Segment *>> idle;
};

Cache &cache() {
  static Cache *c = new Cache;  // intentionally leaked, as the contrastive pool
  return *c;
}

// A failed flatmem call while making a segment: its status and message,
// copied before the cleanup makes other calls.
struct Failure {
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  const char *function = "";
  std::string text;  // flatmem_last_error()

  bool check(flatmem_status s, const char *what) {
    if (s == FLATMEM_STATUS_SUCCESS) return true;
    status = s;
    function = what;
    text = flatmem_last_error();
    return false;
  }
};

Segment *make_segment(const Config &c, Failure &failure) {
  auto *s = new Segment;
  std::vector<flatmem_reversible_block> fg(static_cast<size_t>(c.depth));
  for (int k = 0; k < c.depth; ++k) {
    for (int part = 0; part < 2; ++part) {
      flatmem_block_options o;
      flatmem_block_t *b = nullptr;
      if (!failure.check(flatmem_block_options_init(&o, sizeof(flatmem_block_options)), "flatmem_block_options_init")) break;
      o.kind = part == 0 ? FLATMEM_BLOCK_ATTENTION : FLATMEM_BLOCK_MLP;
      o.width = c.width;
      o.heads = part == 0 ? c.heads : 0;
      o.hidden = part == 1 ? c.hidden : 0;
      o.layer_norm_eps = c.eps;
      o.math = static_cast<flatmem_block_math>(c.math);  // flatmem_block_create checks it
      if (!failure.check(flatmem_block_create(&b, &o), "flatmem_block_create")) break;
      s->blocks.push_back(b);
      if (!failure.check(flatmem_block_function(b, part == 0 ? &fg[k].f : &fg[k].g),
                         "flatmem_block_function"))
        break;
    }
    if (failure.status != FLATMEM_STATUS_SUCCESS) break;
  }
  if (failure.status == FLATMEM_STATUS_SUCCESS) {
    flatmem_reversible_options o;
    if (failure.check(flatmem_reversible_options_init(&o, sizeof(flatmem_reversible_options)), "flatmem_reversible_options_init")) {
      o.mode = static_cast<flatmem_reversible_mode>(c.mode);
      o.num_threads = c.num_threads;
      failure.check(flatmem_reversible_create(&s->handle, fg.data(), c.depth, &o),
                    "flatmem_reversible_create");
    }
  }
  if (failure.status != FLATMEM_STATUS_SUCCESS) {
    delete s;
    return nullptr;
  }
  return s;
}

// A cached segment lent for one call.
class Borrowed {
 public:
  explicit Borrowed(Config c) : config_(c) {
    if (config_.num_threads == 0) config_.num_threads = pool_num_threads();
    {
      std::lock_guard<std::mutex> lock(cache().mutex);
      auto it = cache().idle.find(config_);
      if (it != cache().idle.end() && !it->second.empty()) {
        segment_ = it->second.back();
        it->second.pop_back();
        return;
      }
    }
    segment_ = make_segment(config_, failure_);
  }
  ~Borrowed() {
    if (segment_ == nullptr) return;
    std::lock_guard<std::mutex> lock(cache().mutex);
    try {
      cache().idle[config_].push_back(segment_);
    } catch (...) {  // no memory to keep it: let it go
      delete segment_;
    }
  }
  Borrowed(const Borrowed &) = delete;
  Borrowed &operator=(const Borrowed &) = delete;

  Segment *get() const { return segment_; }
  const Failure &failure() const { return failure_; }

 private:
  Config config_;
  Segment *segment_ = nullptr;
  Failure failure_;
};

// STANDARD keeps every block's activations in the handle from a forward to
// the next backward; cached handles are shared by unrelated XLA calls.
constexpr const char *kStandardRefused =
    "mode: FLATMEM_REVERSIBLE_STANDARD keeps the activations inside the flatmem handle from the "
    "forward call to the backward call, which XLA runs as separate calls on shared handles; use "
    "AUTO, VANILLA or OVERLAPPED";

// As flatmem_error() says it: "<function>: <STATUS>: <text>".
ffi::Error as_error(const Failure &f) { return flatmem_error(f.status, f.function, f.text.c_str()); }

// The configuration of a call: width from the state's last extent, depth
// from the number of parameter buffers, the device from the handler.
ffi::ErrorOr<Config> config_of(const Buffer &x, size_t parameters, const ReversibleAttrs &a,
                               DLDevice device) {
  const auto dims = x.dimensions();
  if (dims.size() == 0)
    return ffi::Unexpected(ffi::Error::InvalidArgument("flatmem_jax: the state has rank 0"));
  if (parameters == 0 || parameters % kPerLayer != 0)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "flatmem_jax: " + std::to_string(parameters) +
        " parameter operands; expected 12 per block (attention's 6, then the MLP's 6)"));
  if (a.mode == FLATMEM_REVERSIBLE_STANDARD)
    return ffi::Unexpected(ffi::Error::InvalidArgument(std::string("flatmem_jax: ") + kStandardRefused));
  Config c{};
  c.depth = static_cast<int>(parameters / kPerLayer);
  c.width = static_cast<int>(dims[dims.size() - 1]);
  c.heads = a.heads;
  c.hidden = a.hidden;
  c.eps = a.eps;
  c.math = a.math;
  c.mode = a.mode;
  c.num_threads = a.num_threads;
  c.device_type = device.device_type;
  c.device_id = device.device_id;
  return c;
}

using ViewOf = std::function<ffi::ErrorOr<DLTensor>(int)>;

// Views of the parameter (and, when get_grad is set, gradient) buffers of
// layer k, and flatmem_block_set_parameters on its two blocks (which checks
// shapes, dtypes and, on CUDA, that the memory is the device's).
ffi::Error set_layer_parameters(Segment &s, int k, const ViewOf &get_param, const ViewOf &get_grad) {
  const bool grads = static_cast<bool>(get_grad);
  static const char *const kPart[2] = {"attention (F)", "MLP (G)"};
  for (int part = 0; part < 2; ++part) {
    DLTensor p[kParams], g[kParams];
    for (int i = 0; i < kParams; ++i) {
      const int index = k * kPerLayer + part * kParams + i;
      ffi::ErrorOr<DLTensor> v = get_param(index);
      if (!v) return v.error();
      p[i] = *v;
      if (grads) {
        ffi::ErrorOr<DLTensor> w = get_grad(index);
        if (!w) return w.error();
        g[i] = *w;
      }
    }
    const flatmem_status status = flatmem_block_set_parameters(
        s.blocks[static_cast<size_t>(2 * k + part)], p, grads ? g : nullptr);
    if (status != FLATMEM_STATUS_SUCCESS) {
      const std::string what = "flatmem_block_set_parameters (block " + std::to_string(k) + ", " +
                               kPart[part] + ")";
      return flatmem_error(status, what.c_str());
    }
  }
  return ffi::Error::Success();
}

// Points every block of the segment at the call's parameter buffers (and
// gradient results, when grads is given).
ffi::Error set_parameters(Segment &s, int depth, DLDevice device, ffi::RemainingArgs &params,
                          ffi::RemainingRets *grads) {
  const ViewOf param = [&](int index) -> ffi::ErrorOr<DLTensor> {
    ffi::ErrorOr<Buffer> b = params.get<Buffer>(static_cast<size_t>(index));
    if (!b) return ffi::Unexpected(b.error());
    return dlpack_view(*b, device, "parameter");
  };
  ViewOf grad;
  if (grads != nullptr)
    grad = [&](int index) -> ffi::ErrorOr<DLTensor> {
      ffi::ErrorOr<ffi::Result<Buffer>> b = grads->get<Buffer>(static_cast<size_t>(index));
      if (!b) return ffi::Unexpected(b.error());
      return dlpack_view(**b, device, "gradient");
    };
  for (int k = 0; k < depth; ++k) {
    ffi::Error e = set_layer_parameters(s, k, param, grad);
    if (e.failure()) return e;
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error run_reversible_forward(DLDevice device, void *stream, Buffer x1, Buffer x2,
                                  ffi::RemainingArgs params, Buffer y1, Buffer y2,
                                  const ReversibleAttrs &attrs, ReversiblePlatform &platform) {
  ffi::ErrorOr<Config> config = config_of(x1, params.size(), attrs, device);
  if (!config) return config.error();
  ffi::ErrorOr<DLTensor> vx1 = dlpack_view(x1, device, "x1"), vx2 = dlpack_view(x2, device, "x2");
  ffi::ErrorOr<DLTensor> vy1 = dlpack_view(y1, device, "y1"), vy2 = dlpack_view(y2, device, "y2");
  for (auto *v : {&vx1, &vx2, &vy1, &vy2})
    if (!*v) return v->error();

  Borrowed segment(*config);
  if (segment.get() == nullptr) return as_error(segment.failure());
  ffi::Error e = set_parameters(*segment.get(), config->depth, device, params, nullptr);
  if (e.failure()) return e;
  ffi::ErrorOr<Workspace> ws = platform.workspace(segment.get()->handle, *vx1, false);
  if (!ws) return ws.error();
  const flatmem_status status =
      flatmem_reversible_forward(segment.get()->handle, &*vx1, &*vx2, attrs.seed, attrs.offset,
                                 &*vy1, &*vy2, ws->data, ws->bytes, stream);
  if (status != FLATMEM_STATUS_SUCCESS) return flatmem_error(status, "flatmem_reversible_forward");
  return ffi::Error::Success();
}

ffi::Error run_reversible_backward(DLDevice device, void *stream, Buffer y1, Buffer y2,
                                   Buffer dy1, Buffer dy2, ffi::RemainingArgs params, Buffer dx1,
                                   Buffer dx2, ffi::RemainingRets grads,
                                   const ReversibleAttrs &attrs, ReversiblePlatform &platform) {
  ffi::ErrorOr<Config> config = config_of(y1, params.size(), attrs, device);
  if (!config) return config.error();
  if (grads.size() != params.size())
    return ffi::Error::InvalidArgument("flatmem_jax: " + std::to_string(grads.size()) +
                                       " gradient results for " + std::to_string(params.size()) +
                                       " parameters");
  ffi::ErrorOr<DLTensor> vy1 = dlpack_view(y1, device, "y1"), vy2 = dlpack_view(y2, device, "y2");
  ffi::ErrorOr<DLTensor> vd1 = dlpack_view(dy1, device, "dy1"), vd2 = dlpack_view(dy2, device, "dy2");
  ffi::ErrorOr<DLTensor> vx1 = dlpack_view(dx1, device, "dx1"), vx2 = dlpack_view(dx2, device, "dx2");
  for (auto *v : {&vy1, &vy2, &vd1, &vd2, &vx1, &vx2})
    if (!*v) return v->error();

  Borrowed segment(*config);
  if (segment.get() == nullptr) return as_error(segment.failure());
  ffi::Error e = set_parameters(*segment.get(), config->depth, device, params, &grads);
  if (e.failure()) return e;
  ffi::ErrorOr<Workspace> ws = platform.workspace(segment.get()->handle, *vy1, true);
  if (!ws) return ws.error();
  // The blocks ACCUMULATE parameter gradients: XLA's result buffers start
  // zeroed here (after every check above, so a refused call writes nothing).
  for (size_t i = 0; i < grads.size(); ++i) {
    ffi::ErrorOr<ffi::Result<Buffer>> g = grads.get<Buffer>(i);
    if (!g) return g.error();
    ffi::Error z = platform.zero(**g);
    if (z.failure()) return z;
  }
  const flatmem_status status = flatmem_reversible_backward(
      segment.get()->handle, &*vy1, &*vy2, &*vd1, &*vd2, attrs.seed, attrs.offset, &*vx1, &*vx2,
      nullptr, nullptr, ws->data, ws->bytes, stream);
  if (status != FLATMEM_STATUS_SUCCESS) return flatmem_error(status, "flatmem_reversible_backward");
  return ffi::Error::Success();
}

}  // namespace flatmem_jax

extern "C" int flatmem_jax_reversible_workspace_size(int backward, int depth, int width, int heads,
                                                     int hidden, float eps, int math, int mode,
                                                     int num_threads, int ndim,
                                                     const int64_t *shape, int dtype_code,
                                                     int dtype_bits, size_t *bytes, char *message,
                                                     size_t message_size) {
  using namespace flatmem_jax;
  auto fail = [&](flatmem_status status, const std::string &text) {
    if (message != nullptr && message_size > 0)
      std::snprintf(message, message_size, "%s: %s", flatmem_status_string(status), text.c_str());
    return static_cast<int>(status);
  };
  if (depth < 1 || depth > 65536 || ndim < 1 || ndim > 8 || shape == nullptr || bytes == nullptr)
    return fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                "depth " + std::to_string(depth) + " / ndim " + std::to_string(ndim) +
                    " out of range (depth 1..65536, ndim 1..8)");
  if (mode == FLATMEM_REVERSIBLE_STANDARD) return fail(FLATMEM_STATUS_INVALID_ARGUMENT, kStandardRefused);
  const Config c{depth, width, heads, hidden, eps, math, mode, num_threads, kDLCPU, 0};
  Borrowed segment(c);
  if (segment.get() == nullptr)
    return fail(segment.failure().status,
                segment.failure().text + " (" + segment.failure().function + ")");
  int64_t dims[8];
  for (int i = 0; i < ndim; ++i) dims[i] = shape[i];
  DLTensor x{};
  x.device = DLDevice{kDLCPU, 0};
  x.ndim = ndim;
  x.dtype = DLDataType{static_cast<uint8_t>(dtype_code), static_cast<uint8_t>(dtype_bits), 1};
  x.shape = dims;
  const flatmem_status status =
      backward ? flatmem_reversible_backward_workspace_size(segment.get()->handle, &x, bytes)
               : flatmem_reversible_forward_workspace_size(segment.get()->handle, &x, bytes);
  if (status != FLATMEM_STATUS_SUCCESS) return fail(status, flatmem_last_error());
  return FLATMEM_STATUS_SUCCESS;
}
