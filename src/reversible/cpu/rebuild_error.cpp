// flatmem_reversible_rebuild_error: the forward keeping every true block
// input, then the rebuild chain from the output (each block rebuilt from the
// previous rebuild, exactly as in a backward), compared block by block.
#include <algorithm>
#include <cmath>
#include <limits>
#include <new>

#include "core/error.hpp"
#include "reversible/schedules.hpp"

namespace flatmem::reversible::cpu {
namespace {

template <typename T>
double relative_error(const StateLayout &s, StatePair truth, StatePair rebuilt) {
  double difference = 0, magnitude = 0;
  for (auto [t, r] : {std::pair{truth.a, rebuilt.a}, std::pair{truth.b, rebuilt.b}}) {
    const T *tv = reinterpret_cast<const T *>(t);
    const T *rv = reinterpret_cast<const T *>(r);
    for (std::int64_t i = 0; i < s.elements; ++i) {
      // NaN compares false everywhere: keep it visible.
      const double d = std::fabs(double(rv[i]) - double(tv[i]));
      difference = std::isnan(d) ? d : std::max(difference, d);
      magnitude = std::max(magnitude, std::fabs(double(tv[i])));
    }
  }
  return difference / std::max(magnitude, std::numeric_limits<double>::min());
}

}  // namespace

void rebuild_error(flatmem_reversible_t &h, const StateLayout &s, const ResidualPlan &r,
                   const char *x1, const char *x2, Randomness rng, double *errors) {
  const auto n = std::size_t(h.size());
  std::vector<StatePair> truth(n + 1);
  StatePair rebuilt[2];
  char *residuals = nullptr;
  auto carve = [&](WorkspaceCarver &w) {
    for (auto &state : truth) state = {w.take<char>(std::int64_t(s.bytes())), w.take<char>(std::int64_t(s.bytes()))};
    for (auto &state : rebuilt) state = {w.take<char>(std::int64_t(s.bytes())), w.take<char>(std::int64_t(s.bytes()))};
    residuals = w.take<char>(std::int64_t(r.slot_bytes));
  };
  WorkspaceCarver measure;
  carve(measure);
  Chain &chain = h.main_chain;
  const ChainBuffer memory = chain.allocate(measure.bytes(), "rebuild_error's states");
  WorkspaceCarver carver(memory.get());
  carve(carver);

  chain.copy(s, x1, truth[0].a);
  chain.copy(s, x2, truth[0].b);
  for (std::size_t k = 0; k < n; ++k) {
    const BlockCall call{&h.blocks[k], std::int32_t(k), &s, rng.seed, rng.offset};
    forward_block(chain, call, FLATMEM_REVERSIBLE_PHASE_FORWARD, truth[k], truth[k + 1]);
  }
  StatePair out = truth[n];
  for (std::int32_t k = std::int32_t(n) - 1; k >= 0; --k) {
    BlockCall call{&h.blocks[std::size_t(k)], k, &s, rng.seed, rng.offset};
    point_residuals(call, residuals, r);
    const StatePair in = rebuilt[k % 2];
    rebuild_block(chain, call, out, in);
    errors[k] = s.real == Real::f32 ? relative_error<float>(s, truth[std::size_t(k)], in)
                                    : relative_error<double>(s, truth[std::size_t(k)], in);
    out = in;
  }
}

}  // namespace flatmem::reversible::cpu
