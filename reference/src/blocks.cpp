#include "blocks.hpp"

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

template <class Scalar>
Matrix<Scalar> gather_rows(const Matrix<Scalar>& x, const std::vector<int64_t>& queries,
                           const QueryBlock& block) {
  Matrix<Scalar> rows(block.size(), x.cols());
  for (int64_t i = 0; i < block.size(); ++i)
    rows.row(i) = x.row(queries[static_cast<size_t>(block.begin + i)]);
  return rows;
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
  if (k0 >= max_left && k0 + n - 1 <= min_right) {
    // Interior block: only landmark columns are masked.
    if (!geometry.landmarks()) return;
    for (int64_t j = 0; j < n; ++j)
      if (geometry.is_landmark(k0 + j)) logits.col(j).setConstant(neg_inf<Scalar>());
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = k0 + j;
      if (slot < left[static_cast<size_t>(i)] || slot > right[static_cast<size_t>(i)] ||
          geometry.is_landmark(slot))
        logits(i, j) = neg_inf<Scalar>();
    }
  }
}

// One streaming-softmax step for one query row over a key block: raises the running max m to
// include the row's logits, turns the logits into exp(logit - m) in place, and rescales the
// running sum l and output row by exp(m_old - m). A row with no valid key yet (m = -inf)
// shifts by 0, so its masked logits give exp(-inf) = 0.
template <class Scalar, class Row>
void rescale_row(Scalar* logit, int64_t width, Scalar& m, Scalar& l, Row acc_row) {
  Scalar row_max = m;
#pragma omp simd reduction(max : row_max)
  for (int64_t j = 0; j < width; ++j) row_max = std::max(row_max, logit[j]);
  const Scalar shift = row_max == neg_inf<Scalar>() ? Scalar(0) : row_max;
  Scalar sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < width; ++j) {
    logit[j] = exp_nonpositive(logit[j] - shift);
    sum += logit[j];
  }
  const Scalar alpha = exp_nonpositive(m - shift);
  l = alpha * l + sum;
  acc_row *= alpha;
  m = row_max;
}

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

template <class Scalar>
Matrix<Scalar> block_surrogate_scores(const Matrix<Scalar>& q_retrieval_rows,
                                      const std::vector<int64_t>& queries,
                                      const QueryBlock& block,
                                      const ChunkSummaries<Scalar>& summaries,
                                      const Geometry& geometry, Scalar scale) {
  Matrix<Scalar> scores = (q_retrieval_rows * scale) * summaries.key.transpose();
  scores.rowwise() += summaries.bias.transpose();
  for (int64_t i = 0; i < block.size(); ++i) {
    const int64_t count = geometry.candidate_count(queries[static_cast<size_t>(block.begin + i)]);
    scores.row(i).tail(scores.cols() - count).setConstant(neg_inf<Scalar>());
  }
  return scores;
}

template <class Scalar>
ChunkAttention<Scalar> attend_chunk(const Eigen::Ref<const Vector<Scalar>>& q_row,
                                    const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                    int64_t chunk, const Geometry& geometry, Scalar scale) {
  const int64_t first = chunk * geometry.S(), tokens = geometry.tokens_per_chunk();
  Vector<Scalar> logits = (k.middleRows(first, tokens) * q_row) * scale;
  const Scalar row_max = logits.maxCoeff();
  Vector<Scalar> p = (logits.array() - row_max).exp().matrix();
  const Scalar total = p.sum();
  ChunkAttention<Scalar> out;
  out.log_mass = row_max + std::log(total);
  out.o = (v.middleRows(first, tokens).transpose() * p) / total;
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
  template ChunkAttention<S> attend_chunk<S>(const Eigen::Ref<const Vector<S>>&,            \
                                             const Matrix<S>&, const Matrix<S>&, int64_t,   \
                                             const Geometry&, S);

HILS_INSTANTIATE_BLOCKS(float)
HILS_INSTANTIATE_BLOCKS(double)
HILS_INSTANTIATE_BLOCKS(long double)

}  // namespace hils::detail
