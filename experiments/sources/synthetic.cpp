#include "sources/synthetic.hpp"

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "hils/draws.hpp"
#include "hils/analysis/needle.hpp"

namespace hils::sources {

namespace {

// Topic model (see header): keys around their chunk's topic, queries toward a past topic.
void draw_topics(const SyntheticParams& p, uint64_t seed, const Geometry& geometry,
                 AttentionInputs<double>& in) {
  const int64_t G = p.Hq / p.Hkv, n_chunks = geometry.n_chunks();
  const double a = std::sqrt(p.topic_share), b = std::sqrt(1.0 - p.topic_share);
  const double aq = std::sqrt(p.query_topic_share), bq = std::sqrt(1.0 - p.query_topic_share);
  std::vector<Matrix<double>> topics;
  for (int64_t g = 0; g < p.Hkv; ++g) {
    auto rng = draw_stream(seed, "topics", g);
    // A trailing partial chunk gets a topic too, so that every key has one.
    topics.push_back(gaussian(rng, n_chunks + 1, p.d, 1.0));
    for (int64_t j = 0; j < p.T; ++j)
      in.k[g].row(j) = a * topics[g].row(geometry.chunk_of(j)) + b * in.k[g].row(j);
  }
  for (int64_t h = 0; h < p.Hq; ++h) {
    auto rng = draw_stream(seed, "query_topic", h);
    const auto& topic = topics[h / G];
    for (int64_t t = 0; t < p.T; ++t) {
      int64_t own = geometry.chunk_of(t);
      int64_t past = std::min(own, n_chunks);  // complete chunks that end before t
      int64_t chosen = own;
      if (!geometry.is_landmark(t) && past > 0) {
        std::uniform_int_distribution<int64_t> pick(0, past - 1);
        chosen = pick(rng);
      }
      // in.q holds logit_std * e; the topic term carries the same gain.
      in.q[h].row(t) = p.logit_std * aq * topic.row(chosen) + bq * in.q[h].row(t);
    }
  }
}

// Needle model (see header): one planted key per KV head.
std::vector<Needle> plant_needles(const SyntheticParams& p, const Geometry& geometry,
                                  AttentionInputs<double>& in) {
  const int64_t G = p.Hq / p.Hkv, real = geometry.real_tokens();
  const double sigma = 1.0 / std::sqrt(static_cast<double>(p.d));
  auto real_index = static_cast<int64_t>(std::llround(p.depth * static_cast<double>(real - 1)));
  int64_t slot = geometry.slot_of_real(real_index);
  int64_t query = p.needle_query >= 0 ? p.needle_query
                                      : geometry.slot_of_real(real - 1);
  require(query > slot, "needle_query / depth",
          fmt::format("a query slot after the needle slot {}", slot), std::to_string(query));
  std::vector<Needle> needles;
  for (int64_t g = 0; g < p.Hkv; ++g) {
    const int64_t h = g * G;
    analysis::plant_needle(in.k, g, slot, in.q[h].row(query), sigma, p.needle_logit,
                           "needle_query");
    needles.push_back(Needle{g, slot, geometry.chunk_of(slot), query, h});
  }
  return needles;
}

// ---- drift (see header): one stream, drawn in a fixed order --------------------------------

// [n x d] standard normal draws, row by row.
Matrix<double> drift_gaussian(std::mt19937_64& rng, int64_t n, int64_t d) {
  std::normal_distribution<double> g(0.0, 1.0);
  Matrix<double> m(n, d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) m(i, j) = g(rng);
  return m;
}

// Topic keys: [T x d], each segment one topic plus noise.
Matrix<double> drift_topic_keys(std::mt19937_64& rng, const SyntheticParams& p) {
  std::exponential_distribution<double> length(1.0 / static_cast<double>(p.segment));
  std::normal_distribution<double> g(0.0, 1.0);
  Matrix<double> k(p.T, p.d);
  Vector<double> topic(p.d);
  int64_t left = 0;
  for (int64_t t = 0; t < p.T; ++t) {
    if (left-- <= 0) {
      for (int64_t j = 0; j < p.d; ++j) topic(j) = g(rng);
      left = 1 + static_cast<int64_t>(length(rng));
    }
    for (int64_t j = 0; j < p.d; ++j) k(t, j) = topic(j) + p.key_noise * g(rng);
  }
  return k;
}

// Queries: [T x d], an AR(1) drift of unit variance times logit_std.
Matrix<double> drift_queries(std::mt19937_64& rng, const SyntheticParams& p) {
  std::normal_distribution<double> g(0.0, 1.0);
  Matrix<double> q(p.T, p.d);
  const double innovation = std::sqrt(1.0 - p.query_rho * p.query_rho);
  for (int64_t j = 0; j < p.d; ++j) q(0, j) = g(rng);
  for (int64_t t = 1; t < p.T; ++t)
    for (int64_t j = 0; j < p.d; ++j) q(t, j) = p.query_rho * q(t - 1, j) + innovation * g(rng);
  return q * p.logit_std;
}

// Landmark slots take the mean of their chunk's real rows.
void fill_landmarks(Matrix<double>& m, const Geometry& geometry) {
  if (!geometry.landmarks()) return;
  for (int64_t c = 0; c < geometry.n_chunks(); ++c) {
    const int64_t first = c * geometry.S(), slot = geometry.landmark_slot(c);
    m.row(slot) = m.middleRows(first, slot - first).colwise().mean();
  }
}

// The drift model's q, k, v (no prior); seeded by (seed, layer) as the studies always were.
AttentionInputs<double> draw_drift(const SyntheticParams& p, const Geometry& geometry,
                                   int64_t layer) {
  std::mt19937_64 rng(p.seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(layer + 1)));
  AttentionInputs<double> in;
  for (int64_t g = 0; g < p.Hkv; ++g) {
    in.k.push_back(drift_topic_keys(rng, p));
    in.v.push_back(drift_gaussian(rng, p.T, p.value_dim()));
    fill_landmarks(in.k.back(), geometry);
    fill_landmarks(in.v.back(), geometry);
  }
  for (int64_t h = 0; h < p.Hq; ++h) {
    in.q.push_back(drift_queries(rng, p));
    fill_landmarks(in.q.back(), geometry);
  }
  return in;
}

// The stream models' seed for a layer: layer 0 keeps the seed (the files `hils dump` wrote).
uint64_t layer_seed(uint64_t seed, int64_t layer) {
  return seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(layer));
}

}  // namespace

