// Positional encodings applied to query and key vectors (reference/SEMANTICS.md §8).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hils/types.hpp"

namespace hils {

enum class RopePairing {
  half,         // dim j pairs with j + d/2 (Hugging Face)
  interleaved,  // dim 2j pairs with 2j+1 (Meta, llama2.c)
};
enum class PositionalKind { nope, rope, hope };

struct PositionalEncoding {
  PositionalKind kind = PositionalKind::nope;
  RopePairing pairing = RopePairing::half;
  double theta = 10000.0;
  // HoPE: keep pair j iff inv_freq[j] >= 2 pi m / L_train (pair 0 always kept).
  double hope_train_length = 8192.0;
  double hope_m = 2.0;
  void validate(int64_t d) const;
};

std::string to_string(RopePairing);
std::string to_string(PositionalKind);
RopePairing parse_rope_pairing(const std::string& text, const std::string& field = "pairing");
PositionalKind parse_positional_kind(const std::string& text,
                                     const std::string& field = "positional");

// inv_freq[j] = theta^(-2j/d), j < d/2.
std::vector<double> rope_inverse_frequencies(int64_t d, double theta);
// Which of the d/2 pairs rotate under `pe` (all for rope, none for nope, the HoPE rule for hope).
std::vector<bool> rotated_pairs(const PositionalEncoding& pe, int64_t d);

// Rotates each row x[i] by position positions[i] in place. x: [n x d], positions: n.
template <class Scalar>
void apply_rotary(Matrix<Scalar>& x, const std::vector<int64_t>& positions,
                  const PositionalEncoding& pe);
// The same for every matrix of xs, each [n x d_m]: the rotations are apply_rotary's bit for bit,
// each (position, pair) angle's cos and sin computed once per block of rows for all of them.
// Each matrix is checked, in order, before any is rotated.
template <class Scalar>
void apply_rotary(const std::vector<Matrix<Scalar>*>& xs, const std::vector<int64_t>& positions,
                  const PositionalEncoding& pe);

}  // namespace hils
