#include "reversible/auto_mode.hpp"

#include <algorithm>

namespace flatmem::reversible {

AutoChooser::Entry &AutoChooser::entry(const StateLayout &s) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->layout == s) {
      std::rotate(it, it + 1, entries_.end());
      return entries_.back();
    }
  if (entries_.size() == 16) entries_.erase(entries_.begin());
  entries_.push_back(Entry{s});
  return entries_.back();
}

flatmem_reversible_mode AutoChooser::next(const StateLayout &s, std::int32_t num_blocks) {
  // One block leaves nothing to overlap.
  if (num_blocks < 2) return FLATMEM_REVERSIBLE_VANILLA;
  const Entry &e = entry(s);
  const std::int64_t phase = e.calls % round_length;
  if (phase < probes) return phase % 2 == 0 ? FLATMEM_REVERSIBLE_VANILLA : FLATMEM_REVERSIBLE_OVERLAPPED;
  return e.choice;
}

void AutoChooser::record(const StateLayout &s, flatmem_reversible_mode ran, double seconds) {
  Entry &e = entry(s);
  const std::int64_t phase = e.calls % round_length;
  if (phase < probes) {
    const int slot = ran == FLATMEM_REVERSIBLE_OVERLAPPED ? 1 : 0;
    e.best[slot] = phase < 2 ? seconds : std::min(e.best[slot], seconds);
    if (phase == probes - 1)
      e.choice = e.best[1] < margin * e.best[0] ? FLATMEM_REVERSIBLE_OVERLAPPED
                                                : FLATMEM_REVERSIBLE_VANILLA;
  }
  ++e.calls;
}

}  // namespace flatmem::reversible
