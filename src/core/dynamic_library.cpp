#include "core/dynamic_library.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace flatmem {

OpenedLibrary open_first_library(const char *environment, const std::vector<std::string> &candidates) {
  std::vector<std::string> names;
  if (const char *env = std::getenv(environment); env != nullptr && *env != '\0') names.emplace_back(env);
  for (const std::string &name : candidates)
    if (!name.empty()) names.push_back(name);
  OpenedLibrary out;
  for (const std::string &name : names) {
    dlerror();
    out.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (out.handle != nullptr) {
      out.where = name;
      return out;
    }
    const char *why = dlerror();
    out.tried += (out.tried.empty() ? "" : "; ") + name + " (" + (why ? why : "not found") + ")";
  }
  return out;
}

void *library_symbol(void *handle, const char *name, std::string &missing) {
  void *symbol = dlsym(handle, name);
  if (symbol == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return symbol;
}

}  // namespace flatmem
