// Tags of the stage-parallel handle's messages (comm::Space::cyclic, 40 bits):
//
//   bits 39..36  handle id (comm.next_sequence() at create, as flatmem_cyclic_t's)
//   bits 35..33  0b101: kind "token" (2) of src/cyclic/tags.hpp with bit 33 set,
//                which no data-parallel tag has (its tokens carry zeros below
//                bit 34): the two handle kinds never match each other's messages
//   bit  32      0: an activation (stage j -> j+1), 1: its gradient (j+1 -> j)
//   bits 31..16  micro-batch (N <= 65535)
//   bits 15..0   step mod 65536
//
// Every message of a stream (one neighbour, one direction) has its own tag,
// so a disagreement between ranks is a receive that times out, never a
// tensor of another micro-batch.
#pragma once

#include <cstdint>

namespace flatmem::cyclic::stages {

enum class Boundary : std::uint64_t { activation = 0, gradient = 1 };

constexpr std::uint64_t boundary_tag(std::uint32_t id, Boundary kind, std::int32_t micro_batch,
                                     std::int64_t step) {
  return (std::uint64_t(id & 0xf) << 36) | (std::uint64_t(0b101) << 33) | (std::uint64_t(kind) << 32) |
         (std::uint64_t(micro_batch & 0xffff) << 16) | std::uint64_t(step & 0xffff);
}

}  // namespace flatmem::cyclic::stages
