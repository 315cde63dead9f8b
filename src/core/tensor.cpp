#include "core/tensor.hpp"

#include <climits>
#include <sstream>
#include <string>

#include "core/error.hpp"

namespace flatmem {
namespace {

std::string shape_text(const DLTensor *t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t->ndim; ++i) s << (i ? ", " : "") << t->shape[i];
  s << (t->ndim == 1 ? ",)" : ")");
  return s.str();
}

// The name of a DLPack type code whose width is part of the name (int32, float64, ...); NULL
// for codes spelled otherwise. Numeric values, not enumerators: the installed dlpack.h may
// predate kDLBool (DLPack 0.8) and the 8/6/4-bit floats (DLPack 1.1).
const char *sized_code_name(std::uint8_t code) {
  switch (code) {
    case 0: return "int";      // kDLInt
    case 1: return "uint";     // kDLUInt
    case 2: return "float";    // kDLFloat
    case 4: return "bfloat";   // kDLBfloat
    case 5: return "complex";  // kDLComplex
    default: return nullptr;
  }
}

// The full name of a code that has one width only (kDLBool and DLPack 1.1's narrow floats,
// codes 6 to 17), or NULL; *bits is set to that width.
const char *fixed_width_name(std::uint8_t code, int *bits) {
  struct Named { const char *name; int bits; };
  static const Named names[] = {
      {"bool", 8},           {"float8_e3m4", 8},    {"float8_e4m3", 8},     {"float8_e4m3b11fnuz", 8},
      {"float8_e4m3fn", 8},  {"float8_e4m3fnuz", 8}, {"float8_e5m2", 8},    {"float8_e5m2fnuz", 8},
      {"float8_e8m0fnu", 8}, {"float6_e2m3fn", 6},  {"float6_e3m2fn", 6},   {"float4_e2m1fn", 4}};
  if (code < 6 || code >= 6 + sizeof names / sizeof names[0]) return nullptr;
  *bits = names[code - 6].bits;
  return names[code - 6].name;
}

const char *device_name(std::int32_t type) {
  switch (type) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLROCM: return "kDLROCM";
    default: return "a non-CPU device";
  }
}

bool decode_dtype(const DLDataType &t, Dtype &out) {
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32) return out = Dtype::f32, true;
  if (t.code == kDLFloat && t.bits == 16) return out = Dtype::f16, true;
  if (t.code == kDLBfloat && t.bits == 16) return out = Dtype::bf16, true;
  if (t.code == kDLInt && t.bits == 64) return out = Dtype::i64, true;
  return false;
}

std::string allowed_text(std::initializer_list<Dtype> dtypes) {
  std::string s;
  for (Dtype d : dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

// Checks pointer, device and dtype common to every tensor; returns the dtype.
Dtype check_common(const DLTensor *t, const char *name, std::initializer_list<Dtype> dtypes,
                   DataUse use, Devices devices) {
  if (t == nullptr) invalid(name, ": tensor is NULL");
  const bool cuda_accepted = devices == Devices::cpu_or_cuda && cuda_backend_built();
  const std::int32_t type = device_type_of(t->device);
  const bool accepted = type == kDLCPU || (type == kDLCUDA && cuda_accepted);
  if (!accepted) {
    fail(type == kDLCUDA ? FLATMEM_STATUS_UNSUPPORTED : FLATMEM_STATUS_INVALID_ARGUMENT,
         name, ": device is ", device_name(type), " (type ", type, "); ",
         cuda_accepted ? "expected kDLCPU or kDLCUDA"
         : devices == Devices::cpu_or_cuda
             ? "this build runs on kDLCPU tensors only (built without CUDA)"
             : "this function runs on kDLCPU tensors only");
  }
  Dtype dtype = Dtype::f32;
  bool known = decode_dtype(t->dtype, dtype);
  bool allowed = false;
  for (Dtype d : dtypes) allowed = allowed || (known && d == dtype);
  if (!allowed)
    invalid(name, ": dtype ", dtype_text(t->dtype), " is not accepted here; expected ", allowed_text(dtypes));
  if (t->ndim < 0 || t->ndim > 8) invalid(name, ": ndim ", t->ndim, " is out of range");
  if (t->ndim > 0 && t->shape == nullptr) invalid(name, ": shape is NULL with ndim ", t->ndim);
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] < 1)
      invalid(name, ": shape ", shape_text(t), " has an extent < 1 in dimension ", i);
  if (use == DataUse::required) {
    if (t->data == nullptr) invalid(name, ": data is NULL");
    const auto address = reinterpret_cast<std::uintptr_t>(t->data) + t->byte_offset;
    if (address % dtype_bytes(dtype) != 0)
      invalid(name, ": data + byte_offset (", address, ") is not aligned to the ",
              dtype_bytes(dtype), "-byte element size");
  }
  return dtype;
}

