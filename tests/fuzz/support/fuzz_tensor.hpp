// Tensors as a hostile caller passes them: built valid from the target's shapes, then
// mutated field by field (device, dtype, ndim, shape, strides, byte_offset, alignment,
// data, the pointer itself), then backed by a real buffer sized from what the mutated
// fields describe -- so any read or write the library makes outside what the caller
// described is an ASan report, and any call the library accepts reads real memory.
//
// Buffers are bounded (kMaxBufferBytes): a tensor that describes more gets a NULL data
// pointer, which the library must refuse for every call that reads data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <dlpack/dlpack.h>

#include "support/fuzz_input.hpp"

namespace flatmem_fuzz {

inline constexpr std::size_t kMaxBufferBytes = std::size_t(1) << 20;
inline constexpr int kMaxNdim = 16;  // shape / strides arrays hold this many entries
inline constexpr unsigned char kSentinel = 0xA5;

inline DLDataType f32() { return DLDataType{kDLFloat, 32, 1}; }
inline DLDataType f64() { return DLDataType{kDLFloat, 64, 1}; }
inline DLDataType f16() { return DLDataType{kDLFloat, 16, 1}; }
inline DLDataType bf16() { return DLDataType{kDLBfloat, 16, 1}; }
inline DLDataType i64() { return DLDataType{kDLInt, 64, 1}; }

class FuzzTensor {
 public:
  FuzzTensor() = default;
  FuzzTensor(DLDataType dtype, std::vector<std::int64_t> shape);
  FuzzTensor(const FuzzTensor &) = delete;
  FuzzTensor &operator=(const FuzzTensor &) = delete;

  // One mutation of one field, chosen and valued by the reader.
  void mutate(Reader &in);
  // Allocates the buffer for what the fields now describe and points data at it
  // (through byte_offset and the misalignment). Call after the mutations.
  void materialize();
  // Input values at every index the tensor describes: floats k / 32 (|k| <= 128; NaN
  // and Inf too when allowed) in the tensor's dtype; integers (labels) in [0, modulo)
  // mostly, hostile values sometimes. Returns whether a non-finite value was written.
  bool fill(Reader &in, bool allow_nonfinite, std::int64_t modulo = 128);
  // Element i of an honest fp32 tensor (writes / reads through the described layout).
  void set_f32(std::int64_t i, float value);
  // Output: every byte of the buffer set to kSentinel.
  void fill_sentinel();
  // Whether any byte of the buffer differs from kSentinel.
  bool written() const;

  // The DLTensor* to pass (NULL when a mutation said so).
  DLTensor *get() { return null_pointer_ ? nullptr : &tensor_; }
  const DLTensor &tensor() const { return tensor_; }
  // Whether the buffer covers everything the fields describe (else data is NULL).
  bool honest() const { return honest_; }
  // Element i (fp32 tensors, compact, honest): for checks after success.
  std::int64_t elements() const { return elements_; }
  float f32_at(std::int64_t i) const;
  // Element i (row-major order of the described layout, honest tensors) as a double:
  // fp32 / fp64 / fp16 / bf16 decoded, integers converted. For oracles after success.
  double value_at(std::int64_t i) const;

 private:
  void sync_pointers();

  DLTensor tensor_{};
  std::int64_t shape_[kMaxNdim] = {};
  std::int64_t strides_[kMaxNdim] = {};
  bool has_strides_ = false;
  bool null_pointer_ = false;
  bool null_data_ = false;
  unsigned misalign_ = 0;
  bool honest_ = false;
  std::int64_t elements_ = 0;   // number of addressable elements (compact equivalents)
  std::vector<std::int64_t> offsets_;  // element offsets the tensor describes (bounded)
  std::vector<unsigned char> storage_;
  unsigned char *start_ = nullptr;  // data + byte_offset
  std::size_t span_bytes_ = 0;
};

// Element size in bytes of a dtype (at least 1), as the caller's fields say.
std::size_t element_bytes(const DLDataType &dtype);

// Applies `count` mutations (count from the reader, bounded) to tensors chosen by the
// reader among `tensors` (nullptr entries skipped).
void mutate_some(Reader &in, std::initializer_list<FuzzTensor *> tensors);

// A caller's workspace: NULL/0, the queried size, one byte short, or a bogus pairing.
struct Workspace {
  std::vector<unsigned char> storage;
  void *pointer = nullptr;
  std::size_t bytes = 0;
  void choose(std::uint8_t choice, std::size_t queried);
};

}  // namespace flatmem_fuzz
