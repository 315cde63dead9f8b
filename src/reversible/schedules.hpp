// The schedules of block steps (block_steps.hpp) for the segment forward and
// each backward mode, written once against Chain. Arguments are already
// checked (src/capi/reversible.cpp).
//
// Backward notation: S_k is the input state of block k; S_n = the segment
// output (Y1, Y2), the caller's, read only.
//   R_k reads S_{k+1}, writes S_k and block k's residuals;
//   B_k reads S_{k+1}.a (Y1), S_k.b (X2) and block k's residuals, and updates
//       the gradients in place.
// VANILLA runs R_{n-1}, B_{n-1}, R_{n-2}, B_{n-2}, ... on one chain, S_k in
// slot k mod 2 and one residual slot. OVERLAPPED runs the R chain and the B
// chain concurrently (cpu/overlapped.cpp: two threads; cuda/overlapped.cpp:
// two streams and events), S_k in slot k mod 3, block k's residuals in slot
// k mod 2; R_k waits for B_{k+2} (which last read both slots R_k overwrites),
// B_k waits for R_k.
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>

#include "reversible/block_steps.hpp"
#include "reversible/chain.hpp"
#include "reversible/segment.hpp"

namespace flatmem::reversible {

struct Randomness {
  std::uint64_t seed = 0, offset = 0;
};

// Inputs and outputs of a backward; x1/x2 may be null (not requested).
struct BackwardIo {
  const char *y1, *y2, *dy1, *dy2;
  char *dx1, *dx2, *x1, *x2;
};

std::size_t forward_workspace_bytes(const StateLayout &s);
// mode is STANDARD, VANILLA or OVERLAPPED.
std::size_t backward_workspace_bytes(const StateLayout &s, const ResidualPlan &r,
                                     flatmem_reversible_mode mode);

// Keeps nothing; y written at the end.
void forward(flatmem_reversible_t &h, Chain &chain, const StateLayout &s, const char *x1,
             const char *x2, Randomness rng, char *y1, char *y2, void *workspace);

// STANDARD: keeps every block's input and residuals in h.record.
void record_forward(flatmem_reversible_t &h, Chain &chain, const StateLayout &s,
                    const ResidualPlan &r, const char *x1, const char *x2, Randomness rng,
                    char *y1, char *y2);

// `chain` is the caller's (CPU: the handle's main chain; CUDA: the stream).
void backward(flatmem_reversible_t &h, Chain &chain, flatmem_reversible_mode mode,
              const StateLayout &s, const ResidualPlan &r, Randomness rng, const BackwardIo &io,
              void *workspace);

// --- pieces shared by the backward schedules of every backend -------------

BlockCall block_call(flatmem_reversible_t &h, std::int32_t k, const StateLayout &s,
                     Randomness rng);
// Gradients start as copies of (dY1, dY2), so that dx may alias dy and
// nothing the caller owns is written before the end.
void start_gradients(Chain &chain, const StateLayout &s, const BackwardIo &io, StatePair g);
// dx from the gradients, x from the rebuilt input (when requested).
void finish_backward(Chain &chain, const StateLayout &s, const BackwardIo &io, StatePair gradients,
                     StatePair input);

namespace cpu {
void run_overlapped(flatmem_reversible_t &h, const StateLayout &s, const ResidualPlan &r,
                    Randomness rng, const BackwardIo &io, const BackwardBuffers &b);
// errors[k] for k in [0, n): see flatmem_reversible_rebuild_error.
void rebuild_error(flatmem_reversible_t &h, const StateLayout &s, const ResidualPlan &r,
                   const char *x1, const char *x2, Randomness rng, double *errors);
}  // namespace cpu

namespace cuda {
// `caller` is the StreamChain of the caller's stream.
void run_overlapped(flatmem_reversible_t &h, Chain &caller, const StateLayout &s,
                    const ResidualPlan &r, Randomness rng, const BackwardIo &io,
                    const BackwardBuffers &b);
}  // namespace cuda

}  // namespace flatmem::reversible
