// Tiny cases (T = 8, S = 2, W = 2, d = 2) whose expected numbers are worked out by hand here,
// independently of the implementation.
#include <catch2/catch.hpp>

#include <cmath>

#include "support.hpp"

using namespace hils;

namespace {

const double e = std::exp(1.0);

MechanismSpec tiny_spec(const char* name, bool landmarks, int64_t K) {
  MechanismSpec spec = preset(name);
  spec.S = 2;
  spec.W = 2;
  spec.K = K;
  spec.landmarks = landmarks;
  spec.scale = 1.0;  // keeps the hand arithmetic in plain logits
  return spec;
}

Matrix<double> rows(std::initializer_list<std::initializer_list<double>> values) {
  Matrix<double> m(static_cast<int64_t>(values.size()),
                   static_cast<int64_t>(values.begin()->size()));
  int64_t i = 0;
  for (const auto& r : values) {
    int64_t j = 0;
    for (double x : r) m(i, j++) = x;
    ++i;
  }
  return m;
}

}  // namespace

TEST_CASE("tiny 1: full, window and naive BSA with landmark slots", "[tiny]") {
  // Slots 1, 3, 5, 7 are landmarks; their keys (5) would dominate if they were attended.
  AttentionInputs<double> in;
  in.q = {rows({{1, 0}, {1, 0}, {1, 0}, {1, 0}, {1, 0}, {1, 0}, {1, 0}, {1, 0}})};
  in.k = {rows({{0, 0}, {5, 0}, {1, 0}, {5, 0}, {2, 0}, {5, 0}, {3, 0}, {5, 0}})};
  in.v = {rows({{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}})};
  RunOptions at;
  at.queries = {6, 7};

  // Full attention at t = 6 and t = 7: keys 0, 2, 4, 6 with logits 0, 1, 2, 3.
  const double z_full = 1 + e + e * e + e * e * e;
  const double o_full = (2 * e + 4 * e * e + 6 * e * e * e) / z_full;
  auto full = run_mechanism(tiny_spec("full", true, 0), in, at);
  for (int64_t r = 0; r < 2; ++r) {
    CHECK(full.heads[0].lse(r) == Approx(std::log(z_full)).epsilon(1e-14));
    CHECK(full.heads[0].o(r, 0) == Approx(o_full).epsilon(1e-14));
    CHECK(full.heads[0].o(r, 1) == Approx(1.0).epsilon(1e-14));
  }

  // Window: tau(6) = floor(5/2) = 2, l = 4, A(6) = {4, 6}; tau(7) = 3, A(7) = {6}.
  auto swa = run_mechanism(tiny_spec("swa", true, 0), in, at);
  CHECK(swa.heads[0].lse(0) == Approx(std::log(e * e + e * e * e)).epsilon(1e-14));
  CHECK(swa.heads[0].o(0, 0) == Approx((4 * e * e + 6 * e * e * e) / (e * e + e * e * e)).epsilon(1e-14));
  CHECK(swa.heads[0].lse(1) == Approx(3.0).epsilon(1e-14));
  CHECK(swa.heads[0].o(1, 0) == Approx(6.0).epsilon(1e-14));

  // Naive BSA, K = 1: V(6) = {0, 1} with L = {0, 1} -> chunk 1 (slot 2); V(7) = {0, 1, 2} ->
  // chunk 2 (slot 4), which at t = 7 lies left of the window {6}.
  auto bsa = run_mechanism(tiny_spec("naive_bsa", true, 1), in, at);
  CHECK(bsa.selection[0](0, 0) == 1);
  CHECK(bsa.selection[0](1, 0) == 2);
  const double z6 = e + e * e + e * e * e;
  CHECK(bsa.heads[0].lse(0) == Approx(std::log(z6)).epsilon(1e-14));
  CHECK(bsa.heads[0].o(0, 0) == Approx((2 * e + 4 * e * e + 6 * e * e * e) / z6).epsilon(1e-14));
  const double z7 = e * e + e * e * e;
  CHECK(bsa.heads[0].lse(1) == Approx(std::log(z7)).epsilon(1e-14));
  CHECK(bsa.heads[0].o(1, 0) == Approx((4 * e * e + 6 * e * e * e) / z7).epsilon(1e-14));
  // Flat fusion weights are the mass shares of the chunk and the window.
  CHECK(bsa.heads[0].fusion_weights(0, 0) == Approx(e / z6).epsilon(1e-14));
  CHECK(bsa.heads[0].fusion_weights(0, 1) == Approx((e * e + e * e * e) / z6).epsilon(1e-14));
}

