// Saturated contrastive inputs and the bound they are held to.
//
// At s = 100 with k = q (pairs aligned) and every other pair's cosine about
// 0.5 lower, each positive logit exceeds every other logit of its row and
// column by tens: the exact loss is ~1e-13 or far less, its gradients of
// the same order. A materialised fp32 loss returns 0 and gradients within
// about that of exact (lse rounds to the positive logit itself, P_ii to 1,
// G_ii to 0). The general bounds of support/tolerance.hpp are far looser here
// (their unit is u |g| / N per term, ~1e-7 / b): a tiled kernel whose lse
// carries a few ulp of the positive logit passes them with loss ~1e-6. The
// saturation bound asks what the fp32 loss gives: every output within twice
// the largest exact magnitude of that output (0 is acceptable, 1e-7 is not),
// plus 1e-14 for the double reference's own rounding at x ~ 100.
#pragma once

#include <cstdint>
#include <vector>

#include "support/random.hpp"
#include "support/tensor.hpp"

namespace flatmem_test {

/** Unit rows q_i = (a u + r_i) / |a u + r_i| with one shared random unit
 *  direction u and random unit r_i, a^2 = cos / (1 - cos): pairwise cosines
 *  about `cos` (spread ~ 1 / sqrt(d)). Then k = q gives saturated pairs at
 *  s = 100 for cos <= 0.5 and d >= 128. */
void fill_saturated(HostTensor &q, Random &rng, double cos);

/** The saturation bound for every element of `want`: 2 max |want| + 1e-14. */
std::vector<double> saturation_tolerance(const std::vector<double> &want);

}  // namespace flatmem_test
