#include "hils/positional.hpp"

#include <cmath>
#include <numbers>

namespace hils {

void PositionalEncoding::validate(int64_t d) const {
  if (kind == PositionalKind::nope) return;
  require(d % 2 == 0, "d", "an even head dim for rotary encodings", std::to_string(d));
  // An infinite base is refused although its limit exists (inv_freq = 0 for every pair but the
  // first): that is NoPE on d-2 dims and a rotation on two, which no one means by "RoPE".
  require(theta > 1.0 && std::isfinite(theta), "theta", "a finite RoPE base greater than 1",
          std::to_string(theta));
  if (kind == PositionalKind::hope) {
    require(hope_train_length > 0.0 && std::isfinite(hope_train_length), "hope_train_length",
            "a positive finite training length", std::to_string(hope_train_length));
    require(hope_m > 0.0 && std::isfinite(hope_m), "hope_m",
            "a positive finite period multiplier", std::to_string(hope_m));
  }
}

std::string to_string(RopePairing p) { return p == RopePairing::half ? "half" : "interleaved"; }

std::string to_string(PositionalKind k) {
  switch (k) {
    case PositionalKind::nope: return "nope";
    case PositionalKind::rope: return "rope";
    case PositionalKind::hope: return "hope";
  }
  return "?";
}

RopePairing parse_rope_pairing(const std::string& text, const std::string& field) {
  if (text == "half") return RopePairing::half;
  if (text == "interleaved") return RopePairing::interleaved;
  throw InvalidArgument(field + ": expected half | interleaved, got '" + text + "'");
}

PositionalKind parse_positional_kind(const std::string& text, const std::string& field) {
  if (text == "nope") return PositionalKind::nope;
  if (text == "rope") return PositionalKind::rope;
  if (text == "hope") return PositionalKind::hope;
  throw InvalidArgument(field + ": expected nope | rope | hope, got '" + text + "'");
}

std::vector<double> rope_inverse_frequencies(int64_t d, double theta) {
  std::vector<double> inv(static_cast<size_t>(d / 2));
  for (int64_t j = 0; j < d / 2; ++j)
    inv[static_cast<size_t>(j)] = std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(d));
  return inv;
}

std::vector<bool> rotated_pairs(const PositionalEncoding& pe, int64_t d) {
  pe.validate(d);
  std::vector<bool> rotated(static_cast<size_t>(d / 2), pe.kind != PositionalKind::nope);
  if (pe.kind != PositionalKind::hope) return rotated;
  // HoPE keeps the pairs whose period 2 pi / inv_freq is at most L_train / m.
  double min_frequency = 2.0 * std::numbers::pi * pe.hope_m / pe.hope_train_length;
  std::vector<double> inv = rope_inverse_frequencies(d, pe.theta);
  for (size_t j = 0; j < inv.size(); ++j) rotated[j] = j == 0 || inv[j] >= min_frequency;
  return rotated;
}

template <class Scalar>
void apply_rotary(Matrix<Scalar>& x, const std::vector<int64_t>& positions,
                  const PositionalEncoding& pe) {
  const int64_t d = x.cols();
  require(static_cast<int64_t>(positions.size()) == x.rows(), "positions",
          std::to_string(x.rows()) + " position ids (one per row)",
          std::to_string(positions.size()));
  if (pe.kind == PositionalKind::nope) return;
  std::vector<bool> rotated = rotated_pairs(pe, d);
  std::vector<double> inv = rope_inverse_frequencies(d, pe.theta);
  const int64_t half = d / 2;
  for (int64_t i = 0; i < x.rows(); ++i) {
    for (int64_t j = 0; j < half; ++j) {
      if (!rotated[static_cast<size_t>(j)]) continue;
      // The angle is formed in long double so that every Scalar sees the same rotation.
      long double angle = static_cast<long double>(positions[static_cast<size_t>(i)]) *
                          static_cast<long double>(inv[static_cast<size_t>(j)]);
      Scalar c = static_cast<Scalar>(std::cos(angle));
      Scalar s = static_cast<Scalar>(std::sin(angle));
      int64_t a = pe.pairing == RopePairing::half ? j : 2 * j;
      int64_t b = pe.pairing == RopePairing::half ? j + half : 2 * j + 1;
      Scalar xa = x(i, a), xb = x(i, b);
      x(i, a) = xa * c - xb * s;
      x(i, b) = xa * s + xb * c;
    }
  }
}

template void apply_rotary<float>(Matrix<float>&, const std::vector<int64_t>&,
                                  const PositionalEncoding&);
template void apply_rotary<double>(Matrix<double>&, const std::vector<int64_t>&,
                                   const PositionalEncoding&);
template void apply_rotary<long double>(Matrix<long double>&, const std::vector<int64_t>&,
                                        const PositionalEncoding&);

}  // namespace hils
