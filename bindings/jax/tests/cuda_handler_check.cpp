// Runs the exported CUDA handlers of libflatmem_jax.so without a GPU or XLA:
// a hand-made XLA FFI call frame and a fake XLA_FFI_Api (errors, stream,
// device ordinal, scratch allocation) drive each handler with host buffers
// labelled as device memory. Without a usable CUDA device flatmem refuses
// kDLCUDA tensors (a build without CUDA: always; a build with its CUDA
// backend: when the CUDA runtime finds no device), so every handler must
// return UNIMPLEMENTED with flatmem's UNSUPPORTED message, leave its results
// untouched and hold no scratch memory afterwards. (On a machine with a GPU
// the host buffers are refused as not being device memory instead.) The CPU
// forward handler through the same fake frame must succeed, which shows the
// harness itself is sound. The contrastive handlers get their two attributes,
// fp32_precision and logit_cache_bytes: a budget of 0 and a budget (the CPU
// forward gives the same loss bits; the CUDA handlers accept it and refuse the
// host buffers all the same), precisions TF32 and FULL (the CPU forward: the
// default's bits for fp32; 7 is flatmem's INVALID_ARGUMENT naming
// options.fp32_precision). The ring handlers (attributes comm and
// fp32_precision) run flatmem's ring on CUDA: given slot 0, which names no
// communicator, each fails naming it; the all-reduce (comm alone) refuses,
// saying it sums kDLCPU buffers only. The sigmoid (SigLIP) handlers likewise: the CPU
// forward through the frame gives the loss of its constant logits (q, k, s
// and the bias t in their places), the CUDA ones refuse.
//
// The reversible-segment handlers (attributes decoded by name, parameters as
// remaining operands, gradients as remaining results) get the same fake
// frame with their attributes: the CPU forward works through it (and math =
// TF32 gives the FP32 bytes there, math = 7 is flatmem's INVALID_ARGUMENT
// naming options.math); the CUDA forward and backward must fail -- flatmem
// refuses the host buffers labelled kDLCUDA (set_parameters or the state
// check, UNSUPPORTED without CUDA), or, with a flatmem that accepts them
// unchecked, the CUDA runtime finds no device for the gradient zeroing --
// with results untouched and no scratch memory held.
//
// Built by bindings/jax/CMakeLists.txt when the CUDA handlers are; run by
// tests/test_jax_library.py. Exit status 0 = every check passed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flatmem_jax.h"

// The opaque types of c_api.h, as this fake runtime defines them.
struct XLA_FFI_Error {
  XLA_FFI_Error_Code code;
  std::string message;
};
struct XLA_FFI_ExecutionContext {
  int live_allocations = 0;
  int total_allocations = 0;
};

namespace {

XLA_FFI_Error *error_create(XLA_FFI_Error_Create_Args *args) {
  return new XLA_FFI_Error{args->errc, args->message};
}
void error_get_message(XLA_FFI_Error_GetMessage_Args *args) {
  args->message = args->error->message.c_str();
}
void error_destroy(XLA_FFI_Error_Destroy_Args *args) { delete args->error; }
XLA_FFI_Error *stream_get(XLA_FFI_Stream_Get_Args *args) {
  args->stream = reinterpret_cast<void *>(0x5eed);  // never dereferenced by the handlers
  return nullptr;
}
XLA_FFI_Error *device_ordinal_get(XLA_FFI_DeviceOrdinal_Get_Args *args) {
  args->device_ordinal = 0;
  return nullptr;
}
XLA_FFI_Error *memory_allocate(XLA_FFI_DeviceMemory_Allocate_Args *args) {
  args->data = std::aligned_alloc(256, (args->size + 255) / 256 * 256);
  ++args->ctx->live_allocations;
  ++args->ctx->total_allocations;
  return nullptr;
}
XLA_FFI_Error *memory_free(XLA_FFI_DeviceMemory_Free_Args *args) {
  std::free(args->data);
  --args->ctx->live_allocations;
  return nullptr;
}

XLA_FFI_Api make_api() {
  XLA_FFI_Api api{};
  api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
  api.api_version = XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                                        XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
  api.XLA_FFI_Error_Create = error_create;
  api.XLA_FFI_Error_GetMessage = error_get_message;
  api.XLA_FFI_Error_Destroy = error_destroy;
  api.XLA_FFI_Stream_Get = stream_get;
  api.XLA_FFI_DeviceOrdinal_Get = device_ordinal_get;
  api.XLA_FFI_DeviceMemory_Allocate = memory_allocate;
  api.XLA_FFI_DeviceMemory_Free = memory_free;
  return api;
}

const XLA_FFI_Api kApi = make_api();

// A host buffer with its XLA_FFI_Buffer description; floats prefilled with a sentinel.
struct Buffer {
  Buffer(XLA_FFI_DataType dtype, std::vector<int64_t> dims, std::size_t bytes)
      : dims(std::move(dims)), storage((bytes + 7) / 8, 0) {
    desc = XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, dtype, storage.data(),
                          static_cast<int64_t>(this->dims.size()), this->dims.data()};
  }
  static Buffer f32(std::vector<int64_t> dims, float fill) {
    std::size_t n = 1;
    for (int64_t d : dims) n *= static_cast<std::size_t>(d);
    Buffer b(XLA_FFI_DataType_F32, std::move(dims), n * 4);
    for (std::size_t i = 0; i < n; ++i) b.floats()[i] = fill;
    return b;
  }
  float *floats() { return reinterpret_cast<float *>(storage.data()); }
  std::vector<int64_t> dims;
  std::vector<uint64_t> storage;
  XLA_FFI_Buffer desc;
};

