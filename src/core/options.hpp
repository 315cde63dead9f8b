// Reading a caller's options struct under the ABI rules: it begins with
// size_t struct_size, the library reads min(struct_size, sizeof) bytes and
// treats what the caller did not provide as 0 ("default").
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.hpp"
#include "core/thread_pool.hpp"

namespace flatmem {

// `init_name` names the INIT macro / init function the message points to.
template <typename Struct>
Struct read_options(const Struct *given, const char *init_name) {
  Struct o{};
  if (given != nullptr) {
    if (given->struct_size < sizeof(std::size_t))
      invalid("options: struct_size is ", given->struct_size, "; initialise with ", init_name);
    std::memcpy(&o, given, std::min<std::size_t>(given->struct_size, sizeof o));
  }
  return o;
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
