#include "reversible/block_steps.hpp"

#include "reversible/callbacks.hpp"

namespace flatmem::reversible {
namespace {

CallSite site(const BlockCall &call, flatmem_reversible_part part, flatmem_reversible_phase phase) {
  CallSite s;
  s.block = call.index;
  s.part = part;
  s.phase = phase;
  s.seed = call.seed;
  s.offset = call.offset;
  return s;
}

}  // namespace

void point_residuals(BlockCall &call, char *slot, const ResidualPlan &plan) {
  call.residual_f = slot;
  call.residual_g = slot ? slot + plan.g_offset(std::size_t(call.index)) : nullptr;
}

void forward_block(Chain &chain, const BlockCall &call, flatmem_reversible_phase phase,
                   StatePair in, StatePair out) {
  const StateLayout &s = *call.state;
  call_forward(call.block->f, site(call, FLATMEM_REVERSIBLE_F, phase), &chain, s, in.b, out.a,
               call.residual_f);
  chain.add_into(s, in.a, out.a);
  call_forward(call.block->g, site(call, FLATMEM_REVERSIBLE_G, phase), &chain, s, out.a, out.b,
               call.residual_g);
  chain.add_into(s, in.b, out.b);
}

void rebuild_block(Chain &chain, const BlockCall &call, StatePair out, StatePair in) {
  const StateLayout &s = *call.state;
  const auto phase = FLATMEM_REVERSIBLE_PHASE_REBUILD;
  call_forward(call.block->g, site(call, FLATMEM_REVERSIBLE_G, phase), &chain, s, out.a, in.b,
               call.residual_g);
  chain.subtract_from(s, out.b, in.b);
  call_forward(call.block->f, site(call, FLATMEM_REVERSIBLE_F, phase), &chain, s, in.b, in.a,
               call.residual_f);
  chain.subtract_from(s, out.a, in.a);
}

void gradient_block(Chain &chain, const BlockCall &call, const char *y1, const char *x2,
                    StatePair gradients) {
  const StateLayout &s = *call.state;
  const auto phase = FLATMEM_REVERSIBLE_PHASE_GRADIENT;
  call_vjp(call.block->g, site(call, FLATMEM_REVERSIBLE_G, phase), &chain, s, y1,
           call.residual_g, gradients.b, gradients.a);
  call_vjp(call.block->f, site(call, FLATMEM_REVERSIBLE_F, phase), &chain, s, x2,
           call.residual_f, gradients.a, gradients.b);
}

}  // namespace flatmem::reversible
