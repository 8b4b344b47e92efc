#include "blocks.hpp"

#include <type_traits>

#include "tiles.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace hils::detail {

std::vector<int64_t> resolve_queries(const std::vector<int64_t>& queries, int64_t T) {
  if (queries.empty()) {
    std::vector<int64_t> all(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all[static_cast<size_t>(t)] = t;
    return all;
  }
  for (size_t i = 0; i < queries.size(); ++i) {
    require(queries[i] >= 0 && queries[i] < T, "queries[" + std::to_string(i) + "]",
            "a slot in [0, " + std::to_string(T) + ")", std::to_string(queries[i]));
    require(i == 0 || queries[i] > queries[i - 1], "queries[" + std::to_string(i) + "]",
            "strictly ascending slots (greater than " +
                std::to_string(i == 0 ? 0 : queries[i - 1]) + ")",
            std::to_string(queries[i]));
  }
  return queries;
}

void prefer_huge_pages(void* data, size_t bytes) {
#ifdef __linux__
  constexpr uintptr_t kHugePage = uintptr_t(1) << 21;
  const auto begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

std::vector<QueryBlock> partition_queries(const std::vector<int64_t>& queries,
                                          const Geometry& geometry) {
  // A block's shared window key range is [l(first), last]; cap it near the dense case's span.
  const int64_t max_span = 2 * kQueryBlock + geometry.W() + geometry.S();
  std::vector<QueryBlock> blocks;
  const int64_t n = static_cast<int64_t>(queries.size());
  int64_t begin = 0;
  for (int64_t i = 1; i <= n; ++i) {
    bool close = i == n || i - begin == kQueryBlock ||
                 queries[static_cast<size_t>(i)] -
                         geometry.window_left(queries[static_cast<size_t>(begin)]) >
                     max_span;
    if (close) {
      blocks.push_back({begin, i});
      begin = i;
    }
  }
  return blocks;
}

}  // namespace hils::detail

namespace hils {

std::vector<std::pair<int64_t, int64_t>> query_blocks(const std::vector<int64_t>& queries,
                                                      const Geometry& geometry) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const detail::QueryBlock& block : detail::partition_queries(queries, geometry))
    ranges.emplace_back(block.begin, block.end);
  return ranges;
}

}  // namespace hils

