// Calling a block's F or G: builds the flatmem_reversible_context, turns a
// failing status into an Error whose message names the block, the part and
// the phase ("block 3, G vjp (gradient): <the callback's message>").
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>

#include "reversible/state.hpp"

namespace flatmem::reversible {

class Chain;

// Who is being called, and why.
struct CallSite {
  std::int32_t block = 0;
  flatmem_reversible_part part = FLATMEM_REVERSIBLE_F;
  flatmem_reversible_phase phase = FLATMEM_REVERSIBLE_PHASE_FORWARD;
  std::uint64_t seed = 0;    // the call's seed; the block's is derived here
  std::uint64_t offset = 0;
};

// The seed block `block`, part `part` receives (flatmem_reversible_block_seed).
std::uint64_t block_seed(std::uint64_t seed, std::int32_t block, std::int32_t part);

// y = fn(x); residuals may be NULL.
void call_forward(const flatmem_reversible_function &fn, const CallSite &site, Chain *chain,
                  const StateLayout &s, const void *x, void *y, void *residuals);

// dx += J_fn(x)^T dy.
void call_vjp(const flatmem_reversible_function &fn, const CallSite &site, Chain *chain,
              const StateLayout &s, const void *x, const void *residuals, const void *dy, void *dx);

// Residual bytes of fn for states of layout s (0 when fn has no residual_size).
std::size_t call_residual_size(const flatmem_reversible_function &fn, std::int32_t block,
                               flatmem_reversible_part part, const StateLayout &s);

// The message a callback left with flatmem_reversible_callback_error().
void set_callback_message(const char *message);

}  // namespace flatmem::reversible
