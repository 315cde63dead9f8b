// Reading a caller's options struct under the ABI rules (core/abi_struct.hpp):
// it begins with size_t struct_size, the library reads min(struct_size, sizeof)
// bytes and treats what the caller did not provide as 0 ("default").
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/abi_struct.hpp"
#include "core/error.hpp"
#include "core/thread_pool.hpp"

namespace flatmem {

// An options struct (begins with size_t struct_size; NULL = defaults).
// `init_name` names the INIT macro / init function the message points to.
template <typename Struct>
Struct read_options(const Struct *given, const char *init_name) {
  return read_sized(given, "options", init_name);
}

// An enum field read as its 32-bit storage: a C caller may store any value.
template <typename Enum>
std::int32_t enum_value(const Enum &field) {
  static_assert(sizeof(Enum) == sizeof(std::int32_t));
  std::int32_t v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

inline constexpr int max_threads = 256;

// 0 = all online processors; otherwise 1..max_threads.
inline int resolve_threads(std::int32_t value, const char *name) {
  if (value < 0 || value > max_threads)
    invalid(name, ": ", value, "; expected 0 (all processors) to ", max_threads);
  return value == 0 ? std::min(hardware_threads(), max_threads) : int(value);
}

}  // namespace flatmem
