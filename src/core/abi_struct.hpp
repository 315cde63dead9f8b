// The caller's structs under the ABI's size rules (flatmem.h, "Conventions"):
// the library reads min(struct_size, sizeof) bytes of a struct it reads and
// refuses non-zero bytes past its own sizeof (a newer caller's field it does
// not know); it writes exactly the caller's size of a struct it fills (its
// fields, then zeros), never more. Every size is checked before anything is
// written, so a refused call leaves the caller's memory untouched.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/abi_layout.hpp"
#include "core/error.hpp"

namespace flatmem {

inline constexpr std::size_t max_struct_size = FLATMEM_MAX_STRUCT_SIZE;

// A size argument (or struct_size) names `what`; `minimum` is the least the
// struct needs (sizeof(size_t) for one that begins with struct_size).
inline void check_struct_size(std::size_t size, const char *what, std::size_t minimum = 1) {
  if (size < minimum || size > max_struct_size)
    invalid(what, ": ", size, "; expected sizeof the struct as the caller was compiled (",
            minimum, " .. FLATMEM_MAX_STRUCT_SIZE = ", max_struct_size, ")");
}

// Non-zero bytes of a caller's struct past the library's sizeof are fields of
// a newer header: refused, never silently ignored.
inline void check_unknown_tail(const void *given, std::size_t size, std::size_t known, const char *what) {
  const auto *bytes = static_cast<const unsigned char *>(given);
  for (std::size_t i = known; i < size; ++i)
    if (bytes[i] != 0)
      fail(FLATMEM_STATUS_UNSUPPORTED, what, ": byte ", i, " of the caller's ", size,
           "-byte struct is set, past the ", known, " bytes this libflatmem (", FLATMEM_VERSION_MAJOR, ".",
           FLATMEM_VERSION_MINOR, ".", FLATMEM_VERSION_PATCH,
           ") knows: a field of a newer flatmem.h; leave it 0 or load a newer libflatmem");
}

// The reserved fields of a struct just read (core/abi_layout.hpp; flatmem.h,
// "Reserved fields"): a caller no larger than this library's struct may have
// left them indeterminate (they were padding in ABI 1), so they are cleared;
// a larger caller was built with them named and must leave them 0.
template <typename Struct>
void clear_reserved(Struct &o, const void *given, std::size_t size, const char *what) {
  for (const ReservedField &field : Reserved<Struct>::fields) {
    std::int32_t value = 0;
    if (size > sizeof o) std::memcpy(&value, static_cast<const char *>(given) + field.offset, sizeof value);
    if (value != 0)
      fail(FLATMEM_STATUS_UNSUPPORTED, what, "->", field.name, " is ", value,
           ": a reserved field, 0 for a caller built against a newer flatmem.h (struct_size ", size,
           " > ", sizeof o, "); this libflatmem gives it no meaning");
    std::memset(reinterpret_cast<char *>(&o) + field.offset, 0, sizeof value);
  }
}

// Reads a struct that begins with size_t struct_size; `given` may be NULL
// (all defaults). `init_name` names the INIT macro / init function the message
// points to.
template <typename Struct>
Struct read_sized(const Struct *given, const char *what, const char *init_name) {
  Struct o{};
  if (given == nullptr) return o;
  const std::size_t size = given->struct_size;
  if (size < sizeof(std::size_t) || size > max_struct_size)
    invalid(what, ": struct_size is ", size, "; initialise with ", init_name);
  check_unknown_tail(given, size, sizeof o, what);
  std::memcpy(&o, given, std::min(size, sizeof o));
  clear_reserved(o, given, size, what);
  return o;
}

// Writes `value` as a struct of `size` bytes at `out`: min(size, sizeof)
// bytes of it, then zeros. The size must have been checked.
template <typename Struct>
void put_struct(void *out, std::size_t size, const Struct &value) {
  const std::size_t known = std::min(size, sizeof value);
  std::memcpy(out, &value, known);
  if (size > known) std::memset(static_cast<char *>(out) + known, 0, size - known);
}

// One output struct with its size argument `size_name` (the struct's pointer
// is checked by the caller or here: NULL is refused naming `what`). A struct
// that begins with struct_size (a schedule) needs at least that field: a
// smaller size could only receive a truncated struct_size.
template <typename Struct>
void write_struct(void *out, std::size_t size, const Struct &value, const char *what, const char *size_name) {
  if (out == nullptr) invalid(what, ": NULL");
  if constexpr (requires { value.struct_size; })
    check_struct_size(size, size_name, sizeof value.struct_size);
  else
    check_struct_size(size, size_name);
  put_struct(out, size, value);
}

// An init function: the defaults with struct_size = the caller's size.
template <typename Struct>
void init_struct(Struct *out, std::size_t size, Struct defaults, const char *what) {
  if (out == nullptr) invalid(what, ": NULL");
  check_struct_size(size, "struct_size", sizeof(std::size_t));
  defaults.struct_size = size;
  put_struct(out, size, defaults);
}

// An output array of structs of a caller-given element size, checked before
// the first element is written. `capacity` is the caller's count: an upper
// bound ("a large count for all that are kept" is fine), never more elements
// than the call returns are written.
template <typename Struct>
class StructArrayOut {
 public:
  StructArrayOut(void *base, std::size_t element_size, std::int64_t capacity, const char *what,
                 const char *size_name)
      : base_(static_cast<char *>(base)), element_size_(element_size) {
    if (capacity < 0) invalid("count: ", capacity, "; expected >= 0");
    check_struct_size(element_size, size_name);
    if (capacity > 0 && base == nullptr) invalid(what, ": NULL with count ", capacity);
  }
  void put(std::int64_t i, const Struct &value) const {
    put_struct(base_ + std::size_t(i) * element_size_, element_size_, value);
  }

 private:
  char *base_;
  std::size_t element_size_;
};

}  // namespace flatmem