std::vector<std::string> generator_names() { return {"gaussian", "topics", "needle", "drift"}; }

// params -> bytes: (q and q_retrieval per query head, k and v per KV head) x T slots x 4 copies.
double SyntheticParams::working_bytes() const {
  const double per_slot = static_cast<double>(Hq) * static_cast<double>(d) * 2 +
                          static_cast<double>(Hkv) * static_cast<double>(d + value_dim());
  return 4.0 * sizeof(double) * static_cast<double>(T) * per_slot;
}

void SyntheticParams::validate() const {
  bool known = false;
  for (const auto& name : generator_names()) known = known || name == generator;
  require(known, "generator", "gaussian | topics | needle | drift", generator);
  require(T >= 1, "T", ">= 1", std::to_string(T));
  require(S >= 1 && (!landmarks || S >= 2), "S", landmarks ? ">= 2 with landmarks" : ">= 1",
          std::to_string(S));
  require(Hq >= 1 && Hkv >= 1 && Hq % Hkv == 0, "Hq, Hkv", "Hq a positive multiple of Hkv",
          fmt::format("Hq={} Hkv={}", Hq, Hkv));
  require(d >= 1 && dv >= 0, "d, dv", "d >= 1, dv >= 1 (or 0: the same as d)",
          fmt::format("d={} dv={}", d, dv));
  require(std::isfinite(logit_std) && logit_std >= 0, "logit_std", "a finite value >= 0",
          std::to_string(logit_std));
  require(topic_share >= 0 && topic_share <= 1, "topic_share", "a value in [0, 1]",
          std::to_string(topic_share));
  require(query_topic_share >= 0 && query_topic_share <= 1, "query_topic_share",
          "a value in [0, 1]", std::to_string(query_topic_share));
  require(depth >= 0 && depth <= 1, "depth", "a value in [0, 1]", std::to_string(depth));
  require(std::isfinite(needle_logit), "needle_logit", "a finite value",
          std::to_string(needle_logit));
  require(needle_query < T, "needle_query", fmt::format("-1 or a slot < T={}", T),
          std::to_string(needle_query));
  require(retrieval_noise >= 0, "retrieval_noise", ">= 0", std::to_string(retrieval_noise));
  require(segment >= 1, "segment", ">= 1", std::to_string(segment));
  require(std::isfinite(key_noise) && key_noise >= 0, "key_noise", "a finite value >= 0",
          std::to_string(key_noise));
  require(query_rho >= 0 && query_rho < 1, "query_rho", "a value in [0, 1)",
          std::to_string(query_rho));
  if (generator == "needle")
    require(logit_std > 0, "logit_std", "> 0 for the needle generator (it copies a query)",
            std::to_string(logit_std));
  positional.validate(d);
}

nlohmann::json SyntheticParams::to_json() const {
  // The fields every generator uses, then its own (the others play no part in the draw).
  nlohmann::json out = {{"generator", generator},
                        {"T", T},
                        {"S", S},
                        {"landmarks", landmarks},
                        {"Hq", Hq},
                        {"Hkv", Hkv},
                        {"d", d},
                        {"dv", value_dim()},
                        {"logit_std", logit_std},
                        {"retrieval_noise", retrieval_noise},
                        {"positional", to_string(positional.kind)},
                        {"rope_pairing", to_string(positional.pairing)},
                        {"rope_theta", positional.theta},
                        {"hope_train_length", positional.hope_train_length},
                        {"hope_m", positional.hope_m},
                        {"seed", seed}};
  if (generator == "topics")
    out.update({{"topic_share", topic_share}, {"query_topic_share", query_topic_share}});
  if (generator == "needle")
    out.update({{"depth", depth}, {"needle_query", needle_query}, {"needle_logit", needle_logit}});
  if (generator == "drift")
    out.update({{"segment", segment}, {"key_noise", key_noise}, {"query_rho", query_rho}});
  return out;
}

