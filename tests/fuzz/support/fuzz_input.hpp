// The fuzz targets' view of their input: a front-to-back byte reader (a byte past the
// end reads as 0, so a short input means "the ordinary choice" everywhere), hostile
// integer values, and the checks every target makes after a call.
//
// Layout convention shared by every target: the input starts with a fixed "plan" (one
// byte per decision, 0 = the ordinary, valid choice), then a list of mutations applied to
// the call's tensors and options (see fuzz_tensor.hpp), then element values. Seed files in
// tests/fuzz/corpus/<target>/ are written in that layout (tests/fuzz/make_seeds.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <flatmem/flatmem.h>

namespace flatmem_fuzz {

class Reader {
 public:
  Reader(const std::uint8_t *data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }

  template <class T>
  T raw() {
    unsigned char bytes[sizeof(T)] = {};
    for (auto &b : bytes) b = byte();
    T value;
    std::memcpy(&value, bytes, sizeof value);
    return value;
  }

  // An int64 that is usually a value callers get wrong (0, -1, 2^31, 2^63 - 1, ...), or
  // raw bytes: selector byte, then (for raw) 8 bytes.
  std::int64_t hostile_int64();

  // A small index in [0, n) (n >= 1).
  std::size_t pick(std::size_t n) { return byte() % n; }

  bool exhausted() const { return pos_ >= size_; }
  std::size_t remaining() const { return pos_ < size_ ? size_ - pos_ : 0; }

 private:
  const std::uint8_t *data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The plan: `Plan` is a struct of uint8_t fields read in one go from the front.
template <class Plan>
Plan read_plan(Reader &in) {
  Plan plan;
  auto *bytes = reinterpret_cast<std::uint8_t *>(&plan);
  for (std::size_t i = 0; i < sizeof plan; ++i) bytes[i] = in.byte();
  return plan;
}

// Aborts the process (a libFuzzer crash) with a message naming the call and why.
[[noreturn]] void violation(const char *call, const std::string &what);

// After any call: a failure must come with a message in flatmem_last_error and a known
// status; success must leave the message empty. Returns whether the call succeeded.
bool check_status(flatmem_status status, const char *call);

// An options struct as a hostile caller fills it: the library must read only
// min(struct_size, sizeof) of it. `choice` 0 keeps sizeof(T); other values give 0 or a
// smaller size (fields past it must read as defaults). A larger one (a newer caller) makes
// the library read the bytes past the struct, so it is fuzz_abi's, over a roomy block.
std::size_t hostile_struct_size(std::uint8_t choice, std::size_t size);

// Whether FLATMEM_FUZZ_BREAK_ORACLE=1 is set: the targets' oracles then expect a wrong
// answer on purpose (a check that the oracles run and can fail: the seed corpus must then
// crash; scripts/fuzz.sh documents it).
bool break_oracle();

// Every flatmem_status this version knows.
bool known_status(flatmem_status status);

}  // namespace flatmem_fuzz
