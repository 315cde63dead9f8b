// A row-major C (m x n) = op(A) op(B) is the column-major C^T (n x m) =
// op(B)^T op(A)^T, and a row-major stored matrix is the column-major
// storage of its transpose: cuBLASLt gets B's buffer as its first operand and
// A's as its second, each with its row-major leading dimension and the same
// transpose flag, and C^T with ldc. The bias epilogue adds a vector over the
// rows of the column-major output, i.e. over the columns of row-major C.
#include "core/cuda/lt_matmul.hpp"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda/cublaslt_library.hpp"
#include "core/cuda/device.hpp"
#include "core/error.hpp"

namespace flatmem::cuda::lt {
namespace {

std::size_t element_bytes(Type t) { return t == Type::f32 ? 4 : 2; }

cudaDataType_t data_type(Type t) {
  switch (t) {
    case Type::bf16: return CUDA_R_16BF;
    case Type::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

const char *type_name(Type t) { return t == Type::bf16 ? "bf16" : t == Type::f16 ? "fp16" : "fp32"; }

// The largest power of two <= 16 dividing the address of every batch item.
std::uint32_t alignment_of(const void *p, std::int64_t batch_stride_bytes) {
  std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(p) | std::uintptr_t(batch_stride_bytes) | 16;
  return std::uint32_t(bits & (~bits + 1));
}

using Key = std::tuple<int, int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,
                       bool, std::uint32_t, std::uint32_t, std::uint32_t, std::size_t>;

// What a shape needs besides its pointers, built once: the operation and the
// three layouts (read-only from then on, so calls on other threads share
// them) and the algorithm. A call with a bias gets its own copy of the
// operation (the bias pointer is one of its attributes).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
};

struct Cache {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;  // per device, never destroyed (process lifetime)
  std::map<Key, Plan> plans;                // never destroyed either (one per shape and alignment)
};

Cache &cache() {
  static Cache *c = new Cache;  // leaked on purpose: outlives static destruction order
  return *c;
}

// RAII owners of the descriptors of one call.
struct Descriptors {
  const Api &api;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  explicit Descriptors(const Api &a) : api(a) {}
  Descriptors(const Descriptors &) = delete;
  Descriptors &operator=(const Descriptors &) = delete;
  // The operation and layouts, kept from here on by the caller (the cache).
  Plan release(const cublasLtMatmulAlgo_t &algorithm) {
    Plan plan{op, first, second, out, algorithm};
    op = nullptr;
    first = second = out = nullptr;
    return plan;
  }
  ~Descriptors() {
    if (preference) api.MatmulPreferenceDestroy(preference);
    if (out) api.MatrixLayoutDestroy(out);
    if (second) api.MatrixLayoutDestroy(second);
    if (first) api.MatrixLayoutDestroy(first);
    if (op) api.MatmulDescDestroy(op);
  }
};

// Column-major layout of a row-major stored matrix of `rows` x `cols` (as
// stored), batched.
cublasLtMatrixLayout_t layout(const Api &api, cudaDataType_t type, std::int64_t stored_rows,
                              std::int64_t stored_cols, std::int64_t ld, std::int64_t batch,
                              std::int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  // column-major: stored_cols rows of length stored_rows, leading dimension ld
  check(api.MatrixLayoutCreate(&l, type, std::uint64_t(stored_cols), std::uint64_t(stored_rows), ld),
        "matmul: layout");
  if (batch > 1) {
    const std::int32_t count = std::int32_t(batch);
    check(api.MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
          "matmul: batch count");
    check(api.MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                       sizeof batch_stride),
          "matmul: batch stride");
  }
  return l;
}

cublasLtHandle_t handle_for(Cache &c, int device) {
  auto it = c.handles.find(device);
  if (it != c.handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  check(api().Create(&h), "matmul: cublasLtCreate");
  c.handles.emplace(device, h);
  return h;
}

}  // namespace

namespace {

// The operation descriptor of a call: compute type, transposes and, with a
// bias, the epilogue and its pointer. Created into d.op.
void describe_operation(Descriptors &d, cublasComputeType_t compute, cublasOperation_t op_first,
                        cublasOperation_t op_second, const float *bias) {
  const Api &api = d.api;
  check(api.MatmulDescCreate(&d.op, compute, CUDA_R_32F), "matmul: descriptor");
  check(api.MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first),
        "matmul: transa");
  check(api.MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second),
        "matmul: transb");
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check(api.MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
          "matmul: epilogue");
    check(api.MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
          "matmul: bias");
  }
}

