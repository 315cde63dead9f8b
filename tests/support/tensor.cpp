#include "support/tensor.hpp"

#include <cstring>
#include <stdexcept>

#include "support/half.hpp"

namespace flatmem_test {

DLDataType dl_dtype(Dtype t) {
  switch (t) {
    case Dtype::f32: return {kDLFloat, 32, 1};
    case Dtype::bf16: return {kDLBfloat, 16, 1};
    case Dtype::f16: return {kDLFloat, 16, 1};
    case Dtype::i64: return {kDLInt, 64, 1};
    case Dtype::f64: return {kDLFloat, 64, 1};
    case Dtype::i32: return {kDLInt, 32, 1};
  }
  throw std::logic_error("dl_dtype: unknown dtype");
}

std::size_t dtype_bytes(Dtype t) {
  switch (t) {
    case Dtype::bf16:
    case Dtype::f16: return 2;
    case Dtype::f32:
    case Dtype::i32: return 4;
    case Dtype::f64:
    case Dtype::i64: return 8;
  }
  throw std::logic_error("dtype_bytes: unknown dtype");
}

const char *dtype_name(Dtype t) {
  switch (t) {
    case Dtype::f32: return "fp32";
    case Dtype::bf16: return "bf16";
    case Dtype::f16: return "fp16";
    case Dtype::i64: return "int64";
    case Dtype::f64: return "fp64";
    case Dtype::i32: return "int32";
  }
  return "?";
}

HostTensor::HostTensor(HostTensor &&other) noexcept { *this = std::move(other); }

HostTensor &HostTensor::operator=(HostTensor &&other) noexcept {
  if (this == &other) return *this;
  dtype_ = other.dtype_;
  rows_ = other.rows_;
  cols_ = other.cols_;
  row_stride_ = other.row_stride_;
  storage_ = std::move(other.storage_);
  data_ = other.data_;
  bytes_ = other.bytes_;
  std::memcpy(shape_, other.shape_, sizeof shape_);
  std::memcpy(strides_, other.strides_, sizeof strides_);
  has_strides_ = other.has_strides_;
  // Keep any deliberate edits of the DLTensor, but re-point the arrays that
  // lived inside `other`.
  tensor_ = other.tensor_;
  if (other.tensor_.shape == other.shape_) tensor_.shape = shape_;
  if (other.tensor_.strides == other.strides_) tensor_.strides = strides_;
  other.data_ = nullptr;
  other.bytes_ = 0;
  other.tensor_ = DLTensor{};
  return *this;
}

void HostTensor::allocate(Dtype t, std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                          int ndim) {
  dtype_ = t;
  rows_ = rows;
  cols_ = cols;
  row_stride_ = row_stride;
  // The last row needs only cols elements; allocate whole strides anyway
  // (simpler, and the tail is padding like the rest).
  bytes_ = std::size_t(rows) * std::size_t(row_stride) * dtype_bytes(t);
  if (bytes_ == 0) bytes_ = dtype_bytes(t);
  storage_.reset(new unsigned char[bytes_ + 64]);
  const auto address = reinterpret_cast<std::uintptr_t>(storage_.get());
  data_ = storage_.get() + (64 - address % 64) % 64;
  std::memset(data_, sentinel_byte, bytes_);
  tensor_ = DLTensor{};
  tensor_.data = data_;
  tensor_.device = {kDLCPU, 0};
  tensor_.ndim = ndim;
  tensor_.dtype = dl_dtype(t);
  tensor_.byte_offset = 0;
  fix_pointers();
}

void HostTensor::fix_pointers() {
  tensor_.shape = tensor_.ndim > 0 ? shape_ : nullptr;
  tensor_.strides = has_strides_ ? strides_ : nullptr;
}

HostTensor HostTensor::matrix(Dtype t, std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                              bool explicit_strides) {
  HostTensor h;
  if (row_stride == 0) row_stride = cols;
  if (row_stride < cols) throw std::logic_error("HostTensor::matrix: row stride < cols");
  h.shape_[0] = rows;
  h.shape_[1] = cols;
  h.strides_[0] = row_stride;
  h.strides_[1] = 1;
  h.has_strides_ = explicit_strides || row_stride != cols;
  h.allocate(t, rows, cols, row_stride, 2);
  return h;
}

HostTensor HostTensor::vector(Dtype t, std::int64_t n) {
  HostTensor h;
  h.shape_[0] = n;
  h.allocate(t, 1, n, n, 1);
  return h;
}

HostTensor HostTensor::scalar(Dtype t, double value, bool as_shape_1) {
  HostTensor h;
  h.shape_[0] = 1;
  h.allocate(t, 1, 1, 1, as_shape_1 ? 1 : 0);
  h.set(0, 0, value);
  return h;
}

unsigned char *HostTensor::element(std::int64_t r, std::int64_t c) const {
  if (r < 0 || r >= rows_ || c < 0 || c >= cols_) throw std::out_of_range("HostTensor: index out of range");
  return data_ + (std::size_t(r) * std::size_t(row_stride_) + std::size_t(c)) * dtype_bytes(dtype_);
}

void HostTensor::set(std::int64_t r, std::int64_t c, double value) {
  unsigned char *p = element(r, c);
  switch (dtype_) {
    case Dtype::f32: {
      const float v = float(value);
      std::memcpy(p, &v, 4);
      break;
    }
    case Dtype::f64: std::memcpy(p, &value, 8); break;
    case Dtype::bf16: {
      const std::uint16_t v = bf16_from_float(float(value));
      std::memcpy(p, &v, 2);
      break;
    }
    case Dtype::f16: {
      const std::uint16_t v = f16_from_float(float(value));
      std::memcpy(p, &v, 2);
      break;
    }
    case Dtype::i64: {
      const std::int64_t v = std::int64_t(value);
      std::memcpy(p, &v, 8);
      break;
    }
    case Dtype::i32: {
      const std::int32_t v = std::int32_t(value);
      std::memcpy(p, &v, 4);
      break;
    }
  }
}

double HostTensor::get(std::int64_t r, std::int64_t c) const {
  const unsigned char *p = element(r, c);
  switch (dtype_) {
    case Dtype::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case Dtype::f64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case Dtype::bf16: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return float_from_bf16(v);
    }
    case Dtype::f16: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return float_from_f16(v);
    }
    case Dtype::i64: {
      std::int64_t v;
      std::memcpy(&v, p, 8);
      return double(v);
    }
    case Dtype::i32: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
  }
  return 0.0;
}

