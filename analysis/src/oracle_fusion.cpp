// The oracle's own pieces of the reference mathematics: bf16 rounding, group scores r(t,g,c)
// and the fusion stage run with a forced selection. Built only from the reference's public
// stage functions (window_attention, exact_chunk_log_mass, summarize, resolve_prior,
// surrogate_scores, fuse_rows), so that reference/ needs no hook for the oracle and the oracle keeps
// no copy of the fusion mathematics.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>

#include "hils/analysis/oracle.hpp"
#include "hils/fuse_rows.hpp"
#include "hils/threads.hpp"

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

// Throws InvalidArgument unless the row's chunks (-1 is padding) are distinct chunks of V(t).
void require_valid_selection_row(const IndexMatrix& selection, int64_t row, int64_t group,
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

// Rows of one unit of forced fusion's parallel loop (a few ms of work each at K = 32, S = 64).
constexpr int64_t kRowsPerUnit = 64;

// What a forced fusion reads besides the selection, per query head: the window and the
// hierarchical fusion's chunk scores, from a run of run_mechanism that kept them (the same bits:
// the same stages on the same query blocks), or computed from the public stages.
template <class Scalar>
struct KnownStages {
  const MechanismOutputs<Scalar>* run = nullptr;
  bool window = false;  // run's o_window and lse_window are the window stage's bits
};

// The fused outputs of query head h under the given selection of its KV group.
template <class Scalar>
HeadOutputs<Scalar> fuse_head(const MechanismSpec& spec, const AttentionInputs<Scalar>& inputs,
                              int64_t h, const IndexMatrix& selection, const Geometry& geometry,
                              Scalar scale, const std::vector<int64_t>& queries,
                              const KnownStages<Scalar>& known) {
  const int64_t g = h / (inputs.Hq() / inputs.Hkv());
  const HeadOutputs<Scalar>* kept = known.run ? &known.run->heads[static_cast<size_t>(h)] : nullptr;
  WindowResult<Scalar> computed;
  if (!known.window)
    computed = window_attention(inputs.q[h], inputs.k[g], inputs.v[g], geometry, scale, queries);
  const Matrix<Scalar>& o_window = known.window ? kept->o_window : computed.o;
  const Vector<Scalar>& lse_window = known.window ? kept->lse_window : computed.lse;
  Matrix<Scalar> computed_scores;
  if (spec.fusion == Fusion::hierarchical && !kept)
    computed_scores = fusion_scores(spec, inputs, h, geometry, scale, queries);
  const Matrix<Scalar>& scores = kept ? kept->surrogate_scores : computed_scores;
  const int64_t Tq = static_cast<int64_t>(queries.size());
  HeadOutputs<Scalar> out;
  out.o.resize(Tq, inputs.dv());
  out.lse.resize(Tq);
  out.fusion_weights.resize(Tq, selection.cols() + 2);
  // Every row checked first, in order (the first bad row is the one named, as ever), then the
  // rows fused in units of kRowsPerUnit on the reference's OpenMP units by fuse_rows: each row
  // gets the bits `fuse` gives it alone, so they do not depend on the units or the thread count.
  for (int64_t row = 0; row < Tq; ++row)
    require_valid_selection_row(selection, row, g, queries[row], geometry);
  detail::parallel_units((Tq + kRowsPerUnit - 1) / kRowsPerUnit, [&](int64_t unit) {
    const int64_t begin = unit * kRowsPerUnit, end = std::min(Tq, begin + kRowsPerUnit);
    std::vector<FusionRow<Scalar>> rows;
    rows.reserve(static_cast<size_t>(end - begin));
    for (int64_t row = begin; row < end; ++row)
      rows.push_back(FusionRow<Scalar>{
          inputs.q[h].row(queries[row]).transpose(), selection.row(row).data(), selection.cols(),
          spec.fusion == Fusion::hierarchical ? scores.row(row).data() : nullptr,
          lse_window(row), o_window.row(row)});
    fuse_rows<Scalar>(spec, rows, inputs.k[g], inputs.v[g], geometry, scale,
                      out.o.middleRows(begin, end - begin), out.lse.segment(begin, end - begin),
                      out.fusion_weights.middleRows(begin, end - begin));
  });
  return out;
}

}  // namespace

double round_to_bf16(double x) { return round_to_bf16(x, Bf16Rounding::nearest); }

