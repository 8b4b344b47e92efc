// Geometry, positional encodings and configuration errors (reference/SEMANTICS.md §1, §2, §8).
#include <catch2/catch.hpp>
#include <algorithm>
#include <limits>
#include <random>

#include "support.hpp"

using namespace hils;

TEST_CASE("paper §7.2: retrievable chunks for 4096 and 65536 real tokens", "[geometry]") {
  // S = 64 with landmarks, W = 512: the last real token sees 57 and 1032 chunks.
  for (auto [real, expected] : {std::pair<int64_t, int64_t>{4096, 57}, {65536, 1032}}) {
    Geometry g = Geometry::for_real_tokens(real, 64, 512, true);
    const int64_t last_real_slot = g.slot_of_real(real - 1);
    CHECK(last_real_slot == g.T() - 1);
    CHECK(g.candidate_count(last_real_slot) == expected);
  }
}

TEST_CASE("landmark layout: slots, positions and attendability", "[geometry]") {
  Geometry g(13, 4, 4, true);
  // Real tokens 0..9 sit at slots 0,1,2,4,5,6,8,9,10,12; slots 3, 7, 11 are landmarks.
  std::vector<int64_t> expected_slots{0, 1, 2, 4, 5, 6, 8, 9, 10, 12};
  CHECK(g.real_slots() == expected_slots);
  for (int64_t r = 0; r < 10; ++r) CHECK(g.slot_of_real(r) == expected_slots[static_cast<size_t>(r)]);
  CHECK(g.real_tokens() == 10);
  CHECK(g.n_chunks() == 3);
  CHECK(g.is_landmark(3));
  CHECK(g.is_landmark(11));
  CHECK_FALSE(g.is_landmark(12));
  // Real tokens keep their positions; a landmark takes its chunk's last real position + 1.
  std::vector<int64_t> expected_positions{0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9};
  CHECK(g.position_ids() == expected_positions);
  CHECK(g.tokens_per_chunk() == 3);
}

TEST_CASE("window and candidates partition every past attendable slot", "[geometry]") {
  for (bool landmarks : {false, true})
    for (int64_t W : {1, 3, 8, 17})
      for (int64_t S : {2, 4, 5}) {
        Geometry g(60, S, W, landmarks);
        for (int64_t t = 0; t < g.T(); ++t) {
          // tau(t) with floor division done by hand.
          const int64_t numerator = t - W + 1;
          const int64_t tau = numerator >= 0 ? numerator / S : -((-numerator + S - 1) / S);
          CHECK(g.window_edge_chunk(t) == tau);
          const int64_t left = g.window_left(t);
          const int64_t candidates = g.candidate_count(t);
          int64_t window_slots = 0;
          for (int64_t j = 0; j <= t; ++j) {
            if (!g.attendable(j)) continue;
            const bool in_window = j >= left;
            const bool in_candidate = j / S < candidates;
            CHECK(in_window != in_candidate);  // exactly one of A(t) or a chunk of V(t)
            window_slots += in_window;
          }
          CHECK(g.window_token_count(t) == window_slots);
          // A(t) spans between W and W+S-1 slots once it is not cut at slot 0.
          if (tau > 0) {
            CHECK(t - left + 1 >= W);
            CHECK(t - left + 1 <= W + S - 1);
          }
        }
      }
}

TEST_CASE("HoPE keeps the pairs whose period fits the training length", "[positional]") {
  PositionalEncoding hope{PositionalKind::hope, RopePairing::half, 1e4, 8192, 2};
  auto kept = rotated_pairs(hope, 64);
  CHECK(std::count(kept.begin(), kept.end(), true) == 23);
  CHECK(kept[0]);
  CHECK(kept[22]);
  CHECK_FALSE(kept[23]);
  hope.theta = 5e5;
  kept = rotated_pairs(hope, 128);
  CHECK(std::count(kept.begin(), kept.end(), true) == 32);
}

