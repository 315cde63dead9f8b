// Element-wise comparison of a library output with reference values and
// per-element tolerances, reporting the worst offender through doctest.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "support/tensor.hpp"

namespace flatmem_test {

/** CHECKs |got - want| <= tol for every element (NaN fails). On failure the
 *  message gives the count, the worst element (by |got - want| / tol) and the
 *  largest ratio. Returns whether all elements passed. */
inline bool check_close(const std::string &what, const HostTensor &got, const std::vector<double> &want,
                        const std::vector<double> &tol) {
  REQUIRE(std::size_t(got.elements()) == want.size());
  REQUIRE(want.size() == tol.size());
  std::size_t failures = 0, worst = 0;
  double worst_ratio = 0.0, max_ratio = 0.0;
  for (std::size_t n = 0; n < want.size(); ++n) {
    const std::int64_t r = std::int64_t(n) / got.cols(), c = std::int64_t(n) % got.cols();
    const double diff = std::fabs(got.get(r, c) - want[n]);
    const double ratio = tol[n] > 0.0 ? diff / tol[n] : (diff == 0.0 ? 0.0 : INFINITY);
    const bool ok = diff <= tol[n];  // false for NaN
    if (!ok) ++failures;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = n;  // NaN ratio becomes the worst
    if (ratio > max_ratio) max_ratio = ratio;
  }
  std::ostringstream text;
  text.precision(9);
  if (!want.empty()) {
    const std::int64_t r = std::int64_t(worst) / got.cols(), c = std::int64_t(worst) % got.cols();
    text << what << ": " << failures << " of " << want.size() << " elements outside tolerance; worst ("
         << r << ", " << c << "): got " << got.get(r, c) << ", reference " << want[worst] << ", tolerance "
         << tol[worst] << " (error / tolerance = " << worst_ratio << ")";
  }
  CHECK_MESSAGE(failures == 0, text.str());
  // FLATMEM_TEST_VERBOSE=1 shows how much of each tolerance was used.
  if (std::getenv("FLATMEM_TEST_VERBOSE") != nullptr) MESSAGE(what, ": largest error / tolerance = ", max_ratio);
  return failures == 0;
}

inline bool check_close(const std::string &what, const HostTensor &got, double want, double tol) {
  return check_close(what, got, std::vector<double>{want}, std::vector<double>{tol});
}

}  // namespace flatmem_test
