#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "hils/attention.hpp"

namespace hils {
namespace {

std::string shape(int64_t rows, int64_t cols) {
  return std::string("[") + std::to_string(rows) + " x " + std::to_string(cols) + "]";
}

// Throws InvalidArgument naming the first NaN or Inf element, e.g. "q[1](5, 2)".
template <class Scalar>
void require_finite(const Matrix<Scalar>& x, const std::string& name) {
  // x - x is 0 for a finite entry and NaN for NaN or +-Inf, so the sum is NaN iff some entry is
  // not finite: one vectorized pass. (Eigen's allFinite tests entry by entry with a branch:
  // 107 ms against 6.8 ms for eight 65536 x 64 double heads, measured in session 19; the
  // studies validate whole inputs once per mechanism and needle depth.)
  if (!std::isnan((x.array() - x.array()).sum())) return;
  for (int64_t i = 0; i < x.rows(); ++i)
    for (int64_t j = 0; j < x.cols(); ++j)
      if (!std::isfinite(x(i, j)))
        throw InvalidArgument(name + "(" + std::to_string(i) + ", " + std::to_string(j) +
                              "): expected a finite value, got " +
                              (std::isnan(x(i, j)) ? "NaN" : x(i, j) > 0 ? "+Inf" : "-Inf"));
}

// The largest Euclidean row norm over every head. Squared norms first (one cheap pass); rows
// whose square overflows are measured again with Eigen's overflow-safe blueNorm.
template <class Scalar>
long double max_row_norm(const std::vector<Matrix<Scalar>>& heads) {
  long double top = 0;
  for (const auto& x : heads) {
    const Vector<Scalar> squares = x.rowwise().squaredNorm();
    for (int64_t i = 0; i < x.rows(); ++i) {
      const long double norm = std::isfinite(squares(i))
                                   ? std::sqrt(static_cast<long double>(squares(i)))
                                   : static_cast<long double>(x.row(i).blueNorm());
      top = std::max(top, norm);
    }
  }
  return top;
}

// Refuses inputs whose logits sigma q.k (or sigma mu.k of the prior) can leave the Scalar range:
// their log-sum-exp, and so lse and the softmax, would not be representable. The bound is
// sigma max|q| max|k| (Cauchy-Schwarz), with max(sigma, 1) because the dot product is formed
// before it is scaled; half the range is kept for the rounding of the sums.
template <class Scalar>
void require_representable_logits(const AttentionInputs<Scalar>& in, double scale,
                                  bool reads_prior) {
  long double queries = std::max(max_row_norm(in.q), max_row_norm(in.q_retrieval));
  if (reads_prior) queries = std::max(queries, max_row_norm(in.prior));
  const long double keys = max_row_norm(in.k);
  const long double bound = queries * keys * std::max<long double>(scale, 1.0L);
  const long double limit = static_cast<long double>(std::numeric_limits<Scalar>::max()) / 2;
  if (bound < limit) return;
  std::ostringstream expected, found;
  expected.precision(3);
  found.precision(3);
  expected << "logits scale * q . k below " << limit
           << " (half the working precision's range), so that their log-sum-exp lse is "
              "representable";
  found << "|logit| up to " << bound << " (max |q| = " << queries << ", max |k| = " << keys
        << ", scale = " << scale << "); rescale q or k";
  require(false, "q, k", expected.str(), found.str());
}

template <class Scalar>
void require_heads(const std::vector<Matrix<Scalar>>& heads, const std::string& field,
                   int64_t rows, int64_t cols) {
  for (size_t h = 0; h < heads.size(); ++h) {
    const std::string name = field + "[" + std::to_string(h) + "]";
    require(heads[h].rows() == rows && heads[h].cols() == cols, name, shape(rows, cols),
            shape(heads[h].rows(), heads[h].cols()));
    require_finite(heads[h], name);
  }
}

// Shapes and values of inputs.prior under the shared and given rules.
template <class Scalar>
void require_prior(const AttentionInputs<Scalar>& in, const MechanismSpec& spec) {
  require(static_cast<int64_t>(in.prior.size()) == in.Hq(), "prior",
          std::to_string(in.Hq()) + " heads for prior_rule " + to_string(spec.prior_rule),
          std::to_string(in.prior.size()));
  const int64_t chunks = in.T() / spec.S, dk = in.d();
  for (size_t h = 0; h < in.prior.size(); ++h) {
    const auto& p = in.prior[h];
    const std::string name = "prior[" + std::to_string(h) + "]";
    const bool shared_row = spec.prior_rule == PriorRule::shared && p.rows() == 1;
    require((shared_row || p.rows() == chunks) && p.cols() == dk, name,
            spec.prior_rule == PriorRule::shared ? shape(1, dk) + " or " + shape(chunks, dk)
                                                 : shape(chunks, dk),
            shape(p.rows(), p.cols()));
    require_finite(p, name);
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
  // The prior is read only by the taylor key and the entropy bias, from inputs.prior under the
  // shared and given rules.
  const bool reads_prior = spec.needs_prior() && spec.prior_rule != PriorRule::landmark_query;
  if (reads_prior) require_prior(*this, spec);
  require_representable_logits(*this, logit_scale(spec, dk), reads_prior);
}

template <class Scalar>
AttentionInputs<Scalar> apply_positional_encoding(const AttentionInputs<Scalar>& raw,
                                                  const Geometry& geometry,
                                                  const PositionalEncoding& pe,
                                                  PriorRule prior_rule) {
  // raw (un-rotated) inputs -> rotated q, k, q~ and, for the shared rule, a positioned prior.
  pe.validate(raw.d());
  require(raw.T() == geometry.T(), "geometry.T", "the inputs' " + std::to_string(raw.T()) +
          " slots", std::to_string(geometry.T()));
  AttentionInputs<Scalar> out = raw;
  const std::vector<int64_t> positions = geometry.position_ids();
  // q, k and q~ share the positions: one table of angles serves them all.
  std::vector<Matrix<Scalar>*> rotated;
  for (auto* heads : {&out.q, &out.k, &out.q_retrieval})
    for (auto& x : *heads) rotated.push_back(&x);
  apply_rotary(rotated, positions, pe);
  // The prior rule decides, never the row count: a given prior is used as given (one row per
  // chunk, even when there is one chunk); a shared prior is one vector per head that becomes one
  // row per chunk, rotated where the chunk's landmark sits (reference/SEMANTICS.md §8).
  if (prior_rule != PriorRule::shared) return out;
  std::vector<int64_t> chunk_positions(static_cast<size_t>(geometry.n_chunks()));
  for (int64_t c = 0; c < geometry.n_chunks(); ++c)
    chunk_positions[static_cast<size_t>(c)] = geometry.position_id(geometry.landmark_slot(c));
  for (size_t h = 0; h < out.prior.size(); ++h) {
    auto& p = out.prior[h];
    require(p.rows() == 1, "prior[" + std::to_string(h) + "]",
            "1 row (the shared prior vector of the head, before positioning)",
            std::to_string(p.rows()) + " rows");
    Matrix<Scalar> rows = p.replicate(geometry.n_chunks(), 1);
    apply_rotary(rows, chunk_positions, pe);
    p = std::move(rows);
  }
  return out;
}

template <class Scalar>
AttentionInputs<Scalar> apply_positional_encoding(const AttentionInputs<Scalar>& raw,
                                                  const Geometry& geometry,
                                                  const PositionalEncoding& pe) {
  // inputs without a prior -> rotated q, k, q~.
  require(raw.prior.empty(), "prior",
          "none here (pass the prior rule to apply_positional_encoding to position a prior)",
          std::to_string(raw.prior.size()) + " heads");
  return apply_positional_encoding(raw, geometry, pe, PriorRule::given);
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
  template AttentionInputs<S> apply_positional_encoding<S>(                                \
      const AttentionInputs<S>&, const Geometry&, const PositionalEncoding&, PriorRule);   \
  template Matrix<S> calibrated_query<S>(const Matrix<S>&, const Matrix<S>&, const Matrix<S>&, \
                                         const Matrix<S>&);

HILS_INSTANTIATE_INPUTS(float)
HILS_INSTANTIATE_INPUTS(double)
HILS_INSTANTIATE_INPUTS(long double)

}  // namespace hils