double round_to_bf16(double x, Bf16Rounding mode) {
  // bf16 keeps 8 significant bits and float's exponent range; below 2^-126 the spacing is
  // fixed at 2^-133 (subnormals). nearbyint rounds ties to even in the default mode; trunc
  // drops the low bits (a conversion that keeps a float's upper 16 bits).
  if (!std::isfinite(x) || x == 0.0) return x;
  auto to_integer = [mode](double m) { return mode == Bf16Rounding::nearest ? std::nearbyint(m) : std::trunc(m); };
  constexpr double kMinNormal = 0x1p-126;
  constexpr double kMaxBf16 = 0x1.FEp127;
  double rounded;
  if (std::fabs(x) < kMinNormal) {
    rounded = to_integer(x * 0x1p133) * 0x1p-133;
  } else {
    int exponent = 0;
    const double mantissa = std::frexp(x, &exponent);  // in [0.5, 1)
    rounded = std::ldexp(to_integer(std::ldexp(mantissa, 8)), exponent - 8);
  }
  if (std::fabs(rounded) > kMaxBf16) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return rounded;
}

double round_to_fp8_e4m3(double x) {
  // e4m3 keeps 4 significant bits, exponents down to 2^-6 (below: fixed spacing 2^-9) and
  // saturates at 448 (a SATFINITE conversion); nearbyint rounds ties to even.
  if (std::isnan(x) || x == 0.0) return x;
  constexpr double kMinNormal = 0x1p-6, kMax = 448.0;
  double rounded;
  if (std::fabs(x) < kMinNormal) {
    rounded = std::nearbyint(x * 0x1p9) * 0x1p-9;
  } else {
    int exponent = 0;
    const double mantissa = std::frexp(x, &exponent);  // in [0.5, 1)
    rounded = std::ldexp(std::nearbyint(std::ldexp(mantissa, 4)), exponent - 4);
  }
  return std::clamp(rounded, -kMax, kMax);
}

double fp8_row_scale(double amax) {
  // amax -> the smallest power of two s with amax / s <= 448.
  if (!(amax > 0.0) || !std::isfinite(amax)) return 1.0;
  int exponent = 0;
  const double mantissa = std::frexp(amax / 448.0, &exponent);  // amax / 448 = mantissa 2^exponent
  return std::ldexp(1.0, mantissa == 0.5 ? exponent - 1 : exponent);
}

float int4_row_scale(double amax) {
  // amax -> float(amax) / 7 in fp32 (the device's __fdiv_rn), so that the largest entry maps to
  // +-7; 1 where the row is all zero (or not finite).
  if (!(amax > 0.0) || !std::isfinite(amax)) return 1.0f;
  const float scale = static_cast<float>(amax) / 7.0f;
  return scale > 0.0f ? scale : 1.0f;  // an amax below 7 x float's smallest subnormal
}

double round_to_fp16(double x) {
  // x -> the nearest fp16 number (ties to even), +-inf from 65520 on (65504 + half a step).
  if (std::isnan(x)) return x;
  const double ax = std::fabs(x);
  if (ax >= 65520.0) return std::copysign(std::numeric_limits<double>::infinity(), x);
  int exponent = 0;
  std::frexp(ax, &exponent);  // ax = m 2^exponent, m in [0.5, 1)
  const int step = std::max(exponent - 11, -24);  // 11 significant bits; subnormals 2^-24
  return std::copysign(std::ldexp(std::nearbyint(std::ldexp(ax, -step)), step), x);
}

float int4h_row_scale(double amax) {
  // amax -> int4's fp32 scale rounded up to fp16; refused outside fp16's normal range.
  if (!std::isfinite(amax))
    throw InvalidArgument("int4_h row: max |k'| must be finite, got " + std::to_string(amax));
  if (!(amax > 0.0)) return 1.0f;
  const float s = static_cast<float>(amax) / 7.0f;
  if (!(s >= 0x1p-14f))
    throw InvalidArgument("int4_h row: scale max |k'| / 7 = " + std::to_string(s) +
                          " lies below fp16's normal range (2^-14)");
  int exponent = 0;
  std::frexp(static_cast<double>(s), &exponent);
  const double step = std::ldexp(1.0, exponent - 11);
  const double up = std::ceil(static_cast<double>(s) / step) * step;  // exact: a power-of-two step
  if (up > 65504.0)
    throw InvalidArgument("int4_h row: scale max |k'| / 7 = " + std::to_string(s) +
                          " lies above fp16's largest finite number (65504)");
  return static_cast<float>(up);
}

double int4h_bias_error(double max_abs_bias) { return 0x1p-11 * max_abs_bias + 0x1p-25; }

int int4_code(double x, float s) {
  // float(x) / s in fp32, to nearest with ties to even (nearbyint), clamped to [-7, 7].
  const float ratio = static_cast<float>(x) / s;
  if (std::isnan(ratio)) return 0;
  return static_cast<int>(std::clamp(std::nearbyint(ratio), -7.0f, 7.0f));
}

