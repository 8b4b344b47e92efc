// Built-in synthetic activations for the studies: raw (un-rotated) q, k, v with the structure
// that makes chunk retrieval meaningful, at any length, from a seed.
//
// - Keys follow topics: the sequence is cut into segments of random length (mean `segment`
//   slots); each segment has a topic vector and its keys are topic + noise, so chunks differ.
// - Queries drift slowly (AR(1) with correlation `query_rho` between adjacent slots) around a
//   mixture of topics, so adjacent queries retrieve similar chunks, as in a language model.
// - With landmarks, the landmark slot of a chunk carries the mean key and the mean query of the
//   chunk's tokens (a stand-in for a trained landmark; the study says which prior it uses).
// Every draw comes from a generator seeded by (seed, layer), so the same call gives the same bits.
#pragma once

#include <cstdint>

#include "hils/attention.hpp"

namespace hils::analysis {

struct SyntheticConfig {
  int64_t Hq = 4, Hkv = 2, d = 64, dv = 64;
  int64_t segment = 192;    // mean topic segment length in slots
  double key_noise = 0.6;   // noise std relative to the unit-variance topic
  double query_rho = 0.98;  // adjacent-slot correlation of the query drift
  double query_gain = 1.0;  // query scale: logits sigma q.k have std ~ gain * sqrt(1 + key_noise^2)
  uint64_t seed = 0x5eed;
};

// One layer's raw inputs with T slots laid out by `geometry` (landmark slots filled as above).
AttentionInputs<double> synthetic_layer(const SyntheticConfig& config, int64_t layer,
                                        const Geometry& geometry);

}  // namespace hils::analysis
