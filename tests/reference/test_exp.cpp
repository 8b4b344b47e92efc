// The reference's vectorized softmax exponentials against the C library's exp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "blocks.hpp"
#include "chunk_mass.hpp"
#include "tiles.hpp"

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

#ifdef HILS_FUSED_KERNELS
namespace {

// exp_nonpositive8 of 8 values, back as doubles.
std::array<double, 8> exp8(const std::array<double, 8>& x) {
  std::array<double, 8> out;
  _mm512_storeu_pd(out.data(), hils::detail::exp_nonpositive8(_mm512_loadu_pd(x.data())));
  return out;
}

}  // namespace

TEST_CASE("exp_nonpositive8 (the fused chunk log-mass's) is within 1 ulp of std::exp", "[exp]") {
  double worst = 0;
  std::array<double, 8> x;
  for (int64_t i = 0; i <= 2'000'000; i += 4) {
    // Lanes 0-3: the whole range; lanes 4-7: [-1, 0], where softmax weights near 1 live.
    for (int lane = 0; lane < 4; ++lane) {
      const double step = static_cast<double>(std::min<int64_t>(i + lane, 2'000'000));
      x[lane] = -708.0 * step / 2e6;
      x[lane + 4] = -1.0 * step / 2e6;
    }
    const auto got = exp8(x);
    for (int lane = 0; lane < 8; ++lane)
      worst = std::max(worst, ulps_apart(got[lane], std::exp(x[lane])));
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst <= 1.0);
}

TEST_CASE("exp_nonpositive8 is exact at 0, 0 below the normal range and at -inf, NaN for NaN",
          "[exp]") {
  const double inf = std::numeric_limits<double>::infinity();
  const auto got = exp8({0.0, -708.5, -1e300, -inf, std::numeric_limits<double>::quiet_NaN(),
                         -708.0, -1e-300, -0.0});
  CHECK(got[0] == 1.0);
  CHECK(got[1] == 0.0);
  CHECK(got[2] == 0.0);
  CHECK(got[3] == 0.0);
  CHECK(std::isnan(got[4]));
  CHECK(ulps_apart(got[5], std::exp(-708.0)) <= 1.0);
  CHECK(got[6] == 1.0);
  CHECK(got[7] == 1.0);
}
#endif
