#include "chunk_mass.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace hils::detail {

namespace {

// Writes L(t,c) = LSE over the chunk's tokens into masses(i, c) for the block rows i that have
// chunk c among their candidates. logits_by_key: [keys x n], the chunk's tokens are its rows
// [first_row, first_row + tokens). Reduces down the key rows so every step is a vector
// operation over the n queries; the sum runs over the tokens in slot order.
template <class Scalar>
void chunk_log_mass_by_key(const Matrix<Scalar>& logits_by_key, int64_t first_row,
                           int64_t tokens, int64_t chunk,
                           const std::vector<int64_t>& candidates, std::vector<Scalar>& top,
                           std::vector<Scalar>& total, Matrix<Scalar>& masses) {
  const int64_t n = masses.rows();
  Scalar* const top_of = top.data();
  Scalar* const total_of = total.data();
  std::copy_n(logits_by_key.row(first_row).data(), n, top_of);
  for (int64_t r = 1; r < tokens; ++r) {
    const Scalar* const logit = logits_by_key.row(first_row + r).data();
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) top_of[i] = std::max(top_of[i], logit[i]);
  }
  std::fill_n(total_of, n, Scalar(0));
  for (int64_t r = 0; r < tokens; ++r) {
    const Scalar* const logit = logits_by_key.row(first_row + r).data();
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) total_of[i] += exp_nonpositive(logit[i] - top_of[i]);
  }
  for (int64_t i = 0; i < n; ++i)
    if (chunk < candidates[static_cast<size_t>(i)])
      masses(i, chunk) = top_of[i] + std::log(total_of[i]);
}

// The plain path: Eigen products of up to kKeyBlock keys by the block's queries.
template <class Scalar>
void plain_chunk_log_mass(const Matrix<Scalar>& q_rows, const std::vector<int64_t>& candidates,
                          int64_t max_candidates, const Matrix<Scalar>& k,
                          const Geometry& geometry, Scalar scale, Matrix<Scalar>& masses) {
  const int64_t n = q_rows.rows(), S = geometry.S(), tokens = geometry.tokens_per_chunk();
  // q^T scaled once: the product below is keys x queries, one key per row.
  const Matrix<Scalar> q_scaled_t = (q_rows * scale).transpose();
  const int64_t chunks_per_product = std::max<int64_t>(1, kKeyBlock / S);
  Matrix<Scalar> logits_by_key;
  std::vector<Scalar> top(static_cast<size_t>(n)), total(static_cast<size_t>(n));
  for (int64_t c0 = 0; c0 < max_candidates; c0 += chunks_per_product) {
    const int64_t count = std::min(chunks_per_product, max_candidates - c0);
    logits_by_key.noalias() = k.middleRows(c0 * S, count * S) * q_scaled_t;
    // The attendable tokens of a chunk are its first `tokens` slots (the landmark is last).
    for (int64_t c = 0; c < count; ++c)
      chunk_log_mass_by_key(logits_by_key, c * S, tokens, c0 + c, candidates, top, total, masses);
  }
}

#ifdef HILS_FUSED_CHUNK_MASS

constexpr int kLanes = 8;         // doubles per AVX-512 register
constexpr int kTileQueries = 3;   // queries per register tile
constexpr int kTileVectors = 8;   // key vectors per register tile: 3 x 8 accumulators of 32

// acc[q][v] = logits of queries q (rows of q_scaled, `d` apart) with the panel's keys
// [8v, 8v + 8) of this tile: sum over the d dimensions in order, one FMA each.
template <int kQ, int kV>
void logit_tile(const double* q_scaled, int64_t d, const double* panel, int64_t width,
                double* out, int64_t out_stride) {
  __m512d acc[kQ][kV];
  for (int q = 0; q < kQ; ++q)
    for (int v = 0; v < kV; ++v) acc[q][v] = _mm512_setzero_pd();
  for (int64_t dim = 0; dim < d; ++dim) {
    __m512d query[kQ];
    for (int q = 0; q < kQ; ++q) query[q] = _mm512_set1_pd(q_scaled[q * d + dim]);
    const double* keys = panel + dim * width;
    for (int v = 0; v < kV; ++v) {
      const __m512d key = _mm512_loadu_pd(keys + v * kLanes);
      for (int q = 0; q < kQ; ++q) acc[q][v] = _mm512_fmadd_pd(query[q], key, acc[q][v]);
    }
  }
  for (int q = 0; q < kQ; ++q)
    for (int v = 0; v < kV; ++v) _mm512_storeu_pd(out + q * out_stride + v * kLanes, acc[q][v]);
}

