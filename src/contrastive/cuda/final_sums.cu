// The last, single-CTA step of forward and backward: the partial sums the
// CTAs of the previous kernel wrote (one per CTA or per row tile) are added in
// a fixed order (strided per thread, then a tree), never with atomics, so
// the scalar results are the same bits on every run.
//   loss = (sum of partials) / N                  N = 2b symmetric, b InfoNCE
//   ds   = g / N * (sum of partials)              partials: sum Gt_ij <q_i, k_j>
// and, for the ring, the bare sum (added to a running total across ring steps;
// the host scales it after summing it over the ranks).
#include "contrastive/cuda/kernels.hpp"

namespace flatmem::contrastive::cuda {
namespace {

constexpr int sum_threads = 256;

__device__ double ordered_sum(const double *partial, int count) {
  __shared__ double values[sum_threads];
  double v = 0.0;
  for (int i = threadIdx.x; i < count; i += sum_threads) v += partial[i];
  values[threadIdx.x] = v;
  __syncthreads();
  for (int half = sum_threads / 2; half > 0; half >>= 1) {
    if (int(threadIdx.x) < half) values[threadIdx.x] += values[threadIdx.x + half];
    __syncthreads();
  }
  return values[0];
}

__global__ void __launch_bounds__(sum_threads) loss_sum_kernel(LossSumParams p) {
  const double total = ordered_sum(p.partial, p.count);
  if (threadIdx.x == 0) *p.loss = float(total * p.inv_count);
}

__global__ void __launch_bounds__(sum_threads) ds_sum_kernel(DsSumParams p) {
  const double total = ordered_sum(p.partial, p.count);
  const double g = p.dloss ? double(*p.dloss) : 1.0;
  if (threadIdx.x == 0) *p.dscale = float(g * p.inv_n * total);
}

__global__ void __launch_bounds__(sum_threads)
    partial_sum_kernel(const double *partial, int count, double *total, bool accumulate) {
  const double sum = ordered_sum(partial, count);
  if (threadIdx.x == 0) *total = accumulate ? *total + sum : sum;
}

}  // namespace

cudaError_t launch_partial_sum(const double *partial, int count, double *total, bool accumulate,
                               cudaStream_t stream) {
  partial_sum_kernel<<<1, sum_threads, 0, stream>>>(partial, count, total, accumulate);
  return cudaGetLastError();
}

cudaError_t launch_loss_sum(const LossSumParams &p, cudaStream_t stream) {
  loss_sum_kernel<<<1, sum_threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_ds_sum(const DsSumParams &p, cudaStream_t stream) {
  ds_sum_kernel<<<1, sum_threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flatmem::contrastive::cuda