TEST_CASE("RoPE pairings rotate the documented dimensions", "[positional]") {
  // d = 4, theta = 100: inv_freq = {1, 0.1}. Position 2 rotates pair 0 by 2 rad, pair 1 by 0.2.
  Matrix<double> x(1, 4);
  x << 1, 2, 3, 4;
  PositionalEncoding rope{PositionalKind::rope, RopePairing::half, 100.0};
  Matrix<double> half = x;
  apply_rotary(half, {2}, rope);
  // half pairing: (x0, x2) by 2 rad and (x1, x3) by 0.2 rad.
  CHECK(half(0, 0) == Approx(1 * std::cos(2.0) - 3 * std::sin(2.0)).epsilon(1e-14));
  CHECK(half(0, 2) == Approx(1 * std::sin(2.0) + 3 * std::cos(2.0)).epsilon(1e-14));
  CHECK(half(0, 1) == Approx(2 * std::cos(0.2) - 4 * std::sin(0.2)).epsilon(1e-14));
  CHECK(half(0, 3) == Approx(2 * std::sin(0.2) + 4 * std::cos(0.2)).epsilon(1e-14));
  rope.pairing = RopePairing::interleaved;
  Matrix<double> inter = x;
  apply_rotary(inter, {2}, rope);
  CHECK(inter(0, 0) == Approx(1 * std::cos(2.0) - 2 * std::sin(2.0)).epsilon(1e-14));
  CHECK(inter(0, 1) == Approx(1 * std::sin(2.0) + 2 * std::cos(2.0)).epsilon(1e-14));
  CHECK(inter(0, 2) == Approx(3 * std::cos(0.2) - 4 * std::sin(0.2)).epsilon(1e-14));
  // Rotation keeps the norm; NoPE changes nothing.
  CHECK(inter.norm() == Approx(x.norm()).epsilon(1e-14));
  Matrix<double> none = x;
  apply_rotary(none, {2}, PositionalEncoding{});
  CHECK(none == x);
}

TEST_CASE("apply_positional_encoding rotates row t of every head by slot t's position id",
          "[positional]") {
  // T = 200 slots with landmarks (position ids are not slot numbers) spans four of apply_rotary's
  // 64-row blocks, the last one partial; Hq = 2, Hkv = 1 and q~ are all rotated in one call.
  // d = 8, theta = 100: inv_freq = {1, 0.316, 0.1, 0.0316}; HoPE with L_train = 64, m = 1 keeps
  // pairs 0-2 (inv_freq >= 2 pi / 64) and leaves pair 3 as it is. Every entry against its
  // rotation formed here from position_ids() and rope_inverse_frequencies() (SEMANTICS §8).
  const int64_t T = 200, d = 8;
  const Geometry g(T, 16, 32, true);
  std::mt19937_64 gen(20261127);
  std::normal_distribution<double> normal;
  auto draw = [&] {
    Matrix<double> m(T, d);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < d; ++j) m(i, j) = normal(gen);
    return m;
  };
  AttentionInputs<double> raw;
  raw.q = {draw(), draw()};
  raw.k = {draw()};
  raw.v = {draw()};
  raw.q_retrieval = {draw(), draw()};
  const std::vector<int64_t> positions = g.position_ids();
  const std::vector<double> inv = rope_inverse_frequencies(d, 100.0);
  for (PositionalKind kind : {PositionalKind::rope, PositionalKind::hope})
    for (RopePairing pairing : {RopePairing::half, RopePairing::interleaved}) {
      const PositionalEncoding pe{kind, pairing, 100.0, 64.0, 1.0};
      const std::vector<bool> rotated = rotated_pairs(pe, d);
      CHECK(std::count(rotated.begin(), rotated.end(), true) == (kind == PositionalKind::hope ? 3 : 4));
      const auto out = apply_positional_encoding(raw, g, pe);
      auto worst_error = [&](const Matrix<double>& x, const Matrix<double>& y) {
        double worst = 0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < d / 2; ++j) {
            const int64_t a = pairing == RopePairing::half ? j : 2 * j;
            const int64_t b = pairing == RopePairing::half ? j + d / 2 : 2 * j + 1;
            const double angle = rotated[static_cast<size_t>(j)]
                                     ? static_cast<double>(positions[static_cast<size_t>(t)]) *
                                           inv[static_cast<size_t>(j)]
                                     : 0.0;
            const double c = std::cos(angle), s = std::sin(angle);
            worst = std::max({worst, std::abs(y(t, a) - (x(t, a) * c - x(t, b) * s)),
                              std::abs(y(t, b) - (x(t, a) * s + x(t, b) * c))});
          }
        return worst;
      };
      INFO(to_string(kind) << " " << to_string(pairing));
      // Angles up to ~210 rad: double rounding of the angle moves the result by ~1e-13 at most.
      for (size_t h = 0; h < 2; ++h) CHECK(worst_error(raw.q[h], out.q[h]) < 1e-12);
      for (size_t h = 0; h < 2; ++h) CHECK(worst_error(raw.q_retrieval[h], out.q_retrieval[h]) < 1e-12);
      CHECK(worst_error(raw.k[0], out.k[0]) < 1e-12);
      CHECK(out.v[0] == raw.v[0]);
    }
}