std::uint64_t HostTensor::bits(std::int64_t r, std::int64_t c) const {
  std::uint64_t v = 0;
  std::memcpy(&v, element(r, c), dtype_bytes(dtype_));
  return v;
}

std::vector<double> HostTensor::values() const {
  std::vector<double> out(std::size_t(rows_ * cols_));
  for (std::int64_t r = 0; r < rows_; ++r)
    for (std::int64_t c = 0; c < cols_; ++c) out[std::size_t(r * cols_ + c)] = get(r, c);
  return out;
}

void HostTensor::fill_bytes(unsigned char value) { std::memset(data_, value, bytes_); }

bool HostTensor::all_bytes_are(unsigned char value) const {
  for (std::size_t i = 0; i < bytes_; ++i)
    if (data_[i] != value) return false;
  return true;
}

bool HostTensor::padding_untouched() const {
  const std::size_t elem = dtype_bytes(dtype_);
  for (std::int64_t r = 0; r < rows_; ++r) {
    const unsigned char *row = data_ + std::size_t(r) * std::size_t(row_stride_) * elem;
    for (std::size_t i = std::size_t(cols_) * elem; i < std::size_t(row_stride_) * elem; ++i)
      if (row[i] != sentinel_byte) return false;
  }
  return true;
}

bool HostTensor::same_bits(const HostTensor &other) const {
  if (dtype_ != other.dtype_ || rows_ != other.rows_ || cols_ != other.cols_) return false;
  for (std::int64_t r = 0; r < rows_; ++r)
    for (std::int64_t c = 0; c < cols_; ++c)
      if (bits(r, c) != other.bits(r, c)) return false;
  return true;
}

}  // namespace flatmem_test