TEST_CASE("tiny 2: Taylor summary with entropy bias and hierarchical fusion", "[tiny]") {
  // No landmarks: chunk c holds slots 2c, 2c+1. The prior mu = (1, 0) gives prior logits
  // (0, ln 3) in every chunk, so p = (1/4, 3/4) and H(p) = ln 4 - (3/4) ln 3.
  const double l3 = std::log(3.0);
  AttentionInputs<double> in;
  in.q = {rows({{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {1, 1}})};
  in.k = {rows({{0, 0}, {l3, 0}, {0, 2}, {l3, 0}, {0, 4}, {l3, -4}, {0, 0}, {l3, 0}})};
  in.v = {rows({{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}})};
  in.prior = {rows({{1, 0}})};
  MechanismSpec spec = tiny_spec("hils", false, 2);
  spec.prior_rule = PriorRule::shared;
  RunOptions at;
  at.queries = {7};
  at.keep_surrogate_scores = true;
  auto out = run_mechanism(spec, in, at);

  // k'_c = (3/4 ln 3, a_c/4 + 3 b_c/4) with (a, b) = (0, 0), (2, 0), (4, -4); q_7 = (1, 1).
  const double H = std::log(4.0) - 0.75 * l3;
  const double s0 = 0.75 * l3 + H, s1 = 0.75 * l3 + 0.5 + H, s2 = 0.75 * l3 - 2 + H;
  CHECK(out.heads[0].surrogate_scores(0, 0) == Approx(s0).epsilon(1e-14));
  CHECK(out.heads[0].surrogate_scores(0, 1) == Approx(s1).epsilon(1e-14));
  CHECK(out.heads[0].surrogate_scores(0, 2) == Approx(s2).epsilon(1e-14));
  CHECK(std::isinf(out.heads[0].surrogate_scores(0, 3)));  // chunk 3 is the window
  CHECK(out.selection[0](0, 0) == 0);
  CHECK(out.selection[0](0, 1) == 1);

  // o_c with q: chunk 0 logits (0, ln 3) -> o = 3/4; chunk 1 logits (2, ln 3) -> (2e^2 + 9)/(e^2 + 3);
  // window {6, 7}: logits (0, ln 3) -> lse = ln 4, o = (6 + 21)/4.
  const double o0 = 0.75, o1 = (2 * e * e + 9) / (e * e + 3), o_swa = 27.0 / 4;
  const double lse = std::log(std::exp(s0) + std::exp(s1) + 4.0);
  const double w0 = std::exp(s0 - lse), w1 = std::exp(s1 - lse), w_swa = 4.0 / std::exp(lse);
  CHECK(out.heads[0].lse(0) == Approx(lse).epsilon(1e-14));
  CHECK(out.heads[0].fusion_weights(0, 0) == Approx(w0).epsilon(1e-14));
  CHECK(out.heads[0].fusion_weights(0, 1) == Approx(w1).epsilon(1e-14));
  CHECK(out.heads[0].fusion_weights(0, 2) == Approx(w_swa).epsilon(1e-14));
  CHECK(out.heads[0].o(0, 0) == Approx(w0 * o0 + w1 * o1 + w_swa * o_swa).epsilon(1e-14));
}

TEST_CASE("tiny 3: the GQA group rules pick different chunks", "[tiny]") {
  // Two query heads share one KV head. Chunk means: m0 = (1, 0), m1 = (0, 1), m2 = (0, 0);
  // window keys (slots 6, 7) = (1, 0). Head A: q = (3, 0); head B: q = (0, 2.9).
  AttentionInputs<double> in;
  Matrix<double> qa = Matrix<double>::Zero(8, 2), qb = Matrix<double>::Zero(8, 2);
  qa.row(7) << 3, 0;
  qb.row(7) << 0, 2.9;
  in.q = {qa, qb};
  in.k = {rows({{1, 0}, {1, 0}, {0, 1}, {0, 1}, {0, 0}, {0, 0}, {1, 0}, {1, 0}})};
  in.v = {rows({{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}})};
  MechanismSpec spec = tiny_spec("nsa", false, 1);
  spec.fusion = Fusion::hierarchical;
  RunOptions at;
  at.queries = {7};

  // s_hat: A = (3, 0, 0), lse_swa_A = 3 + ln 2; B = (0, 2.9, 0), lse_swa_B = ln 2.
  const double log_z_a = std::log(3 * std::exp(3.0) + 2), log_z_b = std::log(std::exp(2.9) + 4);
  const double r0 = std::max(3 - log_z_a, 0 - log_z_b), r1 = std::max(0 - log_z_a, 2.9 - log_z_b);
  REQUIRE(r1 > r0);  // normalized: chunk 1 (head B's chunk is a larger share of its mass)
  spec.group_rule = GroupRule::max_normalized;
  auto normalized = run_mechanism(spec, in, at);
  CHECK(normalized.selection[0](0, 0) == 1);
  spec.group_rule = GroupRule::max_raw;  // raw: 3 > 2.9, chunk 0
  CHECK(run_mechanism(spec, in, at).selection[0](0, 0) == 0);
  const double p0 = std::exp(3 - log_z_a) + std::exp(0 - log_z_b);
  const double p1 = std::exp(0 - log_z_a) + std::exp(2.9 - log_z_b);
  REQUIRE(p1 > p0);
  spec.group_rule = GroupRule::sum_probabilities;
  CHECK(run_mechanism(spec, in, at).selection[0](0, 0) == 1);

  // Head A's output under the normalized rule: a = (s_hat_A(1) = 0, 3 + ln 2); chunk 1's two
  // keys tie, so o_1 = (2 + 3)/2; window keys tie too, so o_swa = (6 + 7)/2.
  const double lse_a = std::log(1 + 2 * std::exp(3.0));
  const double w1 = 1 / std::exp(lse_a);
  CHECK(normalized.heads[0].lse(0) == Approx(lse_a).epsilon(1e-14));
  CHECK(normalized.heads[0].o(0, 0) == Approx(w1 * 2.5 + (1 - w1) * 6.5).epsilon(1e-14));
}
