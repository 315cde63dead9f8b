#include "support/fuzz_tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flatmem_fuzz {
namespace {

// fp32 -> fp16 bits for the values fill() makes (k / 32 with |k| <= 128, 0, inf, nan):
// exact for normal numbers in fp16 range, truncating otherwise (good enough for inputs).
std::uint16_t half_bits(float value) {
  std::uint32_t f;
  std::memcpy(&f, &value, 4);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const int exponent = int((f >> 23) & 0xff);
  const std::uint32_t mantissa = f & 0x7fffffu;
  if (exponent == 0xff) return std::uint16_t(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  const int e = exponent - 127 + 15;
  if (exponent == 0 || e <= 0) return std::uint16_t(sign);
  if (e >= 31) return std::uint16_t(sign | 0x7c00u);
  return std::uint16_t(sign | (std::uint32_t(e) << 10) | (mantissa >> 13));
}

float value_from(Reader &in, bool allow_nonfinite) {
  const auto b = static_cast<std::int8_t>(in.byte());
  if (allow_nonfinite && b == -128) return in.byte() % 2 ? __builtin_nanf("") : __builtin_inff();
  return float(b) / 32.0f;
}

}  // namespace

std::size_t element_bytes(const DLDataType &dtype) {
  const std::size_t bits = std::size_t(dtype.bits) * std::max<std::size_t>(dtype.lanes, 1);
  return std::max<std::size_t>((bits + 7) / 8, 1);
}

FuzzTensor::FuzzTensor(DLDataType dtype, std::vector<std::int64_t> shape) {
  tensor_.device = DLDevice{kDLCPU, 0};
  tensor_.dtype = dtype;
  tensor_.ndim = int(shape.size());
  std::fill(std::begin(shape_), std::end(shape_), 1);
  std::copy(shape.begin(), shape.end(), shape_);
  // Compact strides, used only when a mutation turns strides on.
  std::int64_t stride = 1;
  for (int i = tensor_.ndim - 1; i >= 0; --i) {
    strides_[i] = stride;
    stride *= shape_[i];
  }
  sync_pointers();
}

void FuzzTensor::sync_pointers() {
  tensor_.shape = shape_;
  tensor_.strides = has_strides_ ? strides_ : nullptr;
}

void FuzzTensor::mutate(Reader &in) {
  const std::uint8_t field = in.byte();
  const std::uint8_t index = in.byte() % kMaxNdim;
  switch (field % 13) {
    case 0: {  // any 32-bit value a C caller may store (memcpy: not a C++ enum conversion)
      const std::int32_t type = in.pick(3) == 0 ? std::int32_t(kDLCUDA) : std::int32_t(in.hostile_int64());
      std::memcpy(&tensor_.device.device_type, &type, sizeof type);
      break;
    }
    case 1: tensor_.device.device_id = std::int32_t(in.hostile_int64()); break;
    case 2: tensor_.dtype.code = in.byte(); break;
    case 3: tensor_.dtype.bits = in.byte(); break;
    case 4: tensor_.dtype.lanes = std::uint16_t(in.hostile_int64()); break;
    case 5: tensor_.ndim = int(in.byte() % (kMaxNdim + 3)) - 2; break;  // -2 .. 16
    case 6: shape_[index] = in.hostile_int64(); break;
    case 7: has_strides_ = !has_strides_; break;
    case 8: has_strides_ = true; strides_[index] = in.hostile_int64(); break;
    case 9: tensor_.byte_offset = std::uint64_t(in.hostile_int64()); break;
    case 10: misalign_ = 1 + in.byte() % 7; break;
    case 11: null_data_ = true; break;
    default: null_pointer_ = true; break;
  }
  sync_pointers();
}

void FuzzTensor::materialize() {
  const int ndim = tensor_.ndim;
  // What some function may accept (communicator messages take up to 32 dimensions and
  // empty extents): every ndim the shape array can back, extents >= 0.
  bool valid_shape = ndim >= 0 && ndim <= kMaxNdim;
  for (int i = 0; valid_shape && i < ndim; ++i) valid_shape = shape_[i] >= 0;
  offsets_.clear();
  honest_ = false;
  __int128 lo = 0, hi = 0, count = 1;
  if (valid_shape) {
    for (int i = 0; i < ndim; ++i) {
      const __int128 stride = has_strides_ ? strides_[i] : [&] {
        // The row-major stride, saturated at 2^62: 16 hostile extents overflow even
        // __int128 (UB in this oracle itself; found by the CI smoke). Any stride that
        // large means more elements than kMaxBufferBytes, so the tensor is not honest
        // either way, and (shape - 1) * stride stays below 2^125.
        const __int128 cap = __int128(1) << 62;
        __int128 s = 1;
        for (int j = i + 1; j < ndim; ++j) s = std::min(cap, s * std::min<__int128>(shape_[j], cap));
        return s;
      }();
      const __int128 reach = shape_[i] == 0 ? 0 : (__int128(shape_[i]) - 1) * stride;
      (reach < 0 ? lo : hi) += reach;
      count *= shape_[i];
      if (count > __int128(kMaxBufferBytes) || hi - lo > __int128(kMaxBufferBytes)) break;
    }
    const std::size_t elem = element_bytes(tensor_.dtype);
    honest_ = count <= __int128(kMaxBufferBytes) && (hi - lo + 1) * __int128(elem) <= __int128(kMaxBufferBytes);
  }
  const std::size_t elem = element_bytes(tensor_.dtype);
  span_bytes_ = honest_ ? std::size_t(hi - lo + 1) * elem : 16;
  storage_.assign(span_bytes_ + misalign_, 0);
  start_ = storage_.data() + misalign_ - (honest_ ? std::ptrdiff_t(lo) * std::ptrdiff_t(elem) : 0);
  if (honest_) {
    // Every element offset the fields describe, row-major order.
    std::vector<std::int64_t> index(std::size_t(std::max(ndim, 1)), 0);
    elements_ = std::int64_t(count);
    offsets_.reserve(std::size_t(count));
    for (std::int64_t n = 0; n < elements_; ++n) {
      std::int64_t offset = 0;
      for (int i = 0; i < ndim; ++i) offset += index[std::size_t(i)] * (has_strides_ ? strides_[i] : 0);
      if (!has_strides_) offset = n;
      offsets_.push_back(offset);
      for (int i = ndim - 1; i >= 0; --i) {
        if (++index[std::size_t(i)] < shape_[i]) break;
        index[std::size_t(i)] = 0;
      }
    }
  } else {
    elements_ = 0;
  }
  // data + byte_offset is the buffer (the pointer arithmetic wraps like the caller's).
  const auto start = reinterpret_cast<std::uintptr_t>(start_);
  // A byte_offset larger than the buffer's address cannot be honoured: NULL data then.
  const bool representable = tensor_.byte_offset <= start;
  tensor_.data = null_data_ || (!honest_ && valid_shape) || !representable
                     ? nullptr
                     : reinterpret_cast<void *>(start - tensor_.byte_offset);
  sync_pointers();
}

bool FuzzTensor::fill(Reader &in, bool allow_nonfinite, std::int64_t modulo) {
  const std::size_t elem = element_bytes(tensor_.dtype);
  bool nonfinite = false;
  for (std::int64_t offset : offsets_) {
    unsigned char *p = start_ + offset * std::ptrdiff_t(elem);
    const float v = value_from(in, allow_nonfinite);
    nonfinite = nonfinite || !(v - v == 0.0f);
    if (tensor_.dtype.code == kDLFloat && tensor_.dtype.bits == 32) {
      std::memcpy(p, &v, 4);
    } else if (tensor_.dtype.code == kDLFloat && tensor_.dtype.bits == 64) {
      const double d = v;
      std::memcpy(p, &d, 8);
    } else if (tensor_.dtype.code == kDLFloat && tensor_.dtype.bits == 16) {
      const std::uint16_t h = half_bits(v);
      std::memcpy(p, &h, 2);
    } else if (tensor_.dtype.code == kDLBfloat && tensor_.dtype.bits == 16) {
      std::uint32_t f;
      std::memcpy(&f, &v, 4);
      const auto h = std::uint16_t(f >> 16);
      std::memcpy(p, &h, 2);
    } else {
      // Integers (labels): in [0, modulo) mostly, hostile sometimes.
      const std::uint8_t choice = in.byte();
      const std::int64_t i = choice < 224 ? choice % std::max<std::int64_t>(modulo, 1) : in.hostile_int64();
      std::memcpy(p, &i, std::min<std::size_t>(elem, 8));
    }
  }
  return nonfinite;
}

void FuzzTensor::set_f32(std::int64_t i, float value) {
  if (!honest_ || i >= elements_ || element_bytes(tensor_.dtype) != 4) return;
  std::memcpy(start_ + offsets_[std::size_t(i)] * 4, &value, 4);
}

void FuzzTensor::fill_sentinel() { std::fill(storage_.begin(), storage_.end(), kSentinel); }

bool FuzzTensor::written() const {
  return std::any_of(storage_.begin(), storage_.end(), [](unsigned char c) { return c != kSentinel; });
}

float FuzzTensor::f32_at(std::int64_t i) const {
  float v = 0;
  if (!honest_ || i >= elements_ || element_bytes(tensor_.dtype) != 4) return v;
  std::memcpy(&v, start_ + offsets_[std::size_t(i)] * 4, 4);
  return v;
}

double FuzzTensor::value_at(std::int64_t i) const {
  if (!honest_ || i < 0 || i >= elements_) return 0.0;
  const std::size_t elem = element_bytes(tensor_.dtype);
  const unsigned char *p = start_ + offsets_[std::size_t(i)] * std::ptrdiff_t(elem);
  const DLDataType &t = tensor_.dtype;
  if (t.code == kDLFloat && t.bits == 32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (t.code == kDLFloat && t.bits == 64) {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  if ((t.code == kDLFloat || t.code == kDLBfloat) && t.bits == 16) {
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    if (t.code == kDLBfloat) {
      const std::uint32_t f = std::uint32_t(h) << 16;
      float v;
      std::memcpy(&v, &f, 4);
      return v;
    }
    const int exponent = (h >> 10) & 0x1f;
    const double mantissa = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exponent == 0x1f) return mantissa ? __builtin_nan("") : sign * __builtin_inf();
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    return sign * std::ldexp(1024.0 + mantissa, exponent - 25);
  }
  std::int64_t v = 0;
  std::memcpy(&v, p, std::min<std::size_t>(elem, 8));
  return double(v);
}

void mutate_some(Reader &in, std::initializer_list<FuzzTensor *> tensors) {
  std::vector<FuzzTensor *> present;
  for (FuzzTensor *t : tensors)
    if (t != nullptr) present.push_back(t);
  if (present.empty()) return;
  const int count = in.byte() % 4;  // 0 mutations is the ordinary case
  for (int i = 0; i < count; ++i) present[in.pick(present.size())]->mutate(in);
}

void Workspace::choose(std::uint8_t choice, std::size_t queried) {
  storage.clear();
  pointer = nullptr;
  bytes = 0;
  const std::size_t cap = 8 * kMaxBufferBytes;
  switch (choice % 6) {
    case 0: case 1: return;  // NULL, 0: the handle allocates
    case 2: bytes = queried; break;
    case 3: bytes = queried > 0 ? queried - 1 : 0; break;  // too small
    case 4: bytes = queried + 7; break;                    // larger, odd
    default: bytes = std::size_t(1) << 20; pointer = nullptr; return;  // NULL with a size
  }
  if (bytes > cap) {  // cannot honour it: pass NULL with the size (must be refused)
    return;
  }
  storage.assign(bytes + 1, 0);
  pointer = storage.data() + 1;  // any alignment is accepted
}

}  // namespace flatmem_fuzz
