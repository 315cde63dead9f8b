// VANILLA and STANDARD backward schedules (one chain), the dispatch to the
// backends' OVERLAPPED schedules, and the pieces they all share. See
// schedules.hpp for the notation.
#include "reversible/schedules.hpp"

namespace flatmem::reversible {
namespace {

int state_slots(flatmem_reversible_mode mode) {
  return mode == FLATMEM_REVERSIBLE_OVERLAPPED ? 3 : mode == FLATMEM_REVERSIBLE_VANILLA ? 2 : 0;
}
int residual_slots(flatmem_reversible_mode mode) {
  return mode == FLATMEM_REVERSIBLE_OVERLAPPED ? 2 : mode == FLATMEM_REVERSIBLE_VANILLA ? 1 : 0;
}

void run_vanilla(flatmem_reversible_t &h, Chain &chain, const StateLayout &s,
                 const ResidualPlan &r, Randomness rng, const BackwardIo &io,
                 const BackwardBuffers &b) {
  start_gradients(chain, s, io, b.gradients);
  StatePair out{const_cast<char *>(io.y1), const_cast<char *>(io.y2)};
  for (std::int32_t k = h.size() - 1; k >= 0; --k) {
    BlockCall call = block_call(h, k, s, rng);
    point_residuals(call, b.residuals[0], r);
    const StatePair in = b.states[std::size_t(k % 2)];
    rebuild_block(chain, call, out, in);
    gradient_block(chain, call, out.a, in.b, b.gradients);
    out = in;
  }
  finish_backward(chain, s, io, b.gradients, out);
}

void run_standard(flatmem_reversible_t &h, Chain &chain, const StateLayout &s, Randomness rng,
                  const BackwardIo &io, const BackwardBuffers &b) {
  Record &record = h.record;
  start_gradients(chain, s, io, b.gradients);
  for (std::int32_t k = h.size() - 1; k >= 0; --k) {
    BlockCall call = block_call(h, k, s, rng);
    point_residuals(call, record.residuals[std::size_t(k)], record.residual_plan);
    gradient_block(chain, call, record.states[std::size_t(k) + 1].a,
                   record.states[std::size_t(k)].b, b.gradients);
  }
  finish_backward(chain, s, io, b.gradients, record.states[0]);
}

}  // namespace

BlockCall block_call(flatmem_reversible_t &h, std::int32_t k, const StateLayout &s,
                     Randomness rng) {
  return BlockCall{&h.blocks[std::size_t(k)], k, &s, rng.seed, rng.offset};
}

void start_gradients(Chain &chain, const StateLayout &s, const BackwardIo &io, StatePair g) {
  chain.copy(s, io.dy1, g.a);
  chain.copy(s, io.dy2, g.b);
}

void finish_backward(Chain &chain, const StateLayout &s, const BackwardIo &io, StatePair gradients,
                     StatePair input) {
  chain.copy(s, gradients.a, io.dx1);
  chain.copy(s, gradients.b, io.dx2);
  if (io.x1 != nullptr) {
    chain.copy(s, input.a, io.x1);
    chain.copy(s, input.b, io.x2);
  }
}

std::size_t backward_workspace_bytes(const StateLayout &s, const ResidualPlan &r,
                                     flatmem_reversible_mode mode) {
  WorkspaceCarver measure;
  carve_backward(measure, s, r, state_slots(mode), residual_slots(mode));
  return measure.bytes();
}

void backward(flatmem_reversible_t &h, Chain &chain, flatmem_reversible_mode mode,
              const StateLayout &s, const ResidualPlan &r, Randomness rng, const BackwardIo &io,
              void *workspace) {
  WorkspaceCarver carver(workspace);
  const BackwardBuffers b = carve_backward(carver, s, r, state_slots(mode), residual_slots(mode));
  switch (mode) {
    case FLATMEM_REVERSIBLE_STANDARD: run_standard(h, chain, s, rng, io, b); break;
    case FLATMEM_REVERSIBLE_OVERLAPPED:
#if FLATMEM_HAVE_CUDA_BACKEND
      if (s.device.device_type == kDLCUDA) {
        cuda::run_overlapped(h, chain, s, r, rng, io, b);
        break;
      }
#endif
      cpu::run_overlapped(h, s, r, rng, io, b);
      break;
    default: run_vanilla(h, chain, s, r, rng, io, b); break;
  }
}

}  // namespace flatmem::reversible