struct Outcome {
  bool ok = false;
  XLA_FFI_Error_Code code = XLA_FFI_Error_Code_OK;
  std::string message;
};

// The contrastive handlers' two attributes (contrastive_bindings.hpp) in an
// XLA_FFI_Attrs, sorted by name as XLA passes them: fp32_precision (s64) and
// logit_cache_bytes (u64), or the ring handlers' comm (s64) and
// fp32_precision. Not copyable: it points into itself.
struct ContrastiveAttrs {
  uint64_t logit_cache_bytes = 0;
  int64_t comm = 0;
  int64_t fp32_precision = 0;  // FLATMEM_FP32_PRECISION_DEFAULT

  explicit ContrastiveAttrs(uint64_t bytes, int64_t precision = 0)
      : logit_cache_bytes(bytes), fp32_precision(precision) {}
  struct Comm {
    int64_t slot;
  };
  explicit ContrastiveAttrs(Comm c, int64_t precision = 0)
      : comm(c.slot), fp32_precision(precision), ring_(true) {}
  // The ring all-reduce's one attribute, comm.
  struct CommOnly {
    int64_t slot;
  };
  explicit ContrastiveAttrs(CommOnly c) : comm(c.slot), ring_(true), count_(1) {}
  ContrastiveAttrs(const ContrastiveAttrs &) = delete;
  ContrastiveAttrs &operator=(const ContrastiveAttrs &) = delete;

  const XLA_FFI_Attrs *get() {
    const char *names[2] = {"fp32_precision", "logit_cache_bytes"};
    XLA_FFI_Scalar values[2] = {{XLA_FFI_DataType_S64, &fp32_precision},
                                {XLA_FFI_DataType_U64, &logit_cache_bytes}};
    if (ring_) {
      names[0] = "comm";
      names[1] = "fp32_precision";
      values[0] = XLA_FFI_Scalar{XLA_FFI_DataType_S64, &comm};
      values[1] = XLA_FFI_Scalar{XLA_FFI_DataType_S64, &fp32_precision};
    }
    for (int i = 0; i < 2; ++i) {
      spans_[i] = XLA_FFI_ByteSpan{names[i], std::strlen(names[i])};
      span_ptrs_[i] = &spans_[i];
      scalars_[i] = values[i];
      ptrs_[i] = &scalars_[i];
      types_[i] = XLA_FFI_AttrType_SCALAR;
    }
    attrs_ = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr, count_, types_, span_ptrs_, ptrs_};
    return &attrs_;
  }

 private:
  bool ring_ = false;
  int64_t count_ = 2;
  XLA_FFI_ByteSpan spans_[2];
  XLA_FFI_ByteSpan *span_ptrs_[2];
  XLA_FFI_Scalar scalars_[2];
  void *ptrs_[2];
  XLA_FFI_AttrType types_[2];
  XLA_FFI_Attrs attrs_;
};

