// Shared libraries opened at run time (dlopen), for the optional GPU
// libraries that libflatmem is not linked against (NCCL, cuBLASLt): a build
// with them still loads, and runs everything else, where they are absent.
#pragma once

#include <string>
#include <vector>

namespace flatmem {

struct OpenedLibrary {
  void *handle = nullptr;  // NULL when none of the candidates loaded
  std::string where;       // the candidate that loaded
  std::string tried;       // "name (dlerror); name (dlerror)" when none did
};

// `environment` (a variable naming a path or file name; tried first when set
// and non-empty), then `candidates` in order (empty ones skipped). Handles are
// never closed: the libraries keep threads and CUDA state for the process.
OpenedLibrary open_first_library(const char *environment, const std::vector<std::string> &candidates);

// Binds `slot` to the symbol `name`; appends the name to `missing` when absent.
void *library_symbol(void *handle, const char *name, std::string &missing);

template <typename F>
void bind_symbol(void *handle, const char *name, F &slot, std::string &missing) {
  slot = reinterpret_cast<F>(library_symbol(handle, name, missing));
}

}  // namespace flatmem
