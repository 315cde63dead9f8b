#include "comm/message.hpp"

#include <cstdint>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace flatmem::comm {

Message check_message(const DLTensor *t, const char *name) {
  if (t == nullptr) invalid(name, ": NULL");
  const std::int32_t type = device_type_of(t->device);
  if (type != kDLCPU && type != kDLCUDA)
    fail(FLATMEM_STATUS_UNSUPPORTED, name, ": device type ", type,
         "; messages live on kDLCPU (host transport) or kDLCUDA (device transport)");
  if (t->dtype.lanes != 1) invalid(name, ": dtype lanes ", int(t->dtype.lanes), "; expected 1");
  if (t->dtype.bits == 0 || t->dtype.bits % 8 != 0)
    invalid(name, ": dtype bits ", int(t->dtype.bits), "; expected a multiple of 8");
  if (t->ndim < 0 || t->ndim > 32) invalid(name, ": ndim ", t->ndim, "; expected 0 .. 32");
  if (t->ndim > 0 && t->shape == nullptr) invalid(name, ": shape is NULL with ndim ", t->ndim);
  std::uint64_t count = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    const std::int64_t extent = t->shape[i];
    if (extent < 0) invalid(name, ": shape[", i, "] = ", extent, "; expected >= 0");
    if (t->strides != nullptr && extent > 1 && t->strides[i] != std::int64_t(count))
      invalid(name, ": strides[", i, "] = ", t->strides[i], "; messages must be compact (expected ",
              count, ")");
    if (extent != 0 && count > (std::uint64_t(1) << 62) / std::uint64_t(extent))
      invalid(name, ": ", t->ndim, "-d shape overflows 64-bit sizes");
    count *= std::uint64_t(extent);
  }
  const std::uint64_t element = t->dtype.bits / 8;
  if (count > (std::uint64_t(1) << 62) / element) invalid(name, ": byte size overflows 64 bits");
  Message m;
  m.count = std::size_t(count);
  m.bytes = std::size_t(count * element);
  m.device = t->device;
  m.dtype = t->dtype;
  if (m.bytes > 0 && t->data == nullptr) invalid(name, ": data is NULL");
  m.data = data_plus_offset(t);
  return m;
}

bool overlaps(const Message &a, const Message &b) {
  if (a.bytes == 0 || b.bytes == 0) return false;
  return a.data < b.data + b.bytes && b.data < a.data + a.bytes;
}

}  // namespace flatmem::comm
