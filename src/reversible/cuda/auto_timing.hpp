// AUTO on CUDA: the same chooser as on the CPU (auto_mode.hpp), timed without
// a host wait. A timed backward is bracketed by two events on the caller's
// stream; a later backward reads them once the device has passed the second
// (cudaEventQuery) and reports the time to the chooser. While a measurement
// is still in flight, backwards run the chooser's current mode untimed (the
// chooser counts timed backwards only, so a probe is simply repeated).
#pragma once

#include <cuda_runtime_api.h>

#include "reversible/segment.hpp"

namespace flatmem::reversible::cuda {

// Collects a finished measurement, then returns the mode this backward runs;
// `timed` says whether auto_backward_end must be called after enqueuing it.
flatmem_reversible_mode auto_backward_begin(flatmem_reversible_t &h, const StateLayout &s, cudaStream_t stream,
                                            bool &timed);

// Records the end event of a timed backward.
void auto_backward_end(flatmem_reversible_t &h, const StateLayout &s, flatmem_reversible_mode ran,
                       cudaStream_t stream);

}  // namespace flatmem::reversible::cuda
