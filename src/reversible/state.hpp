// The segment's state tensors: two of the same shape, fp32 or fp64, compact,
// on one device. StateLayout is the checked description every part of the
// executor uses to size buffers and to build DLTensors for callbacks.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace flatmem::reversible {

enum class Real { f32, f64 };

struct StateLayout {
  Real real = Real::f32;
  DLDataType dtype{kDLFloat, 32, 1};
  DLDevice device{kDLCPU, 0};
  std::vector<std::int64_t> shape;
  std::int64_t elements = 0;

  std::size_t element_bytes() const { return real == Real::f32 ? 4 : 8; }
  std::size_t bytes() const { return std::size_t(elements) * element_bytes(); }
  // A compact DLTensor of this layout over `data` (the shape array is ours:
  // valid while this layout lives).
  DLTensor tensor(const void *data) const;
  bool operator==(const StateLayout &o) const {
    return real == o.real && device.device_type == o.device.device_type &&
           device.device_id == o.device.device_id && shape == o.shape;
  }
};

// Checks a state tensor and returns its layout.
StateLayout check_state(const DLTensor *t, const char *name, DataUse use);

// Checks that `t` has exactly `reference`'s layout (named `reference_name`).
void check_state_like(const DLTensor *t, const char *name, const StateLayout &reference,
                      const char *reference_name, DataUse use);

// Fails if the byte ranges of two tensors' data overlap (a and b non-NULL).
void check_disjoint(const DLTensor *a, const char *a_name, const DLTensor *b, const char *b_name,
                    std::size_t bytes);

// The data pointer of a checked tensor (data + byte_offset).
inline char *data_of(const DLTensor *t) { return data_plus_offset(t); }

}  // namespace flatmem::reversible
