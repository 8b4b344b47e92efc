#include <cmath>
#include <string>

#include "hils/attention.hpp"

namespace hils {
namespace {

std::string shape(int64_t rows, int64_t cols) {
  return std::string("[") + std::to_string(rows) + " x " + std::to_string(cols) + "]";
}

template <class Scalar>
void require_heads(const std::vector<Matrix<Scalar>>& heads, const std::string& field,
                   int64_t rows, int64_t cols) {
  for (size_t h = 0; h < heads.size(); ++h) {
    const std::string name = field + "[" + std::to_string(h) + "]";
    require(heads[h].rows() == rows && heads[h].cols() == cols, name, shape(rows, cols),
            shape(heads[h].rows(), heads[h].cols()));
    require(heads[h].allFinite(), name, "finite values", "NaN or Inf");
  }
}

}  // namespace

template <class Scalar>
void AttentionInputs<Scalar>::validate(const MechanismSpec& spec) const {
  require(!q.empty(), "q", "at least one query head", "none");
  require(!k.empty(), "k", "at least one key/value head", "none");
  require(v.size() == k.size(), "v", std::to_string(k.size()) + " heads (as many as k)",
          std::to_string(v.size()));
  require(Hq() % Hkv() == 0, "Hq", "a multiple of Hkv = " + std::to_string(Hkv()),
          std::to_string(Hq()));
  const int64_t t = T(), dk = d(), dval = dv();
  require(t >= 1 && dk >= 1, "q[0]", "at least 1 slot and 1 dim", shape(t, dk));
  require(dval >= 1, "v[0]", "at least 1 value dim", shape(v.front().rows(), dval));
  require_heads(q, "q", t, dk);
  require_heads(k, "k", t, dk);
  require_heads(v, "v", t, dval);
  if (!q_retrieval.empty()) {
    require(static_cast<int64_t>(q_retrieval.size()) == Hq(), "q_retrieval",
            std::to_string(Hq()) + " heads or none", std::to_string(q_retrieval.size()));
    require_heads(q_retrieval, "q_retrieval", t, dk);
  }
  if (!spec.needs_prior() || spec.prior_rule == PriorRule::landmark_query) return;
  require(static_cast<int64_t>(prior.size()) == Hq(), "prior",
          std::to_string(Hq()) + " heads for prior_rule " + to_string(spec.prior_rule),
          std::to_string(prior.size()));
  const int64_t chunks = t / spec.S;
  for (size_t h = 0; h < prior.size(); ++h) {
    const std::string name = "prior[" + std::to_string(h) + "]";
    const bool shared_row = spec.prior_rule == PriorRule::shared && prior[h].rows() == 1;
    require((shared_row || prior[h].rows() == chunks) && prior[h].cols() == dk, name,
            spec.prior_rule == PriorRule::shared ? shape(1, dk) + " or " + shape(chunks, dk)
                                                 : shape(chunks, dk),
            shape(prior[h].rows(), prior[h].cols()));
    require(prior[h].allFinite(), name, "finite values", "NaN or Inf");
  }
}

template <class Scalar>
AttentionInputs<Scalar> apply_positional_encoding(const AttentionInputs<Scalar>& raw,
                                                  const Geometry& geometry,
                                                  const PositionalEncoding& pe) {
  pe.validate(raw.d());
  require(raw.T() == geometry.T(), "geometry.T", "the inputs' " + std::to_string(raw.T()) +
          " slots", std::to_string(geometry.T()));
  AttentionInputs<Scalar> out = raw;
  const std::vector<int64_t> positions = geometry.position_ids();
  for (auto* heads : {&out.q, &out.k, &out.q_retrieval})
    for (auto& x : *heads) apply_rotary(x, positions, pe);
  // A one-row shared prior becomes one row per chunk, rotated where the chunk's landmark sits.
  std::vector<int64_t> chunk_positions(static_cast<size_t>(geometry.n_chunks()));
  for (int64_t c = 0; c < geometry.n_chunks(); ++c)
    chunk_positions[static_cast<size_t>(c)] = geometry.position_id(geometry.landmark_slot(c));
  for (auto& p : out.prior) {
    if (p.rows() != 1) continue;
    Matrix<Scalar> rows = p.replicate(geometry.n_chunks(), 1);
    apply_rotary(rows, chunk_positions, pe);
    p = std::move(rows);
  }
  return out;
}

template <class Scalar>
Matrix<Scalar> calibrated_query(const Matrix<Scalar>& q, const Matrix<Scalar>& hidden,
                                const Matrix<Scalar>& w_up, const Matrix<Scalar>& w_down) {
  require(hidden.rows() == q.rows(), "hidden", std::to_string(q.rows()) + " rows (one per slot)",
          std::to_string(hidden.rows()));
  require(w_up.rows() == q.cols(), "w_up", std::to_string(q.cols()) + " rows (d)",
          std::to_string(w_up.rows()));
  require(w_down.rows() == w_up.cols(), "w_down", std::to_string(w_up.cols()) + " rows (rank r)",
          std::to_string(w_down.rows()));
  require(w_down.cols() == hidden.cols(), "w_down",
          std::to_string(hidden.cols()) + " columns (d_model)", std::to_string(w_down.cols()));
  // Row form of Eq. 11: q~_t = q_t + (W_up W_down h_t)^T.
  return q + (hidden * w_down.transpose()) * w_up.transpose();
}

#define HILS_INSTANTIATE_INPUTS(S)                                                         \
  template struct AttentionInputs<S>;                                                      \
  template AttentionInputs<S> apply_positional_encoding<S>(                                \
      const AttentionInputs<S>&, const Geometry&, const PositionalEncoding&);              \
  template Matrix<S> calibrated_query<S>(const Matrix<S>&, const Matrix<S>&, const Matrix<S>&, \
                                         const Matrix<S>&);

HILS_INSTANTIATE_INPUTS(float)
HILS_INSTANTIATE_INPUTS(double)
HILS_INSTANTIATE_INPUTS(long double)

}  // namespace hils
