#include "chunk_mass.hpp"

#include "tiles.hpp"

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

#ifdef HILS_FUSED_KERNELS

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
      chunk_logits_rows(count, q_scaled.row(i).data(), d, panel, width, logits.data());
      for (int64_t r = 0; r < count; ++r)
        if (c < candidates[static_cast<size_t>(i + r)])
          masses(i + r, c) = log_sum_exp(logits.data() + r * width, tokens);
    }
  }
}

#endif  // HILS_FUSED_KERNELS

}  // namespace

template <class Scalar>
ChunkKeys<Scalar> prepare_chunk_keys(const Matrix<Scalar>& k, const Geometry& geometry,
                                     bool fused) {
  ChunkKeys<Scalar> keys;
  keys.k = &k;
#ifdef HILS_FUSED_KERNELS
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
#ifdef HILS_FUSED_KERNELS
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
