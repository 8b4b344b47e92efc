// The reference's vectorized softmax exponential against the C library's exp.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "blocks.hpp"

using hils::detail::exp_nonpositive;

namespace {

// |got - want| in units of the last place of want (want > 0 and normal).
double ulps_apart(double got, double want) {
  return std::abs(got - want) / (std::nextafter(want, 2 * want) - want);
}

}  // namespace

TEST_CASE("exp_nonpositive is within 1 ulp of std::exp on [-708, 0]", "[exp]") {
  double worst = 0;
  // A dense grid over the whole range, and a finer one where softmax weights near 1 live.
  for (int64_t i = 0; i <= 2'000'000; ++i) {
    const double coarse = -708.0 * static_cast<double>(i) / 2e6;
    const double fine = -1.0 * static_cast<double>(i) / 2e6;
    worst = std::max(worst, ulps_apart(exp_nonpositive(coarse), std::exp(coarse)));
    worst = std::max(worst, ulps_apart(exp_nonpositive(fine), std::exp(fine)));
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst <= 1.0);
}

TEST_CASE("exp_nonpositive is exact at 0 and 0 below the normal range and at -inf", "[exp]") {
  CHECK(exp_nonpositive(0.0) == 1.0);
  CHECK(exp_nonpositive(-708.5) == 0.0);
  CHECK(exp_nonpositive(-1e300) == 0.0);
  CHECK(exp_nonpositive(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(std::isnan(exp_nonpositive(std::numeric_limits<double>::quiet_NaN())));
}