// The logits of kQ queries with the chunk's `width` keys (a multiple of 8) into out[q][width].
template <int kQ>
void chunk_logits(const double* q_scaled, int64_t d, const double* panel, int64_t width,
                  double* out) {
  for (int64_t v0 = 0; v0 < width / kLanes; v0 += kTileVectors) {
    const double* keys = panel + v0 * kLanes;
    double* dest = out + v0 * kLanes;
    switch (std::min<int64_t>(kTileVectors, width / kLanes - v0)) {
      case 1: logit_tile<kQ, 1>(q_scaled, d, keys, width, dest, width); break;
      case 2: logit_tile<kQ, 2>(q_scaled, d, keys, width, dest, width); break;
      case 3: logit_tile<kQ, 3>(q_scaled, d, keys, width, dest, width); break;
      case 4: logit_tile<kQ, 4>(q_scaled, d, keys, width, dest, width); break;
      case 5: logit_tile<kQ, 5>(q_scaled, d, keys, width, dest, width); break;
      case 6: logit_tile<kQ, 6>(q_scaled, d, keys, width, dest, width); break;
      case 7: logit_tile<kQ, 7>(q_scaled, d, keys, width, dest, width); break;
      default: logit_tile<kQ, 8>(q_scaled, d, keys, width, dest, width); break;
    }
  }
}

// LSE of logits[0, tokens) (logits padded to a multiple of 8, in L1): the maximum, then the
// sum of exp(logit - maximum) lane by lane in key order, the 8 lanes added in a fixed order.
double log_sum_exp(double* logits, int64_t tokens) {
  const int64_t width = (tokens + kLanes - 1) / kLanes * kLanes;
  std::fill(logits + tokens, logits + width, neg_inf<double>());  // padding keys add nothing
  __m512d top = _mm512_set1_pd(neg_inf<double>());
  for (int64_t j = 0; j < width; j += kLanes) top = _mm512_max_pd(top, _mm512_loadu_pd(logits + j));
  alignas(64) double lanes[kLanes];
  _mm512_store_pd(lanes, top);
  const double maximum = *std::max_element(lanes, lanes + kLanes);
  const __m512d shift = _mm512_set1_pd(maximum);
  __m512d sum = _mm512_setzero_pd();
  for (int64_t j = 0; j < width; j += kLanes)
    sum = _mm512_add_pd(sum, exp_nonpositive8(_mm512_sub_pd(_mm512_loadu_pd(logits + j), shift)));
  _mm512_store_pd(lanes, sum);
  double total = 0;
  for (double lane : lanes) total += lane;
  return maximum + std::log(total);
}

// The fused path. Chunk by chunk (its panel stays in L1/L2 while every query tile of the block
// uses it), tiles of kTileQueries queries: their logits into `logits` (L1), then their LSE.
void fused_chunk_log_mass(const Matrix<double>& q_rows, const std::vector<int64_t>& candidates,
                          int64_t max_candidates, const ChunkKeys<double>& keys,
                          const Geometry& geometry, double scale, Matrix<double>& masses) {
  const int64_t n = q_rows.rows(), d = q_rows.cols(), width = keys.width;
  const int64_t tokens = geometry.tokens_per_chunk();
  const Matrix<double> q_scaled = q_rows * scale;
  std::vector<double, Eigen::aligned_allocator<double>> logits(
      static_cast<size_t>(kTileQueries * width));
  // Candidates of the tile's queries starting at i: the most of them.
  auto tile_candidates = [&](int64_t i, int64_t count) {
    return *std::max_element(candidates.begin() + i, candidates.begin() + i + count);
  };
  for (int64_t c = 0; c < max_candidates; ++c) {
    const double* panel = keys.panels.data() + c * d * width;
    for (int64_t i = 0; i < n; i += kTileQueries) {
      const int64_t count = std::min<int64_t>(kTileQueries, n - i);
      if (c >= tile_candidates(i, count)) continue;
      const double* q = q_scaled.row(i).data();
      switch (count) {
        case 1: chunk_logits<1>(q, d, panel, width, logits.data()); break;
        case 2: chunk_logits<2>(q, d, panel, width, logits.data()); break;
        default: chunk_logits<3>(q, d, panel, width, logits.data()); break;
      }
      for (int64_t r = 0; r < count; ++r)
        if (c < candidates[static_cast<size_t>(i + r)])
          masses(i + r, c) = log_sum_exp(logits.data() + r * width, tokens);
    }
  }
}

// The table of exp_nonpositive8: 2^(j/16) = head[j] + tail[j], j = 0..15.
struct ExpTable {
  alignas(64) double head[16];
  alignas(64) double tail[16];
  ExpTable() {
    for (int j = 0; j < 16; ++j) {
      const long double value = std::exp2l(static_cast<long double>(j) / 16);
      head[j] = static_cast<double>(value);
      tail[j] = static_cast<double>(value - head[j]);
    }
  }
};
const ExpTable kExpTable;

#endif  // HILS_FUSED_CHUNK_MASS

}  // namespace