// The reversible handlers' attributes (ReversibleAttrs of reversible_call.hpp) in
// an XLA_FFI_Attrs, sorted by name as XLA passes them. Not copyable: it points
// into itself.
struct ReversibleAttrs {
  float eps = 1e-6f;
  int32_t heads = 2, hidden = 8, math = 0, mode = 2 /* VANILLA */, num_threads = 1;
  uint64_t offset = 0, seed = 0;

  ReversibleAttrs() = default;
  ReversibleAttrs(const ReversibleAttrs &) = delete;
  ReversibleAttrs &operator=(const ReversibleAttrs &) = delete;

  const XLA_FFI_Attrs *get() {
    static const char *const names[kCount] = {"eps",  "heads",       "hidden", "math",
                                              "mode", "num_threads", "offset", "seed"};
    const XLA_FFI_Scalar values[kCount] = {
        {XLA_FFI_DataType_F32, &eps},         {XLA_FFI_DataType_S32, &heads},
        {XLA_FFI_DataType_S32, &hidden},      {XLA_FFI_DataType_S32, &math},
        {XLA_FFI_DataType_S32, &mode},        {XLA_FFI_DataType_S32, &num_threads},
        {XLA_FFI_DataType_U64, &offset},      {XLA_FFI_DataType_U64, &seed}};
    for (int i = 0; i < kCount; ++i) {
      spans_[i] = XLA_FFI_ByteSpan{names[i], std::strlen(names[i])};
      span_ptrs_[i] = &spans_[i];
      scalars_[i] = values[i];
      ptrs_[i] = &scalars_[i];
      types_[i] = XLA_FFI_AttrType_SCALAR;
    }
    attrs_ = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr, kCount, types_, span_ptrs_, ptrs_};
    return &attrs_;
  }

 private:
  static constexpr int kCount = 8;
  XLA_FFI_ByteSpan spans_[kCount];
  XLA_FFI_ByteSpan *span_ptrs_[kCount];
  XLA_FFI_Scalar scalars_[kCount];
  void *ptrs_[kCount];
  XLA_FFI_AttrType types_[kCount];
  XLA_FFI_Attrs attrs_;
};

Outcome call(XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *), std::vector<Buffer *> args,
             std::vector<Buffer *> rets, XLA_FFI_ExecutionContext &ctx,
             const XLA_FFI_Attrs *attrs = nullptr) {
  std::vector<XLA_FFI_ArgType> arg_types(args.size(), XLA_FFI_ArgType_BUFFER);
  std::vector<XLA_FFI_RetType> ret_types(rets.size(), XLA_FFI_RetType_BUFFER);
  std::vector<void *> arg_ptrs, ret_ptrs;
  for (Buffer *b : args) arg_ptrs.push_back(&b->desc);
  for (Buffer *b : rets) ret_ptrs.push_back(&b->desc);
  XLA_FFI_CallFrame frame{};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.api = &kApi;
  frame.ctx = &ctx;
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  frame.args = XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr, static_cast<int64_t>(args.size()),
                            arg_types.data(), arg_ptrs.data()};
  frame.rets = XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr, static_cast<int64_t>(rets.size()),
                            ret_types.data(), ret_ptrs.data()};
  frame.attrs = attrs ? *attrs
                      : XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 0, nullptr, nullptr, nullptr};
  XLA_FFI_Error *error = handler(&frame);
  Outcome out;
  out.ok = error == nullptr;
  if (error != nullptr) {
    out.code = error->code;
    out.message = error->message;
    delete error;
  }
  return out;
}

int failures = 0;

void expect(bool condition, const std::string &what) {
  std::printf("%s: %s\n", condition ? "ok  " : "FAIL", what.c_str());
  if (!condition) ++failures;
}

bool all_equal(Buffer &b, float value) {
  std::size_t n = 1;
  for (int64_t d : b.dims) n *= static_cast<std::size_t>(d);
  for (std::size_t i = 0; i < n; ++i)
    if (!(b.floats()[i] == value)) return false;
  return true;
}

