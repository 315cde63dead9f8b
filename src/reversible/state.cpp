#include "reversible/state.hpp"

#include <climits>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "core/tensor.hpp"
#if FLATMEM_HAVE_CUDA_BACKEND
#include "core/cuda/device.hpp"
#endif

namespace flatmem::reversible {
namespace {

std::string shape_text(const std::int64_t *shape, int ndim) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < ndim; ++i) s << (i ? ", " : "") << shape[i];
  s << (ndim == 1 ? ",)" : ")");
  return s.str();
}

}  // namespace

DLTensor StateLayout::tensor(const void *data) const {
  DLTensor t{};
  t.data = const_cast<void *>(data);
  t.device = device;
  t.ndim = int(shape.size());
  t.dtype = dtype;
  t.shape = const_cast<std::int64_t *>(shape.data());
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

StateLayout check_state(const DLTensor *t, const char *name, DataUse use) {
  if (t == nullptr) invalid(name, ": tensor is NULL");
  StateLayout s;
  s.device = t->device;
#if FLATMEM_HAVE_CUDA_BACKEND
  const bool supported = device_type_of(t->device) == kDLCPU || device_type_of(t->device) == kDLCUDA;
#else
  const bool supported = device_type_of(t->device) == kDLCPU;
#endif
  if (!supported)
    fail(device_type_of(t->device) == kDLCUDA ? FLATMEM_STATUS_UNSUPPORTED
                                              : FLATMEM_STATUS_INVALID_ARGUMENT,
         name, ": device type ", device_type_of(t->device),
         " is not supported; reversible segments run on kDLCPU",
#if FLATMEM_HAVE_CUDA_BACKEND
         " and kDLCUDA",
#endif
         " tensors in this build");
  const DLDataType d = t->dtype;
  if (d.code == kDLFloat && d.bits == 32 && d.lanes == 1) s.real = Real::f32;
  else if (d.code == kDLFloat && d.bits == 64 && d.lanes == 1) s.real = Real::f64;
  else
    invalid(name, ": dtype ", dtype_text(d), " is not accepted; a state is float32 or float64");
  s.dtype = d;
  if (t->ndim < 1 || t->ndim > 8) invalid(name, ": ndim is ", t->ndim, "; expected 1 to 8");
  if (t->shape == nullptr) invalid(name, ": shape is NULL with ndim ", t->ndim);
  __int128 elements = 1;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 1)
      invalid(name, ": shape ", shape_text(t->shape, t->ndim), " has an extent < 1 in dimension ", i);
    elements *= t->shape[i];
    if (elements * __int128(s.element_bytes()) + t->byte_offset > __int128(INT64_MAX))
      invalid(name, ": shape ", shape_text(t->shape, t->ndim),
              " spans more than 2^63 bytes (the size overflows)");
  }
  s.shape.assign(t->shape, t->shape + t->ndim);
  s.elements = std::int64_t(elements);
  if (t->strides != nullptr) {
    std::int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] > 1 && t->strides[i] != expected)
        invalid(name, ": strides are not compact row-major (dimension ", i, " has stride ",
                t->strides[i], ", expected ", expected, "); pass a contiguous tensor");
      expected *= t->shape[i];
    }
  }
  if (use == DataUse::required) {
    if (t->data == nullptr) invalid(name, ": data is NULL");
    const auto address = reinterpret_cast<std::uintptr_t>(t->data) + t->byte_offset;
    if (address % s.element_bytes() != 0)
      invalid(name, ": data + byte_offset (", address, ") is not aligned to the ",
              s.element_bytes(), "-byte element size");
#if FLATMEM_HAVE_CUDA_BACKEND
    if (t->device.device_type == kDLCUDA)
      flatmem::cuda::check_device_pointer(data_of(t), name, t->device.device_id);
#endif
  }
  return s;
}

void check_state_like(const DLTensor *t, const char *name, const StateLayout &reference,
                      const char *reference_name, DataUse use) {
  if (t != nullptr && (device_type_of(t->device) != device_type_of(reference.device) ||
                       t->device.device_id != reference.device.device_id))
    invalid(name, ": device (type ", device_type_of(t->device), ", id ", t->device.device_id,
            ") differs from ", reference_name, "'s (type ", device_type_of(reference.device),
            ", id ", reference.device.device_id, ")");
  const StateLayout s = check_state(t, name, use);
  if (s.real != reference.real)
    invalid(name, ": dtype is ", s.real == Real::f32 ? "fp32" : "fp64", " but ", reference_name,
            " is ", reference.real == Real::f32 ? "fp32" : "fp64");
  if (s.shape != reference.shape)
    invalid(name, ": shape ", shape_text(s.shape.data(), int(s.shape.size())), " differs from ",
            reference_name, "'s ", shape_text(reference.shape.data(), int(reference.shape.size())));
}

void check_disjoint(const DLTensor *a, const char *a_name, const DLTensor *b, const char *b_name,
                    std::size_t bytes) {
  const auto pa = reinterpret_cast<std::uintptr_t>(data_of(a));
  const auto pb = reinterpret_cast<std::uintptr_t>(data_of(b));
  if (pa < pb + bytes && pb < pa + bytes)
    invalid(a_name, " and ", b_name, ": their memory overlaps; they must be distinct buffers");
}

}  // namespace flatmem::reversible