#ifdef HILS_FUSED_CHUNK_MASS
__m512d exp_nonpositive8(__m512d x) {
  constexpr double kSixteenLog2e = 23.083120654223414517;  // 16 / ln 2
  // ln2/16 in two parts: the head has 32 significant bits, so k * head is exact for |k| < 2^21.
  constexpr double kHead = 6.93147180369123816490e-01 / 16;
  constexpr double kTail = 1.90821492927058770002e-10 / 16;
  constexpr double kRoundingShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const __m512d underflow = _mm512_set1_pd(-708.0);
  // max(a, b) returns b when either is NaN: NaN goes through to the result.
  const __m512d clamped = _mm512_max_pd(underflow, x);
  const __m512d shift = _mm512_set1_pd(kRoundingShift);
  const __m512d shifted = _mm512_fmadd_pd(clamped, _mm512_set1_pd(kSixteenLog2e), shift);
  const __m512d k = _mm512_sub_pd(shifted, shift);
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(kHead), clamped);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(kTail), r);
  // q = exp(r) - 1 = r + r^2/2! + ... + r^7/7!, Horner's rule.
  __m512d p = _mm512_set1_pd(1.0 / 5040);
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 720));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 120));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
  const __m512d q = _mm512_mul_pd(p, r);
  // The low bits of `shifted` hold k = 16 n + j.
  const __m512i k_bits = _mm512_sub_epi64(_mm512_castpd_si512(shifted), _mm512_castpd_si512(shift));
  const __m512i j = _mm512_and_si512(k_bits, _mm512_set1_epi64(15));
  const __m512i n = _mm512_srai_epi64(k_bits, 4);
  const __m512d head_lo = _mm512_loadu_pd(kExpTable.head), head_hi = _mm512_loadu_pd(kExpTable.head + 8);
  const __m512d tail_lo = _mm512_loadu_pd(kExpTable.tail), tail_hi = _mm512_loadu_pd(kExpTable.tail + 8);
  const __m512d head = _mm512_permutex2var_pd(head_lo, j, head_hi);
  const __m512d tail = _mm512_permutex2var_pd(tail_lo, j, tail_hi);
  // 2^(j/16) (1 + q), then times 2^n: exact, as the result is normal for x >= -708.
  const __m512d mantissa = _mm512_add_pd(_mm512_fmadd_pd(head, q, tail), head);
  const __m512d two_to_n =
      _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(n, _mm512_set1_epi64(1023)), 52));
  const __mmask8 below = _mm512_cmp_pd_mask(x, underflow, _CMP_LT_OQ);
  return _mm512_maskz_mul_pd(static_cast<__mmask8>(~below), mantissa, two_to_n);
}
#endif

template <class Scalar>
ChunkKeys<Scalar> prepare_chunk_keys(const Matrix<Scalar>& k, const Geometry& geometry,
                                     bool fused) {
  ChunkKeys<Scalar> keys;
  keys.k = &k;
#ifdef HILS_FUSED_CHUNK_MASS
  if constexpr (std::is_same_v<Scalar, double>) {
    if (!fused) return keys;
    const int64_t d = k.cols(), S = geometry.S(), tokens = geometry.tokens_per_chunk();
    keys.width = (tokens + kLanes - 1) / kLanes * kLanes;
    keys.panels.assign(static_cast<size_t>(geometry.n_chunks() * d * keys.width), 0.0);
    for (int64_t c = 0; c < geometry.n_chunks(); ++c) {
      double* panel = keys.panels.data() + c * d * keys.width;
      for (int64_t j = 0; j < tokens; ++j)
        for (int64_t dim = 0; dim < d; ++dim) panel[dim * keys.width + j] = k(c * S + j, dim);
    }
  }
#else
  (void)geometry, (void)fused;
#endif
  return keys;
}

template <class Scalar>
Matrix<Scalar> block_chunk_log_mass(const Matrix<Scalar>& q_rows,
                                    const std::vector<int64_t>& queries,
                                    const QueryBlock& block, const ChunkKeys<Scalar>& keys,
                                    const Geometry& geometry, Scalar scale) {
  const int64_t n = block.size();
  Matrix<Scalar> masses = Matrix<Scalar>::Constant(n, geometry.n_chunks(), neg_inf<Scalar>());
  std::vector<int64_t> candidates(static_cast<size_t>(n));
  int64_t max_candidates = 0;
  for (int64_t i = 0; i < n; ++i) {
    candidates[static_cast<size_t>(i)] =
        geometry.candidate_count(queries[static_cast<size_t>(block.begin + i)]);
    max_candidates = std::max(max_candidates, candidates[static_cast<size_t>(i)]);
  }
#ifdef HILS_FUSED_CHUNK_MASS
  if constexpr (std::is_same_v<Scalar, double>) {
    if (!keys.panels.empty()) {
      fused_chunk_log_mass(q_rows, candidates, max_candidates, keys, geometry, scale, masses);
      return masses;
    }
  }
#endif
  plain_chunk_log_mass(q_rows, candidates, max_candidates, *keys.k, geometry, scale, masses);
  return masses;
}

#define HILS_INSTANTIATE_CHUNK_MASS(S)                                                       \
  template ChunkKeys<S> prepare_chunk_keys<S>(const Matrix<S>&, const Geometry&, bool);      \
  template Matrix<S> block_chunk_log_mass<S>(const Matrix<S>&, const std::vector<int64_t>&,  \
                                             const QueryBlock&, const ChunkKeys<S>&,         \
                                             const Geometry&, S);

HILS_INSTANTIATE_CHUNK_MASS(float)
HILS_INSTANTIATE_CHUNK_MASS(double)
HILS_INSTANTIATE_CHUNK_MASS(long double)

}  // namespace hils::detail
