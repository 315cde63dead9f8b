// The partial dk as the schedule's relayed item on the CPU (the softmax
// backward ring and the sigmoid ring): fp32, ld d, summed in ring order.
#pragma once

#include <cstdint>
#include <optional>

#include "contrastive/ring/schedule.hpp"

namespace flatmem::contrastive::ring {

// fresh: (max_cols x d) fp32, written by the step; partial[0..1]: two such
// blocks in transit. nullopt when dk is not requested (fresh == nullptr).
std::optional<Relayed> relayed_dk(float *fresh, float *const partial[2], std::int64_t d);

}  // namespace flatmem::contrastive::ring