// A refusal: XLA error `code` with flatmem's `status` and `about` in the
// message (by default UNIMPLEMENTED / UNSUPPORTED), results untouched, no
// scratch memory held.
void expect_refusal(const char *name, XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *),
                    std::vector<Buffer *> args, std::vector<Buffer *> rets,
                    ContrastiveAttrs &attrs, const char *about,
                    XLA_FFI_Error_Code code = XLA_FFI_Error_Code_UNIMPLEMENTED,
                    const char *status = "FLATMEM_STATUS_UNSUPPORTED") {
  XLA_FFI_ExecutionContext ctx;
  const Outcome out = call(handler, args, rets, ctx, attrs.get());
  std::printf("      %s -> code %d: %s\n", name, static_cast<int>(out.code), out.message.c_str());
  expect(!out.ok && out.code == code, std::string(name) + " returns error code " + std::to_string(int(code)));
  expect(out.message.find(status) != std::string::npos && out.message.find(about) != std::string::npos,
         std::string(name) + " carries a " + status + " message about " + about);
  bool untouched = true;
  for (Buffer *r : rets) untouched = untouched && all_equal(*r, -7.0f);
  expect(untouched, std::string(name) + " leaves its results untouched");
  expect(ctx.live_allocations == 0, std::string(name) + " holds no scratch memory afterwards");
}

// The contrastive CUDA handlers: flatmem refuses the host buffers labelled kDLCUDA.
void expect_refused(const char *name, XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *),
                    std::vector<Buffer *> args, std::vector<Buffer *> rets,
                    uint64_t logit_cache_bytes = 0, int64_t fp32_precision = 0) {
  ContrastiveAttrs attrs(logit_cache_bytes, fp32_precision);
  expect_refusal(name, handler, std::move(args), std::move(rets), attrs, "kDLCUDA");
}

// The ring CUDA handlers run flatmem's ring on the device buffers; slot 0
// names no communicator here, so each must fail naming it (INVALID_ARGUMENT)
// before any buffer is touched.
void expect_ring_refused(const char *name, XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *),
                         std::vector<Buffer *> args, std::vector<Buffer *> rets,
                         int64_t fp32_precision = 0) {
  ContrastiveAttrs attrs(ContrastiveAttrs::Comm{0}, fp32_precision);
  expect_refusal(name, handler, std::move(args), std::move(rets), attrs, "slot 0",
                 XLA_FFI_Error_Code_INVALID_ARGUMENT, "FLATMEM_STATUS_INVALID_ARGUMENT");
}

// The ring all-reduce's CUDA handler (attribute comm alone): refused likewise.
void expect_all_reduce_refused(const char *name, XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *),
                               std::vector<Buffer *> args, std::vector<Buffer *> rets) {
  ContrastiveAttrs attrs(ContrastiveAttrs::CommOnly{0});
  expect_refusal(name, handler, std::move(args), std::move(rets), attrs, "kDLCPU");
}

// A reversible segment of one block on states (2, 3, width 4), heads 2, hidden 8:
// the 12 parameter buffers (attention's 6, then the MLP's), LayerNorm weights 1.
struct ReversibleCase {
  static constexpr int64_t w = 4, h = 8;
  std::vector<Buffer> params, grads;
  Buffer x1 = Buffer::f32({2, 3, w}, 0.0f), x2 = Buffer::f32({2, 3, w}, 0.0f);

  // The buffers are moved into the vectors (reserved: no reallocation); a moved
  // std::vector keeps its heap block, so each XLA_FFI_Buffer stays valid.
  ReversibleCase() {
    const std::vector<std::vector<int64_t>> shapes = {{w}, {w}, {w, 3 * w}, {3 * w}, {w, w}, {w},
                                                      {w}, {w}, {w, h},     {h},     {h, w}, {w}};
    params.reserve(shapes.size());
    grads.reserve(shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      params.push_back(Buffer::f32(shapes[i], 1.0f));  // LayerNorm weights stay 1
      grads.push_back(Buffer::f32(shapes[i], -7.0f));
      std::size_t n = 1;
      for (int64_t d : shapes[i]) n *= static_cast<std::size_t>(d);
      for (std::size_t j = 0; j < n && i % 6 != 0; ++j)  // the rest small, different values
        params[i].floats()[j] = 0.01f * static_cast<float>((i * 7 + j * 3) % 11) - 0.05f;
    }
    for (int j = 0; j < 24; ++j) {
      x1.floats()[j] = 0.1f * static_cast<float>(j % 7) - 0.3f;
      x2.floats()[j] = 0.2f * static_cast<float>(j % 5) - 0.4f;
    }
  }
  std::vector<Buffer *> with_params(std::vector<Buffer *> states) {
    for (Buffer &p : params) states.push_back(&p);
    return states;
  }
  std::vector<Buffer *> with_grads(std::vector<Buffer *> results) {
    for (Buffer &g : grads) results.push_back(&g);
    return results;
  }
};