namespace hils::detail {

template <class Scalar>
Matrix<Scalar> gather_rows(const Matrix<Scalar>& x, const std::vector<int64_t>& queries,
                           const QueryBlock& block) {
  Matrix<Scalar> rows(block.size(), x.cols());
  for (int64_t i = 0; i < block.size(); ++i)
    rows.row(i) = x.row(queries[static_cast<size_t>(block.begin + i)]);
  return rows;
}

std::vector<int64_t> landmark_columns(const Geometry& geometry, int64_t k0, int64_t n) {
  std::vector<int64_t> columns;
  if (!geometry.landmarks()) return columns;
  // The first landmark slot at or after k0 is the last slot of k0's chunk; then every S slots.
  for (int64_t j = geometry.landmark_slot(geometry.chunk_of(k0)) - k0; j < n; j += geometry.S())
    columns.push_back(j);
  return columns;
}

template <class Scalar>
Scalar log_add_exp(Scalar a, Scalar b) {
  Scalar m = std::max(a, b);
  if (m == neg_inf<Scalar>()) return m;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

namespace {

// Sets logits of keys outside [left_i, t_i] or at landmark slots to -inf. Keys of the block
// are slots [k0, k0 + n).
template <class Scalar>
void mask_logits(Matrix<Scalar>& logits, const std::vector<int64_t>& left,
                 const std::vector<int64_t>& right, int64_t k0, const Geometry& geometry) {
  const int64_t rows = logits.rows(), n = logits.cols();
  const int64_t min_right = *std::min_element(right.begin(), right.end());
  const int64_t max_left = *std::max_element(left.begin(), left.end());
  const auto landmarks = landmark_columns(geometry, k0, n);
  for (const int64_t j : landmarks) logits.col(j).setConstant(neg_inf<Scalar>());
  // Interior block: only landmark columns are masked.
  if (k0 >= max_left && k0 + n - 1 <= min_right) return;
  for (int64_t i = 0; i < rows; ++i)
    mask_outside_range(logits.row(i).data(), n, left[static_cast<size_t>(i)] - k0,
                       right[static_cast<size_t>(i)] - k0);
}

// One streaming-softmax step for one query row over a key block: raises the running max m to
// include the row's logits, turns the logits into exp(logit - m) in place, and rescales the
// running sum l and output row by exp(m_old - m). A row with no valid key yet (m = -inf)
// shifts by 0, so its masked logits give exp(-inf) = 0.
// The maximum is taken lane by lane (exact in any order; NaN logits are skipped as std::max
// skips them, and a zero maximum's sign changes no output) and the exponentials are one vector
// loop; the sum adds the exponentials one by one in key order, as it always has: the order of a
// floating-point sum is part of the result's bits (the reference's outputs stay bit for bit
// what they were before this loop was vectorized, tests/reference/test_reference.cpp).
template <class Scalar, class Row>
void rescale_row(Scalar* logit, int64_t width, Scalar& m, Scalar& l, Row acc_row) {
  Scalar row_max = m;
#pragma omp simd reduction(max : row_max)
  for (int64_t j = 0; j < width; ++j) row_max = logit[j] > row_max ? logit[j] : row_max;
  const Scalar shift = row_max == neg_inf<Scalar>() ? Scalar(0) : row_max;
#pragma omp simd
  for (int64_t j = 0; j < width; ++j) logit[j] = exp_nonpositive(logit[j] - shift);
  Scalar sum = 0;
  for (int64_t j = 0; j < width; ++j) sum += logit[j];
  const Scalar alpha = exp_nonpositive(m - shift);
  l = alpha * l + sum;
  acc_row *= alpha;
  m = row_max;
}

#ifdef HILS_FUSED_KERNELS

// rescale_row for double with exp_nonpositive8: logit[0, width) (width a multiple of 8) in
// place to exp(logit - m_new); l and acc_row[0, dv) rescaled by exp(m - m_new). The sum adds
// lane by lane in key order, then the 8 lanes in a fixed order.
void rescale_row8(double* logit, int64_t width, double& m, double& l, double* acc_row,
                  int64_t dv) {
  __m512d top = _mm512_set1_pd(m);
  for (int64_t j = 0; j < width; j += kLanes) top = _mm512_max_pd(top, _mm512_loadu_pd(logit + j));
  alignas(64) double lanes[kLanes];
  _mm512_store_pd(lanes, top);
  const double row_max = *std::max_element(lanes, lanes + kLanes);
  const double shift = row_max == neg_inf<double>() ? 0.0 : row_max;
  const __m512d shift8 = _mm512_set1_pd(shift);
  __m512d sum = _mm512_setzero_pd();
  for (int64_t j = 0; j < width; j += kLanes) {
    const __m512d p = exp_nonpositive8(_mm512_sub_pd(_mm512_loadu_pd(logit + j), shift8));
    _mm512_storeu_pd(logit + j, p);
    sum = _mm512_add_pd(sum, p);
  }
  _mm512_store_pd(lanes, sum);
  double total = 0;
  for (double lane : lanes) total += lane;
  const double alpha = exp_nonpositive(m - shift);
  l = alpha * l + total;
  for (int64_t c = 0; c < dv; ++c) acc_row[c] *= alpha;
  m = row_max;
}

// The streaming softmax of block_attention for double, fused: per 64 keys, their transpose
// [d x 64] in L1, then per tile of 3 queries the logits (register tile), mask, max, exp and
// rescale while they are in L1, and the weighted values into the tile's output rows. The same
// steps in the same order for any thread count; differs from the plain path by rounding only
// (tests/reference/test_fused_kernels.cpp).
WindowResult<double> fused_block_attention(const Matrix<double>& q_rows,
                                           const std::vector<int64_t>& left,
                                           const std::vector<int64_t>& right,
                                           const Matrix<double>& k, const Matrix<double>& v,
                                           const Geometry& geometry, double scale) {
  constexpr int64_t kKeys = kTileVectors * kLanes;  // keys per step: one register tile wide
  const int64_t n = q_rows.rows(), d = q_rows.cols(), dv = v.cols();
  const int64_t key_begin = *std::min_element(left.begin(), left.end());
  const int64_t key_end = *std::max_element(right.begin(), right.end()) + 1;
  const Matrix<double> q_scaled = q_rows * scale;
  std::vector<double> m(static_cast<size_t>(n), neg_inf<double>()), l(static_cast<size_t>(n), 0.0);
  Matrix<double> acc = Matrix<double>::Zero(n, dv);
  std::vector<double, Eigen::aligned_allocator<double>> keys_t(static_cast<size_t>(d * kKeys)),
      logits(static_cast<size_t>(kTileQueries * kKeys)), column_mask(static_cast<size_t>(kKeys));
  for (int64_t k0 = key_begin; k0 < key_end; k0 += kKeys) {
    const int64_t width = std::min(kKeys, key_end - k0);
    const int64_t padded = (width + kLanes - 1) / kLanes * kLanes;
    transpose_rows(k.row(k0).data(), d, width, d, keys_t.data(), padded);
    const bool columns_masked = key_column_mask(geometry, k0, width, padded, column_mask.data());
    for (int64_t i = 0; i < n; i += kTileQueries) {
      const int64_t count = std::min<int64_t>(kTileQueries, n - i);
      // A tile whose queries attend none of these keys skips them.
      bool any = false;
      for (int64_t r = 0; r < count; ++r)
        any |= left[static_cast<size_t>(i + r)] < k0 + width && right[static_cast<size_t>(i + r)] >= k0;
      if (!any) continue;
      chunk_logits_rows(count, q_scaled.row(i).data(), d, keys_t.data(), padded, logits.data());
      for (int64_t r = 0; r < count; ++r) {
        double* row = logits.data() + r * padded;
        const auto at = static_cast<size_t>(i + r);
        mask_row(row, k0, width, padded, left[at], right[at], column_mask.data(), columns_masked);
        rescale_row8(row, padded, m[at], l[at], acc.row(i + r).data(), dv);
      }
      weighted_values_rows(count, logits.data(), padded, width, v.row(k0).data(), dv,
                           acc.row(i).data(), acc.cols());
    }
  }
  WindowResult<double> out;
  const Eigen::Map<const Vector<double>> m_map(m.data(), n), l_map(l.data(), n);
  out.o = l_map.cwiseInverse().asDiagonal() * acc;
  out.lse = m_map + l_map.array().log().matrix();
  return out;
}

#endif  // HILS_FUSED_KERNELS

}  // namespace

template <class Scalar>
WindowResult<Scalar> block_attention(const Matrix<Scalar>& q_rows,
                                     const std::vector<int64_t>& queries,
                                     const QueryBlock& block, const Matrix<Scalar>& k,
                                     const Matrix<Scalar>& v, const Geometry& geometry,
                                     Scalar scale, bool window_only) {
  const int64_t n = block.size();
  std::vector<int64_t> left(static_cast<size_t>(n)), right(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = queries[static_cast<size_t>(block.begin + i)];
    left[static_cast<size_t>(i)] = window_only ? geometry.window_left(t) : 0;
    right[static_cast<size_t>(i)] = t;
  }
#ifdef HILS_FUSED_KERNELS
  if constexpr (std::is_same_v<Scalar, double>)
    return fused_block_attention(q_rows, left, right, k, v, geometry, scale);
#endif
  const int64_t key_begin = *std::min_element(left.begin(), left.end());
  const int64_t key_end = *std::max_element(right.begin(), right.end()) + 1;

  const Matrix<Scalar> q_scaled = q_rows * scale;
  Vector<Scalar> m = Vector<Scalar>::Constant(n, neg_inf<Scalar>());
  Vector<Scalar> l = Vector<Scalar>::Zero(n);
  Matrix<Scalar> acc = Matrix<Scalar>::Zero(n, v.cols());
  Matrix<Scalar> logits;
  for (int64_t k0 = key_begin; k0 < key_end; k0 += kKeyBlock) {
    const int64_t width = std::min(kKeyBlock, key_end - k0);
    logits.noalias() = q_scaled * k.middleRows(k0, width).transpose();
    mask_logits(logits, left, right, k0, geometry);
    for (int64_t i = 0; i < n; ++i)
      rescale_row(logits.row(i).data(), width, m(i), l(i), acc.row(i));
    acc.noalias() += logits * v.middleRows(k0, width);
  }
  WindowResult<Scalar> out;
  out.o = l.cwiseInverse().asDiagonal() * acc;
  out.lse = m + l.array().log().matrix();
  return out;
}

namespace {

// a b^T, each entry's sum taken in the order k = 0, 1, ..., d-1 whatever the entry's place:
// out(i, c) = (...((a(i,0) b(c,0)) + a(i,1) b(c,1)) + ...). Eigen's blocked product sums an
// entry in an order that depends on where its column falls in the kernel's blocking (on an AVX2
// machine, columns 12-15 of 18 in another order than 0-11), so two chunks with the same summary
// scored an ulp apart and a tie went to the higher chunk, against reference/SEMANTICS.md §4
// (ties to the lower index). The loop over c runs the same operation in every lane.
template <class Scalar>
Matrix<Scalar> ordered_product(const Matrix<Scalar>& a, const Matrix<Scalar>& b) {
  const int64_t n = a.rows(), m = b.rows(), d = a.cols();
  const Matrix<Scalar> bt = b.transpose();  // [d x m]: row k holds b(., k)
  Matrix<Scalar> out = Matrix<Scalar>::Zero(n, m);
  for (int64_t i = 0; i < n; ++i) {
    Scalar* row = out.row(i).data();
    for (int64_t k = 0; k < d; ++k) {
      const Scalar x = a(i, k);
      const Scalar* column = bt.row(k).data();
      for (int64_t c = 0; c < m; ++c) row[c] += x * column[c];
    }
  }
  return out;
}

}  // namespace

template <class Scalar>
Matrix<Scalar> block_surrogate_scores(const Matrix<Scalar>& q_retrieval_rows,
                                      const std::vector<int64_t>& queries,
                                      const QueryBlock& block,
                                      const ChunkSummaries<Scalar>& summaries,
                                      const Geometry& geometry, Scalar scale) {
  Matrix<Scalar> scores = ordered_product<Scalar>(q_retrieval_rows * scale, summaries.key);
  scores.rowwise() += summaries.bias.transpose();
  for (int64_t i = 0; i < block.size(); ++i) {
    const int64_t count = geometry.candidate_count(queries[static_cast<size_t>(block.begin + i)]);
    scores.row(i).tail(scores.cols() - count).setConstant(neg_inf<Scalar>());
  }
  return scores;
}

BlockSelections group_selections(const std::vector<const int32_t*>& selected, int64_t K,
                                 int64_t n_chunks) {
  BlockSelections out;
  std::vector<int64_t> group(static_cast<size_t>(n_chunks), -1);  // chunk -> its index in chunks
  out.row_begin.push_back(0);
  for (size_t i = 0; i < selected.size(); ++i) {
    for (int64_t s = 0; s < K; ++s) {
      const int32_t c = selected[i][s];
      if (c < 0) continue;
      require(c < n_chunks, "selection", "a chunk below " + std::to_string(n_chunks),
              std::to_string(c));
      auto& at = group[static_cast<size_t>(c)];
      if (at < 0) {
        at = static_cast<int64_t>(out.chunks.size());
        out.chunks.push_back({c, {}});
      }
      const auto e = static_cast<int64_t>(out.row.size());
      out.chunks[static_cast<size_t>(at)].selections.push_back(e);
      out.row.push_back(static_cast<int64_t>(i));
      out.slot.push_back(s);
    }
    out.row_begin.push_back(static_cast<int64_t>(out.row.size()));
  }
  return out;
}

template <class Scalar>
Matrix<Scalar> gather_selected(const Matrix<Scalar>& x_rows, const BlockSelections& block,
                               const std::vector<int64_t>& selections) {
  Matrix<Scalar> out(static_cast<int64_t>(selections.size()), x_rows.cols());
  for (size_t r = 0; r < selections.size(); ++r)
    out.row(static_cast<int64_t>(r)) = x_rows.row(block.row[static_cast<size_t>(selections[r])]);
  return out;
}

template <class Scalar>
Matrix<Scalar> chunk_logits(const Matrix<Scalar>& q_selected, const Matrix<Scalar>& k,
                            int64_t chunk, const Geometry& geometry, Scalar scale) {
  Matrix<Scalar> logits;
  logits.noalias() =
      (q_selected * k.middleRows(chunk * geometry.S(), geometry.tokens_per_chunk()).transpose()) *
      scale;
  return logits;
}

template <class Scalar>
void attend_chunk(const Matrix<Scalar>& q_rows, const BlockSelections& block,
                  const BlockSelections::Chunk& chunk, const Matrix<Scalar>& k,
                  const Matrix<Scalar>& v, const Geometry& geometry, Scalar scale,
                  SelectedAttention<Scalar>& out) {
  // p = exp(logits - row max) in place, then o_c = (p . V) / sum p, row by row.
  Matrix<Scalar> p = chunk_logits(gather_selected(q_rows, block, chunk.selections), k,
                                  chunk.chunk, geometry, scale);
  Vector<Scalar> total(p.rows());
  for (int64_t r = 0; r < p.rows(); ++r) {
    const Scalar row_max = p.row(r).maxCoeff();
    p.row(r) = (p.row(r).array() - row_max).exp().matrix();
    total(r) = p.row(r).sum();
    out.log_mass(chunk.selections[static_cast<size_t>(r)]) = row_max + std::log(total(r));
  }
  const Matrix<Scalar> weighted =
      p * v.middleRows(chunk.chunk * geometry.S(), geometry.tokens_per_chunk());
  for (int64_t r = 0; r < p.rows(); ++r)
    out.o.row(chunk.selections[static_cast<size_t>(r)]) = weighted.row(r) / total(r);
}

template <class Scalar>
SelectedAttention<Scalar> attend_selected(const Matrix<Scalar>& q_rows,
                                          const BlockSelections& block,
                                          const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                          const Geometry& geometry, Scalar scale) {
  const auto selections = static_cast<int64_t>(block.row.size());
  SelectedAttention<Scalar> out;
  out.log_mass.resize(selections);
  out.o.resize(selections, v.cols());
  for (const auto& chunk : block.chunks)
    attend_chunk(q_rows, block, chunk, k, v, geometry, scale, out);
  return out;
}

#define HILS_INSTANTIATE_BLOCKS(S)                                                          \
  template Matrix<S> gather_rows<S>(const Matrix<S>&, const std::vector<int64_t>&,          \
                                    const QueryBlock&);                                     \
  template S log_add_exp<S>(S, S);                                                          \
  template WindowResult<S> block_attention<S>(const Matrix<S>&, const std::vector<int64_t>&, \
                                              const QueryBlock&, const Matrix<S>&,          \
                                              const Matrix<S>&, const Geometry&, S, bool);  \
  template Matrix<S> block_surrogate_scores<S>(                                             \
      const Matrix<S>&, const std::vector<int64_t>&, const QueryBlock&,                     \
      const ChunkSummaries<S>&, const Geometry&, S);                                        \
  template Matrix<S> gather_selected<S>(const Matrix<S>&, const BlockSelections&,          \
                                        const std::vector<int64_t>&);                       \
  template Matrix<S> chunk_logits<S>(const Matrix<S>&, const Matrix<S>&, int64_t,           \
                                     const Geometry&, S);                                   \
  template void attend_chunk<S>(const Matrix<S>&, const BlockSelections&,                  \
                                const BlockSelections::Chunk&, const Matrix<S>&,            \
                                const Matrix<S>&, const Geometry&, S, SelectedAttention<S>&); \
  template SelectedAttention<S> attend_selected<S>(const Matrix<S>&, const BlockSelections&, \
                                                   const Matrix<S>&, const Matrix<S>&,      \
                                                   const Geometry&, S);

HILS_INSTANTIATE_BLOCKS(float)
HILS_INSTANTIATE_BLOCKS(double)
HILS_INSTANTIATE_BLOCKS(long double)

}  // namespace hils::detail
