// Synthetic sources: seeded, and each statistical model does what its documentation says.
#include <catch2/catch.hpp>

#include <cmath>

#include "hils/attention.hpp"
#include "sources/synthetic.hpp"

namespace src = hils::sources;

namespace {

src::SyntheticParams small(const std::string& generator, uint64_t seed) {
  src::SyntheticParams p;
  p.generator = generator;
  p.T = 512;
  p.S = 16;
  p.Hq = 4;
  p.Hkv = 2;
  p.d = 32;
  p.dv = 16;
  p.seed = seed;
  return p;
}

// Standard deviation of sigma q_t . k_j over all pairs of one head.
double logit_std(const hils::AttentionInputs<double>& in) {
  hils::Matrix<double> s = (in.q[0] * in.k[0].transpose()) / std::sqrt(double(in.d()));
  double mean = s.mean();
  return std::sqrt((s.array() - mean).square().mean());
}

}  // namespace

TEST_CASE("synthetic sources are deterministic in the seed", "[sources]") {
  for (const auto& name : src::generator_names()) {
    auto a = src::generate(small(name, 1));
    auto b = src::generate(small(name, 1));
    auto c = src::generate(small(name, 2));
    CHECK(a.inputs.q[3] == b.inputs.q[3]);
    CHECK(a.inputs.k[1] == b.inputs.k[1]);
    CHECK(a.inputs.v[0] == b.inputs.v[0]);
    CHECK(a.inputs.q[3] != c.inputs.q[3]);
  }
}

TEST_CASE("logit_std moves the logits between the flat and the peaked regime", "[sources]") {
  for (double target : {0.05, 1.0, 4.0}) {
    auto p = small("gaussian", 3);
    p.logit_std = target;
    double measured = logit_std(src::generate(p).inputs);
    INFO("target " << target << " measured " << measured);
    CHECK(std::abs(measured / target - 1.0) < 0.05);
  }
}

TEST_CASE("topics: keys cluster around their chunk's topic", "[sources]") {
  auto p = small("topics", 4);
  p.topic_share = 0.8;
  auto sample = src::generate(p);
  const auto& k = sample.unrotated.k[0];
  // Correlation of two keys of one chunk ~ topic_share; of keys in different chunks ~ 0.
  double same = 0, other = 0;
  int64_t n_same = 0, n_other = 0;
  for (int64_t i = 0; i < p.T; i += 3)
    for (int64_t j = i + 1; j < std::min(p.T, i + 40); ++j) {
      double c = k.row(i).dot(k.row(j)) / (k.row(i).norm() * k.row(j).norm());
      if (i / p.S == j / p.S) same += c, ++n_same;
      else other += c, ++n_other;
    }
  same /= double(n_same);
  other /= double(n_other);
  INFO("same " << same << " other " << other);
  CHECK(std::abs(same - 0.8) < 0.1);
  CHECK(std::abs(other) < 0.1);
}

TEST_CASE("needle: the planted key has the requested logit and naive BSA retrieves its chunk",
          "[sources]") {
  auto p = small("needle", 5);
  p.depth = 0.3;
  p.needle_logit = 12.0;
  auto sample = src::generate(p);
  REQUIRE(sample.needles.size() == 2);
  for (const auto& n : sample.needles) {
    CHECK_FALSE(sample.geometry.is_landmark(n.slot));
    double logit = sample.inputs.q[n.query_head].row(n.query_slot).dot(
                       sample.inputs.k[n.kv_head].row(n.slot)) /
                   std::sqrt(double(p.d));
    CHECK(logit == Approx(12.0).epsilon(1e-12));
    CHECK(n.chunk == n.slot / p.S);
  }
  auto spec = hils::preset("naive_bsa");
  spec.S = p.S;
  spec.W = 32;
  spec.K = 2;
  spec.landmarks = true;
  hils::RunOptions options;
  options.queries = {sample.needles[0].query_slot};
  auto out = hils::run_mechanism(spec, sample.inputs, options);
  const auto& selected = out.selection[0];
  bool found = false;
  for (int64_t c = 0; c < selected.cols(); ++c) found = found || selected(0, c) == sample.needles[0].chunk;
  CHECK(found);
}

TEST_CASE("RoPE is applied to the kept un-rotated vectors", "[sources]") {
  auto p = small("gaussian", 6);
  p.positional.kind = hils::PositionalKind::rope;
  p.positional.pairing = hils::RopePairing::interleaved;
  auto sample = src::generate(p);
  auto expected = hils::apply_positional_encoding(sample.unrotated, sample.geometry, p.positional,
                                                  hils::PriorRule::shared);
  CHECK(sample.inputs.q[1] == expected.q[1]);
  CHECK(sample.inputs.k[1] == expected.k[1]);
  CHECK(sample.inputs.q[1] != sample.unrotated.q[1]);
  CHECK(sample.inputs.v[1] == sample.unrotated.v[1]);
  auto file = src::to_activation_file(sample);
  CHECK(file.meta.rotated);
  CHECK(file.meta.rope_pairing == "interleaved");
  CHECK(file.layers[0].q_unrotated[2] == sample.unrotated.q[2]);
}

TEST_CASE("synthetic parameters are validated with the field named", "[sources]") {
  auto p = small("gaussian", 7);
  p.Hkv = 3;
  CHECK_THROWS_WITH(src::generate(p), Catch::Contains("Hq"));
  p = small("bogus", 7);
  CHECK_THROWS_WITH(src::generate(p), Catch::Contains("generator"));
  p = small("needle", 7);
  p.depth = 1.5;
  CHECK_THROWS_WITH(src::generate(p), Catch::Contains("depth"));
}
