// Errors inside flatmem are C++ exceptions carrying a flatmem_status; src/capi/
// turns them into the status and the thread's last-error text. They never cross
// the C ABI.
#pragma once

#include <flatmem/flatmem.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace flatmem {

class Error : public std::runtime_error {
 public:
  Error(flatmem_status status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  flatmem_status status() const noexcept { return status_; }

 private:
  flatmem_status status_;
};

// Builds a message from streamable parts: fail(FLATMEM_STATUS_..., "q: ndim ", n).
template <typename... Parts>
[[noreturn]] void fail(flatmem_status status, const Parts &...parts) {
  std::ostringstream text;
  (text << ... << parts);
  throw Error(status, text.str());
}

template <typename... Parts>
[[noreturn]] void invalid(const Parts &...parts) {
  fail(FLATMEM_STATUS_INVALID_ARGUMENT, parts...);
}

// Records / reads the calling thread's message (empty on success).
void set_last_error(const std::string &message);
const char *last_error() noexcept;

// Runs body(); maps exceptions to a status and the thread's last-error text.
template <typename Body>
flatmem_status guarded(Body &&body) noexcept {
  try {
    body();
    set_last_error("");
    return FLATMEM_STATUS_SUCCESS;
  } catch (const Error &e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc &) {
    set_last_error("out of host memory");
    return FLATMEM_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    set_last_error(std::string("internal error: ") + e.what());
    return FLATMEM_STATUS_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return FLATMEM_STATUS_INTERNAL;
  }
}

}  // namespace flatmem
