#include "support/fuzz_checks.hpp"

#include <cmath>
#include <cstddef>
#include <string>

namespace flatmem_fuzz {

std::int32_t pick_int32(Reader &in, std::uint8_t choice, std::initializer_list<std::int32_t> table) {
  const std::size_t i = choice % (table.size() + 1);
  return i < table.size() ? table.begin()[i] : std::int32_t(in.hostile_int64());
}

flatmem_contrastive_options contrastive_options(Reader &in, const ContrastiveOptionBytes &p,
                                                std::initializer_list<std::int32_t> losses) {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.loss = static_cast<flatmem_contrastive_loss>(pick_int32(in, p.loss, losses));
  o.num_threads = pick_int32(in, p.threads, {1, 2, 0, -1, 257, 3});
  o.tile_rows = pick_int32(in, p.tile_rows, {0, 1, 2, 3, 7, -1, 4097});
  o.tile_cols = pick_int32(in, p.tile_cols, {0, 1, 2, 5, 8, -1, 4097});
  o.nonfinite = static_cast<flatmem_nonfinite_policy>(
      pick_int32(in, p.nonfinite, {FLATMEM_NONFINITE_ERROR, FLATMEM_NONFINITE_PROPAGATE}));
  o.fp32_precision = pick_int32(in, p.precision, {0, 1, 2});
  static constexpr std::size_t caches[] = {0, std::size_t(1) << 20, 64, 4};
  o.logit_cache_bytes = p.cache % 5 < 4 ? caches[p.cache % 5] : std::size_t(in.hostile_int64());
  o.struct_size = hostile_struct_size(p.struct_size, sizeof o);
  return o;
}

flatmem_contrastive_loss effective_loss(const flatmem_contrastive_options *o) {
  const bool has_loss = o != nullptr && o->struct_size >= offsetof(flatmem_contrastive_options, loss) + 4;
  const flatmem_contrastive_loss loss = has_loss ? o->loss : FLATMEM_CONTRASTIVE_DEFAULT;
  return loss == FLATMEM_CONTRASTIVE_DEFAULT ? FLATMEM_CONTRASTIVE_SYMMETRIC : loss;
}

float scale_value(Reader &in, std::uint8_t choice) {
  static constexpr float table[] = {1.0f, 10.0f, 100.0f, 0.0f, -1.0f, 1e-30f};
  const std::size_t i = choice % 9;
  if (i < 6) return table[i];
  if (i == 6) return std::nanf("");
  if (i == 7) return INFINITY;
  return float(static_cast<std::int8_t>(in.byte())) / 16.0f;
}

void expect_unwritten(const char *call, std::initializer_list<const FuzzTensor *> outputs) {
  for (const FuzzTensor *t : outputs)
    if (t != nullptr && t->written())
      violation(call, std::string("failed (") + flatmem_last_error() + ") but wrote an output");
}

void expect_finite(const char *call, const FuzzTensor &t, const char *name) {
  for (std::int64_t i = 0; i < t.elements(); ++i)
    if (!std::isfinite(t.f32_at(i)))
      violation(call, std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(t.f32_at(i)) +
                          " is not finite for finite inputs");
}

}  // namespace flatmem_fuzz
