// The fusion stage (reference/SEMANTICS.md §5, Eq. 3 and 10): the one implementation, called by
// run_mechanism and by the oracle's forced fusion.
#include <cmath>
#include <vector>

#include "blocks.hpp"

namespace hils {

template <class Scalar>
void fuse(const MechanismSpec& spec, const FusionRow<Scalar>& row, const Matrix<Scalar>& k,
          const Matrix<Scalar>& v, const Geometry& geometry, Scalar scale,
          Eigen::Ref<RowVector<Scalar>> o, Scalar& lse, Eigen::Ref<RowVector<Scalar>> weights) {
  // K selected chunks + window -> o [dv], lse, weights [K+2] (Eq. 3 flat, Eq. 10 hierarchical).
  const int64_t K = row.K;
  const bool flat = spec.fusion == Fusion::flat;
  // The selected entries (not -1 padding): at most the candidates, however large K is. Their
  // outputs only are held, so a K far beyond the chunk count costs K + 2 logits, not K x dv.
  std::vector<int64_t> chosen;
  for (int64_t s = 0; s < K; ++s)
    if (row.selected[s] >= 0) chosen.push_back(s);
  const auto m = static_cast<Eigen::Index>(chosen.size());
  // logits: the selected chunks' (-inf for padding), the window's, and the optional zero logit.
  Vector<Scalar> logits = Vector<Scalar>::Constant(K + 2, detail::neg_inf<Scalar>());
  Matrix<Scalar> chunk_out(m, v.cols());
  for (Eigen::Index j = 0; j < m; ++j) {
    const int64_t s = chosen[static_cast<size_t>(j)];
    const int32_t c = row.selected[s];
    auto chunk = detail::attend_chunk<Scalar>(row.q, k, v, c, geometry, scale);
    logits(s) = flat ? chunk.log_mass : row.scores[c];
    chunk_out.row(j) = chunk.o.transpose();
  }
  logits(K) = row.lse_window;
  if (spec.softmax1 && spec.fusion == Fusion::hierarchical) logits(K + 1) = Scalar(0);
  const Scalar top = logits.maxCoeff();
  lse = top + std::log((logits.array() - top).exp().sum());
  weights = (logits.array() - lse).exp().matrix().transpose();
  RowVector<Scalar> chosen_weights(m);
  for (Eigen::Index j = 0; j < m; ++j) chosen_weights(j) = weights(chosen[static_cast<size_t>(j)]);
  o = chosen_weights * chunk_out + weights(K) * row.o_window;
}

#define HILS_INSTANTIATE_FUSE(S)                                                          \
  template void fuse<S>(const MechanismSpec&, const FusionRow<S>&, const Matrix<S>&,      \
                        const Matrix<S>&, const Geometry&, S, Eigen::Ref<RowVector<S>>, S&, \
                        Eigen::Ref<RowVector<S>>);

HILS_INSTANTIATE_FUSE(float)
HILS_INSTANTIATE_FUSE(double)
HILS_INSTANTIATE_FUSE(long double)

}  // namespace hils
