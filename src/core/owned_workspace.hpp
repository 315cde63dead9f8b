// The workspace rule every handle follows: a caller buffer is checked against
// the size the call needs; NULL with 0 bytes makes the handle use (and grow)
// a buffer of its own, freed with the handle.
#pragma once

#include <cstddef>
#include <memory>

namespace flatmem {

class OwnedWorkspace {
 public:
  // Returns `given` after checking its size, or the handle's own buffer
  // grown to `needed` when given is NULL.
  void *resolve(void *given, std::size_t given_bytes, std::size_t needed);
  std::size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<char[]> buffer_;
  std::size_t bytes_ = 0;
};

}  // namespace flatmem
