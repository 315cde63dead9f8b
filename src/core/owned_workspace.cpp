#include "core/owned_workspace.hpp"

#include <new>

#include "core/error.hpp"

namespace flatmem {

void *OwnedWorkspace::resolve(void *given, std::size_t given_bytes, std::size_t needed) {
  if (given != nullptr) {
    if (given_bytes < needed)
      fail(FLATMEM_STATUS_WORKSPACE_TOO_SMALL, "workspace: ", given_bytes, " bytes given; ", needed,
           " bytes needed (ask the *_workspace_size function)");
    return given;
  }
  if (given_bytes != 0) invalid("workspace: NULL with workspace_bytes = ", given_bytes, "; pass 0");
  if (bytes_ < needed) {
    buffer_.reset();
    bytes_ = 0;
    buffer_.reset(new (std::nothrow) char[needed]);
    if (!buffer_) fail(FLATMEM_STATUS_OUT_OF_MEMORY, "workspace: could not allocate ", needed, " bytes");
    bytes_ = needed;
  }
  return buffer_.get();
}

}  // namespace flatmem