// Byte extent rows * row_stride * elem (plus byte_offset) must fit in int64.
void check_extent(const DLTensor *t, const char *name, std::int64_t rows, std::int64_t row_stride,
                  std::size_t elem) {
  __int128 extent = __int128(rows) * row_stride * __int128(elem) + t->byte_offset;
  if (extent > __int128(INT64_MAX))
    invalid(name, ": shape ", shape_text(t), " with row stride ", row_stride,
            " spans more than 2^63 bytes (the size overflows)");
}

}  // namespace

std::string dtype_text(const DLDataType &t) {
  int width = 0;
  const char *fixed = fixed_width_name(t.code, &width);
  const char *sized = sized_code_name(t.code);
  std::string name;
  if (fixed != nullptr && t.bits == width) name = fixed;
  else if (sized != nullptr && t.bits > 0 && (t.code != 4 || t.bits == 16))  // bfloat16 is the one bfloat
    name = sized + std::to_string(t.bits);
  if (name.empty() || t.lanes == 0)
    return "(code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) + ", lanes " +
           std::to_string(t.lanes) + ")";
  return t.lanes > 1 ? name + "x" + std::to_string(t.lanes) : name;
}

bool cuda_backend_built() {
#ifdef FLATMEM_HAVE_CUDA_BACKEND
  return true;
#else
  return false;
#endif
}

void check_same_device(const DLDevice &device, const char *name, const DLDevice &reference,
                       const char *reference_name) {
  if (device_type_of(device) != device_type_of(reference) || device.device_id != reference.device_id)
    invalid(name, ": device (type ", device_type_of(device), ", id ", device.device_id,
            ") differs from ", reference_name, "'s (type ", device_type_of(reference), ", id ",
            reference.device_id, ")");
}

MatrixView check_matrix(const DLTensor *t, const char *name, std::initializer_list<Dtype> dtypes,
                        DataUse use, Devices devices) {
  MatrixView v;
  v.dtype = check_common(t, name, dtypes, use, devices);
  if (t->ndim != 2) invalid(name, ": ndim is ", t->ndim, " with shape ", shape_text(t), "; expected 2");
  v.rows = t->shape[0];
  v.cols = t->shape[1];
  v.row_stride = v.cols;
  if (t->strides != nullptr) {
    if (t->strides[1] != 1)
      invalid(name, ": inner stride is ", t->strides[1], " elements; expected 1 (rows must be contiguous)");
    if (t->strides[0] < v.cols && v.rows > 1)
      invalid(name, ": row stride ", t->strides[0], " is smaller than the row length ", v.cols);
    v.row_stride = v.rows > 1 ? t->strides[0] : v.cols;
  }
  check_extent(t, name, v.rows, v.row_stride, dtype_bytes(v.dtype));
  // BLAS takes the row length and the row stride as 32-bit ints.
  if (v.cols > INT_MAX || v.row_stride > INT_MAX)
    invalid(name, ": row length ", v.cols, " or row stride ", v.row_stride,
            " exceeds 2^31-1, the largest extent BLAS accepts");
  v.data = data_plus_offset(t);
  v.device = t->device;
  return v;
}

VectorView check_vector(const DLTensor *t, const char *name, Dtype dtype, std::int64_t expected_size,
                        DataUse use, Devices devices) {
  VectorView v;
  v.dtype = check_common(t, name, {dtype}, use, devices);
  if (t->ndim != 1)
    invalid(name, ": ndim is ", t->ndim, " with shape ", shape_text(t), "; expected 1 with shape (",
            expected_size, ",)");
  if (t->shape[0] != expected_size)
    invalid(name, ": shape ", shape_text(t), "; expected (", expected_size, ",)");
  if (t->strides != nullptr && t->strides[0] != 1 && expected_size > 1)
    invalid(name, ": stride ", t->strides[0], "; expected 1 (contiguous)");
  check_extent(t, name, 1, expected_size, dtype_bytes(v.dtype));
  v.size = expected_size;
  v.data = data_plus_offset(t);
  v.device = t->device;
  return v;
}

VectorView check_scalar(const DLTensor *t, const char *name, Devices devices) {
  VectorView v;
  v.dtype = check_common(t, name, {Dtype::f32}, DataUse::required, devices);
  const bool one_element = t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1);
  if (!one_element)
    invalid(name, ": shape ", shape_text(t), "; expected one element (ndim 0, or shape (1,))");
  v.size = 1;
  v.data = data_plus_offset(t);
  v.device = t->device;
  return v;
}

}  // namespace flatmem
