// DLPack views of XLA FFI buffers: the DLTensor borrows the buffer's data and
// dimensions (XLA keeps both alive for the whole call) and says "compact
// row-major" (strides NULL), which is the layout jax.ffi.ffi_call asks XLA for.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <optional>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace flatmem_jax {

namespace ffi = xla::ffi;

// The DLPack code and bits of an XLA element type; nullopt for types DLPack
// 0.6 cannot name (PRED, the fp8 and 4-bit types, TOKEN).
inline std::optional<DLDataType> dlpack_dtype(ffi::DataType type) {
  auto dt = [](int code, int bits) {
    return DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (type) {
    case ffi::DataType::F16: return dt(kDLFloat, 16);
    case ffi::DataType::F32: return dt(kDLFloat, 32);
    case ffi::DataType::F64: return dt(kDLFloat, 64);
    case ffi::DataType::BF16: return dt(kDLBfloat, 16);
    case ffi::DataType::S8: return dt(kDLInt, 8);
    case ffi::DataType::S16: return dt(kDLInt, 16);
    case ffi::DataType::S32: return dt(kDLInt, 32);
    case ffi::DataType::S64: return dt(kDLInt, 64);
    case ffi::DataType::U8: return dt(kDLUInt, 8);
    case ffi::DataType::U16: return dt(kDLUInt, 16);
    case ffi::DataType::U32: return dt(kDLUInt, 32);
    case ffi::DataType::U64: return dt(kDLUInt, 64);
    case ffi::DataType::C64: return dt(kDLComplex, 64);
    case ffi::DataType::C128: return dt(kDLComplex, 128);
    default: return std::nullopt;
  }
}

// A view of `buffer` on `device`, or an error naming the operand when its
// element type has no DLPack equivalent. Everything else (dtype accepted,
// shapes, devices) is left to flatmem, whose messages say more.
inline ffi::ErrorOr<DLTensor> dlpack_view(const ffi::AnyBuffer &buffer, DLDevice device,
                                          const char *name) {
  const std::optional<DLDataType> dtype = dlpack_dtype(buffer.element_type());
  if (!dtype)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string("flatmem_jax: ") + name + ": XLA element type " +
        std::to_string(static_cast<int>(buffer.element_type())) + " has no DLPack equivalent"));
  const ffi::AnyBuffer::Dimensions dims = buffer.dimensions();
  DLTensor t{};
  t.data = buffer.untyped_data();
  t.device = device;
  t.ndim = static_cast<int32_t>(dims.size());
  t.dtype = *dtype;
  t.shape = const_cast<int64_t *>(dims.begin());  // flatmem only reads it
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

// The labels operand: s64 (b,) as it is, or s32 (b, 2) -- each label's low
// and high 32-bit words, see flatmem_jax.h -- viewed as s64 (b,). The view's
// shape points at the first extent of the (b, 2) dimensions.
inline ffi::ErrorOr<DLTensor> labels_view(const ffi::AnyBuffer &buffer, DLDevice device) {
  ffi::ErrorOr<DLTensor> view = dlpack_view(buffer, device, "labels");
  if (!view || buffer.element_type() != ffi::DataType::S32) return view;
  const ffi::AnyBuffer::Dimensions dims = buffer.dimensions();
  if (dims.size() != 2 || dims[1] != 2)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "flatmem_jax: labels: s32 labels must have shape (b, 2), the (low, high) words of each "
        "int64 label"));
  view->ndim = 1;
  view->dtype = DLDataType{kDLInt, 64, 1};
  return view;
}

}  // namespace flatmem_jax
