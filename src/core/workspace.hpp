// Carves typed, 64-byte aligned regions out of one workspace buffer. The same
// code measures (base == nullptr: only counts bytes) and carves, so a size
// query and the call that uses the workspace can never disagree.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.hpp"

namespace flatmem {

class WorkspaceCarver {
 public:
  static constexpr std::size_t alignment = 64;

  // base == nullptr measures only. The base is aligned up here, which the
  // measured size accounts for with `alignment` bytes of slack.
  explicit WorkspaceCarver(void *base = nullptr) {
    if (base != nullptr) {
      const auto address = reinterpret_cast<std::uintptr_t>(base);
      base_ = static_cast<char *>(base) + (alignment - address % alignment) % alignment;
    }
  }

  // A negative count is a size that wrapped before it got here (a size_t
  // above 2^63 cast to int64_t): refused, never taken as 0 (checked size
  // arithmetic: flatmem.h's workspace rule).
  template <typename T>
  T *take(std::int64_t count) {
    if (count < 0) invalid("workspace: a region of ", count, " elements (a size that overflowed 63 bits)");
    offset_ = (offset_ + alignment - 1) / alignment * alignment;
    const unsigned __int128 bytes = (unsigned __int128)count * sizeof(T);
    if (bytes > (unsigned __int128)(INT64_MAX) - offset_)
      invalid("workspace: the sizes requested overflow 64 bits");
    T *region = base_ ? reinterpret_cast<T *>(base_ + offset_) : nullptr;
    offset_ += std::size_t(bytes);
    return region;
  }

  // Total bytes a caller must provide for everything taken so far.
  std::size_t bytes() const { return offset_ + alignment; }

 private:
  char *base_ = nullptr;
  std::size_t offset_ = 0;
};

}  // namespace flatmem
