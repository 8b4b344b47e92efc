// The fusion stage (reference/SEMANTICS.md §5, Eq. 3 and 10): the one implementation, called by
// run_mechanism (a query block's rows at a time) and by the oracle's forced fusion (fuse, a row).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "blocks.hpp"
#include "hils/fuse_rows.hpp"

namespace hils {

namespace detail {

template <class Scalar>
void fuse_selected(const MechanismSpec& spec, const FusionRow<Scalar>& row,
                   const BlockSelections& block, const SelectedAttention<Scalar>& chunks,
                   int64_t i, Eigen::Ref<RowVector<Scalar>> o, Scalar& lse,
                   Eigen::Ref<RowVector<Scalar>> weights) {
  // K selected chunks + window -> o [dv], lse, weights [K+2] (Eq. 3 flat, Eq. 10 hierarchical).
  const int64_t K = row.K;
  const bool flat = spec.fusion == Fusion::flat;
  // The row's selections (not -1 padding), in slot order: at most the candidates, however large
  // K is. Their outputs only are held, so a K far beyond the chunk count costs K + 2 logits,
  // not K x dv.
  const int64_t first = block.row_begin[static_cast<size_t>(i)];
  const int64_t m = block.row_begin[static_cast<size_t>(i) + 1] - first;
  // logits: the selected chunks' (-inf for padding), the window's, and the optional zero logit.
  Vector<Scalar> logits = Vector<Scalar>::Constant(K + 2, neg_inf<Scalar>());
  for (int64_t j = 0; j < m; ++j) {
    const int64_t s = block.slot[static_cast<size_t>(first + j)];
    logits(s) = flat ? chunks.log_mass(first + j) : row.scores[row.selected[s]];
  }
  logits(K) = row.lse_window;
  if (spec.softmax1 && spec.fusion == Fusion::hierarchical) logits(K + 1) = Scalar(0);
  const Scalar top = logits.maxCoeff();
  lse = top + std::log((logits.array() - top).exp().sum());
  weights = (logits.array() - lse).exp().matrix().transpose();
  RowVector<Scalar> chosen_weights(m);
  for (int64_t j = 0; j < m; ++j)
    chosen_weights(j) = weights(block.slot[static_cast<size_t>(first + j)]);
  o = chosen_weights * chunks.o.middleRows(first, m) + weights(K) * row.o_window;
}

}  // namespace detail

namespace {

// "[rows x cols]" of a shape, as the errors below show it.
std::string shape_text(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + " x " + std::to_string(cols) + "]";
}

// fuse's arguments against each other, before any is read or written: a weights or o buffer
// shorter than K + 2 or dv was written past its end (heap corruption), and hierarchical fusion
// read a null scores pointer (a segfault). The row's chunks are checked by group_selections.
template <class Scalar>
void require_fusion_row(const MechanismSpec& spec, const FusionRow<Scalar>& row,
                        const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                        const Geometry& geometry, const Eigen::Ref<RowVector<Scalar>>& o,
                        const Eigen::Ref<RowVector<Scalar>>& weights) {
  // fuse runs once per row in the oracle's forced fusion: the messages are built only for a
  // failing check.
  const auto d = k.cols(), dv = v.cols();
  if (k.rows() != geometry.T() || v.rows() != geometry.T())
    require(false, "k, v", "T = " + std::to_string(geometry.T()) + " rows each (the geometry's slots)",
            shape_text(k.rows(), d) + " and " + shape_text(v.rows(), dv));
  if (row.q.size() != d)
    require(false, "row.q", "d = " + std::to_string(d) + " entries (k's columns)",
            std::to_string(row.q.size()));
  if (row.K < 0 || (row.K > 0 && !row.selected))
    require(false, "row.selected, row.K", "K >= 0 chunk slots (selected not null when K > 0)",
            "K = " + std::to_string(row.K));
  if (row.o_window.size() != dv)
    require(false, "row.o_window", "dv = " + std::to_string(dv) + " entries (v's columns)",
            std::to_string(row.o_window.size()));
  if (o.size() != dv)
    require(false, "o", "dv = " + std::to_string(dv) + " entries (v's columns)",
            std::to_string(o.size()));
  if (weights.size() != row.K + 2)
    require(false, "weights", "K + 2 = " + std::to_string(row.K + 2) + " entries",
            std::to_string(weights.size()));
  // A row with no chunk selected (K = 0, all padding, no chunk yet) reads no score.
  const bool any_chunk =
      std::any_of(row.selected, row.selected + row.K, [](int32_t c) { return c >= 0; });
  require(spec.fusion != Fusion::hierarchical || row.scores || !any_chunk, "row.scores",
          "the surrogate scores of every chunk for hierarchical fusion", "null");
}

}  // namespace

template <class Scalar>
void fuse(const MechanismSpec& spec, const FusionRow<Scalar>& row, const Matrix<Scalar>& k,
          const Matrix<Scalar>& v, const Geometry& geometry, Scalar scale,
          Eigen::Ref<RowVector<Scalar>> o, Scalar& lse, Eigen::Ref<RowVector<Scalar>> weights) {
  require_fusion_row(spec, row, k, v, geometry, o, weights);
  const auto block = detail::group_selections({row.selected}, row.K, geometry.n_chunks());
  const Matrix<Scalar> q = row.q.transpose();
  const auto chunks = detail::attend_selected(q, block, k, v, geometry, scale);
  detail::fuse_selected(spec, row, block, chunks, 0, o, lse, weights);
}

template <class Scalar>
void fuse_rows(const MechanismSpec& spec, const std::vector<FusionRow<Scalar>>& rows,
               const Matrix<Scalar>& k, const Matrix<Scalar>& v, const Geometry& geometry,
               Scalar scale, Eigen::Ref<Matrix<Scalar>> o, Eigen::Ref<Vector<Scalar>> lse,
               Eigen::Ref<Matrix<Scalar>> weights) {
  const auto n = static_cast<int64_t>(rows.size());
  if (o.rows() != n || lse.size() != n || weights.rows() != n)
    require(false, "o, lse, weights", std::to_string(n) + " rows each (one per fusion row)",
            std::to_string(o.rows()) + ", " + std::to_string(lse.size()) + " and " +
                std::to_string(weights.rows()));
  // Each row as `fuse` takes it: its selections grouped alone, its query as a [1 x d] matrix,
  // its chunks' statistics sized for its own selections.
  std::vector<detail::BlockSelections> blocks;
  std::vector<Matrix<Scalar>> queries;
  std::vector<detail::SelectedAttention<Scalar>> chunks(rows.size());
  struct Pending {
    int64_t chunk, row;
    size_t index;  // the chunk's place in blocks[row].chunks
  };
  std::vector<Pending> pending;
  for (int64_t i = 0; i < n; ++i) {
    const auto& row = rows[static_cast<size_t>(i)];
    require_fusion_row(spec, row, k, v, geometry, Eigen::Ref<RowVector<Scalar>>(o.row(i)),
                       Eigen::Ref<RowVector<Scalar>>(weights.row(i)));
    blocks.push_back(detail::group_selections({row.selected}, row.K, geometry.n_chunks()));
    queries.push_back(row.q.transpose());
    auto& stats = chunks[static_cast<size_t>(i)];
    stats.log_mass.resize(static_cast<int64_t>(blocks.back().row.size()));
    stats.o.resize(static_cast<int64_t>(blocks.back().row.size()), v.cols());
    for (size_t c = 0; c < blocks.back().chunks.size(); ++c)
      pending.push_back({blocks.back().chunks[c].chunk, i, c});
  }
  // Chunk by chunk: the rows that selected a chunk read its keys and values one after another.
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.chunk < b.chunk; });
  for (const Pending& p : pending) {
    const auto r = static_cast<size_t>(p.row);
    detail::attend_chunk(queries[r], blocks[r], blocks[r].chunks[p.index], k, v, geometry, scale,
                         chunks[r]);
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto r = static_cast<size_t>(i);
    detail::fuse_selected<Scalar>(spec, rows[r], blocks[r], chunks[r], 0, o.row(i), lse(i),
                                  weights.row(i));
  }
}

#define HILS_INSTANTIATE_FUSE(S)                                                            \
  template void fuse<S>(const MechanismSpec&, const FusionRow<S>&, const Matrix<S>&,        \
                        const Matrix<S>&, const Geometry&, S, Eigen::Ref<RowVector<S>>, S&, \
                        Eigen::Ref<RowVector<S>>);                                          \
  template void fuse_rows<S>(const MechanismSpec&, const std::vector<FusionRow<S>>&,         \
                             const Matrix<S>&, const Matrix<S>&, const Geometry&, S,          \
                             Eigen::Ref<Matrix<S>>, Eigen::Ref<Vector<S>>,                    \
                             Eigen::Ref<Matrix<S>>);                                          \
  template void detail::fuse_selected<S>(                                                   \
      const MechanismSpec&, const FusionRow<S>&, const detail::BlockSelections&,            \
      const detail::SelectedAttention<S>&, int64_t, Eigen::Ref<RowVector<S>>, S&,           \
      Eigen::Ref<RowVector<S>>);

HILS_INSTANTIATE_FUSE(float)
HILS_INSTANTIATE_FUSE(double)
HILS_INSTANTIATE_FUSE(long double)

}  // namespace hils
