// The platform-independent body of the reversible-segment handlers
// (reversible_cpu.cpp, reversible_cuda.cu): the cache of flatmem segment
// handles, pointing their blocks at a call's parameter buffers, and one call
// of flatmem_reversible_forward / _backward. The handlers only bind operands
// and say where the device, the stream, the workspace and the zeroing of the
// gradient results come from. See flatmem_jax.h for the operands.
//
// Compiled as C++20 (reversible_call.cpp) and, through reversible_cuda.cu, by
// nvcc as C++17: keep this header C++17.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>

#include "contrastive_call.hpp"  // Workspace, flatmem_error
#include "xla/ffi/api/ffi.h"

namespace flatmem_jax {

// The handlers' attributes, decoded by name into this struct (the
// registration below; XLA passes them sorted by name, order here is free).
struct ReversibleAttrs {
  int32_t mode;         // flatmem_reversible_mode (STANDARD is refused by the Python side)
  int32_t num_threads;  // CPU threads per call, 0 = $FLATMEM_JAX_NUM_THREADS or all
  uint64_t seed, offset;
  int32_t heads, hidden;
  float eps;
  int32_t math;  // flatmem_block_math
};

// What differs between the platforms.
class ReversiblePlatform {
 public:
  // The workspace of the forward (backward) on states like `state`, for the
  // segment `handle` (CPU: the handler's result buffer; CUDA: sized by
  // flatmem's query and taken from XLA's scratch allocator).
  virtual ffi::ErrorOr<Workspace> workspace(flatmem_reversible_t *handle, const DLTensor &state,
                                            bool backward) = 0;
  // Sets a gradient result to zero before the backward accumulates into it
  // (CPU: memset; CUDA: cudaMemsetAsync on XLA's stream).
  virtual ffi::Error zero(ffi::AnyBuffer buffer) = 0;

 protected:
  ~ReversiblePlatform() = default;
};

// x1, x2, params... -> y1, y2 on `device`, enqueued on `stream` (NULL on the CPU).
ffi::Error run_reversible_forward(DLDevice device, void *stream, ffi::AnyBuffer x1,
                                  ffi::AnyBuffer x2, ffi::RemainingArgs params, ffi::AnyBuffer y1,
                                  ffi::AnyBuffer y2, const ReversibleAttrs &attrs,
                                  ReversiblePlatform &platform);

// y1, y2, dy1, dy2, params... -> dx1, dx2, grads... (written: zeroed, then
// accumulated by the blocks).
ffi::Error run_reversible_backward(DLDevice device, void *stream, ffi::AnyBuffer y1,
                                   ffi::AnyBuffer y2, ffi::AnyBuffer dy1, ffi::AnyBuffer dy2,
                                   ffi::RemainingArgs params, ffi::AnyBuffer dx1,
                                   ffi::AnyBuffer dx2, ffi::RemainingRets grads,
                                   const ReversibleAttrs &attrs, ReversiblePlatform &platform);

}  // namespace flatmem_jax

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(::flatmem_jax::ReversibleAttrs,
                                      ::xla::ffi::StructMember<int32_t>("mode"),
                                      ::xla::ffi::StructMember<int32_t>("num_threads"),
                                      ::xla::ffi::StructMember<uint64_t>("seed"),
                                      ::xla::ffi::StructMember<uint64_t>("offset"),
                                      ::xla::ffi::StructMember<int32_t>("heads"),
                                      ::xla::ffi::StructMember<int32_t>("hidden"),
                                      ::xla::ffi::StructMember<float>("eps"),
                                      ::xla::ffi::StructMember<int32_t>("math"));
