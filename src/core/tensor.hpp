// Checked views of DLTensors. Every check names the argument, the value it
// had and what was expected, so that the caller's message says what to fix.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "core/dtype.hpp"

namespace flatmem {

// A matrix of rows x cols elements, row r starting at data + r * row_stride elements.
struct MatrixView {
  char *data = nullptr;
  Dtype dtype = Dtype::f32;
  std::int64_t rows = 0, cols = 0, row_stride = 0;
  DLDevice device{kDLCPU, 0};

  template <typename T>
  T *row(std::int64_t r) const {
    return reinterpret_cast<T *>(data) + r * row_stride;
  }
};

// A contiguous vector (or a one-element scalar when size == 1).
struct VectorView {
  char *data = nullptr;
  Dtype dtype = Dtype::f32;
  std::int64_t size = 0;
  DLDevice device{kDLCPU, 0};

  template <typename T>
  T *as() const {
    return reinterpret_cast<T *>(data);
  }
};

// Whether a check reads data (a compute call) or only metadata (a size query).
enum class DataUse { required, metadata_only };

// Devices a caller's backend accepts. kDLCUDA passes only with cpu_or_cuda
// and a library built with its CUDA backend (FLATMEM_HAVE_CUDA_BACKEND);
// otherwise it is FLATMEM_STATUS_UNSUPPORTED, as before.
enum class Devices { cpu_only, cpu_or_cuda };

// A DLDataType as the frameworks spell it, for messages: "int32", "uint8", "float64", "bfloat16",
// "bool", "complex64", "float8_e4m3fn"; lanes > 1 appended as "x<lanes>" ("float32x4"); a code
// DLPack does not define, or a width that does not go with it, as "(code 9, bits 32, lanes 1)".
std::string dtype_text(const DLDataType &t);

// Whether this library was built with the CUDA backend.
bool cuda_backend_built();

// data + byte_offset in integer arithmetic: a hostile byte_offset must not make pointer
// arithmetic overflow (undefined behaviour) while the tensor is being checked.
inline char *data_plus_offset(const DLTensor *t) {
  return reinterpret_cast<char *>(reinterpret_cast<std::uintptr_t>(t->data) + t->byte_offset);
}

// A caller's device type as its 32-bit storage: a C caller may store any value there, and
// loading a value outside DLDeviceType's range as the enum is undefined behaviour in C++.
inline std::int32_t device_type_of(const DLDevice &device) {
  std::int32_t type;
  static_assert(sizeof type == sizeof device.device_type);
  std::memcpy(&type, &device.device_type, sizeof type);
  return type;
}

// A 2-D tensor of one of `dtypes`; inner stride 1, row stride >= cols.
MatrixView check_matrix(const DLTensor *t, const char *name, std::initializer_list<Dtype> dtypes,
                        DataUse use, Devices devices = Devices::cpu_only);

// A contiguous 1-D tensor of `expected_size` elements of `dtype`.
VectorView check_vector(const DLTensor *t, const char *name, Dtype dtype, std::int64_t expected_size,
                        DataUse use, Devices devices = Devices::cpu_only);

// One fp32 element: ndim 0, or ndim 1 with shape (1,).
VectorView check_scalar(const DLTensor *t, const char *name, Devices devices = Devices::cpu_only);

// Fails unless `device` equals `reference` (named `reference_name`).
void check_same_device(const DLDevice &device, const char *name, const DLDevice &reference,
                       const char *reference_name);

}  // namespace flatmem
