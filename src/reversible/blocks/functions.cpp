// The flatmem_reversible_function callbacks of a built-in block: check the
// context and the state tensors, then run the CPU kernels or, for kDLCUDA
// states, the CUDA ones on context->stream. A failure returns
// its status with the message also given to flatmem_reversible_callback_error
// (the executor prefixes it with "block k, F forward: ").
#include <climits>
#include <cstddef>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "core/options.hpp"
#include "reversible/blocks/block.hpp"
#include "reversible/blocks/cpu/kernels.hpp"

#if FLATMEM_HAVE_CUDA_BLOCKS
#include "reversible/blocks/cuda/blocks.hpp"
#endif

namespace flatmem::blocks {
namespace {

enum class Data { required, metadata_only };

std::string shape_text(const DLTensor *t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t->ndim; ++i) s << (i ? ", " : "") << t->shape[i];
  s << (t->ndim == 1 ? ",)" : ")");
  return s.str();
}

const flatmem_block_s &check_block(const void *user) {
  if (user == nullptr) invalid("block: NULL user pointer (use flatmem_block_function)");
  return *static_cast<const flatmem_block_s *>(user);
}

void check_context(const flatmem_reversible_context *c) {
  if (c == nullptr) invalid("context: NULL");
  if (c->struct_size < offsetof(flatmem_reversible_context, internal))
    invalid("context: struct_size ", c->struct_size, " is smaller than the fields up to parallel_for (",
            offsetof(flatmem_reversible_context, internal), " bytes)");
  if (c->num_threads < 1 || c->num_threads > max_threads)
    invalid("context.num_threads: ", c->num_threads, "; expected 1 to ", max_threads);
}

const char *device_text(const DLDevice &d) {
  const std::int32_t type = device_type_of(d);
  return type == kDLCPU ? "kDLCPU" : type == kDLCUDA ? "kDLCUDA" : "another device";
}

// A state: fp32, CPU, (batch, tokens, width) or (tokens, width), compact.
BlockShape check_state(const flatmem_block_s &block, const DLTensor *t, const char *name, Data use) {
  if (t == nullptr) invalid(name, ": NULL");
  const std::int32_t type = device_type_of(t->device);
#if FLATMEM_HAVE_CUDA_BLOCKS
  const bool accepted = type == kDLCPU || type == kDLCUDA;
#else
  const bool accepted = type == kDLCPU;
#endif
  if (!accepted)
    fail(type == kDLCUDA ? FLATMEM_STATUS_UNSUPPORTED : FLATMEM_STATUS_INVALID_ARGUMENT, name, ": device type ",
         int(type), type == kDLCUDA ? "; this build runs the built-in blocks on kDLCPU tensors only (built without CUDA)"
                                    : "; the built-in blocks run on kDLCPU or kDLCUDA tensors");
  if (block.has_parameters &&
      (type != device_type_of(block.device) || t->device.device_id != block.device.device_id))
    invalid(name, ": device ", device_text(t->device), " (id ", t->device.device_id,
            ") differs from the block parameters' ", device_text(block.device), " (id ", block.device.device_id,
            "); a block runs where its parameters are");
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1)
    invalid(name, ": dtype ", dtype_text(t->dtype), " is not accepted; the built-in blocks take float32 states");
  if (t->ndim != 2 && t->ndim != 3)
    invalid(name, ": ndim ", t->ndim, "; expected 3 (batch, tokens, width) or 2 (tokens, width)");
  if (t->shape == nullptr) invalid(name, ": shape is NULL");
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] < 1) invalid(name, ": shape ", shape_text(t), " has an extent < 1");
  const BlockOptions &o = block.options;
  if (t->shape[t->ndim - 1] != o.width)
    invalid(name, ": shape ", shape_text(t), "; the last extent must be the block width ", o.width);
  if (t->strides != nullptr) {
    std::int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] > 1 && t->strides[i] != expected)
        invalid(name, ": strides are not compact row-major (dimension ", i, " has stride ",
                t->strides[i], ", expected ", expected, ")");
      expected *= t->shape[i];
    }
  }
  BlockShape s;
  s.batch = t->ndim == 3 ? t->shape[0] : 1;
  s.tokens = t->shape[t->ndim - 2];
  s.width = o.width;
  s.heads = o.heads;
  s.head_dim = o.width / o.heads;
  s.hidden = o.hidden;
  s.eps = o.eps;
  // Every buffer must be addressable and every extent BLAS-sized.
  const __int128 rows = __int128(s.batch) * s.tokens;
  const __int128 floats = rows * (5 * __int128(s.width) + s.hidden + 2) +
                          __int128(s.batch) * s.heads * s.tokens * s.tokens;
  if (rows > INT_MAX || s.tokens > INT_MAX || floats > (__int128(1) << 58))
    invalid(name, ": shape ", shape_text(t), " is too large (", (long double)(rows),
            " token rows; at most 2^31-1 rows and 2^60 bytes of buffers)");
  s.rows = std::int64_t(rows);
  if (use == Data::required) {
    if (t->data == nullptr) invalid(name, ": data is NULL");
    if ((reinterpret_cast<std::uintptr_t>(t->data) + t->byte_offset) % alignof(float) != 0)
      invalid(name, ": data + byte_offset is not 4-byte aligned");
  }
  return s;
}

