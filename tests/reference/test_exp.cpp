// The reference's vectorized softmax exponentials against the C library's exp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "blocks.hpp"
#include "hils/attention.hpp"
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

TEST_CASE("exp_nonpositive gives the same bits in a vector loop as one value at a time", "[exp]") {
  // The softmax loops run it over arrays (vectorized since it has no branch); each lane must be
  // the scalar call's value, 0 below the range and NaN for NaN included.
  std::vector<double> x;
  for (int64_t i = 0; i <= 100'000; ++i) x.push_back(-720.0 * static_cast<double>(i) / 1e5);
  x.push_back(-std::numeric_limits<double>::infinity());
  x.push_back(std::numeric_limits<double>::quiet_NaN());
  x.push_back(-0.0);
  std::vector<double> looped(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) looped[i] = exp_nonpositive(x[i]);
  int64_t differing = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    volatile double one = x[i];  // a separate scalar call, not part of the loop above
    const double alone = exp_nonpositive(static_cast<double>(one));
    differing += std::memcmp(&alone, &looped[i], sizeof alone) != 0;
  }
  CHECK(differing == 0);
}

namespace {

// One query attends 200 keys (one key block) with logits k_j (d = 1, q = 1, scale 1: every
// logit exact), the largest first, so lse = log(sum_j exp(k_j)) with the sum taken in key
// order. Summed 4 or 8 lanes at a time it differs in the last bits (required first): the
// order is part of the reference's bits, which its vectorized loops keep.
template <class Scalar>
void check_key_order_sum() {
  const int64_t T = 200;
  hils::Matrix<Scalar> q = hils::Matrix<Scalar>::Ones(T, 1), k(T, 1);
  const hils::Matrix<Scalar> v = hils::Matrix<Scalar>::Ones(T, 1);
  uint64_t state = 12345;
  for (int64_t j = 0; j < T; ++j) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    k(j, 0) = j == 0 ? Scalar(0) : static_cast<Scalar>(-30.0 * static_cast<double>(state >> 11) / 9007199254740992.0);
  }
  Scalar in_order = 0;
  std::array<Scalar, 8> lanes8{};
  std::array<Scalar, 4> lanes4{};
  for (int64_t j = 0; j < T; ++j) {
    const Scalar p = exp_nonpositive(k(j, 0));
    in_order += p;
    lanes8[static_cast<size_t>(j % 8)] += p;
    lanes4[static_cast<size_t>(j % 4)] += p;
  }
  Scalar by8 = 0, by4 = 0;
  for (Scalar lane : lanes8) by8 += lane;
  for (Scalar lane : lanes4) by4 += lane;
  REQUIRE(by8 != in_order);
  REQUIRE(by4 != in_order);
  const hils::Geometry geometry(T, 8, T, false);
  const auto out = hils::full_attention<Scalar>(q, k, v, geometry, Scalar(1), {T - 1});
  CHECK(out.lse(0) == std::log(in_order));
}

}  // namespace

TEST_CASE("the streaming softmax adds a row's exponentials one by one in key order", "[exp]") {
  check_key_order_sum<float>();
#ifndef HILS_FUSED_KERNELS  // the fused double kernel (AVX-512) sums 8 lanes, then the lanes
  check_key_order_sum<double>();
#endif
}

TEST_CASE("landmark columns and a row's key range mask what is_landmark and the first and last key say",
          "[exp]") {
  for (int64_t S : {2, 5, 64}) {
    const hils::Geometry geometry(1000, S, 100, true);
    for (int64_t k0 : {int64_t{0}, int64_t{1}, S - 1, S, 3 * S + 2, int64_t{700}}) {
      const int64_t n = 256 < 1000 - k0 ? 256 : 1000 - k0;
      std::vector<int64_t> want;
      for (int64_t j = 0; j < n; ++j)
        if (geometry.is_landmark(k0 + j)) want.push_back(j);
      CHECK(hils::detail::landmark_columns(geometry, k0, n) == want);
    }
  }
  CHECK(hils::detail::landmark_columns(hils::Geometry(100, 8, 10, false), 0, 100).empty());
  for (int64_t first : {-5, 0, 3, 9, 12}) {
    for (int64_t last : {-1, 0, 4, 9, 20}) {
      std::array<double, 10> row;
      row.fill(1.0);
      hils::detail::mask_outside_range(row.data(), 10, first, last);
      for (int64_t j = 0; j < 10; ++j)
        CHECK((row[static_cast<size_t>(j)] == 1.0) == (j >= first && j <= last));
    }
  }
}
