// Owning host tensors for the tests: a 64-byte aligned buffer plus the
// DLTensor that describes it. Values are set and read as doubles and rounded
// to the element type on the way in (round to nearest even), so a test always
// knows the exact values the library receives.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace flatmem_test {

enum class Dtype { f32, bf16, f16, i64, f64, i32 };

DLDataType dl_dtype(Dtype t);
std::size_t dtype_bytes(Dtype t);
const char *dtype_name(Dtype t);  // "fp32", "bf16", ...

/** The bytes every fresh tensor is filled with (and outputs are prefilled
 *  with) so that a write the library should not have made shows up. */
constexpr unsigned char sentinel_byte = 0xA5;

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(HostTensor &&other) noexcept;
  HostTensor &operator=(HostTensor &&other) noexcept;
  HostTensor(const HostTensor &) = delete;
  HostTensor &operator=(const HostTensor &) = delete;

  /** rows x cols; row_stride (elements) 0 = compact. A row stride > cols, or
   *  explicit_strides, gives the DLTensor a strides array {row_stride, 1};
   *  otherwise strides is NULL. Padding between rows holds sentinel bytes. */
  static HostTensor matrix(Dtype t, std::int64_t rows, std::int64_t cols, std::int64_t row_stride = 0,
                           bool explicit_strides = false);
  /** A contiguous (n,) vector. */
  static HostTensor vector(Dtype t, std::int64_t n);
  /** One element: ndim 0, or ndim 1 with shape (1,). */
  static HostTensor scalar(Dtype t, double value, bool as_shape_1 = false);

  /** The DLTensor (mutable: tests that need a malformed one edit it). */
  DLTensor *dl() { return &tensor_; }
  const DLTensor *dl() const { return &tensor_; }

  Dtype dtype() const { return dtype_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t row_stride() const { return row_stride_; }
  std::int64_t elements() const { return rows_ * cols_; }

  /** Element (r, c) of a matrix, or element c of a vector/scalar with r = 0.
   *  set() rounds to the element type; get() is exact. */
  void set(std::int64_t r, std::int64_t c, double value);
  double get(std::int64_t r, std::int64_t c) const;
  void set(std::int64_t i, double value) { set(0, i, value); }
  double get(std::int64_t i) const { return get(0, i); }
  /** Raw bit pattern of element (r, c) (for bitwise comparisons). */
  std::uint64_t bits(std::int64_t r, std::int64_t c) const;

  /** Dense row-major copy of the values (rows * cols doubles). */
  std::vector<double> values() const;

  /** Every byte of the buffer, padding included. */
  const unsigned char *bytes() const { return data_; }
  std::size_t byte_count() const { return bytes_; }
  void fill_bytes(unsigned char value);
  bool all_bytes_are(unsigned char value) const;
  /** Whether the padding bytes between rows (row stride > cols) still hold
   *  sentinel_byte. */
  bool padding_untouched() const;
  /** Bitwise equality of the elements (padding ignored). */
  bool same_bits(const HostTensor &other) const;

 private:
  void allocate(Dtype t, std::int64_t rows, std::int64_t cols, std::int64_t row_stride, int ndim);
  unsigned char *element(std::int64_t r, std::int64_t c) const;
  void fix_pointers();

  Dtype dtype_ = Dtype::f32;
  std::int64_t rows_ = 0, cols_ = 0, row_stride_ = 0;
  std::unique_ptr<unsigned char[]> storage_;
  unsigned char *data_ = nullptr;  // storage_ aligned up to 64 bytes
  std::size_t bytes_ = 0;
  std::int64_t shape_[2] = {0, 0};
  std::int64_t strides_[2] = {0, 1};
  bool has_strides_ = false;
  DLTensor tensor_{};
};

}  // namespace flatmem_test
