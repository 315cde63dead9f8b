// Tags of the cyclic runtime's messages (comm::Space::cyclic, 40 bits):
//
//   bits 39..36  handle id (an earlier handle's stray message never matches)
//   bits 35..34  kind: partial sum, average, start token, SYNC all-reduce
//   bits 33..28  step mod 64
//   bits 27..21  stage mod 128
//   bits 20..0   ring step of a SYNC all-reduce (0 otherwise)
//
// The ZeRO relay (never beside SYNC: a relayed handle refuses it) reuses the
// all-reduce kind with bit 20 set and its own kind in bits 19..16.
//
// Messages match by order (each thread talks to one neighbour in a fixed
// order); the step and stage bits make a disagreement between ranks a
// mismatch that times out, never a silently wrong sum.
#pragma once

#include <cstdint>

namespace flatmem::cyclic {

enum class Link : std::uint64_t { partial = 0, average = 1, token = 2, all_reduce = 3 };

constexpr std::uint64_t link_tag(std::uint32_t id, Link kind, std::int64_t step, std::int32_t stage) {
  return (std::uint64_t(id & 0xf) << 36) | (std::uint64_t(kind) << 34) |
         (std::uint64_t(step & 0x3f) << 28) | (std::uint64_t(stage & 0x7f) << 21);
}

// Full stages r-1 -> r (forward / backward relay), shards owner -> rank 0
// (for rank 0's forward / backward gather), average shards N-1 -> owner.
enum class RelayLink : std::uint64_t { forward = 0, backward = 1, shard_forward = 2, shard_backward = 3, gradient = 4 };

constexpr std::uint64_t relay_tag(std::uint32_t id, RelayLink kind, std::int64_t step, std::int32_t stage) {
  return link_tag(id, Link::all_reduce, step, stage) | (std::uint64_t(1) << 20) | (std::uint64_t(kind) << 16);
}

}  // namespace flatmem::cyclic
