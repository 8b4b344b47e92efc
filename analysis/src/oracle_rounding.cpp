// The oracle's bf16-rounding analysis of a hierarchical fusion's lse (check_lse_shifts, which
// compare_fused in oracle.cpp runs on a bf16 lse): how rounding summaries, scores and the stored
// lse to bf16 moves a correct kernel's mean lse error and its logit-scale slope (bf16_ulp,
// expected_store_error, SummaryRounding, RoundingShifts, RowStoreShift, lse_shift_bound), the
// kernel's conversion and store roundings read from its outputs (conversion_rounding), and the
// two statistics checked against them (Tolerances::kMeanSigmas, MeanShiftBound; oracle.hpp).
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hils/analysis/oracle.hpp"
#include "oracle_context.hpp"
#include "oracle_rounding.hpp"

namespace hils::oracle::detail {

namespace {

// The spacing of bf16 numbers at x: |x| in [2^(e-1), 2^e) keeps 8 significant bits, ulp = 2^(e-8).
double bf16_ulp(double x) {
  if (x == 0.0 || !std::isfinite(x)) return 0.0;
  int exponent = 0;
  std::frexp(x, &exponent);
  return std::ldexp(1.0, exponent - 8);
}

// Variance of the error of rounding x to bf16: uniform within +-ulp(x)/2 to nearest, within
// (-ulp, 0] toward zero; either way ulp^2 / 12 about its mean.
double bf16_rounding_variance(double x) {
  const double ulp = bf16_ulp(x);
  return Tolerances::kRoundingVariance * ulp * ulp;
}

// The same variance for a value stored in fp32 (24 significant bits): a kernel whose stored lse
// are not all bf16 numbers did not round them to bf16.
double fp32_rounding_variance(double x) { return std::ldexp(bf16_rounding_variance(x), -32); }

// The mean error of storing x + nu in bf16 by `mode`, nu ~ N(0, tau^2), less the mean of the
// same rounding over a uniform position within the ulp (0 to nearest, -sign ulp/2 toward
// zero): E[R(x + nu) - (x + nu)] - E_uniform[R(y) - y]. With tau = 0 it is R(x) - x less that
// mean, a deterministic sawtooth; as tau grows past the ulp it falls to 0.
double expected_store_error(double x, double tau, Bf16Rounding mode) {
  const double ulp = bf16_ulp(x);
  if (ulp == 0.0) return 0.0;
  if (mode == Bf16Rounding::toward_zero && x < 0) return -expected_store_error(-x, tau, mode);
  const double uniform_mean = mode == Bf16Rounding::toward_zero ? -0.5 * ulp : 0.0;
  const double base = std::floor(x / ulp) * ulp;
  const double offset = mode == Bf16Rounding::nearest ? 0.5 : 0.0;  // cell m: value base + m ulp
  if (tau <= 0.0) {
    const double m = std::floor((x - base) / ulp + offset);
    return base + m * ulp - x - uniform_mean;
  }
  // Cell m holds [base + (m - offset) ulp, base + (m + 1 - offset) ulp), value base + m ulp.
  const int span = 2 + static_cast<int>(std::ceil(8.0 * tau / ulp));
  auto below = [&](double edge) { return 0.5 * std::erfc(-(edge - x) / (std::sqrt(2.0) * tau)); };
  double expected = 0.0;
  for (int m = -span; m <= span + 1; ++m)
    expected += (base + m * ulp) * (below(base + (m + 1 - offset) * ulp) - below(base + (m - offset) * ulp));
  return expected - x - uniform_mean;
}

// expected_store_error averaged over a uniform offset of x within +-width/2 (midpoint rule): a
// top logit's own rounding, of which a row's lse carries the fraction 1 - omega_top.
double smeared_store_error(double x, double tau, double width, Bf16Rounding mode) {
  if (width <= 0.0) return expected_store_error(x, tau, mode);
  constexpr int kNodes = 16;
  double sum = 0.0;
  for (int k = 0; k < kNodes; ++k)
    sum += expected_store_error(x + width * ((k + 0.5) / kNodes - 0.5), tau, mode);
  return sum / kNodes;
}

// Per chunk [n_chunks x (d + 1)], the bias in the last column: what rounding the summary to bf16
// does, as a kernel does it: k'_i once, and its weights w_j once (taylor: p, mean: 1/|T_c|;
// Eq. 6-7), so var(dk'_i) = var(round k'_i) + sum_j var(round w_j) k_j,i^2; the entropy bias
// b' = log|T_c| - H(p) likewise var(round b') + sum_j var(round p_j) (log p_j + 1)^2. And, per
// rounding mode (index: Bf16Rounding), the exact errors of the same roundings, known from the
// reference's values: of the stored k' and b' (key, bias) and through the weights (weights).
struct SummaryRounding {
  Matrix<double> variance;
  std::array<Matrix<double>, 2> key, bias, weights;
};

// True when a key rule's summaries are the same for every head of a KV group (they read no
// prior query), so that their rounding is shared across the group's heads.
bool summary_per_group(KeyRule rule) {
  switch (rule) {
    case KeyRule::mean:
    case KeyRule::landmark_key: return true;
    case KeyRule::taylor:
    case KeyRule::exact: return false;
  }
  return false;
}

SummaryRounding summary_rounding(const Context& ctx, int64_t h) {
  const int64_t chunks = ctx.geometry.n_chunks(), tokens = ctx.geometry.tokens_per_chunk();
  const int64_t d = ctx.inputs.d();
  const Matrix<double>& k = ctx.inputs.k[h / ctx.G];
  const double scale = logit_scale(ctx.spec, d);
  const ChunkSummaries<double> summary = summaries_of(ctx, ctx.inputs, h);
  Matrix<double> prior;
  if (ctx.spec.key_rule == KeyRule::taylor) prior = resolve_prior(ctx.inputs, h, ctx.spec, ctx.geometry);
  const Matrix<double> zero = Matrix<double>::Zero(chunks, d + 1);
  SummaryRounding out{zero, {zero, zero}, {zero, zero}, {zero, zero}};
  const bool entropy = ctx.spec.bias_rule == BiasRule::entropy && ctx.spec.key_rule != KeyRule::exact;
  for (int64_t c = 0; c < chunks; ++c) {
    const auto keys = k.middleRows(c * ctx.spec.S, tokens);
    Vector<double> w = Vector<double>::Zero(tokens);  // k'_c = sum_j w_j k_j: the weights rounded
    switch (ctx.spec.key_rule) {
      case KeyRule::mean: w.setConstant(1.0 / static_cast<double>(tokens)); break;
      case KeyRule::taylor: {
        const Vector<double> logits = scale * (keys * prior.row(c).transpose());
        w = (logits.array() - logits.maxCoeff()).exp().matrix();
        w /= w.sum();
        break;
      }
      case KeyRule::landmark_key: break;  // a copy of one key: no weights to round
      case KeyRule::exact: break;         // no summary
    }
    const Vector<double> w_var = w.unaryExpr([](double x) { return bf16_rounding_variance(x); });
    const Vector<double> entropy_slope = (w.array().max(1e-300).log() + 1.0).matrix();
    out.variance.row(c).head(d) =
        summary.key.row(c).unaryExpr([](double x) { return bf16_rounding_variance(x); }) +
        w_var.transpose() * keys.array().square().matrix();
    if (entropy)
      out.variance(c, d) = bf16_rounding_variance(summary.bias(c)) +
                           (w_var.array() * entropy_slope.array().square()).sum();
    for (const Bf16Rounding mode : {Bf16Rounding::nearest, Bf16Rounding::toward_zero}) {
      auto error = [mode](double x) { return round_to_bf16(x, mode) - x; };
      const size_t m = static_cast<size_t>(mode);
      const Vector<double> w_error = w.unaryExpr(error);
      out.key[m].row(c).head(d) = summary.key.row(c).unaryExpr(error);
      out.weights[m].row(c).head(d) = w_error.transpose() * keys;
      if (entropy) {
        out.bias[m](c, d) = error(summary.bias(c));
        out.weights[m](c, d) = w_error.dot(entropy_slope);
      }
    }
  }
  return out;
}

// Where a correct kernel's biased roundings can centre a statistic. Each rounding point (the
// fused s_hat, the stored k', the stored b', the summaries' weights) contributes, when the
// kernel rounds there, its exact error (computed from the reference's values: round(x) - x,
// per mode, index Bf16Rounding), or nothing when it keeps that value in fp32; so the statistic
// is centred within [sum of each point's smallest, sum of each point's largest] (0 among them).
// A bf16-stored lse adds one of store_alternatives or nothing (lse_shift_bound).
struct RoundingShifts {
  std::vector<std::array<double, 2>> points;
  std::vector<double> store_alternatives;
  // The range of the points' sum, the conversions' mode known (nullopt: either, per point).
  std::pair<double, double> range(const std::optional<Bf16Rounding>& conversions) const {
    double low = 0, high = 0;
    for (const auto& point : points) {
      double point_low = 0, point_high = 0;
      for (const Bf16Rounding mode : {Bf16Rounding::nearest, Bf16Rounding::toward_zero})
        if (!conversions || *conversions == mode) {
          point_low = std::min(point_low, point[static_cast<size_t>(mode)]);
          point_high = std::max(point_high, point[static_cast<size_t>(mode)]);
        }
      low += point_low;
      high += point_high;
    }
    return {low, high};
  }
  std::pair<double, double> store_range() const {
    double low = 0, high = 0;
    for (double x : store_alternatives) {
      low = std::min(low, x);
      high = std::max(high, x);
    }
    return {low, high};
  }
};

// Per head and row, a weight a_r of the lse errors' linear statistic sum_r a_r e_r.
using RowWeights = std::vector<Vector<double>>;

// One row's error of a bf16-stored lse when the kernel rounds its scores (lse_shift_bound):
// exact (summaries exact) and expected (summaries rounded too). Zero for a row without a
// selected chunk.
struct RowStoreShift {
  double exact = 0, smeared = 0;
};
RowStoreShift row_store_shift(const HeadOutputs<double>& head, Eigen::Index row,
                              const Matrix<double>& s_hat, const IndexMatrix& selection,
                              Bf16Rounding store, Bf16Rounding scores) {
  const double t = head.lse(row);
  Eigen::Index top = -1;
  double lse_moved = 0;  // sum_i omega_i (R(s_i) - s_i): the scores' rounding in the lse
  for (Eigen::Index i = 0; i < selection.cols(); ++i) {
    const int64_t c = selection(row, i);
    if (c < 0) continue;
    lse_moved += head.fusion_weights(row, i) * (round_to_bf16(s_hat(row, c), scores) - s_hat(row, c));
    if (top < 0 || s_hat(row, c) > s_hat(row, selection(row, top))) top = i;
  }
  if (top < 0 || !std::isfinite(t)) return {};
  const double s_top = s_hat(row, selection(row, top));
  const double omega_top = head.fusion_weights(row, top);
  double others = 0;  // variance of the other scores' roundings in eps
  for (Eigen::Index i = 0; i < selection.cols(); ++i) {
    const int64_t c = selection(row, i);
    if (c < 0 || i == top) continue;
    const double omega = head.fusion_weights(row, i);
    others += omega * omega * bf16_rounding_variance(s_hat(row, c));
  }
  RowStoreShift shift;
  shift.exact = round_to_bf16(t + lse_moved, store) - round_to_bf16(t, store) - lse_moved;
  shift.smeared = smeared_store_error(round_to_bf16(s_top, scores) + (t - s_top), std::sqrt(others),
                                      (1.0 - omega_top) * bf16_ulp(s_top), store);
  return shift;
}

// Standard error of sum_r a_r e_r, e_r a correct bf16-score kernel's lse error (hierarchical
// fusion): each rounding is unbiased about its mean (bf16_rounding_variance); the kernel may
// round each fused s_hat to bf16 where it fuses it (weight omega) and the summaries behind s_hat
// (summary_rounding); the window's lse_swa stays fp32 (its logits accumulate in fp32, the
// precision the oracle holds lse_window to: tensor_precision). A summary's error is shared by every
// row that fuses its chunk, so its coefficient sums those rows' a sigma omega q~ (a omega for the
// bias) first; summaries kept per KV head (mean, landmark keys) share it across the group's G
// heads too. The stored lse's own rounding is bf16's when the kernel stored bf16 numbers, else
// fp32's.
// Also returns (shifts.points) each rounding point's exact error in the statistic when the
// kernel rounds there, per mode: s_hat (sum a omega (R(s) - s)), the stored k' and b', and the
// summaries' weights. And (shifts.store_alternatives) the one rounding whose error a bf16 store
// does not average away: a kernel that rounds its scores puts its largest s_hat on the bf16
// grid, so its lse = s'_top + eps stores with the error R(s'_top + eps) - (s'_top + eps), a
// sawtooth in eps that is the same in every row with the same eps (rounding back to s'_top
// when eps < ulp/2: -eps). Computed per row from the reference's values, for each mode the
// conversions may have, two ways, one of which (or neither: scores kept in fp32) a correct
// kernel is: its scores rounded from exact summaries (exact: R(t + D) - R(t) - D, D = sum_i
// omega_i (R(s_i) - s_i)), or from rounded summaries (expected: the top's grid point R(s_top)
// fixed, the others' roundings and the fraction 1 - omega_top of the top's own as noise,
// expected_store_error).
MeanShiftBound lse_shift_bound(const Context& ctx, const std::vector<IndexMatrix>& selection,
                               const std::vector<HeadOutputs<double>>& truth, const RowWeights& a,
                               const std::optional<Bf16Rounding>& store,
                               const std::optional<Bf16Rounding>& conversions,
                               RoundingShifts& shifts) {
  const bool stored_bf16 = store.has_value();
  std::vector<Bf16Rounding> modes;  // the conversions' modes to account for
  for (const Bf16Rounding mode : {Bf16Rounding::nearest, Bf16Rounding::toward_zero})
    if (!conversions || *conversions == mode) modes.push_back(mode);
  const double scale = logit_scale(ctx.spec, ctx.inputs.d());
  const int64_t chunks = ctx.geometry.n_chunks(), d = ctx.inputs.d();
  const bool summaries = ctx.spec.key_rule != KeyRule::exact && chunks > 0;
  const int64_t K = ctx.spec.K;
  const bool per_group = summary_per_group(ctx.spec.key_rule);
  double variance = 0;
  std::array<double, 2> score_error{}, key_error{}, bias_error{}, weights_key_error{},
      weights_bias_error{};
  std::array<double, 2> store_exact{}, store_smeared{};  // per mode of the scores
  for (int64_t g = 0; g < ctx.inputs.Hkv(); ++g) {
    Matrix<double> group_weight = Matrix<double>::Zero(chunks, d + 1);
    Matrix<double> group_signed = Matrix<double>::Zero(chunks, d + 1);
    for (int64_t h = g * ctx.G; h < (g + 1) * ctx.G; ++h) {
      const HeadOutputs<double>& head = truth[static_cast<size_t>(h)];
      const Vector<double>& a_h = a[static_cast<size_t>(h)];
      const Matrix<double>& s_hat = ctx.truth.heads[static_cast<size_t>(h)].surrogate_scores;
      const Vector<double>& lse_window = ctx.truth.heads[static_cast<size_t>(h)].lse_window;
      const Matrix<double>& q = ctx.inputs.retrieval_query(h);
      Matrix<double> weight = Matrix<double>::Zero(chunks, d + 1);  // d(statistic) / d(k', b')
      for (Eigen::Index row = 0; row < head.lse.size(); ++row) {
        const double a_r = a_h(row);
        const double omega_window = head.fusion_weights(row, K);
        const double store_variance = stored_bf16 ? bf16_rounding_variance(head.lse(row))
                                                  : fp32_rounding_variance(head.lse(row));
        variance += a_r * a_r * (store_variance +
                                 omega_window * omega_window * fp32_rounding_variance(lse_window(row)));
        if (stored_bf16 && a_r != 0.0)
          for (const Bf16Rounding mode : modes) {
            const RowStoreShift shift = row_store_shift(head, row, s_hat, selection[g], *store, mode);
            store_exact[static_cast<size_t>(mode)] += a_r * shift.exact;
            store_smeared[static_cast<size_t>(mode)] += a_r * shift.smeared;
          }
        for (Eigen::Index i = 0; i < selection[g].cols(); ++i) {
          const int64_t c = selection[g](row, i);
          if (c < 0) continue;
          const double omega = head.fusion_weights(row, i);
          variance += a_r * a_r * omega * omega * bf16_rounding_variance(s_hat(row, c));
          for (const Bf16Rounding mode : {Bf16Rounding::nearest, Bf16Rounding::toward_zero})
            score_error[static_cast<size_t>(mode)] +=
                a_r * omega * (round_to_bf16(s_hat(row, c), mode) - s_hat(row, c));
          weight.row(c).head(d) += a_r * scale * omega * q.row(ctx.queries[static_cast<size_t>(row)]);
          weight(c, d) += a_r * omega;
        }
      }
      if (!summaries) continue;
      if (per_group) {  // one summary per KV head: its rounding is shared by the G heads
        group_weight += weight.cwiseAbs();
        group_signed += weight;
        if (h < (g + 1) * ctx.G - 1) continue;
        weight = group_signed;
      }
      const SummaryRounding rounding = summary_rounding(ctx, h);
      variance += (per_group ? group_weight : weight).array().square().cwiseProduct(
                      rounding.variance.array()).sum();
      for (size_t m = 0; m < 2; ++m) {
        key_error[m] += weight.cwiseProduct(rounding.key[m]).sum();
        bias_error[m] += weight.cwiseProduct(rounding.bias[m]).sum();
        // the weights' rounding reaches k' and b' each or not (a kernel may take b' from fp32 p)
        weights_key_error[m] += weight.leftCols(d).cwiseProduct(rounding.weights[m].leftCols(d)).sum();
        weights_bias_error[m] += weight.col(d).cwiseProduct(rounding.weights[m].col(d)).sum();
      }
    }
  }
  shifts.points = {score_error, key_error, bias_error, weights_key_error, weights_bias_error};
  shifts.store_alternatives.clear();
  for (const Bf16Rounding mode : modes) {
    shifts.store_alternatives.push_back(store_exact[static_cast<size_t>(mode)]);
    shifts.store_alternatives.push_back(store_smeared[static_cast<size_t>(mode)]);
  }
  return {std::sqrt(variance)};
}

// Whether each kernel head has the truth's shape (else the element-wise report says so).
bool shape_problems_free(const std::vector<Matrix<double>>& kernel,
                         const std::vector<HeadOutputs<double>>& truth) {
  if (kernel.size() != truth.size()) return false;
  for (size_t h = 0; h < truth.size(); ++h)
    if (kernel[h].rows() != truth[h].o.rows() || kernel[h].cols() != truth[h].o.cols()) return false;
  return true;
}

// Per head and row, g_r = d lse_r / d log(sigma): the lse of the fusion of `selection` with the
// logit scale sigma (1 + eta) (summaries, scores and window alike), minus the truth, over eta.
// A logit scale off by a fraction delta moves every row by delta g_r to first order.
RowWeights lse_scale_sensitivity(const Context& ctx, const std::vector<IndexMatrix>& selection,
                                 const std::vector<HeadOutputs<double>>& truth) {
  const auto moved = fusion_from_own(ctx, scale_moved(ctx), ctx.inputs, selection,
                                     own_scaled_fusion(ctx));
  RowWeights g;
  for (size_t h = 0; h < truth.size(); ++h) g.push_back((moved[h].lse - truth[h].lse) / kScaleEta);
  return g;
}

// The reference as the kernel stored its lse: rounded to bf16 as the kernel rounded
// (bf16_store_rounding) when every finite value it gave is a bf16 number; else the truth.
// Comparing like with like removes the bias of a truncating store.
std::vector<Vector<double>> stored_reference(const std::optional<Bf16Rounding>& rounding,
                                             const std::vector<HeadOutputs<double>>& truth) {
  std::vector<Vector<double>> lse;
  for (const auto& head : truth)
    lse.push_back(!rounding ? head.lse : head.lse.unaryExpr([&](double x) { return round_to_bf16(x, *rounding); }).eval());
  return lse;
}

// The rounding of the kernel's bf16 conversions of summaries and scores, and where it was read:
// as declared, or (detect) as the kernel's bf16-stored lse, else o, shows; nullopt = either.
std::pair<std::optional<Bf16Rounding>, std::string> conversion_rounding(
    const Context& ctx, const KernelOutputs& kernel, const std::optional<Bf16Rounding>& lse_store,
    const std::vector<HeadOutputs<double>>& truth) {
  switch (ctx.options.bf16_rounding) {
    case Bf16RoundingClaim::nearest: return {Bf16Rounding::nearest, "to nearest (declared)"};
    case Bf16RoundingClaim::toward_zero: return {Bf16Rounding::toward_zero, "toward zero (declared)"};
    case Bf16RoundingClaim::any: return {std::nullopt, "either (declared any)"};
    case Bf16RoundingClaim::detect: break;
  }
  auto name = [](Bf16Rounding r) { return r == Bf16Rounding::nearest ? "to nearest" : "toward zero"; };
  if (lse_store) return {lse_store, std::string(name(*lse_store)) + " (read from the stored lse)"};
  if (!kernel.o.empty() && shape_problems_free(kernel.o, truth)) {
    const auto o_store = bf16_store_rounding(kernel.o, field_of(truth, &HeadOutputs<double>::o));
    if (o_store) return {o_store, std::string(name(*o_store)) + " (read from the stored o)"};
  }
  return {std::nullopt, "either (no bf16-stored lse or o to read it from)"};
}

// The most terms a row's softmax sum can hold: every key, every chunk and a softmax1 logit.
int64_t softmax_terms(const Context& ctx) {
  const int64_t T = ctx.geometry.T();
  return T + (T + ctx.geometry.S() - 1) / ctx.geometry.S() + 1;
}

}  // namespace

// The statistics over all lse rows (hierarchical fusion, bf16 scores): the mean error and the
// logit-scale slope sum g e / sum g^2, each against what a correct kernel's rounding gives.
void check_lse_shifts(const Context& ctx, const std::vector<IndexMatrix>& selection,
                      const std::vector<HeadOutputs<double>>& truth,
                      const std::vector<HeadOutputs<float>>& base, const KernelOutputs& kernel,
                      TensorReport& report) {
  const auto rounding = bf16_store_rounding(as_columns(kernel.lse), field_of(truth, &HeadOutputs<double>::lse));
  const std::vector<Vector<double>> reference = stored_reference(rounding, truth);
  const auto [conversions, conversions_text] = conversion_rounding(ctx, kernel, rounding, truth);
  const RowWeights g = lse_scale_sensitivity(ctx, selection, truth);
  int64_t count = 0;
  double sum_g2 = 0;
  for (size_t h = 0; h < truth.size(); ++h)
    for (Eigen::Index r = 0; r < truth[h].lse.size(); ++r)
      if (std::isfinite(kernel.lse[h](r)) && std::isfinite(reference[h](r))) {
        ++count;
        sum_g2 += g[h](r) * g[h](r);
      }
  if (count == 0) return;
  report.stored_as = describe_store(rounding);
  report.conversions = conversions_text;
  // a_r per statistic; value, baseline and the residual spread of sum a e.
  auto run = [&](const std::string& name, const std::string& unit, const RowWeights& a,
                 const RowWeights& fit_shape) {
    ShiftTest test;
    test.name = name;
    test.unit = unit;
    double fit_a = 0;  // a . fit_shape, to scale the fitted values from the value
    double sum_abs_a = 0;
    for (size_t h = 0; h < truth.size(); ++h)
      for (Eigen::Index r = 0; r < truth[h].lse.size(); ++r) {
        const double y = kernel.lse[h](r);
        if (!std::isfinite(y) || !std::isfinite(reference[h](r))) continue;
        test.value += a[h](r) * (y - reference[h](r));
        test.baseline += a[h](r) * (static_cast<double>(base[h].lse(r)) - truth[h].lse(r));
        fit_a += a[h](r) * fit_shape[h](r);
        sum_abs_a += std::fabs(a[h](r));
      }
    const double fit = fit_a != 0 ? test.value / fit_a : 0.0;  // e_r ~ fit x fit_shape_r
    double spread = 0;
    for (size_t h = 0; h < truth.size(); ++h)
      for (Eigen::Index r = 0; r < truth[h].lse.size(); ++r) {
        const double y = kernel.lse[h](r);
        if (!std::isfinite(y) || !std::isfinite(reference[h](r))) continue;
        const double residual = y - reference[h](r) - fit * fit_shape[h](r);
        spread += a[h](r) * a[h](r) * residual * residual;
      }
    test.spread_standard_error = std::sqrt(spread);
    test.approximation_allowance = sum_abs_a * Tolerances::fp32_lse_approximation(softmax_terms(ctx));
    RoundingShifts shifts;
    const MeanShiftBound bound = lse_shift_bound(ctx, selection, truth, a, rounding, conversions, shifts);
    std::tie(test.rounding_low, test.rounding_high) = shifts.range(conversions);
    std::tie(test.store_low, test.store_high) = shifts.store_range();
    check_shift(report, test, bound);
  };
  RowWeights mean_weight, ones, slope_weight;
  for (size_t h = 0; h < truth.size(); ++h) {
    const Eigen::Index rows = truth[h].lse.size();
    mean_weight.push_back(Vector<double>::Constant(rows, 1.0 / static_cast<double>(count)));
    ones.push_back(Vector<double>::Ones(rows));
    slope_weight.push_back(sum_g2 > 0 ? Vector<double>(g[h] / sum_g2) : Vector<double>::Zero(rows));
  }
  run("mean", "", mean_weight, ones);
  if (sum_g2 > 0) run("logit scale", " of sigma", slope_weight, g);
}

}  // namespace hils::oracle::detail
