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
// harness itself is sound.
//
// Built by bindings/jax/CMakeLists.txt when the CUDA handlers are; run by
// tests/test_jax_library.py. Exit status 0 = every check passed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

Outcome call(XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *), std::vector<Buffer *> args,
             std::vector<Buffer *> rets, XLA_FFI_ExecutionContext &ctx) {
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
  frame.attrs = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 0, nullptr, nullptr, nullptr};
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

void expect_refused(const char *name, XLA_FFI_Error *(*handler)(XLA_FFI_CallFrame *),
                    std::vector<Buffer *> args, std::vector<Buffer *> rets) {
  XLA_FFI_ExecutionContext ctx;
  const Outcome out = call(handler, args, rets, ctx);
  std::printf("      %s -> code %d: %s\n", name, static_cast<int>(out.code), out.message.c_str());
  expect(!out.ok && out.code == XLA_FFI_Error_Code_UNIMPLEMENTED,
         std::string(name) + " returns UNIMPLEMENTED");
  expect(out.message.find("FLATMEM_STATUS_UNSUPPORTED") != std::string::npos &&
             out.message.find("kDLCUDA") != std::string::npos,
         std::string(name) + " carries flatmem's UNSUPPORTED message about kDLCUDA");
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

  // The harness: the CPU forward through the same frame works (loss = log b for equal rows).
  {
    size_t bytes = 0;
    char message[256] = "";
    const int status = flatmem_jax_workspace_size(1, 0, 2, 32, b, d, 2, 32, b, d, &bytes, message,
                                                  sizeof message);
    Buffer workspace(XLA_FFI_DataType_U8, {static_cast<int64_t>(bytes)}, bytes);
    XLA_FFI_ExecutionContext ctx;
    Buffer cpu_loss = Buffer::f32({}, -7.0f), cpu_row = Buffer::f32({b}, -7.0f),
           cpu_col = Buffer::f32({b}, -7.0f);
    const Outcome out = call(flatmem_jax_clip_forward_cpu, {&q, &k, &s},
                             {&cpu_loss, &cpu_row, &cpu_col, &workspace}, ctx);
    std::printf("      cpu forward: %s loss %g\n", out.ok ? "ok" : out.message.c_str(),
                cpu_loss.floats()[0]);
    expect(status == 0 && out.ok && std::fabs(cpu_loss.floats()[0] - std::log(4.0f)) < 1e-5f,
           "harness: flatmem_jax_clip_forward_cpu succeeds with loss log(4)");
  }

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

  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
