// main() of the GPU test executables: doctest as usual when a CUDA device
// exists; without one every run prints "skipped: no CUDA device" and exits
// with skip_return_code, which tests/CMakeLists.txt registers as the tests'
// SKIP_RETURN_CODE, so ctest reports them as skipped (not passed, not failed).
// Listing the test cases (ctest's discovery at build time) works either way.
// "--probe-device" only answers the question (0: a device, 77: none).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include "support/gpu.hpp"

namespace {

bool lists_only(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    if (std::strstr(arg, "list") != nullptr) return true;  // --list-test-cases, -dt-list-...
    for (const char *flag : {"-ltc", "-lts", "-lr", "-h", "--help", "-v", "--version", "-c", "--count"})
      if (std::strcmp(arg, flag) == 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char **argv) {
  const bool probe = argc == 2 && std::strcmp(argv[1], "--probe-device") == 0;
  if (probe || !lists_only(argc, argv)) {
    if (!flatmem_test::cuda_device_available()) {
      std::printf("skipped: no CUDA device\n");
      return flatmem_test::skip_return_code;
    }
    if (probe) return 0;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
