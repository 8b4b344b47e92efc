#include "hils/positional.hpp"

#include <algorithm>
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

namespace {

// Rows per block of the cos/sin table: the table holds kRotaryBlock x d/2 pairs of Scalars
// (64 KiB for d = 128 in double), whatever T is.
constexpr int64_t kRotaryBlock = 64;

// apply_rotary's checks of one matrix, in its order: one position per row, then pe for d.
template <class Scalar>
void check_rotary(const Matrix<Scalar>& x, const std::vector<int64_t>& positions,
                  const PositionalEncoding& pe) {
  require(static_cast<int64_t>(positions.size()) == x.rows(), "positions",
          std::to_string(x.rows()) + " position ids (one per row)",
          std::to_string(positions.size()));
  if (pe.kind != PositionalKind::nope) pe.validate(x.cols());
}

// The cos and sin of every (row, rotated pair) of rows [begin, end): c[r half + j] and
// s[r half + j] for row begin + r and pair j.
template <class Scalar>
void rotary_table(const std::vector<int64_t>& positions, const std::vector<double>& inv,
                  const std::vector<bool>& rotated, int64_t begin, int64_t end,
                  std::vector<Scalar>& c, std::vector<Scalar>& s) {
  const int64_t half = static_cast<int64_t>(inv.size());
  c.resize(static_cast<size_t>((end - begin) * half));
  s.resize(c.size());
  for (int64_t i = begin; i < end; ++i) {
    for (int64_t j = 0; j < half; ++j) {
      if (!rotated[static_cast<size_t>(j)]) continue;
      // The angle is formed in long double so that every Scalar sees the same rotation.
      long double angle = static_cast<long double>(positions[static_cast<size_t>(i)]) *
                          static_cast<long double>(inv[static_cast<size_t>(j)]);
      const size_t at = static_cast<size_t>((i - begin) * half + j);
      c[at] = static_cast<Scalar>(std::cos(angle));
      s[at] = static_cast<Scalar>(std::sin(angle));
    }
  }
}

// Rotates rows [begin, end) of x (row-major) by the table of those rows, pair by pair in scalar
// code as apply_rotary always did. Not vectorized: GCC turns the interleaved pairs into complex
// products (vaddsubps / vfmaddsub) whose float results differ in the last bit from the scalar
// expressions' (measured against main's apply_rotary, session 19; double happened to agree).
template <class Scalar>
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
void rotate_rows(Matrix<Scalar>& x, const std::vector<Scalar>& cos_table,
                 const std::vector<Scalar>& sin_table, const std::vector<bool>& rotated,
                 RopePairing pairing, int64_t begin, int64_t end) {
  const int64_t half = x.cols() / 2;
  for (int64_t i = begin; i < end; ++i) {
    Scalar* row = x.data() + i * x.cols();
    for (int64_t j = 0; j < half; ++j) {
      if (!rotated[static_cast<size_t>(j)]) continue;
      const size_t at = static_cast<size_t>((i - begin) * half + j);
      const Scalar c = cos_table[at], s = sin_table[at];
      int64_t a = pairing == RopePairing::half ? j : 2 * j;
      int64_t b = pairing == RopePairing::half ? j + half : 2 * j + 1;
      Scalar xa = row[a], xb = row[b];
      row[a] = xa * c - xb * s;
      row[b] = xa * s + xb * c;
    }
  }
}

// Rotates every matrix of xs (all with d columns) block of rows by block, each block's angles
// computed once for all of them.
template <class Scalar>
void rotate_same_width(const std::vector<Matrix<Scalar>*>& xs, int64_t d,
                       const std::vector<int64_t>& positions, const PositionalEncoding& pe) {
  const std::vector<bool> rotated = rotated_pairs(pe, d);
  const std::vector<double> inv = rope_inverse_frequencies(d, pe.theta);
  const int64_t n = static_cast<int64_t>(positions.size());
  std::vector<Scalar> c, s;
  for (int64_t begin = 0; begin < n; begin += kRotaryBlock) {
    const int64_t end = std::min(n, begin + kRotaryBlock);
    rotary_table(positions, inv, rotated, begin, end, c, s);
    for (Matrix<Scalar>* x : xs) rotate_rows(*x, c, s, rotated, pe.pairing, begin, end);
  }
}

}  // namespace

template <class Scalar>
void apply_rotary(const std::vector<Matrix<Scalar>*>& xs, const std::vector<int64_t>& positions,
                  const PositionalEncoding& pe) {
  // Every matrix is checked before any is rotated, in the order given: the first bad one throws
  // what rotating them one by one would have thrown.
  for (const Matrix<Scalar>* x : xs) check_rotary(*x, positions, pe);
  if (pe.kind == PositionalKind::nope) return;
  // One table per head dim (inputs have one; the matrices are not validated together here).
  std::vector<bool> done(xs.size(), false);
  for (size_t first = 0; first < xs.size(); ++first) {
    if (done[first]) continue;
    const int64_t d = xs[first]->cols();
    std::vector<Matrix<Scalar>*> same;
    for (size_t m = first; m < xs.size(); ++m)
      if (!done[m] && xs[m]->cols() == d) {
        same.push_back(xs[m]);
        done[m] = true;
      }
    rotate_same_width(same, d, positions, pe);
  }
}

template <class Scalar>
void apply_rotary(Matrix<Scalar>& x, const std::vector<int64_t>& positions,
                  const PositionalEncoding& pe) {
  apply_rotary(std::vector<Matrix<Scalar>*>{&x}, positions, pe);
}

template void apply_rotary<float>(Matrix<float>&, const std::vector<int64_t>&,
                                  const PositionalEncoding&);
template void apply_rotary<double>(Matrix<double>&, const std::vector<int64_t>&,
                                   const PositionalEncoding&);
template void apply_rotary<long double>(Matrix<long double>&, const std::vector<int64_t>&,
                                        const PositionalEncoding&);
template void apply_rotary<float>(const std::vector<Matrix<float>*>&, const std::vector<int64_t>&,
                                  const PositionalEncoding&);
template void apply_rotary<double>(const std::vector<Matrix<double>*>&,
                                   const std::vector<int64_t>&, const PositionalEncoding&);
template void apply_rotary<long double>(const std::vector<Matrix<long double>*>&,
                                        const std::vector<int64_t>&, const PositionalEncoding&);

}  // namespace hils