SyntheticLayer draw_layer(const SyntheticParams& p, int64_t layer) {
  p.validate();
  require(layer >= 0, "layer", ">= 0", std::to_string(layer));
  Geometry geometry(p.T, p.S, p.S, p.landmarks);  // W plays no part in the layout
  SyntheticLayer out;
  AttentionInputs<double>& raw = out.inputs;
  const uint64_t seed = layer_seed(p.seed, layer);
  if (p.generator == "drift") {
    raw = draw_drift(p, geometry, layer);
  } else {
    for (int64_t h = 0; h < p.Hq; ++h) {
      auto rng = draw_stream(seed, "q", h);
      raw.q.push_back(gaussian(rng, p.T, p.d, p.logit_std));
    }
    for (int64_t g = 0; g < p.Hkv; ++g) {
      auto rng = draw_stream(seed, "k", g);
      raw.k.push_back(gaussian(rng, p.T, p.d, 1.0));
    }
    for (int64_t g = 0; g < p.Hkv; ++g) {
      auto rng = draw_stream(seed, "v", g);
      raw.v.push_back(gaussian(rng, p.T, p.value_dim(), 1.0));
    }
    for (int64_t h = 0; h < p.Hq; ++h) {
      auto rng = draw_stream(seed, "prior", h);
      raw.prior.push_back(gaussian(rng, 1, p.d, p.logit_std));
    }
  }
  if (p.generator == "topics") draw_topics(p, seed, geometry, raw);
  if (p.generator == "needle") out.needles = plant_needles(p, geometry, raw);
  if (p.retrieval_noise > 0) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      auto rng = draw_stream(seed, "q_retrieval", h);
      raw.q_retrieval.push_back(raw.q[h] +
                                gaussian(rng, p.T, p.d, p.retrieval_noise * p.logit_std));
    }
  }
  return out;
}

SyntheticSample generate(const SyntheticParams& p, int64_t layer) {
  SyntheticLayer drawn = draw_layer(p, layer);
  const AttentionInputs<double>& raw = drawn.inputs;
  const std::vector<Needle>& needles = drawn.needles;
  Geometry geometry(p.T, p.S, p.S, p.landmarks);
  AttentionInputs<double> rotated = p.positional.kind == PositionalKind::nope
                                        ? raw
                                        : apply_positional_encoding(raw, geometry, p.positional,
                                                                    PriorRule::shared);
  nlohmann::json description = p.to_json();
  nlohmann::json needle_json = nlohmann::json::array();
  for (const auto& n : needles)
    needle_json.push_back({{"kv_head", n.kv_head},
                           {"slot", n.slot},
                           {"chunk", n.chunk},
                           {"query_slot", n.query_slot},
                           {"query_head", n.query_head}});
  description["needles"] = needle_json;
  if (layer != 0) description["layer"] = layer;  // layer 0: what a dump holds, unmarked
  return SyntheticSample{std::move(rotated), std::move(drawn.inputs), geometry,
                         geometry.position_ids(), std::move(drawn.needles), std::move(description)};
}

io::ActivationFile to_activation_file(const SyntheticSample& sample) {
  io::ActivationFile file;
  auto& meta = file.meta;
  const auto& in = sample.inputs;
  const bool rotated = sample.description.value("positional", "nope") != "nope";
  meta.n_layers = 1;
  meta.Hq = in.Hq();
  meta.Hkv = in.Hkv();
  meta.T = in.T();
  meta.d = in.d();
  meta.dv = in.dv();
  meta.rotated = rotated;
  meta.rope_pairing = rotated ? sample.description.value("rope_pairing", "half") : "none";
  meta.rope_theta = rotated ? sample.description.value("rope_theta", 10000.0) : 0.0;
  meta.position_ids = sample.position_ids;
  for (int64_t slot = 0; slot < meta.T; ++slot)
    meta.landmarks.push_back(sample.geometry.is_landmark(slot) ? 1 : 0);
  meta.source = {{"kind", "synthetic"}, {"params", sample.description}};
  io::LayerActivations layer;
  layer.inputs.q = in.q;
  layer.inputs.k = in.k;
  layer.inputs.v = in.v;
  layer.inputs.q_retrieval = in.q_retrieval;
  if (rotated) {
    layer.q_unrotated = sample.unrotated.q;
    layer.k_unrotated = sample.unrotated.k;
  }
  file.layers.push_back(std::move(layer));
  return file;
}

}  // namespace hils::sources
