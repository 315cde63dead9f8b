// Peak resident memory of this process, measured by the kernel: reset the
// high-water mark to the current RSS (/proc/self/clear_refs, "5"), run
// something, then read VmHWM. Linux >= 4.0.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace flatmem_test {

// kB of a /proc/self/status field ("VmHWM", "VmRSS"); -1 if unreadable.
inline std::int64_t status_kb(const char *field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream s(line.substr(key.size()));
      std::int64_t kb = -1;
      s >> kb;
      return kb;
    }
  return -1;
}

// Resets VmHWM to the current RSS; false if the kernel refuses.
inline bool reset_peak_memory() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return bool(out);
}

// Bytes the process peaked above its RSS at the reset.
template <typename Body>
std::int64_t peak_bytes_during(Body &&body) {
  reset_peak_memory();
  const std::int64_t before = status_kb("VmRSS");
  body();
  return (status_kb("VmHWM") - before) * 1024;
}

}  // namespace flatmem_test
