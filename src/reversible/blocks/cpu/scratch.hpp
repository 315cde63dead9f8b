// Temporary fp32 buffers of one callback: 64-byte aligned regions carved out
// of one allocation that lives for the call (nothing is kept between calls,
// so a block holds no memory while a segment is idle).
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include "core/error.hpp"
#include "core/workspace.hpp"

namespace flatmem::blocks::cpu {

class Scratch {
 public:
  explicit Scratch(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    memory_.reset(new (std::nothrow) char[bytes]);
    if (!memory_)
      fail(FLATMEM_STATUS_OUT_OF_MEMORY, "block: could not allocate ", bytes, " bytes of scratch");
  }
  void *data() const { return memory_.get(); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<char[]> memory_;
  std::size_t bytes_;
};

}  // namespace flatmem::blocks::cpu