TEST_CASE("positional encodings refuse non-finite bases and lengths", "[positional][errors]") {
  const double inf = std::numeric_limits<double>::infinity();
  PositionalEncoding rope{PositionalKind::rope, RopePairing::half, inf};
  CHECK_THROWS_WITH(rope.validate(8), Catch::Contains("theta: expected a finite RoPE base"));
  PositionalEncoding hope{PositionalKind::hope, RopePairing::half, 1e4, inf, 2};
  CHECK_THROWS_WITH(hope.validate(8), Catch::Contains("hope_train_length"));
  hope.hope_train_length = 8192, hope.hope_m = inf;
  CHECK_THROWS_WITH(hope.validate(8), Catch::Contains("hope_m"));
  hope.hope_m = 2;
  CHECK_NOTHROW(hope.validate(8));
}

TEST_CASE("configurations that make no sense are clear errors", "[errors]") {
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message_of([] { Geometry(10, 4, 0, false); }), Catch::Contains("W"));
  CHECK_THAT(message_of([] { Geometry(10, 4, -3, false); }), Catch::Contains("W"));
  CHECK_THAT(message_of([] { Geometry(10, 1, 4, true); }), Catch::Contains("S"));
  CHECK_THAT(message_of([] { Geometry(0, 4, 4, false); }), Catch::Contains("T"));
  CHECK_THAT(message_of([] { preset("hilz"); }), Catch::Contains("preset"));
  CHECK_THAT(message_of([] { parse_key_rule("max"); }), Catch::Contains("key_rule"));
  MechanismSpec lmk_without_landmarks = preset("lmk");
  lmk_without_landmarks.landmarks = false;
  CHECK_THAT(message_of([&] { lmk_without_landmarks.validate(); }), Catch::Contains("key_rule"));
  MechanismSpec flat_sink = preset("naive_bsa");
  flat_sink.softmax1 = true;
  CHECK_THAT(message_of([&] { flat_sink.validate(); }), Catch::Contains("softmax1"));

  const auto& c = cases::kCaseTable[3];
  auto inputs = cases::make_inputs<double>(c);
  MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  inputs.k.pop_back();
  inputs.v.pop_back();
  inputs.k.push_back(inputs.k.front());
  inputs.v.push_back(inputs.v.front());
  inputs.k.push_back(inputs.k.front());
  inputs.v.push_back(inputs.v.front());  // Hq = 4, Hkv = 3
  CHECK_THAT(message_of([&] { run_mechanism(spec, inputs); }), Catch::Contains("Hq"));
  inputs = cases::make_inputs<double>(c);
  inputs.q[1](5, 2) = std::numeric_limits<double>::quiet_NaN();
  CHECK_THAT(message_of([&] { run_mechanism(spec, inputs); }), Catch::Contains("q[1]"));
  inputs = cases::make_inputs<double>(c);
  inputs.v[0].conservativeResize(c.T - 1, Eigen::NoChange);
  CHECK_THAT(message_of([&] { run_mechanism(spec, inputs); }), Catch::Contains("v[0]"));
  inputs = cases::make_inputs<double>(c);
  RunOptions unsorted;
  unsorted.queries = {5, 3};
  CHECK_THAT(message_of([&] { run_mechanism(spec, inputs, unsorted); }), Catch::Contains("queries"));
  MechanismSpec shared = spec;
  shared.prior_rule = PriorRule::shared;
  inputs.prior.clear();
  CHECK_THAT(message_of([&] { run_mechanism(shared, inputs); }), Catch::Contains("prior"));
}
