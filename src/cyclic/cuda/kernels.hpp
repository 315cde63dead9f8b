// The element-wise kernels of the cyclic runtimes on the device (the
// data-parallel chains, the stage-parallel accumulators and headers): the
// partial-sum addition, the scaling to the average, the scan for non-finite
// elements, a header write. Each enqueues on `stream` (on the current device) and
// returns; a failed launch is INTERNAL naming `what`. The arithmetic is the
// host chains' (comm::add_into, kept.hpp's to_average), so both form the
// same bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace flatmem::cyclic::device {

// into[i] = into[i] + from[i], i < count; f64 picks double, else float.
void add(bool f64, void *into, const void *from, std::size_t count, cudaStream_t stream);
// data[i] = data[i] * factor, the factor 1/n rounded to the element type.
void scale_to_average(bool f64, void *data, std::size_t count, long long n, cudaStream_t stream);
// The 32 bytes of words[] to dst (device memory, 8-byte aligned): a header
// written in stream order without a host buffer to keep alive.
void write_words(void *dst, const unsigned long long (&words)[4], cudaStream_t stream);
// *first = min(*first, index of each non-finite element); the caller sets
// *first to ~0ull beforehand (device memory).
void first_nonfinite(bool f64, const void *data, std::size_t count, unsigned long long *first,
                     cudaStream_t stream);

}  // namespace flatmem::cyclic::device