AttentionInputs<double> round_inputs_to_bf16(const AttentionInputs<double>& inputs) {
  return round_inputs_to(inputs, InputPrecision::bf16);
}

double round_to_input_precision(double x, InputPrecision precision) {
  if (precision == InputPrecision::bf16) return round_to_bf16(x);
  if (precision == InputPrecision::fp16) return round_to_fp16(x);
  return x;
}

AttentionInputs<double> round_inputs_to(const AttentionInputs<double>& inputs,
                                        InputPrecision precision) {
  // inputs -> the same inputs with every entry rounded to the input precision.
  if (precision == InputPrecision::fp32) return inputs;
  auto round_all = [precision](std::vector<Matrix<double>>& heads) {
    for (auto& m : heads)
      m = m.unaryExpr([precision](double x) { return round_to_input_precision(x, precision); });
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
  // G x [Tq x n_chunks] s_hat, G x [Tq] lse_swa -> [Tq x n_chunks] r (reference/SEMANTICS.md §4),
  // in double.
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

namespace {
std::atomic<int64_t> forced_fusion_count{0};
}  // namespace

int64_t forced_fusion_runs() { return forced_fusion_count.load(); }

namespace {

// forced_fusion's checks and its loop over the query heads.
template <class Scalar>
std::vector<HeadOutputs<Scalar>> fuse_heads(const MechanismSpec& spec,
                                            const AttentionInputs<Scalar>& inputs,
                                            const std::vector<IndexMatrix>& selection,
                                            const std::vector<int64_t>& queries,
                                            const KnownStages<Scalar>& known) {
  // Hkv x [Tq x K] selection -> Hq heads of o [Tq x dv], lse [Tq], fusion weights [Tq x K+2].
  ++forced_fusion_count;
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
    heads.push_back(fuse_head(spec, inputs, h, selection[h / G], geometry, scale, queries, known));
  return heads;
}

// Whether `run` holds what fuse_heads reads for every head: the window ([Tq x dv] and [Tq]) and,
// for a hierarchical fusion, the chunk scores ([Tq x n_chunks]).
template <class Scalar>
void require_kept_stages(const MechanismSpec& spec, const AttentionInputs<Scalar>& inputs,
                         const MechanismOutputs<Scalar>& run) {
  const auto Tq = static_cast<Eigen::Index>(run.queries.size());
  const int64_t chunks = geometry_of(spec, inputs.T()).n_chunks();
  bool kept = static_cast<int64_t>(run.heads.size()) == inputs.Hq();
  for (size_t h = 0; kept && h < run.heads.size(); ++h) {
    const auto& head = run.heads[h];
    kept = head.o_window.rows() == Tq && head.o_window.cols() == inputs.dv() &&
           head.lse_window.size() == Tq &&
           (spec.fusion != Fusion::hierarchical ||
            (head.surrogate_scores.rows() == Tq && head.surrogate_scores.cols() == chunks));
  }
  require(kept, "run",
          "run_mechanism's outputs for these inputs with keep_window (and keep_surrogate_scores "
          "for a hierarchical fusion)",
          "outputs without them, or of other shapes");
}

}  // namespace

template <class Scalar>
std::vector<HeadOutputs<Scalar>> forced_fusion(const MechanismSpec& spec,
                                               const AttentionInputs<Scalar>& inputs,
                                               const std::vector<IndexMatrix>& selection,
                                               const std::vector<int64_t>& queries) {
  return fuse_heads(spec, inputs, selection, queries, KnownStages<Scalar>{});
}

template <class Scalar>
std::vector<HeadOutputs<Scalar>> forced_fusion(const MechanismSpec& spec,
                                               const AttentionInputs<Scalar>& inputs,
                                               const std::vector<IndexMatrix>& selection,
                                               const MechanismOutputs<Scalar>& run) {
  require_kept_stages(spec, inputs, run);
  return fuse_heads(spec, inputs, selection, run.queries,
                    KnownStages<Scalar>{&run, !scales_values_down(inputs)});
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
template std::vector<HeadOutputs<float>> forced_fusion(const MechanismSpec&,
                                                       const AttentionInputs<float>&,
                                                       const std::vector<IndexMatrix>&,
                                                       const MechanismOutputs<float>&);
template std::vector<HeadOutputs<double>> forced_fusion(const MechanismSpec&,
                                                        const AttentionInputs<double>&,
                                                        const std::vector<IndexMatrix>&,
                                                        const MechanismOutputs<double>&);

}  // namespace hils::oracle