// The CPU forward through the fake frame with this math; its y1 (or the failure).
Outcome reversible_cpu_forward(ReversibleCase &c, int32_t math, std::vector<float> &y1_out) {
  ReversibleAttrs attrs;
  attrs.math = math;
  size_t bytes = 0;
  char message[512] = "";
  const int64_t shape[3] = {2, 3, ReversibleCase::w};
  const int status = flatmem_jax_reversible_workspace_size(
      0, 1, ReversibleCase::w, attrs.heads, attrs.hidden, attrs.eps, 0, attrs.mode,
      attrs.num_threads, 3, shape, 2, 32, &bytes, message, sizeof message);
  if (status != 0) {
    Outcome out;
    out.message = message;
    return out;
  }
  Buffer workspace(XLA_FFI_DataType_U8, {static_cast<int64_t>(bytes)}, bytes);
  Buffer y1 = Buffer::f32({2, 3, ReversibleCase::w}, -7.0f);
  Buffer y2 = Buffer::f32({2, 3, ReversibleCase::w}, -7.0f);
  XLA_FFI_ExecutionContext ctx;
  const Outcome out = call(flatmem_jax_reversible_forward_cpu, c.with_params({&c.x1, &c.x2}),
                           {&y1, &y2, &workspace}, ctx, attrs.get());
  y1_out.assign(y1.floats(), y1.floats() + 24);
  return out;
}

// A CUDA reversible handler must fail without touching its results or holding scratch.
void expect_reversible_refused(const char *name, XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *),
                               std::vector<Buffer *> args, std::vector<Buffer *> rets) {
  ReversibleAttrs attrs;
  XLA_FFI_ExecutionContext ctx;
  const Outcome out = call(handler, args, rets, ctx, attrs.get());
  std::printf("      %s -> code %d (reversible): %s\n", name, static_cast<int>(out.code),
              out.message.c_str());
  expect(!out.ok && !out.message.empty(), std::string(name) + " fails with a message");
  expect(out.message.find("Failed to decode") == std::string::npos,
         std::string(name) + " fails in the handler, not in the attribute or operand decoding");
  bool untouched = true;
  for (Buffer *r : rets) untouched = untouched && all_equal(*r, -7.0f);
  expect(untouched, std::string(name) + " leaves its results untouched");
  expect(ctx.live_allocations == 0, std::string(name) + " holds no scratch memory afterwards");
}

}  // namespace

