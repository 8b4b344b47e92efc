// The oracle's own pieces of the reference mathematics: bf16 rounding, group scores r(t,g,c)
// and the fusion stage run with a forced selection. Built only from the reference's public
// stage functions (window_attention, exact_chunk_log_mass, summarize, resolve_prior,
// surrogate_scores), so that reference/ needs no hook for the oracle.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "hils/analysis/oracle.hpp"

namespace hils::oracle {

namespace {

template <class Scalar>
constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();

// log(exp(a) + exp(b)) without overflow; -inf + -inf is -inf.
template <class Scalar>
Scalar log_add_exp(Scalar a, Scalar b) {
  if (a < b) std::swap(a, b);
  if (a == kNegInf<Scalar>) return a;
  return a + std::log1p(std::exp(b - a));
}

// LSE of a row restricted to its finite entries; -inf when none.
template <class Scalar>
Scalar row_log_sum_exp(const Eigen::Ref<const Eigen::Matrix<Scalar, 1, Eigen::Dynamic>>& row) {
  Scalar top = kNegInf<Scalar>;
  for (Eigen::Index c = 0; c < row.size(); ++c) top = std::max(top, row(c));
  if (top == kNegInf<Scalar>) return top;
  Scalar sum = 0;
  for (Eigen::Index c = 0; c < row.size(); ++c)
    if (row(c) != kNegInf<Scalar>) sum += std::exp(row(c) - top);
  return top + std::log(sum);
}

// Softmax statistics of one query over chunk c's attendable tokens: (L, o_c) (Eq. 1, 10).
template <class Scalar>
std::pair<Scalar, Vector<Scalar>> attend_chunk(const Matrix<Scalar>& q, int64_t row,
                                               const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                               int64_t chunk, const Geometry& geometry,
                                               Scalar scale) {
  const int64_t first = chunk * geometry.S();
  std::vector<int64_t> slots;
  for (int64_t j = first; j < first + geometry.S(); ++j)
    if (geometry.attendable(j)) slots.push_back(j);
  Vector<Scalar> logits(static_cast<Eigen::Index>(slots.size()));
  for (size_t i = 0; i < slots.size(); ++i)
    logits(i) = scale * q.row(row).dot(k.row(slots[i]));
  const Scalar top = logits.maxCoeff();
  Vector<Scalar> o = Vector<Scalar>::Zero(v.cols());
  Scalar sum = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Scalar p = std::exp(logits(i) - top);
    sum += p;
    o += p * v.row(slots[i]).transpose();
  }
  return {top + std::log(sum), o / sum};
}

// Chunks of one selection row, in row order, after checking them against V(t).
std::vector<int64_t> selected_chunks(const IndexMatrix& selection, int64_t row, int64_t group,
                                     int64_t t, const Geometry& geometry) {
  std::vector<int64_t> chunks;
  const int64_t candidates = geometry.candidate_count(t);
  for (Eigen::Index i = 0; i < selection.cols(); ++i) {
    const int64_t c = selection(row, i);
    if (c == -1) continue;
    const std::string where =
        "selection[group " + std::to_string(group) + "] row t=" + std::to_string(t);
    require(c >= 0 && c < candidates, where, "a chunk of V(t) = [0, " + std::to_string(candidates) + ")",
            std::to_string(c));
    require(std::find(chunks.begin(), chunks.end(), c) == chunks.end(), where,
            "distinct chunks", "chunk " + std::to_string(c) + " twice");
    chunks.push_back(c);
  }
  return chunks;
}

// The scores the hierarchical fusion uses for query head h: s_hat, or L for the exact rule.
template <class Scalar>
Matrix<Scalar> fusion_scores(const MechanismSpec& spec, const AttentionInputs<Scalar>& inputs,
                             int64_t h, const Geometry& geometry, Scalar scale,
                             const std::vector<int64_t>& queries) {
  const int64_t g = h / (inputs.Hq() / inputs.Hkv());
  if (spec.key_rule == KeyRule::exact)
    return exact_chunk_log_mass(inputs.q[h], inputs.k[g], geometry, scale, queries);
  const Matrix<Scalar> prior =
      spec.needs_prior() ? resolve_prior(inputs, h, spec, geometry) : Matrix<Scalar>();
  const ChunkSummaries<Scalar> summaries =
      summarize(inputs.k[g], prior, spec.key_rule, spec.bias_rule, geometry, scale);
  return surrogate_scores(inputs.retrieval_query(h), summaries, geometry, scale, queries);
}

// One query row of one head fused over its chunks and the window (Eq. 3 flat, Eq. 10
// hierarchical). Writes o, lse and the K+2 fusion weights of row `row` of `out`.
template <class Scalar>
void fuse_row(const MechanismSpec& spec, const std::vector<Scalar>& chunk_logits, const std::vector<Vector<Scalar>>& chunk_o,
              const WindowResult<Scalar>& window, int64_t row, const IndexMatrix& selection,
              HeadOutputs<Scalar>& out) {
  // Flat fusion weights each chunk by its exact mass L; hierarchical by s_hat. Both then are
  // one softmax over [chunk logits, lse_swa (, 0)].
  Scalar lse = window.lse(row);
  for (Scalar a : chunk_logits) lse = log_add_exp(lse, a);
  const bool zero_logit = spec.fusion == Fusion::hierarchical && spec.softmax1;
  if (zero_logit) lse = log_add_exp(lse, Scalar(0));
  Vector<Scalar> o = std::exp(window.lse(row) - lse) * window.o.row(row).transpose();
  const int64_t K = selection.cols();
  out.fusion_weights.row(row).setZero();
  size_t next = 0;
  for (int64_t i = 0; i < K; ++i) {
    if (selection(row, i) == -1) continue;
    const Scalar w = std::exp(chunk_logits[next] - lse);
    o += w * chunk_o[next];
    out.fusion_weights(row, i) = w;
    ++next;
  }
  out.fusion_weights(row, K) = std::exp(window.lse(row) - lse);
  out.fusion_weights(row, K + 1) = zero_logit ? std::exp(-lse) : Scalar(0);
  out.o.row(row) = o.transpose();
  out.lse(row) = lse;
}

// The fused outputs of query head h under the given selection of its KV group.
template <class Scalar>
HeadOutputs<Scalar> fuse_head(const MechanismSpec& spec, const AttentionInputs<Scalar>& inputs,
                              int64_t h, const IndexMatrix& selection, const Geometry& geometry,
                              Scalar scale, const std::vector<int64_t>& queries) {
  const int64_t g = h / (inputs.Hq() / inputs.Hkv());
  const WindowResult<Scalar> window =
      window_attention(inputs.q[h], inputs.k[g], inputs.v[g], geometry, scale, queries);
  Matrix<Scalar> scores;
  if (spec.fusion == Fusion::hierarchical)
    scores = fusion_scores(spec, inputs, h, geometry, scale, queries);
  const int64_t Tq = static_cast<int64_t>(queries.size());
  HeadOutputs<Scalar> out;
  out.o.resize(Tq, inputs.dv());
  out.lse.resize(Tq);
  out.fusion_weights.resize(Tq, selection.cols() + 2);
  for (int64_t row = 0; row < Tq; ++row) {
    const int64_t t = queries[row];
    const std::vector<int64_t> chunks = selected_chunks(selection, row, g, t, geometry);
    std::vector<Scalar> logits;
    std::vector<Vector<Scalar>> chunk_o;
    for (int64_t c : chunks) {
      auto [mass, o_c] = attend_chunk(inputs.q[h], t, inputs.k[g], inputs.v[g], c, geometry, scale);
      logits.push_back(spec.fusion == Fusion::hierarchical ? scores(row, c) : mass);
      chunk_o.push_back(std::move(o_c));
    }
    fuse_row(spec, logits, chunk_o, window, row, selection, out);
  }
  return out;
}

}  // namespace

