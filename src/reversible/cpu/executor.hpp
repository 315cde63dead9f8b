// The CPU executor: schedules of block steps (cpu/block_steps.hpp) for the
// segment forward and for each backward mode. Arguments are already checked
// (src/capi/reversible.cpp).
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>

#include "reversible/segment.hpp"

namespace flatmem::reversible::cpu {

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
void forward(flatmem_reversible_t &h, const StateLayout &s, const char *x1, const char *x2,
             Randomness rng, char *y1, char *y2, void *workspace);

// STANDARD: keeps every block's input and residuals in h.record.
void record_forward(flatmem_reversible_t &h, const StateLayout &s, const ResidualPlan &r,
                    const char *x1, const char *x2, Randomness rng, char *y1, char *y2);

void backward(flatmem_reversible_t &h, flatmem_reversible_mode mode, const StateLayout &s,
              const ResidualPlan &r, Randomness rng, const BackwardIo &io, void *workspace);

// errors[k] for k in [0, n): see flatmem_reversible_rebuild_error.
void rebuild_error(flatmem_reversible_t &h, const StateLayout &s, const ResidualPlan &r,
                   const char *x1, const char *x2, Randomness rng, double *errors);

}  // namespace flatmem::reversible::cpu
