// Seeded random draws shared by the generators of inputs (the synthetic activations of
// experiments/sources and the oracle's hard cases): one independent stream per (seed, tag,
// index), so that adding a tensor or a head to one generator never changes another's values.
#pragma once

#include <cstdint>
#include <random>
#include <string_view>

#include "hils/types.hpp"

namespace hils {

// The seed part of a name: FNV-1a's xor-multiply steps from 1469598103934665603 (the seeds' start
// since the first tests, one digit short of FNV's standard 14695981039346656037; kept so that no
// seed moves). Not the identity hash of a file (experiments/sources/model_trace.cpp has that).
constexpr uint64_t name_hash(std::string_view text) {
  uint64_t hash = 1469598103934665603ull;
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

// The stream of (seed, tag, index): the seed, the tag's hash and the index mixed by seed_seq.
inline std::mt19937_64 draw_stream(uint64_t seed, std::string_view tag, int64_t index) {
  const uint64_t hash = name_hash(tag);
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(hash), static_cast<uint32_t>(hash >> 32),
                    static_cast<uint32_t>(index)};
  return std::mt19937_64(seq);
}

// [rows x cols] of i.i.d. N(0, gain^2), row by row.
inline Matrix<double> gaussian(std::mt19937_64& rng, int64_t rows, int64_t cols, double gain) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Matrix<double> m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = gain * normal(rng);
  return m;
}

}  // namespace hils