double round_to_bf16(double x) {
  // bf16 keeps 8 significant bits and float's exponent range; below 2^-126 the spacing is
  // fixed at 2^-133 (subnormals). nearbyint rounds ties to even in the default mode.
  if (!std::isfinite(x) || x == 0.0) return x;
  constexpr double kMinNormal = 0x1p-126;
  constexpr double kMaxBf16 = 0x1.FEp127;
  double rounded;
  if (std::fabs(x) < kMinNormal) {
    rounded = std::nearbyint(x * 0x1p133) * 0x1p-133;
  } else {
    int exponent = 0;
    const double mantissa = std::frexp(x, &exponent);  // in [0.5, 1)
    rounded = std::ldexp(std::nearbyint(std::ldexp(mantissa, 8)), exponent - 8);
  }
  if (std::fabs(rounded) > kMaxBf16) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return rounded;
}

AttentionInputs<double> round_inputs_to_bf16(const AttentionInputs<double>& inputs) {
  // inputs -> the same inputs with every entry rounded to bf16.
  auto round_all = [](std::vector<Matrix<double>>& heads) {
    for (auto& m : heads) m = m.unaryExpr([](double x) { return round_to_bf16(x); });
  };
  AttentionInputs<double> rounded = inputs;
  round_all(rounded.q);
  round_all(rounded.k);
  round_all(rounded.v);
  round_all(rounded.q_retrieval);
  round_all(rounded.prior);
  return rounded;
}

