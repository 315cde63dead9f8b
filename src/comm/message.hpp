// A DLTensor as a message: its bytes, where they live, and (for sums) its
// element type. Any dtype with whole bytes and lanes 1, any ndim, compact.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>

namespace flatmem::comm {

struct Message {
  char *data = nullptr;
  std::size_t bytes = 0;
  std::size_t count = 0;  // elements
  DLDevice device{kDLCPU, 0};
  DLDataType dtype{};
};

// INVALID_ARGUMENT naming `name` for NULL, lanes != 1, bits not a multiple of
// 8, non-compact strides, negative extents, sizes that overflow, NULL data
// with bytes > 0; UNSUPPORTED for devices other than kDLCPU / kDLCUDA.
Message check_message(const DLTensor *t, const char *name);

// Whether [a, a + n) and [b, b + m) share a byte.
bool overlaps(const Message &a, const Message &b);

}  // namespace flatmem::comm
