// The variants the contrastive benchmark times, each run alone in a fresh
// process (contrastive_bench --worker ...) so that its peak resident set can
// be measured by the parent:
//
//   inputs     allocates and fills q, k and touches dq, dk (b x d fp32 each),
//              nothing else: the baseline every other variant is compared to.
//   flatmem    inputs + flatmem_contrastive_forward + _backward (symmetric
//              loss, caller workspace from the size queries; logit cache of
//              VariantConfig::logit_cache_bytes). Reports the CPU ISA in use.
//   naive      inputs + the materialised loss: X = s Q K^T (b x b), row and
//              column log-sum-exp, G = (P + Q - 2I) / (2b) into a second b x b
//              matrix, dq = s G K, dk = s G^T Q. 3 GEMMs (6 b^2 d FLOPs),
//              element-wise passes threaded and vectorised. 2 b^2 fp32 extra.
//   gemm4      inputs + the four b x b x d GEMMs the fused design performs
//              (logits, logits again in backward, G K, G^T Q: 8 b^2 d FLOPs),
//              in column strips b x strip so that no b x b matrix exists.
//   tilegemm   inputs + the same four GEMMs cut into tile x tile blocks, one
//              single-threaded sgemm per call, the row tiles split over the
//              hardware threads: flatmem's GEMM work without its element-wise
//              passes (a diagnostic).
//
// The sigmoid (SigLIP) loss, L = -(1/b) sum_ij log sigmoid(z_ij (s <q_i, k_j>
// + t)), z = +1 on the diagonal, -1 elsewhere (flatmem.h):
//
//   sigmoid        inputs + flatmem_contrastive_sigmoid_value_and_grad (loss,
//                  dq, dk, ds, dt in one tile walk: 6 b^2 d FLOPs; caller
//                  workspace from the size query). Reports the CPU ISA.
//   sigmoid-naive  inputs + the materialised loss: X = s Q K^T (b x b), one
//                  threaded, vectorised element-wise pass giving the loss, ds,
//                  dt and G in place of X, dq = s G K, dk = s G^T Q. 3 GEMMs,
//                  b^2 fp32 extra.
//   gemm3          inputs + the three b x b x d GEMMs of the fused sigmoid
//                  (logits, G K, G^T Q: 6 b^2 d FLOPs) in column strips as
//                  gemm4: the floor of the sigmoid variants.
//
// dtype "bf16" (inputs, flatmem, sigmoid only; the BLAS variants are fp32):
// the fp32 features rounded to bf16 (round to nearest even), passed as
// kDLBfloat 16 tensors, dq and dk bf16 too (as a framework passes them). The
// process keeps the rounded values in fp32 beside them (inputs does the same,
// so that "extra memory" stays the call's own).
//
// The float64 references (untimed, for the loss error column), of the very
// inputs a row used (for bf16: the rounded values), the logits by dgemm in
// column strips (no b x b matrix), then the loss in double:
//
//   reference          the symmetric CLIP loss
//   sigmoid-reference  the sigmoid loss (bias VariantConfig::bias)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bench {

struct VariantConfig {
  std::string variant;
  std::int64_t b = 0, d = 0;
  float scale = 14.3f;
  float bias = -10.0f;     // sigmoid variants: logit bias t (SigLIP's initial value)
  double min_time = 10.0;  // keep timing until this many seconds were measured
  int max_reps = 10;
  std::int64_t strip = 2048;  // gemm4: column strip width
  std::int64_t tile = 512;    // tilegemm: tile extent
  std::uint64_t seed = 1;
  std::size_t logit_cache_bytes = 0;  // flatmem: options.logit_cache_bytes
  std::string dtype = "fp32";         // fp32 | bf16 (inputs, flatmem, sigmoid, the references)
  // flatmem, sigmoid: options.fp32_precision (0 default, 1 TF32, 2 FULL). On the CPU it matters for
  // bf16 at avx512bf16 only: TF32 rounds G to bf16 once (all four products at the bf16 rate).
  std::int64_t fp32_precision = 0;
};

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN); bf16 bits -> fp32.
std::uint16_t bf16_bits(float x);
float bf16_value(std::uint16_t bits);

// key = value pairs reported back to the driver (times in seconds, sizes in bytes).
using Report = std::vector<std::pair<std::string, double>>;

// Runs one variant; throws std::runtime_error with a message on failure.
Report run_variant(const VariantConfig &config);

// Bytes a variant needs beyond the inputs (q, k, dq, dk), known before running it.
double planned_extra_bytes(const std::string &variant, std::int64_t b, std::int64_t d,
                           std::int64_t strip);

// What the BLAS linked into the benchmark (not flatmem's own) reports:
// openblas_get_num_threads() and openblas_get_parallel() (0 sequential,
// 1 pthreads, 2 OpenMP); -1 when the BLAS is not OpenBLAS.
int blas_threads();
int blas_parallel();
std::string blas_config();

}  // namespace bench
