#include "contrastive/ring/relayed_dk.hpp"

#include <cstring>

namespace flatmem::contrastive::ring {

std::optional<Relayed> relayed_dk(float *fresh, float *const partial[2], std::int64_t d) {
  if (fresh == nullptr) return std::nullopt;
  const auto fold_in = [d](void *into, const void *mine, std::int64_t cols, bool first) {
    const std::int64_t count = cols * d;
    float *sum = static_cast<float *>(into);
    const float *add = static_cast<const float *>(mine);
    if (first) {
      std::memcpy(sum, add, std::size_t(count) * sizeof(float));
      return;
    }
    for (std::int64_t i = 0; i < count; ++i) sum[i] += add[i];  // ranks o .. r - 1, then this one
  };
  return Relayed{Message::dk_partial, fresh, {partial[0], partial[1]},
                 std::size_t(d) * sizeof(float), fold_in};
}

}  // namespace flatmem::contrastive::ring
