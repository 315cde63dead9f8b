// Test cases of the built-in reversible blocks (reversible.h, "Built-in
// blocks"), shared by the CPU tests (reversible/test_blocks.cpp) and the GPU
// tests (reversible/gpu/test_gpu_blocks.cpp):
//   - shapes (BlockConfig helpers), the options and parameter shapes they mean;
//   - HostBlock: a CPU block with random parameters in owning fp32 tensors,
//     its callbacks called directly with a context built here;
//   - the tolerance of an fp32 (or TF32) block result against the double
//     reference (support/transformer_reference.hpp) and the check itself.
#pragma once

#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/transformer_reference.hpp"

namespace flatmem_test {

using Floats = std::vector<float>;

// --- shapes and options ---------------------------------------------------------

BlockConfig attention(std::int64_t batch, std::int64_t tokens, std::int64_t width, std::int64_t heads);
/** hidden 0 = the option's default, 4 width (see resolved()). */
BlockConfig mlp(std::int64_t batch, std::int64_t tokens, std::int64_t width, std::int64_t hidden);
/** The MLP's hidden width after the option's default (0 = 4 width). */
BlockConfig resolved(BlockConfig c);
/** "attention batch 2 tokens 7 width 24 heads 3". */
std::string describe(const BlockConfig &c);
/** flatmem_block_options_init, then kind, width, heads / hidden, eps and math. */
flatmem_block_options block_options(const BlockConfig &c, flatmem_block_math math = FLATMEM_BLOCK_MATH_FP32);
std::vector<std::int64_t> parameter_shape(const BlockConfig &c, int i);
/** "qkv_weight", "fc1_bias", ...: the header's names, index i in 0..5. */
const char *parameter_name(BlockKind kind, int i);
/** (tokens, width) for batch 1 (the 2-D form), else (batch, tokens, width). */
std::vector<std::int64_t> state_shape(const BlockConfig &c);

/** Random parameter values (LN weight ~ 1, weights ~ 1/sqrt(fan_in), biases
 *  ~ 0.2), rounded to fp32, from one generator over the six in order. */
std::array<Floats, 6> random_parameters(const BlockConfig &c, std::uint64_t seed);
/** A random (rows, width) state, N(0, 1) per element; `offsets` adds one
 *  N(0, 4) offset per row (LayerNorm must remove it). */
Floats random_state(const BlockConfig &c, std::uint64_t seed, bool offsets);

// --- host memory --------------------------------------------------------------------

/** An fp32 DLTensor over `data` (compact, byte_offset 0); `shape` must
 *  outlive the tensor. */
DLTensor float_tensor(void *data, const std::vector<std::int64_t> &shape, DLDevice device);

/** An owning fp32 CPU tensor with its DLTensor. */
struct FloatTensor {
  Floats data;
  std::vector<std::int64_t> shape;
  DLTensor dl{};

  FloatTensor() = default;
  explicit FloatTensor(std::vector<std::int64_t> s, float fill = 0.0f);
  FloatTensor(std::vector<std::int64_t> s, Floats values);
  FloatTensor(const FloatTensor &o) : data(o.data), shape(o.shape), dl(o.dl) { refresh(); }
  FloatTensor &operator=(const FloatTensor &o);
  void refresh();
  Values values() const { return Values(data.begin(), data.end()); }
};

bool same_bits(const Floats &a, const Floats &b);
inline bool same_bits(const FloatTensor &a, const FloatTensor &b) { return same_bits(a.data, b.data); }

/** A residual buffer as the executor gives it: 64-byte aligned, filled with
 *  garbage so that nothing may rely on zeroed memory. */
struct AlignedBytes {
  explicit AlignedBytes(std::size_t n);
  void *data() { return base; }
  std::vector<unsigned char> storage;
  unsigned char *base;
};

/** A CPU context: struct_size, block 0, part F, the phase, num_threads and a
 *  parallel_for (serial for 1 thread, else std::threads claiming items). */
flatmem_reversible_context cpu_context(int threads, flatmem_reversible_phase phase);

// --- a CPU block with random parameters ------------------------------------------------

/** What one block computed: y = F(x), and dx and the six parameter gradients
 *  after a number of VJPs with the same dy into a zero dx and zero gradients. */
struct BlockResults {
  Floats y, dx;
  std::array<Floats, 6> grads;
};

/** Bitwise equality of every output; CHECKs each with `what` in the message. */
bool same_bits(const BlockResults &a, const BlockResults &b, const char *what);

struct HostBlock {
  BlockConfig config;
  flatmem_block_t *handle = nullptr;
  std::array<FloatTensor, 6> params, grads;  // grads start at zero
  flatmem_reversible_function fn{};

  explicit HostBlock(const BlockConfig &c, std::uint64_t seed = 1,
                     flatmem_block_math math = FLATMEM_BLOCK_MATH_FP32);
  ~HostBlock();
  HostBlock(const HostBlock &) = delete;
  HostBlock &operator=(const HostBlock &) = delete;

  void set_parameters(bool with_gradients);
  void zero_gradients();
  FloatTensor random_state(std::uint64_t seed, bool offsets) const;
  BlockParameterValues parameter_values() const;
  std::array<Floats, 6> gradient_values() const;