template <class Scalar>
Matrix<double> group_scores(const std::vector<Matrix<Scalar>>& scores,
                            const std::vector<Vector<Scalar>>& lse_window, GroupRule rule) {
  // G x [Tq x n_chunks] s_hat, G x [Tq] lse_swa -> [Tq x n_chunks] r (SPEC §5), in double.
  require(!scores.empty() && scores.size() == lse_window.size(), "group_scores",
          "one score matrix and one lse_window per head of the group",
          std::to_string(scores.size()) + " and " + std::to_string(lse_window.size()));
  const Eigen::Index Tq = scores.front().rows(), n = scores.front().cols();
  Matrix<double> r = Matrix<double>::Constant(Tq, n, rule == GroupRule::sum_probabilities
                                                         ? 0.0
                                                         : kNegInf<double>);
  for (size_t h = 0; h < scores.size(); ++h) {
    const Matrix<double> s = scores[h].template cast<double>();
    for (Eigen::Index t = 0; t < Tq; ++t) {
      const double log_z = log_add_exp(static_cast<double>(lse_window[h](t)),
                                       row_log_sum_exp<double>(s.row(t)));
      for (Eigen::Index c = 0; c < n; ++c) {
        if (s(t, c) == kNegInf<double>) continue;
        if (rule == GroupRule::max_raw) r(t, c) = std::max(r(t, c), s(t, c));
        if (rule == GroupRule::max_normalized) r(t, c) = std::max(r(t, c), s(t, c) - log_z);
        if (rule == GroupRule::sum_probabilities) r(t, c) += std::exp(s(t, c) - log_z);
      }
    }
  }
  // Outside V(t) the score stays -inf for every rule, so a set comparison never picks it.
  if (rule == GroupRule::sum_probabilities)
    for (Eigen::Index t = 0; t < Tq; ++t)
      for (Eigen::Index c = 0; c < n; ++c)
        if (scores.front()(t, c) == kNegInf<Scalar>) r(t, c) = kNegInf<double>;
  return r;
}

template <class Scalar>
std::vector<HeadOutputs<Scalar>> forced_fusion(const MechanismSpec& spec,
                                               const AttentionInputs<Scalar>& inputs,
                                               const std::vector<IndexMatrix>& selection,
                                               const std::vector<int64_t>& queries) {
  // Hkv x [Tq x K] selection -> Hq heads of o [Tq x dv], lse [Tq], fusion weights [Tq x K+2].
  require(spec.selects(), "spec.fusion", "flat or hierarchical (a mechanism that selects)",
          to_string(spec.fusion));
  require(static_cast<int64_t>(selection.size()) == inputs.Hkv(), "selection",
          std::to_string(inputs.Hkv()) + " KV groups", std::to_string(selection.size()));
  for (const auto& rows : selection)
    require(rows.rows() == static_cast<Eigen::Index>(queries.size()), "selection rows",
            std::to_string(queries.size()) + " (one per query)", std::to_string(rows.rows()));
  const Geometry geometry = geometry_of(spec, inputs.T());
  const Scalar scale = static_cast<Scalar>(logit_scale(spec, inputs.d()));
  const int64_t G = inputs.Hq() / inputs.Hkv();
  std::vector<HeadOutputs<Scalar>> heads;
  for (int64_t h = 0; h < inputs.Hq(); ++h)
    heads.push_back(fuse_head(spec, inputs, h, selection[h / G], geometry, scale, queries));
  return heads;
}

template Matrix<double> group_scores(const std::vector<Matrix<float>>&,
                                     const std::vector<Vector<float>>&, GroupRule);
template Matrix<double> group_scores(const std::vector<Matrix<double>>&,
                                     const std::vector<Vector<double>>&, GroupRule);
template std::vector<HeadOutputs<float>> forced_fusion(const MechanismSpec&,
                                                       const AttentionInputs<float>&,
                                                       const std::vector<IndexMatrix>&,
                                                       const std::vector<int64_t>&);
template std::vector<HeadOutputs<double>> forced_fusion(const MechanismSpec&,
                                                        const AttentionInputs<double>&,
                                                        const std::vector<IndexMatrix>&,
                                                        const std::vector<int64_t>&);

}  // namespace hils::oracle
