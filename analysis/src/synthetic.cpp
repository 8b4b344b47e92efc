#include "hils/analysis/synthetic.hpp"

#include <cmath>
#include <random>

namespace hils::analysis {

namespace {

// [n x d] standard normal draws.
Matrix<double> gaussian(std::mt19937_64& rng, int64_t n, int64_t d) {
  std::normal_distribution<double> g(0.0, 1.0);
  Matrix<double> m(n, d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) m(i, j) = g(rng);
  return m;
}

// Topic keys: [T x d], each segment one topic plus noise.
Matrix<double> topic_keys(std::mt19937_64& rng, const SyntheticConfig& c, int64_t T) {
  std::exponential_distribution<double> length(1.0 / static_cast<double>(c.segment));
  std::normal_distribution<double> g(0.0, 1.0);
  Matrix<double> k(T, c.d);
  Vector<double> topic(c.d);
  int64_t left = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (left-- <= 0) {
      for (int64_t j = 0; j < c.d; ++j) topic(j) = g(rng);
      left = 1 + static_cast<int64_t>(length(rng));
    }
    for (int64_t j = 0; j < c.d; ++j) k(t, j) = topic(j) + c.key_noise * g(rng);
  }
  return k;
}

// Queries: [T x d], an AR(1) drift of unit variance times the gain.
Matrix<double> drifting_queries(std::mt19937_64& rng, const SyntheticConfig& c, int64_t T) {
  std::normal_distribution<double> g(0.0, 1.0);
  Matrix<double> q(T, c.d);
  const double innovation = std::sqrt(1.0 - c.query_rho * c.query_rho);
  for (int64_t j = 0; j < c.d; ++j) q(0, j) = g(rng);
  for (int64_t t = 1; t < T; ++t)
    for (int64_t j = 0; j < c.d; ++j) q(t, j) = c.query_rho * q(t - 1, j) + innovation * g(rng);
  return q * c.query_gain;
}

// Landmark slots take the mean of their chunk's real rows.
void fill_landmarks(Matrix<double>& m, const Geometry& geometry) {
  if (!geometry.landmarks()) return;
  for (int64_t c = 0; c < geometry.n_chunks(); ++c) {
    const int64_t first = c * geometry.S(), slot = geometry.landmark_slot(c);
    m.row(slot) = m.middleRows(first, slot - first).colwise().mean();
  }
}

}  // namespace

AttentionInputs<double> synthetic_layer(const SyntheticConfig& config, int64_t layer,
                                        const Geometry& geometry) {
  require(config.Hq >= 1 && config.Hkv >= 1 && config.Hq % config.Hkv == 0, "synthetic Hq/Hkv",
          "Hq a positive multiple of Hkv", std::to_string(config.Hq) + "/" +
          std::to_string(config.Hkv));
  require(config.d >= 2 && config.d % 2 == 0, "synthetic d", "even and >= 2",
          std::to_string(config.d));
  require(config.query_rho >= 0.0 && config.query_rho < 1.0, "synthetic query_rho", "in [0, 1)",
          std::to_string(config.query_rho));
  const int64_t T = geometry.T();
  std::mt19937_64 rng(config.seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(layer + 1)));
  AttentionInputs<double> in;
  for (int64_t g = 0; g < config.Hkv; ++g) {
    in.k.push_back(topic_keys(rng, config, T));
    in.v.push_back(gaussian(rng, T, config.dv));
    fill_landmarks(in.k.back(), geometry);
    fill_landmarks(in.v.back(), geometry);
  }
  for (int64_t h = 0; h < config.Hq; ++h) {
    in.q.push_back(drifting_queries(rng, config, T));
    fill_landmarks(in.q.back(), geometry);
  }
  return in;
}

}  // namespace hils::analysis