int main() {
  const int64_t b = 4, d = 3;
  Buffer q = Buffer::f32({b, d}, 0.25f), k = Buffer::f32({b, d}, 0.5f);
  Buffer s = Buffer::f32({}, 2.0f), g = Buffer::f32({}, 1.0f);
  Buffer row_lse = Buffer::f32({b}, 1.0f), col_lse = Buffer::f32({b}, 1.0f);
  Buffer labels(XLA_FFI_DataType_S64, {b}, b * 8);
  Buffer loss = Buffer::f32({}, -7.0f), out_row = Buffer::f32({b}, -7.0f),
         out_col = Buffer::f32({b}, -7.0f);
  Buffer dq = Buffer::f32({b, d}, -7.0f), dk = Buffer::f32({b, d}, -7.0f),
         ds = Buffer::f32({}, -7.0f);

  // The harness: the CPU forward through the same frame works (loss = log b for equal rows),
  // with the same bits under a logit cache of every tile.
  {
    size_t bytes = 0;
    char message[256] = "";
    const int status = flatmem_jax_workspace_size(1, 0, 2, 32, b, d, 2, 32, b, d, &bytes, message,
                                                  sizeof message);
    Buffer workspace(XLA_FFI_DataType_U8, {static_cast<int64_t>(bytes)}, bytes);
    float losses[2] = {-7.0f, -7.0f};
    for (int cached = 0; cached < 2; ++cached) {
      ContrastiveAttrs attrs(cached ? 4 * b * b : 0);
      XLA_FFI_ExecutionContext ctx;
      Buffer cpu_loss = Buffer::f32({}, -7.0f), cpu_row = Buffer::f32({b}, -7.0f),
             cpu_col = Buffer::f32({b}, -7.0f);
      const Outcome out = call(flatmem_jax_clip_forward_cpu, {&q, &k, &s},
                               {&cpu_loss, &cpu_row, &cpu_col, &workspace}, ctx, attrs.get());
      std::printf("      cpu forward (logit_cache_bytes %llu): %s loss %g\n",
                  static_cast<unsigned long long>(attrs.logit_cache_bytes),
                  out.ok ? "ok" : out.message.c_str(), cpu_loss.floats()[0]);
      expect(status == 0 && out.ok && std::fabs(cpu_loss.floats()[0] - std::log(4.0f)) < 1e-5f,
             "harness: flatmem_jax_clip_forward_cpu succeeds with loss log(4)");
      losses[cached] = cpu_loss.floats()[0];
    }
    expect(std::memcmp(&losses[0], &losses[1], sizeof(float)) == 0,
           "logit_cache_bytes reaches the CPU handler and gives the same loss bits");
    // fp32_precision: TF32 and FULL give the default's bits for fp32 inputs on the CPU;
    // 7 reaches flatmem_contrastive_create, which refuses it naming options.fp32_precision.
    for (int64_t precision : {1, 2, 7}) {
      ContrastiveAttrs attrs(0, precision);
      XLA_FFI_ExecutionContext ctx;
      Buffer cpu_loss = Buffer::f32({}, -7.0f), cpu_row = Buffer::f32({b}, -7.0f),
             cpu_col = Buffer::f32({b}, -7.0f);
      const Outcome out = call(flatmem_jax_clip_forward_cpu, {&q, &k, &s},
                               {&cpu_loss, &cpu_row, &cpu_col, &workspace}, ctx, attrs.get());
      std::printf("      cpu forward (fp32_precision %lld) -> code %d: %s loss %g\n",
                  static_cast<long long>(precision), static_cast<int>(out.code),
                  out.ok ? "ok" : out.message.c_str(), cpu_loss.floats()[0]);
      if (precision != 7)
        expect(out.ok && std::memcmp(&losses[0], cpu_loss.floats(), sizeof(float)) == 0,
               "fp32_precision " + std::to_string(precision) +
                   " reaches the CPU handler and gives the default's loss bits (fp32)");
      else
        expect(!out.ok && out.code == XLA_FFI_Error_Code_INVALID_ARGUMENT &&
                   out.message.find("options.fp32_precision") != std::string::npos &&
                   all_equal(cpu_loss, -7.0f),
               "fp32_precision = 7 is flatmem's INVALID_ARGUMENT naming options.fp32_precision, "
               "loss untouched");
    }
  }

  // The sigmoid loss through the same frame: every logit is x = s <q_i, k_j> + t
  // = 2 * 0.375 - 0.25 = 0.5, so L = softplus(-x) + (b - 1) softplus(x).
  Buffer t = Buffer::f32({}, -0.25f), dt = Buffer::f32({}, -7.0f);
  {
    size_t bytes = 0;
    char message[256] = "";
    const int status = flatmem_jax_workspace_size(3, 0, 2, 32, b, d, 2, 32, b, d, &bytes, message,
                                                  sizeof message);
    Buffer workspace(XLA_FFI_DataType_U8, {static_cast<int64_t>(bytes)}, bytes);
    Buffer cpu_loss = Buffer::f32({}, -7.0f);
    ContrastiveAttrs attrs(0);
    XLA_FFI_ExecutionContext ctx;
    const Outcome out = call(flatmem_jax_sigmoid_forward_cpu, {&q, &k, &s, &t},
                             {&cpu_loss, &workspace}, ctx, attrs.get());
    const double softplus = std::log1p(std::exp(0.5)), want = softplus - 0.5 + 3.0 * softplus;
    std::printf("      cpu sigmoid forward: %s loss %g (want %g)\n", out.ok ? "ok" : out.message.c_str(),
                cpu_loss.floats()[0], want);
    expect(status == 0 && out.ok && std::fabs(cpu_loss.floats()[0] - want) < 1e-5,
           "harness: flatmem_jax_sigmoid_forward_cpu succeeds with the loss of logits 0.5");
  }
  expect_refused("flatmem_jax_sigmoid_forward_cuda", flatmem_jax_sigmoid_forward_cuda,
                 {&q, &k, &s, &t}, {&loss});
  expect_refused("flatmem_jax_sigmoid_forward_cuda (labels)", flatmem_jax_sigmoid_forward_cuda,
                 {&q, &k, &s, &t, &labels}, {&loss});
  expect_refused("flatmem_jax_sigmoid_value_and_grad_cuda", flatmem_jax_sigmoid_value_and_grad_cuda,
                 {&q, &k, &s, &t}, {&loss, &dq, &dk, &ds, &dt});
  expect_refused("flatmem_jax_sigmoid_backward_cuda", flatmem_jax_sigmoid_backward_cuda,
                 {&q, &k, &s, &t, &g, &labels}, {&dq, &dk, &ds, &dt});
  expect_ring_refused("flatmem_jax_ring_sigmoid_forward_cuda", flatmem_jax_ring_sigmoid_forward_cuda,
                      {&q, &k, &s, &t}, {&loss});
  expect_ring_refused("flatmem_jax_ring_sigmoid_value_and_grad_cuda",
                      flatmem_jax_ring_sigmoid_value_and_grad_cuda, {&q, &k, &s, &t, &labels},
                      {&loss, &dq, &dk, &ds, &dt});
  expect_ring_refused("flatmem_jax_ring_sigmoid_backward_cuda",
                      flatmem_jax_ring_sigmoid_backward_cuda, {&q, &k, &s, &t, &g},
                      {&dq, &dk, &ds, &dt});

  expect_refused("flatmem_jax_clip_forward_cuda", flatmem_jax_clip_forward_cuda, {&q, &k, &s},
                 {&loss, &out_row, &out_col});
  expect_refused("flatmem_jax_clip_backward_cuda", flatmem_jax_clip_backward_cuda,
                 {&q, &k, &s, &row_lse, &col_lse, &g}, {&dq, &dk, &ds});
  expect_refused("flatmem_jax_infonce_forward_cuda", flatmem_jax_infonce_forward_cuda,
                 {&q, &k, &s, &labels}, {&loss, &out_row});
  expect_refused("flatmem_jax_infonce_forward_cuda (no labels)", flatmem_jax_infonce_forward_cuda,
                 {&q, &k, &s}, {&loss, &out_row});
  expect_refused("flatmem_jax_infonce_backward_cuda", flatmem_jax_infonce_backward_cuda,
                 {&q, &k, &s, &row_lse, &g, &labels}, {&dq, &dk, &ds});
  expect_refused("flatmem_jax_clip_forward_cuda (logit_cache_bytes 1 MiB)",
                 flatmem_jax_clip_forward_cuda, {&q, &k, &s}, {&loss, &out_row, &out_col}, 1 << 20);
  expect_refused("flatmem_jax_clip_backward_cuda (logit_cache_bytes 1 MiB)",
                 flatmem_jax_clip_backward_cuda, {&q, &k, &s, &row_lse, &col_lse, &g},
                 {&dq, &dk, &ds}, 1 << 20);
  expect_refused("flatmem_jax_clip_forward_cuda (fp32_precision tf32)",
                 flatmem_jax_clip_forward_cuda, {&q, &k, &s}, {&loss, &out_row, &out_col}, 0, 1);
  expect_refused("flatmem_jax_sigmoid_backward_cuda (fp32_precision full)",
                 flatmem_jax_sigmoid_backward_cuda, {&q, &k, &s, &t, &g}, {&dq, &dk, &ds, &dt}, 0,
                 2);
  expect_ring_refused("flatmem_jax_ring_clip_forward_cuda", flatmem_jax_ring_clip_forward_cuda,
                      {&q, &k, &s}, {&loss, &out_row, &out_col});
  expect_ring_refused("flatmem_jax_ring_clip_backward_cuda", flatmem_jax_ring_clip_backward_cuda,
                      {&q, &k, &s, &row_lse, &col_lse, &g}, {&dq, &dk, &ds});
  expect_ring_refused("flatmem_jax_ring_infonce_forward_cuda",
                      flatmem_jax_ring_infonce_forward_cuda, {&q, &k, &s, &labels},
                      {&loss, &out_row});
  expect_ring_refused("flatmem_jax_ring_infonce_backward_cuda",
                      flatmem_jax_ring_infonce_backward_cuda, {&q, &k, &s, &row_lse, &g, &labels},
                      {&dq, &dk, &ds});
  expect_ring_refused("flatmem_jax_ring_clip_forward_cuda (fp32_precision full)",
                      flatmem_jax_ring_clip_forward_cuda, {&q, &k, &s}, {&loss, &out_row, &out_col},
                      2);
  expect_all_reduce_refused("flatmem_jax_ring_all_reduce_cuda", flatmem_jax_ring_all_reduce_cuda,
                            {&q}, {&dq});

  // Reversible segments: the harness (attributes by name, remaining operands) on the CPU.
  {
    ReversibleCase c;
    std::vector<float> fp32, tf32, bad;
    const Outcome a = reversible_cpu_forward(c, 0, fp32), b = reversible_cpu_forward(c, 1, tf32);
    std::printf("      reversible cpu forward: %s y1[0] %g\n", a.ok ? "ok" : a.message.c_str(),
                fp32.empty() ? 0.0f : fp32[0]);
    bool moved = false;
    for (std::size_t i = 0; i < fp32.size(); ++i) moved = moved || fp32[i] != c.x1.floats()[i];
    expect(a.ok && moved && fp32[0] != -7.0f,
           "harness: flatmem_jax_reversible_forward_cpu succeeds and adds F(x2) to x1");
    expect(b.ok && std::memcmp(fp32.data(), tf32.data(), fp32.size() * sizeof(float)) == 0,
           "math = TF32 reaches the CPU blocks and gives the FP32 bytes");
    ReversibleAttrs attrs;
    attrs.math = 7;
    Buffer y1 = Buffer::f32({2, 3, ReversibleCase::w}, -7.0f);
    Buffer y2 = Buffer::f32({2, 3, ReversibleCase::w}, -7.0f);
    Buffer workspace(XLA_FFI_DataType_U8, {4096}, 4096);
    XLA_FFI_ExecutionContext ctx;
    const Outcome out = call(flatmem_jax_reversible_forward_cpu, c.with_params({&c.x1, &c.x2}),
                             {&y1, &y2, &workspace}, ctx, attrs.get());
    std::printf("      reversible cpu forward, math 7 -> code %d: %s\n", static_cast<int>(out.code),
                out.message.c_str());
    expect(!out.ok && out.code == XLA_FFI_Error_Code_INVALID_ARGUMENT &&
               out.message.find("options.math") != std::string::npos && all_equal(y1, -7.0f),
           "math = 7 is flatmem's INVALID_ARGUMENT naming options.math, y1 untouched");
  }
  {
    ReversibleCase c;
    Buffer y1 = Buffer::f32({2, 3, ReversibleCase::w}, -7.0f), y2 = Buffer::f32({2, 3, 4}, -7.0f);
    Buffer dy1 = Buffer::f32({2, 3, 4}, 0.5f), dy2 = Buffer::f32({2, 3, 4}, 0.25f);
    Buffer dx1 = Buffer::f32({2, 3, 4}, -7.0f), dx2 = Buffer::f32({2, 3, 4}, -7.0f);
    expect_reversible_refused("flatmem_jax_reversible_forward_cuda",
                              flatmem_jax_reversible_forward_cuda, c.with_params({&c.x1, &c.x2}),
                              {&y1, &y2});
    expect_reversible_refused("flatmem_jax_reversible_backward_cuda",
                              flatmem_jax_reversible_backward_cuda,
                              c.with_params({&c.x1, &c.x2, &dy1, &dy2}), c.with_grads({&dx1, &dx2}));
  }

  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
