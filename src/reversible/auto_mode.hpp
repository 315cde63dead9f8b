// AUTO mode: per state shape, time VANILLA and OVERLAPPED backwards and keep
// running the faster. Both give bitwise the same values, so the choice only
// changes speed. Each round of 64 backwards of a shape starts with 4 probes
// (V, O, V, O); the faster best-of-two then runs the remaining 60, OVERLAPPED
// only when it beat VANILLA by more than 3% (VANILLA needs less memory, and a
// noisy probe should not lock in a slower mode for a whole round).
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <vector>

#include "reversible/state.hpp"

namespace flatmem::reversible {

class AutoChooser {
 public:
  static constexpr std::int64_t round_length = 64;
  static constexpr std::int64_t probes = 4;
  static constexpr double margin = 0.97;

  // The mode the next backward of this layout should run.
  flatmem_reversible_mode next(const StateLayout &s, std::int32_t num_blocks);
  // Reports how long that backward took.
  void record(const StateLayout &s, flatmem_reversible_mode ran, double seconds);

 private:
  struct Entry {
    StateLayout layout;
    std::int64_t calls = 0;
    double best[2] = {0, 0};  // VANILLA, OVERLAPPED in this round's probes
    flatmem_reversible_mode choice = FLATMEM_REVERSIBLE_VANILLA;
  };
  Entry &entry(const StateLayout &s);
  std::vector<Entry> entries_;  // most recent last; at most 16 shapes
};

}  // namespace flatmem::reversible