// cuBLASLt's first heuristic for d's descriptors under these alignments and
// workspace (with fixed_order: split-K in place or none, else any scheme when
// it has none of those).
cublasLtMatmulAlgo_t choose_algorithm(cublasLtHandle_t handle, Descriptors &d, const Context &context,
                                      const std::uint32_t (&alignment)[3], const Gemm &p) {
  const Api &api = d.api;
  check(api.MatmulPreferenceCreate(&d.preference), "matmul: preference");
  const std::uint64_t workspace = context.workspace_bytes;
  check(api.MatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof workspace),
        "matmul: workspace preference");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment[0]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment[1]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment[2]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment[2]}};
  for (const auto &[attribute, bytes] : alignments)
    check(api.MatmulPreferenceSetAttribute(d.preference, attribute, &bytes, sizeof bytes),
          "matmul: alignment preference");
  if (context.fixed_order) {
    const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_INPLACE;  // and NONE (no bit)
    check(api.MatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                           sizeof schemes),
          "matmul: reduction scheme preference");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found_count = 0;
  check(api.MatmulAlgoGetHeuristic(handle, d.op, d.first, d.second, d.out, d.out, d.preference, 1, &result,
                                   &found_count),
        "matmul: heuristic");
  if (found_count == 0 && context.fixed_order) {
    // No in-place / unsplit algorithm for this shape: cuBLASLt's others reduce split-K
    // partials in its own workspace, in a fixed order too (the algorithm is pinned here).
    const std::uint32_t any = CUBLASLT_REDUCTION_SCHEME_MASK;
    check(api.MatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &any,
                                           sizeof any),
          "matmul: reduction scheme preference");
    check(api.MatmulAlgoGetHeuristic(handle, d.op, d.first, d.second, d.out, d.out, d.preference, 1, &result,
                                     &found_count),
          "matmul: heuristic");
  }
  if (found_count == 0)
    fail(FLATMEM_STATUS_UNSUPPORTED, "matmul: cuBLASLt has no algorithm for ", p.m, " x ", p.n, " x ", p.k, " (",
         type_name(p.a.type), ", batch ", p.batch, ")");
  return result.algo;
}

}  // namespace

void matmul(const Context &context, const Gemm &p) {
  if (reinterpret_cast<std::uintptr_t>(context.workspace) % workspace_alignment != 0)
    fail(FLATMEM_STATUS_INTERNAL, "matmul: the cuBLASLt workspace at ", context.workspace, " is not ",
         workspace_alignment, "-byte aligned");
  if (p.a.type != p.b.type) fail(FLATMEM_STATUS_INTERNAL, "matmul: A and B of different element types");
  if (p.bias != nullptr && p.batch != 1) invalid("matmul: a bias needs batch 1");
  const Api &api = lt::api();
  const cudaDataType_t operand = data_type(p.a.type);
  const std::int64_t esize = std::int64_t(element_bytes(p.a.type));
  const cublasOperation_t op_first = p.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const bool tf32 = context.tf32 && p.a.type == Type::f32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const std::uint32_t alignment[3] = {
      alignment_of(p.b.data, p.b.batch_stride * esize), alignment_of(p.a.data, p.a.batch_stride * esize),
      alignment_of(p.c, p.c_batch_stride * 4) & (p.bias ? alignment_of(p.bias, 0) : 16u)};
  const Key key{context.device, int(p.a.type), tf32, context.fixed_order, p.m, p.n, p.k, p.batch,
                p.a.transposed, p.b.transposed, p.a.ld, p.b.ld, p.ldc, p.a.batch_stride, p.b.batch_stride,
                p.c_batch_stride, p.bias != nullptr, p.beta != 0.0f, alignment[0], alignment[1], alignment[2],
                context.workspace_bytes};

  DeviceGuard guard(context.device);
  Cache &c = cache();
  cublasLtHandle_t handle;
  const Plan *plan;  // a std::map node: stays where it is
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    handle = handle_for(c, context.device);
    auto found = c.plans.find(key);
    if (found == c.plans.end()) {
      Descriptors d(api);
      describe_operation(d, compute, op_first, op_second, p.bias);
      // Stored shapes (row-major): B is k x n (n x k transposed), A is m x k (k x m transposed).
      d.first = p.b.transposed ? layout(api, operand, p.n, p.k, p.b.ld, p.batch, p.b.batch_stride)
                               : layout(api, operand, p.k, p.n, p.b.ld, p.batch, p.b.batch_stride);
      d.second = p.a.transposed ? layout(api, operand, p.k, p.m, p.a.ld, p.batch, p.a.batch_stride)
                                : layout(api, operand, p.m, p.k, p.a.ld, p.batch, p.a.batch_stride);
      d.out = layout(api, CUDA_R_32F, p.m, p.n, p.ldc, p.batch, p.c_batch_stride);
      const cublasLtMatmulAlgo_t algorithm = choose_algorithm(handle, d, context, alignment, p);
      found = c.plans.emplace(key, d.release(algorithm)).first;
    }
    plan = &found->second;
  }
  // The cached operation carries the bias pointer of the call that built it: a call with a bias
  // describes its own.
  Descriptors with_bias(api);
  if (p.bias != nullptr) describe_operation(with_bias, compute, op_first, op_second, p.bias);
  const cublasLtMatmulDesc_t op = p.bias != nullptr ? with_bias.op : plan->op;
  const cublasStatus_t status =
      api.Matmul(handle, op, &p.alpha, p.b.data, plan->first, p.a.data, plan->second, &p.beta, p.c, plan->out, p.c,
                 plan->out, &plan->algorithm, context.workspace, context.workspace_bytes, context.stream);
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(FLATMEM_STATUS_INTERNAL, "matmul: cublasLtMatmul: cuBLASLt ", api.GetStatusString(status), " (",
         int(status), ") for ", p.m, " x ", p.n, " x ", p.k, " (", type_name(p.a.type), ", batch ", p.batch, ", A",
         p.a.transposed ? "^T" : "", " ld ", p.a.ld, ", B", p.b.transposed ? "^T" : "", " ld ", p.b.ld, ", ldc ",
         p.ldc, ", beta ", p.beta, p.bias ? ", bias" : "", tf32 ? ", TF32" : "", "; alignments ", alignment[0], "/",
         alignment[1], "/", alignment[2], " bytes)");
}

}  // namespace flatmem::cuda::lt
