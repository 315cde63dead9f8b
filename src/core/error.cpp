#include "core/error.hpp"

namespace flatmem {
namespace {
thread_local std::string last_error_text;
}

void set_last_error(const std::string &message) {
  try {
    last_error_text = message;
  } catch (...) {
    last_error_text.clear();  // out of memory while reporting: keep the status, drop the text
  }
}

const char *last_error() noexcept { return last_error_text.c_str(); }

}  // namespace flatmem
