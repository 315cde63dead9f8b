#include "reversible/segment.hpp"

#include <algorithm>

namespace flatmem::reversible {

int rebuild_threads(int num_threads) { return std::max(1, num_threads / 3); }
int gradient_threads(int num_threads) {
  return std::max(1, num_threads - rebuild_threads(num_threads));
}

}  // namespace flatmem::reversible

void flatmem_reversible_s::start_overlap_chains() {
  using namespace flatmem::reversible;
  if (rebuild_lane) return;
  rebuild_chain = std::make_unique<cpu::ThreadChain>(rebuild_threads(num_threads));
  gradient_chain = std::make_unique<cpu::ThreadChain>(gradient_threads(num_threads));
  rebuild_lane = std::make_unique<cpu::Lane>();
}
