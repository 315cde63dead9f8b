#include "support/fuzz_input.hpp"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace flatmem_fuzz {

std::int64_t Reader::hostile_int64() {
  static constexpr std::int64_t table[] = {
      0, 1, -1, 2, 3, 7, 8, 16, 63, 64, 65, 255, 256, 4096, 4097, 65535, 65536,
      std::int64_t(1) << 31, (std::int64_t(1) << 31) - 1, std::int64_t(1) << 32,
      (std::int64_t(1) << 32) + 1, std::int64_t(1) << 40, std::int64_t(1) << 61,
      std::int64_t(1) << 62, std::numeric_limits<std::int64_t>::max(),
      std::numeric_limits<std::int64_t>::min(), -(std::int64_t(1) << 31), -2, -4096};
  constexpr std::size_t n = sizeof table / sizeof table[0];
  const std::uint8_t selector = byte();
  if (selector < n) return table[selector];
  if (selector < 128) return selector - n;  // small non-negative values
  return raw<std::int64_t>();
}

void violation(const char *call, const std::string &what) {
  std::fprintf(stderr, "\nflatmem fuzz: contract violated by %s: %s\n", call, what.c_str());
  std::fflush(stderr);
  std::abort();
}

bool break_oracle() {
  static const bool broken = [] {
    const char *v = std::getenv("FLATMEM_FUZZ_BREAK_ORACLE");
    return v != nullptr && std::string(v) == "1";
  }();
  return broken;
}

bool known_status(flatmem_status status) {
  return status >= FLATMEM_STATUS_SUCCESS && status <= FLATMEM_STATUS_COMM_POISONED;
}

bool check_status(flatmem_status status, const char *call) {
  const char *message = flatmem_last_error();
  if (message == nullptr) violation(call, "flatmem_last_error() returned NULL");
  if (!known_status(status)) violation(call, "unknown status " + std::to_string(int(status)));
  if (status == FLATMEM_STATUS_INTERNAL)
    violation(call, std::string("FLATMEM_STATUS_INTERNAL (a bug by the header's definition): ") + message);
  if (status != FLATMEM_STATUS_SUCCESS && *message == '\0')
    violation(call, std::string("failed with ") + flatmem_status_string(status) +
                        " but flatmem_last_error() is empty");
  if (status == FLATMEM_STATUS_SUCCESS && *message != '\0')
    violation(call, std::string("succeeded but flatmem_last_error() still says: ") + message);
  return status == FLATMEM_STATUS_SUCCESS;
}

std::size_t hostile_struct_size(std::uint8_t choice, std::size_t size) {
  switch (choice % 8) {
    case 0: case 1: case 2: case 3: return size;
    case 4: return 0;
    case 5: return sizeof(std::size_t);            // only struct_size itself
    case 6: return size > 8 ? size - 8 : size;     // an older caller: the last field missing
    default: return size;  // a newer caller's larger struct needs the bytes after it: fuzz_abi
  }
}

}  // namespace flatmem_fuzz