  std::size_t residual_bytes(const FloatTensor &x);
  /** y = F(x); residuals kept when `residuals` is given (sized here). */
  FloatTensor forward(const FloatTensor &x, int threads, std::unique_ptr<AlignedBytes> *residuals);
  void vjp(const FloatTensor &x, AlignedBytes &residuals, const FloatTensor &dy, FloatTensor &dx, int threads);
  /** Forward keeping residuals, then one VJP into a zero dx (the gradients
   *  accumulate onto what they hold). */
  BlockResults forward_and_vjp(const FloatTensor &x, const FloatTensor &dy, int threads);
};

// --- tolerances ------------------------------------------------------------------------
//
// FP32. Every output is a short chain of fp32 stages (LayerNorm sums over
// width, GEMMs over width / hidden / tokens / head_dim, softmax sums over
// tokens, a GELU within a few 1e-7), each summing at most K terms. An fp32 sum
// of K terms errs by gamma_K ~ K u in the worst case and by ~ sqrt(K) u in
// practice (rounding errors of random sign); the errors of the inputs of a
// stage carry into its output with factors of order one (LayerNorm's rstd
// rescales by the input's own spread, softmax is 1-Lipschitz, weights are
// ~ 1/sqrt(fan_in)). So an element is within  c u sqrt(K) max|output|  of the
// exact value, K the longest reduction feeding it: max(3 width, hidden,
// tokens) for y and dx, plus the rows summed for a parameter gradient. c = 16
// allows ~6 chained stages of ~sqrt(K) u each plus the polynomial exp (< 2 ulp)
// and GELU (< 5e-7 relative); the largest error observed on the CPU over the
// shapes of test_blocks.cpp is ~0.27 of the tolerance (FLATMEM_TEST_VERBOSE=1
// prints each ratio). The order of the sums does not enter the bound, so it
// holds for the GPU's cuBLASLt and our reductions alike. A real defect -- a
// missing term, a wrong scale, a dropped slab or head -- is an O(1) relative
// error, 10^3 times this tolerance at these sizes.
//
// TF32 (FLATMEM_BLOCK_MATH_TF32, CUDA): every GEMM input keeps a 10-bit
// mantissa. Rounded to nearest (unit roundoff 2^-11) each input errs by up to
// 2^-11 relative, rms 2^-11 / sqrt(3) ~ 2.8e-4, a product by ~4e-4 rms; over K
// terms of random sign that is ~4e-4 of the sum's own rms, independently of K
// (the fp32 accumulation adds the FP32 term above). Chained over up to 6 GEMM
// stages (the attention VJP: proj^T, dA V^T, P^T dA, dS K, dS^T Q, qkv^T) and
// measured against the tensor's largest magnitude, the worst element lands
// near 1-2e-3 of max|output|. Tensor cores may instead truncate (read only
// the top 10 mantissa bits): the error is then biased, up to 2^-10 per input,
// and adds up along the chain rather than in quadrature. Emulating both on the
// CPU (the double reference with every GEMM operand cut to TF32) over the
// shapes of test_gpu_blocks.cpp, the worst element is 1.3e-3 (y) and 2.0e-3
// (dx, parameter gradients) of max|output| when rounding, 5.1e-3 and 7.4e-3
// when truncating. The tolerance, on top of the FP32 term, is 24 * 2^-11 ~
// 1.2e-2 of max|output|: 1.6x the truncating worst case, 6x the rounding one,
// and still ~100x below an O(1) defect.
constexpr double fp32_unit_roundoff = 0x1p-24;
constexpr double tf32_unit_roundoff = 0x1p-11;
constexpr double fp32_tolerance_factor = 16.0;
constexpr double tf32_tolerance_factor = 24.0;

/** The longest reduction feeding y and dx: max(3 width, hidden, tokens). */
double forward_reduction(const BlockConfig &c);
/** Absolute tolerance for a block output whose reference has largest
 *  magnitude `scale` and whose longest reduction has K terms. */
double block_tolerance(double scale, double reduction_length, flatmem_block_math math);
/** CHECKs |got - want| <= tolerance for every element (NaN fails), reporting
 *  the worst element and the share of the tolerance it used; returns that
 *  share (FLATMEM_TEST_VERBOSE=1 prints it). */
double check_close(const std::string &what, const Floats &got, const Values &want, double tolerance);
/** The same with block_tolerance(max|want|, K, math). */
double check_close(const std::string &what, const Floats &got, const Values &want, double reduction_length,
                   flatmem_block_math math);

/** The double reference of block `c` (resolved) with parameters p at x, dy. */
struct BlockReference {
  Values y;
  BlockGradients gradients;
};
BlockReference block_reference(const BlockConfig &c, const BlockParameterValues &p, const Values &x,
                               const Values &dy);

/** Checks every output of `got` against the reference, its gradients taken
 *  `vjps` times. */
void check_block_results(const BlockConfig &c, const BlockReference &ref, const BlockResults &got, int vjps,
                         flatmem_block_math math);

/** Whether flatmem_last_error() contains `needle` (the message is shown when not). */
bool last_error_names(const char *needle);

}  // namespace flatmem_test