void check_same_shape(const DLTensor *t, const char *name, const DLTensor *x, const BlockShape &xs,
                      const flatmem_block_s &block) {
  check_state(block, t, name, Data::required);
  bool same = t->ndim == x->ndim;
  for (int i = 0; same && i < t->ndim; ++i) same = t->shape[i] == x->shape[i];
  if (!same) invalid(name, ": shape ", shape_text(t), " differs from x's ", shape_text(x));
  (void)xs;
}

const float *data_of(const DLTensor *t) { return reinterpret_cast<const float *>(data_plus_offset(t)); }
float *data_of(DLTensor *t) { return reinterpret_cast<float *>(data_plus_offset(t)); }

void check_parameters_set(const flatmem_block_s &block) {
  if (!block.has_parameters)
    invalid("block: parameters not set (call flatmem_block_set_parameters)");
}

#if FLATMEM_HAVE_CUDA_BLOCKS
cuda::DeviceCall device_call(const flatmem_block_s &block, const flatmem_reversible_context *context) {
  cuda::DeviceCall call;
  call.device = block.device.device_id;
  call.stream = static_cast<cudaStream_t>(context->stream);
  call.tf32 = block.options.tf32;
  return call;
}
#endif

template <typename Body>
flatmem_status callback(Body &&body) noexcept {
  const flatmem_status status = guarded(body);
  if (status != FLATMEM_STATUS_SUCCESS) flatmem_reversible_callback_error(last_error());
  return status;
}

flatmem_status forward(void *user, const flatmem_reversible_context *context, const DLTensor *x,
                       DLTensor *y, void *residuals) {
  return callback([&] {
    const flatmem_block_s &block = check_block(user);
    check_context(context);
    const BlockShape s = check_state(block, x, "x", Data::required);
    check_same_shape(y, "y", x, s, block);
    check_parameters_set(block);
#if FLATMEM_HAVE_CUDA_BLOCKS
    if (x->device.device_type == kDLCUDA) {
      const cuda::DeviceCall call = device_call(block, context);
      if (block.options.kind == Kind::attention)
        cuda::attention_forward(call, s, block.parameters, data_of(x), data_of(y), residuals);
      else
        cuda::mlp_forward(call, s, block.parameters, data_of(x), data_of(y), residuals);
      return;
    }
#endif
    const cpu::Parallel parallel(context);
    if (block.options.kind == Kind::attention)
      cpu::attention_forward(parallel, s, block.parameters, data_of(x), data_of(y), residuals);
    else
      cpu::mlp_forward(parallel, s, block.parameters, data_of(x), data_of(y), residuals);
  });
}

flatmem_status vjp(void *user, const flatmem_reversible_context *context, const DLTensor *x,
                   const void *residuals, const DLTensor *dy, DLTensor *dx) {
  return callback([&] {
    const flatmem_block_s &block = check_block(user);
    check_context(context);
    const BlockShape s = check_state(block, x, "x", Data::required);
    check_same_shape(dy, "dy", x, s, block);
    check_same_shape(dx, "dx", x, s, block);
    if (residuals == nullptr)
      invalid("residuals: NULL; the VJP needs what the forward stored (residual_size bytes)");
    check_parameters_set(block);
    if (!block.has_gradients)
      invalid("block: gradients not set (pass them to flatmem_block_set_parameters before a backward)");
#if FLATMEM_HAVE_CUDA_BLOCKS
    if (x->device.device_type == kDLCUDA) {
      const cuda::DeviceCall call = device_call(block, context);
      if (block.options.kind == Kind::attention)
        cuda::attention_vjp(call, s, block.parameters, data_of(x), residuals, data_of(dy), data_of(dx));
      else
        cuda::mlp_vjp(call, s, block.parameters, data_of(x), residuals, data_of(dy), data_of(dx));
      return;
    }
#endif
    const cpu::Parallel parallel(context);
    if (block.options.kind == Kind::attention)
      cpu::attention_vjp(parallel, s, block.parameters, data_of(x), residuals, data_of(dy), data_of(dx));
    else
      cpu::mlp_vjp(parallel, s, block.parameters, data_of(x), residuals, data_of(dy), data_of(dx));
  });
}

flatmem_status residual_size(void *user, const flatmem_reversible_context *context,
                             const DLTensor *x, size_t *bytes) {
  return callback([&] {
    const flatmem_block_s &block = check_block(user);
    (void)context;  // sizes do not depend on the call
    if (bytes == nullptr) invalid("bytes: NULL");
    const BlockShape s = check_state(block, x, "x", Data::metadata_only);
#if FLATMEM_HAVE_CUDA_BLOCKS
    if (x->device.device_type == kDLCUDA) {
      *bytes = block.options.kind == Kind::attention ? cuda::attention_residual_bytes(s)
                                                     : cuda::mlp_residual_bytes(s);
      return;
    }
#endif
    *bytes = block.options.kind == Kind::attention ? cpu::attention_residual_bytes(s)
                                                   : cpu::mlp_residual_bytes(s);
  });
}

}  // namespace

flatmem_reversible_function block_function(flatmem_block_s &block) {
  flatmem_reversible_function f{};
  f.forward = forward;
  f.vjp = vjp;
  f.residual_size = residual_size;
  f.user = &block;
  return f;
}

}  // namespace flatmem::blocks
