// Synthetic sources: seeded, and each statistical model does what its documentation says.
#include <catch2/catch.hpp>

#include <cmath>

#include "hils/attention.hpp"
#include <fstream>

#include "sources/study_inputs.hpp"
#include "support.hpp"
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

TEST_CASE("layers are independent draws, and layer 0 is what a dump holds", "[sources]") {
  for (const auto& name : src::generator_names()) {
    INFO(name);
    auto p = small(name, 8);
    auto dumped = src::generate(p);
    auto layer0 = src::generate(p, 0);
    auto layer1 = src::generate(p, 1);
    CHECK(layer0.inputs.q[0] == dumped.inputs.q[0]);
    CHECK(layer0.inputs.k[1] == dumped.inputs.k[1]);
    CHECK(layer1.inputs.q[0] != layer0.inputs.q[0]);
    CHECK(layer1.inputs.v[1] != layer0.inputs.v[1]);
    CHECK(src::generate(p, 1).inputs.k[0] == layer1.inputs.k[0]);
  }
}

TEST_CASE("drift: landmark slots hold their chunk's mean, queries drift, keys share segments",
          "[sources]") {
  auto p = small("drift", 9);
  p.segment = 64;
  p.query_rho = 0.9;
  p.key_noise = 0.5;
  auto sample = src::generate(p);
  const auto& in = sample.unrotated;
  CHECK(in.prior.empty());
  CHECK(in.v[0].cols() == 16);
  const auto& geometry = sample.geometry;
  for (int64_t c : {int64_t{0}, geometry.n_chunks() - 1}) {
    const int64_t slot = geometry.landmark_slot(c), first = c * p.S;
    for (const auto* heads : {&in.q, &in.k, &in.v}) {
      const hils::Matrix<double>& m = (*heads)[0];
      Eigen::RowVectorXd mean = m.middleRows(first, slot - first).colwise().mean();
      CHECK((m.row(slot) - mean).cwiseAbs().maxCoeff() < 1e-12);
    }
  }
  // Adjacent real queries: correlation ~ query_rho; keys of one segment: ~ 1/(1 + key_noise^2).
  double q_corr = 0, k_corr = 0;
  int64_t n = 0;
  for (int64_t t = 0; t + 1 < p.T; ++t) {
    if (geometry.is_landmark(t) || geometry.is_landmark(t + 1)) continue;
    const auto& q = in.q[1];
    q_corr += q.row(t).dot(q.row(t + 1)) / (q.row(t).norm() * q.row(t + 1).norm());
    const auto& k = in.k[1];
    k_corr += k.row(t).dot(k.row(t + 1)) / (k.row(t).norm() * k.row(t + 1).norm());
    ++n;
  }
  q_corr /= double(n), k_corr /= double(n);
  INFO("q " << q_corr << " k " << k_corr);
  CHECK(std::abs(q_corr - 0.9) < 0.05);
  CHECK(k_corr > 0.6);  // 0.8 within a segment; a segment boundary every ~64 slots
  CHECK(k_corr < 0.85);
  // logit_std scales the queries and nothing else.
  auto scaled = p;
  scaled.logit_std = 2.0;
  auto twice = src::draw_layer(scaled).inputs;
  CHECK((twice.q[2] - 2.0 * in.q[2]).cwiseAbs().maxCoeff() < 1e-12);
  CHECK(twice.k[0] == in.k[0]);
}

TEST_CASE("the studies' synthetic inputs are the generator's layer, under the study's RoPE",
          "[sources]") {
  auto p = small("topics", 10);
  hils::PositionalEncoding pe{hils::PositionalKind::rope, hils::RopePairing::half, 10000.0};
  auto inputs = src::synthetic_study_inputs(p, pe, 2, {128, 256});
  CHECK(inputs.positioned.n_layers == 2);
  CHECK(inputs.description["generator"] == "topics");
  CHECK(inputs.description["kind"] == "synthetic");
  CHECK_FALSE(inputs.description.contains("T"));
  auto at = p;
  at.T = 256;
  auto drawn = src::draw_layer(at, 1).inputs;
  drawn.prior.clear();
  auto raw = inputs.raw.load(1, 256);
  CHECK(raw.prior.empty());
  CHECK(raw.q[3] == drawn.q[3]);
  CHECK(raw.k[1] == drawn.k[1]);
  auto positioned = inputs.positioned.load(1, 256);
  auto expected = hils::apply_positional_encoding(drawn, hils::Geometry(256, p.S, p.S, true), pe);
  CHECK(positioned.q[3] == expected.q[3]);
  CHECK(positioned.k[0] == expected.k[0]);
  CHECK(positioned.v[1] == drawn.v[1]);
  CHECK(positioned.q[3] != raw.q[3]);
}

TEST_CASE("drift parameters are validated with the field named", "[sources]") {
  auto p = small("drift", 11);
  p.query_rho = 1.0;
  CHECK_THROWS_WITH(src::generate(p), Catch::Contains("query_rho"));
  p = small("drift", 11);
  p.segment = 0;
  CHECK_THROWS_WITH(src::generate(p), Catch::Contains("segment"));
  p = small("drift", 11);
  p.key_noise = -1;
  CHECK_THROWS_WITH(src::generate(p), Catch::Contains("key_noise"));
}

TEST_CASE("a study's [source] table takes the generator keys of hils dump synthetic",
          "[sources][cli]") {
  hils::test::TempDir dir("study_source_keys");
  auto q = [](const std::filesystem::path& p) { return "'" + p.string() + "'"; };
  std::ofstream(dir / "topics.toml") << "[source]\ngenerator = \"topics\"\ntopic_share = 0.9\n"
                                        "d = 32\nseed = 3\n";
  auto r = hils::test::run_hils("fidelity --config " + q(dir / "topics.toml") + " --out " +
                                q(dir / "f.h5") + " --lengths 1024 --n-layers 1 --queries 4 -q");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto info = hils::test::run_hils("info " + q(dir / "f.h5") + " --json");
  CHECK_THAT(info.output, Catch::Contains("\"generator\": \"topics\"") &&
                              Catch::Contains("\"topic_share\": 0.9") &&
                              Catch::Contains("\"dv\": 32"));
  // Keys the study sets itself, and keys no generator has, are refused by name.
  std::ofstream(dir / "owned.toml") << "[source]\nS = 16\n";
  auto owned = hils::test::run_hils("fidelity --config " + q(dir / "owned.toml") + " --out " +
                                    q(dir / "g.h5") + " --lengths 512 -q");
  CHECK(owned.exit_code == 2);
  CHECK_THAT(owned.output, Catch::Contains("[source] S"));
  // The studies' old name of logit_std is refused with the new name.
  std::ofstream(dir / "renamed.toml") << "[source]\nquery_gain = 2.0\n";
  auto renamed = hils::test::run_hils("fidelity --config " + q(dir / "renamed.toml") +
                                      " --out " + q(dir / "h.h5") + " --lengths 512 -q");
  CHECK(renamed.exit_code == 2);
  CHECK_THAT(renamed.output, Catch::Contains("query_gain") && Catch::Contains("logit_std = 2.0"));
  std::ofstream(dir / "unknown.toml") << "[source]\nsegmnet = 64\n";
  auto unknown = hils::test::run_hils("fidelity --config " + q(dir / "unknown.toml") +
                                      " --out " + q(dir / "i.h5") + " --lengths 512 -q");
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.output, Catch::Contains("unknown key 'segmnet'"));
  for (const char* name : {"g.h5", "h.h5", "i.h5"})
    CHECK_FALSE(std::filesystem::exists(dir / name));
}
