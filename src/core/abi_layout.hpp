// Layout facts of the public structs (flatmem.h, "Conventions"): which fields
// are reserved (bytes that were padding in ABI 1), and, checked at compile
// time, that no struct ends in padding (its last field ends at sizeof).
// Padding between fields is refused by the ABI gate (scripts/abi_compare.py
// reads the DWARF of every public struct); this header is the compile-time
// half, so a field appended 4 bytes wide fails the build at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <flatmem/comm.h>
#include <flatmem/cyclic.h>
#include <flatmem/cyclic_stages.h>
#include <flatmem/flatmem.h>
#include <flatmem/reversible.h>

namespace flatmem {

// One reserved int32_t field of a struct the library reads.
struct ReservedField {
  const char *name;
  std::size_t offset;
};

// The reserved fields of a struct the library reads (none unless listed).
template <typename Struct>
struct Reserved {
  static constexpr std::array<ReservedField, 0> fields{};
};

#define FLATMEM_RESERVED_FIELD(Struct, member)                                         \
  ReservedField { #member, offsetof(Struct, member) }
#define FLATMEM_RESERVED(Struct, ...)                                                 \
  template <>                                                                         \
  struct Reserved<Struct> {                                                           \
    static constexpr std::array fields{__VA_ARGS__};                                  \
  }

FLATMEM_RESERVED(flatmem_contrastive_options,
                 FLATMEM_RESERVED_FIELD(flatmem_contrastive_options, reserved0));
FLATMEM_RESERVED(flatmem_cyclic_schedule, FLATMEM_RESERVED_FIELD(flatmem_cyclic_schedule, reserved0));
FLATMEM_RESERVED(flatmem_cyclic_options, FLATMEM_RESERVED_FIELD(flatmem_cyclic_options, reserved0),
                 FLATMEM_RESERVED_FIELD(flatmem_cyclic_options, reserved1),
                 FLATMEM_RESERVED_FIELD(flatmem_cyclic_options, reserved2),
                 FLATMEM_RESERVED_FIELD(flatmem_cyclic_options, reserved3),
                 FLATMEM_RESERVED_FIELD(flatmem_cyclic_options, reserved4));
FLATMEM_RESERVED(flatmem_cyclic_stages_schedule,
                 FLATMEM_RESERVED_FIELD(flatmem_cyclic_stages_schedule, reserved0));
FLATMEM_RESERVED(flatmem_cyclic_stages_options,
                 FLATMEM_RESERVED_FIELD(flatmem_cyclic_stages_options, reserved0),
                 FLATMEM_RESERVED_FIELD(flatmem_cyclic_stages_options, reserved1));

#undef FLATMEM_RESERVED
#undef FLATMEM_RESERVED_FIELD

// No public struct ends in padding: its last field ends at sizeof.
#define FLATMEM_ENDS_AT_SIZEOF(Struct, last)                                                   \
  static_assert(offsetof(Struct, last) + sizeof(static_cast<Struct *>(nullptr)->last) ==        \
                    sizeof(Struct),                                                             \
                #Struct " ends in padding after " #last ": append fields 8-byte aligned "       \
                "(flatmem.h, Conventions)")
FLATMEM_ENDS_AT_SIZEOF(flatmem_comm_unique_id, internal);
FLATMEM_ENDS_AT_SIZEOF(flatmem_comm_options, connect_timeout_ms);
FLATMEM_ENDS_AT_SIZEOF(flatmem_contrastive_options, logit_cache_bytes);
#ifdef FLATMEM_EXPERIMENTAL  // src/capi/contrastive.cpp
FLATMEM_ENDS_AT_SIZEOF(flatmem_contrastive_ring_stats, reserved0);
#endif
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_schedule, reserved0);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_action, phase);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_options, reserved4);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_time_step_stats, bytes_scheduled);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_summary, seconds);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_relay_time_step, relay_bytes_sent);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_relay_summary, relay_messages_sent);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_stages_schedule, reserved0);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_stages_action, actions_in_time_step);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_stages_occupancy, mean_activations_held);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_stages_options, reserved1);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_stages_time_step_stats, wait_seconds);
FLATMEM_ENDS_AT_SIZEOF(flatmem_cyclic_stages_summary, seconds);
FLATMEM_ENDS_AT_SIZEOF(flatmem_reversible_context, internal);
FLATMEM_ENDS_AT_SIZEOF(flatmem_reversible_function, user);
FLATMEM_ENDS_AT_SIZEOF(flatmem_reversible_block, g);
FLATMEM_ENDS_AT_SIZEOF(flatmem_reversible_options, num_threads);
FLATMEM_ENDS_AT_SIZEOF(flatmem_block_options, math);
#undef FLATMEM_ENDS_AT_SIZEOF

}  // namespace flatmem
