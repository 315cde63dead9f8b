#include "reversible/blocks/options.hpp"

#include <climits>
#include <cmath>

#include "core/error.hpp"
#include "core/options.hpp"

namespace flatmem::blocks {
namespace {

// The largest width: 4 * width (the default hidden) and 3 * width (the qkv
// columns) must stay BLAS-sized (32-bit) extents.
constexpr std::int64_t max_width = INT_MAX / 4;

}  // namespace

BlockOptions resolve_block_options(const flatmem_block_options *given) {
  if (given == nullptr)
    invalid("options: NULL; kind and width are required (initialise with "
            "FLATMEM_BLOCK_OPTIONS_INIT or flatmem_block_options_init, then set them)");
  const flatmem_block_options o =
      read_options(given, "FLATMEM_BLOCK_OPTIONS_INIT or flatmem_block_options_init");
  BlockOptions r;
  const std::int32_t kind = enum_value(o.kind);
  if (kind != FLATMEM_BLOCK_ATTENTION && kind != FLATMEM_BLOCK_MLP)
    invalid("options.kind: ", kind, " is not a flatmem_block_kind; expected FLATMEM_BLOCK_ATTENTION (",
            int(FLATMEM_BLOCK_ATTENTION), ") or FLATMEM_BLOCK_MLP (", int(FLATMEM_BLOCK_MLP), ")");
  r.kind = Kind(kind);
  if (o.width < 1 || o.width > max_width)
    invalid("options.width: ", o.width, "; expected 1 to ", max_width, " (required)");
  r.width = o.width;
  if (r.kind == Kind::attention) {
    if (o.heads < 0) invalid("options.heads: ", o.heads, "; expected 0 (one head) or more");
    r.heads = o.heads == 0 ? 1 : o.heads;
    if (r.width % r.heads != 0)
      invalid("options.heads: ", r.heads, " does not divide options.width = ", r.width,
              " (each head takes width / heads columns)");
  } else {
    if (o.hidden < 0) invalid("options.hidden: ", o.hidden, "; expected 0 (4 * width) or more");
    r.hidden = o.hidden == 0 ? 4 * r.width : o.hidden;  // <= INT_MAX by max_width
  }
  if (!std::isfinite(o.layer_norm_eps) || o.layer_norm_eps < 0.0f)
    invalid("options.layer_norm_eps: ", o.layer_norm_eps, "; expected a finite value >= 0 (0 = 1e-6)");
  r.eps = o.layer_norm_eps == 0.0f ? 1e-6f : o.layer_norm_eps;
  const std::int32_t math = enum_value(o.math);
  if (math != FLATMEM_BLOCK_MATH_FP32 && math != FLATMEM_BLOCK_MATH_TF32)
    invalid("options.math: ", math, " is not a flatmem_block_math; expected FLATMEM_BLOCK_MATH_FP32 (",
            int(FLATMEM_BLOCK_MATH_FP32), ") or FLATMEM_BLOCK_MATH_TF32 (", int(FLATMEM_BLOCK_MATH_TF32), ")");
  r.tf32 = math == FLATMEM_BLOCK_MATH_TF32;
  return r;
}

std::array<ParameterShape, num_parameters> parameter_shapes(const BlockOptions &o) {
  const std::int64_t w = o.width;
  if (o.kind == Kind::attention)
    return {{{"ln_weight", w, 0},
             {"ln_bias", w, 0},
             {"qkv_weight", w, 3 * w},
             {"qkv_bias", 3 * w, 0},
             {"proj_weight", w, w},
             {"proj_bias", w, 0}}};
  return {{{"ln_weight", w, 0},
           {"ln_bias", w, 0},
           {"fc1_weight", w, o.hidden},
           {"fc1_bias", o.hidden, 0},
           {"fc2_weight", o.hidden, w},
           {"fc2_bias", w, 0}}};
}

}  // namespace flatmem::blocks
