// The oracle for backward kernels (data/verify_format.md "Gradients"): a kernel's dq, dk, dv,
// dq~ and dprior against run_mechanism_backward in double (truth) and float (baseline), with
// the forward's policy (2 x the float error + a floor of the kernel's precision).
#include "oracle_gradients.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "hils/backward.hpp"
#include "oracle_context.hpp"
#include "text_format.hpp"

namespace hils::oracle::detail {

namespace {

double max_abs(const std::vector<Matrix<double>>& heads) {
  double m = 0;
  for (const auto& x : heads) m = std::max(m, x.size() ? x.cwiseAbs().maxCoeff() : 0.0);
  return m;
}

// Upstream gradients must be what a backward can take: Hq x [T x dv] finite d_o, optional
// Hq x [T] finite d_lse (they are the kernel's inputs: a wrong one is the caller's error).
void require_upstream(const KernelGradients& grads, const AttentionInputs<double>& inputs) {
  const int64_t Hq = inputs.Hq(), T = inputs.T(), dv = inputs.dv();
  // "[a, b, c]", appended piecewise (GCC 12 warns falsely (-Wrestrict) on long "+" chains).
  auto shape = [](std::initializer_list<int64_t> dims) {
    std::string text = "[";
    for (int64_t n : dims) text += (text.size() > 1 ? ", " : "") + std::to_string(n);
    return text += "]";
  };
  const bool d_o_shape =
      static_cast<int64_t>(grads.d_o.size()) == Hq &&
      std::all_of(grads.d_o.begin(), grads.d_o.end(),
                  [&](const Matrix<double>& m) { return m.rows() == T && m.cols() == dv; });
  require(d_o_shape, "inputs/do", shape({Hq, T, dv}) + " (heads, all T queries, dv)",
          grads.d_o.empty() ? "none"
                            : shape({static_cast<int64_t>(grads.d_o.size()), grads.d_o[0].rows(),
                                     grads.d_o[0].cols()}));
  for (const auto& m : grads.d_o) require(m.allFinite(), "inputs/do", "finite values", "NaN or Inf");
  if (grads.d_lse.empty()) return;
  const bool d_lse_shape =
      static_cast<int64_t>(grads.d_lse.size()) == Hq &&
      std::all_of(grads.d_lse.begin(), grads.d_lse.end(),
                  [&](const Vector<double>& x) { return x.size() == T; });
  require(d_lse_shape, "inputs/dlse", shape({Hq, T}),
          shape({static_cast<int64_t>(grads.d_lse.size()),
                 static_cast<int64_t>(grads.d_lse[0].size())}));
  for (const auto& x : grads.d_lse)
    require(x.allFinite(), "inputs/dlse", "finite values", "NaN or Inf");
}

// The upstream gradients as the reference takes them; a bf16 kernel's d_o is rounded to bf16
// like its other inputs (a no-op when it already is).
template <class Scalar>
OutputGradients<Scalar> upstream_of(const KernelGradients& grads, InputPrecision precision) {
  OutputGradients<Scalar> up;
  for (const auto& m : grads.d_o) {
    Matrix<double> x = m;
    x = x.unaryExpr([precision](double e) { return round_to_input_precision(e, precision); });
    up.d_o.push_back(x.cast<Scalar>());
  }
  for (const auto& x : grads.d_lse) up.d_lse.push_back(x.cast<Scalar>());
  return up;
}

// "is exactly zero on h=0 rows 128-191 (chunk 2) ...": blocks of S rows (chunk-aligned) that
// the kernel left all zero where the truth is not, e.g. a key block its backward skipped.
std::string diagnose_zero_blocks(const std::vector<Matrix<double>>& kernel,
                                 const std::vector<Matrix<double>>& truth, int64_t S) {
  std::string found;
  int64_t count = 0;
  for (size_t h = 0; h < kernel.size() && h < truth.size(); ++h) {
    if (kernel[h].rows() != truth[h].rows() || kernel[h].cols() != truth[h].cols()) return "";
    for (int64_t a = 0; a < truth[h].rows(); a += S) {
      const int64_t n = std::min(S, truth[h].rows() - a);
      if (!kernel[h].middleRows(a, n).isZero(0) || truth[h].middleRows(a, n).isZero(0)) continue;
      if (count++ < 4)
        found += format("%sh=%zu rows %lld-%lld (chunk %lld)", found.empty() ? "" : ", ", h,
                        static_cast<long long>(a), static_cast<long long>(a + n - 1),
                        static_cast<long long>(a / S));
    }
  }
  if (count == 0) return "";
  return "is exactly zero on " + found + (count > 4 ? format(" and %lld more", count - 4) : "") +
         " where the reference is not: the kernel left those rows' gradient out (a skipped "
         "key/query block?)";
}

// "is the reference times 0.707...": the kernel's tensor is a constant multiple of the truth
// (within the tolerance) and the constant is not 1, e.g. a wrong logit scale in the backward.
std::string diagnose_scaled(const std::vector<Matrix<double>>& kernel,
                            const std::vector<Matrix<double>>& truth, double tolerance,
                            double scale) {
  double kt = 0, tt = 0;
  for (size_t h = 0; h < kernel.size() && h < truth.size(); ++h) {
    if (kernel[h].rows() != truth[h].rows() || kernel[h].cols() != truth[h].cols()) return "";
    kt += (kernel[h].array() * truth[h].array()).sum();
    tt += truth[h].squaredNorm();
  }
  if (!(tt > 0) || !std::isfinite(kt)) return "";
  const double factor = kt / tt;
  double residual = 0;
  for (size_t h = 0; h < truth.size(); ++h)
    residual = std::max(residual, (kernel[h] - factor * truth[h]).cwiseAbs().maxCoeff());
  if (residual > tolerance || std::fabs(factor - 1) * max_abs(truth) <= tolerance) return "";
  return format("is the reference times %.6g (within the tolerance): a constant factor is wrong, "
                "e.g. the logit scale sigma (the spec's sigma = %.6g; sigma x %.6g = %.6g)",
                factor, scale, factor, scale * factor);
}

// Whether the kernel's tensor matches the gradient of the fusion with softmax1 flipped.
std::string diagnose_softmax1(const MechanismSpec& spec, const std::vector<Matrix<double>>& kernel,
                              const std::vector<Matrix<double>>& flipped, double tolerance) {
  if (flipped.size() != kernel.size() || flipped.empty()) return "";
  for (size_t h = 0; h < kernel.size(); ++h)
    if (flipped[h].rows() != kernel[h].rows() || flipped[h].cols() != kernel[h].cols() ||
        !((flipped[h] - kernel[h]).cwiseAbs().maxCoeff() <= tolerance))
      return "";
  return spec.softmax1 ? "matches the gradient of the fusion without the softmax1 zero logit: the "
                         "kernel's backward is missing the softmax1 term (spec.softmax1 = true)"
                       : "matches the gradient of the fusion with a softmax1 zero logit that the "
                         "spec does not have (spec.softmax1 = false)";
}

// One gradient tensor to compare: its name, row label and the field in each struct.
struct GradientField {
  const char* name;
  const char* row_label;  // "t" (query slot), "slot" (key slot), "c" (prior row)
  std::vector<Matrix<double>> KernelGradients::*kernel;
  std::vector<Matrix<double>> InputGradients<double>::*truth;
  std::vector<Matrix<float>> InputGradients<float>::*baseline;
  const char* absent;  // why the truth may have no such tensor
};

const GradientField kGradientFields[] = {
    {"dq", "t", &KernelGradients::dq, &InputGradients<double>::dq, &InputGradients<float>::dq, ""},
    {"dq_retrieval", "t", &KernelGradients::dq_retrieval, &InputGradients<double>::dq_retrieval,
     &InputGradients<float>::dq_retrieval,
     "the inputs have no q_retrieval (q~ = q: its gradient is part of dq)"},
    {"dk", "slot", &KernelGradients::dk, &InputGradients<double>::dk, &InputGradients<float>::dk, ""},
    {"dv", "slot", &KernelGradients::dv, &InputGradients<double>::dv, &InputGradients<float>::dv, ""},
    {"dprior", "c", &KernelGradients::dprior, &InputGradients<double>::dprior,
     &InputGradients<float>::dprior, "the inputs have no prior (/inputs/prior)"},
};

// A hierarchical fusion's summaries, in fp16 (data/verify_format.md "Gradients"): the kernel
// rounds d s_hat before dq~ = sigma d s_hat K' and dK' = sigma d s_hat^T Q~, the summaries'
// gradients dk', db' before the key rule's backward, and the prior's d ell before dk += sigma
// d ell mu^T and d mu = sigma K^T d ell, each by up to 2^-25 below 2^-14 (p, k' and the
// fusion weights stay fp32: the summaries' arithmetic is score_precision's). First order, per
// query head h and chunk c, in units of 2^-25 (the most over chunks):
//   dk'_c,i: sigma sum_{t selecting c} |q~_t,i| (its d s_hat) + 1 (its own)     = key
//   db'_c:   |{t selecting c}| + 1                                             = bias
//   d ell_j / p_j: taylor ||k_j - k'_c||_1 key + entropy |ell_j - sum p ell| bias = ell
//     (d ell_j = p_j (k_j - k').dk' - db' p_j (ell_j - sum p ell), SEMANTICS.md section 6)
//   d mu_c,i = sigma sum_j d ell_j k_j,i: sigma max|k| (|T_c| + ell)        -> prior_row
//   dk_j: the key rule's dk' (landmark_key, taylor: key; mean: key / |T_c|) and
//     sigma |mu_c| (1 + ell) through d ell, summed over the KV group's heads  -> key_rows
struct SummaryRounding {
  double prior_row = 0;  // one d mu_c row (q~ at its landmark slot, or a given prior's row)
  double prior_sum = 0;  // a shared prior's one row: the sum over chunks of d mu_c
  double key_rows = 0;   // one dk row's part from the key rule
};

SummaryRounding summary_rounding(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                 const std::vector<IndexMatrix>& selection) {
  const Geometry geometry = geometry_of(spec, inputs.T());
  const double sigma = logit_scale(spec, inputs.d());
  const int64_t S = geometry.S(), tokens = geometry.tokens_per_chunk(),
                chunks = geometry.n_chunks(), G = inputs.Hq() / inputs.Hkv();
  const bool taylor = spec.key_rule == KeyRule::taylor;
  const bool entropy = spec.bias_rule == BiasRule::entropy;
  const double kappa = sigma * max_abs(inputs.k);
  SummaryRounding out;
  for (int64_t g = 0; g < inputs.Hkv(); ++g) {
    const auto& sel = selection[static_cast<size_t>(g)];
    const auto& k = inputs.k[static_cast<size_t>(g)];
    Vector<double> key_rows = Vector<double>::Zero(chunks);
    for (int64_t h = g * G; h < (g + 1) * G; ++h) {
      const auto& q_retrieval = inputs.retrieval_query(h);
      Matrix<double> column_sums = Matrix<double>::Zero(chunks, inputs.d());
      Vector<double> selectors = Vector<double>::Zero(chunks);
      for (int64_t t = 0; t < sel.rows(); ++t)
        for (int64_t s = 0; s < sel.cols(); ++s)
          if (sel(t, s) >= 0) {
            column_sums.row(sel(t, s)) += q_retrieval.row(t).cwiseAbs();
            selectors(sel(t, s)) += 1.0;
          }
      const Matrix<double> prior =
          spec.needs_prior() ? resolve_prior(inputs, h, spec, geometry) : Matrix<double>();
      double prior_sum = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const double key = sigma * column_sums.row(c).maxCoeff() + 1.0;
        const double bias = selectors(c) + 1.0;
        key_rows(c) += spec.key_rule == KeyRule::mean ? key / static_cast<double>(tokens) : key;
        if (!spec.needs_prior()) continue;
        const auto keys = k.middleRows(c * S, tokens);
        const Vector<double> ell = sigma * (keys * prior.row(c).transpose());
        Vector<double> p = (ell.array() - ell.maxCoeff()).exp().matrix();
        p /= p.sum();
        const RowVector<double> mean_key = p.transpose() * keys;  // k'_c for taylor
        const double spread = (ell.array() - p.dot(ell)).abs().maxCoeff();
        const double distance = (keys.rowwise() - mean_key).cwiseAbs().rowwise().sum().maxCoeff();
        const double d_ell = (taylor ? distance * key : 0.0) + (entropy ? spread * bias : 0.0);
        const double d_mu = kappa * (static_cast<double>(tokens) + d_ell);
        out.prior_row = std::max(out.prior_row, d_mu);
        prior_sum += d_mu;
        key_rows(c) += sigma * prior.row(c).cwiseAbs().maxCoeff() * (1.0 + d_ell);
      }
      out.prior_sum = std::max(out.prior_sum, prior_sum);
    }
    if (chunks > 0) out.key_rows = std::max(out.key_rows, key_rows.maxCoeff());
  }
  return out;
}

// The absolute error fp16 rounding may add to gradient `name` (Tolerances::
// subnormal_gradient_error; 0 but for fp16): dq sums sigma dS K over the keys of its query's
// softmaxes, dk sigma dS^T Q and dv P^T dO over the queries of the KV group that read its key
// (G x T; G x min(T, W + S - 1) for window fusion: window_slots). A hierarchical fusion with
// summaries adds K d s_hat (times sigma max |k'| <= sigma max |k|) to dq~ (dq when q~ = q), a
// d mu row at the landmark slots (landmark_query prior) and the key rule's rows to dk
// (summary_rounding); dprior gets its d mu rows. Elsewhere q~ and the prior reach no output
// and get the store's term only.
// `chain` is summary_rounding's (zero without summaries).
double subnormal_error(const char* name, const MechanismSpec& spec,
                       const AttentionInputs<double>& inputs, const OutputGradients<double>& up,
                       const SummaryRounding& chain, InputPrecision precision) {
  if (precision != InputPrecision::fp16) return 0.0;  // no pass over the inputs for the others
  const double sigma = logit_scale(spec, inputs.d());
  const int64_t T = inputs.T(), G = inputs.Hq() / std::max<int64_t>(inputs.Hkv(), 1);
  const int64_t readers =
      spec.fusion == Fusion::window ? std::min<int64_t>(T, window_slots(spec)) : T;
  const double queries_per_key = static_cast<double>(G) * static_cast<double>(readers);
  const double kappa = sigma * max_abs(inputs.k);
  const bool summaries = spec.fusion == Fusion::hierarchical && spec.key_rule != KeyRule::exact;
  const bool landmark_prior =
      spec.needs_prior() && spec.prior_rule == PriorRule::landmark_query;
  // dq~ of one row: its K d s_hat, and d mu_c at chunk c's landmark slot.
  const Tolerances::SubnormalTerm dscore{summaries ? static_cast<double>(spec.K) : 0.0, kappa};
  const Tolerances::SubnormalTerm prior_row{landmark_prior ? 1.0 : 0.0, chain.prior_row};
  const std::string tensor = name;
  if (tensor == "dq") {
    const bool holds_retrieval = inputs.q_retrieval.empty();  // q~ = q: its gradient is in dq
    return Tolerances::subnormal_gradient_error(
        precision, {{static_cast<double>(keys_per_softmax(spec, T)), kappa},
                    holds_retrieval ? dscore : Tolerances::SubnormalTerm{},
                    holds_retrieval ? prior_row : Tolerances::SubnormalTerm{}});
  }
  if (tensor == "dq_retrieval")
    return Tolerances::subnormal_gradient_error(precision, {dscore, prior_row});
  if (tensor == "dk")
    return Tolerances::subnormal_gradient_error(
        precision, {{queries_per_key, sigma * max_abs(inputs.q)}, {1.0, chain.key_rows}});
  if (tensor == "dv")
    return Tolerances::subnormal_gradient_error(precision, {{queries_per_key, max_abs(up.d_o)}});
  if (tensor == "dprior" && summaries && spec.needs_prior() && !landmark_prior) {
    const bool shared_row = !inputs.prior.empty() && inputs.prior[0].rows() == 1;
    return Tolerances::subnormal_gradient_error(
        precision, {{1.0, shared_row ? chain.prior_sum : chain.prior_row}});
  }
  return Tolerances::subnormal_gradient_error(precision, {});
}

}  // namespace

std::vector<TensorReport> compare_gradients(const MechanismSpec& spec,
                                            const AttentionInputs<double>& inputs,
                                            const AttentionInputs<float>& inputs_float,
                                            const std::vector<IndexMatrix>& selection,
                                            const MechanismOutputs<double>& truth_forward,
                                            const MechanismOutputs<float>& baseline_forward,
                                            const KernelGradients& kernel,
                                            const VerifyOptions& options,
                                            std::vector<std::string>& not_compared) {
  // kernel gradients -> one report per returned gradient (policy: oracle.hpp, Tolerances).
  require_upstream(kernel, inputs);
  const OutputGradients<double> upstream = upstream_of<double>(kernel, options.precision);
  InputGradients<double> truth;
  InputGradients<float> baseline;
  try {
    truth = run_mechanism_backward(spec, inputs, selection, upstream, &truth_forward);
    baseline = run_mechanism_backward(spec, inputs_float, selection,
                                      upstream_of<float>(kernel, options.precision),
                                      &baseline_forward);
  } catch (const InvalidArgument& e) {
    // Upstream and inputs are valid by now: what remains is the kernel's selection.
    TensorReport r;
    r.name = "gradients";
    r.problems.push_back(std::string("gradients not compared: the kernel's selection cannot be "
                                     "held fixed (") + e.what() + ")");
    return {r};
  }
  std::vector<TensorReport> reports;
  // fp16's count of the summaries' rounded gradients (the selection is valid by now).
  const SummaryRounding chain = options.precision == InputPrecision::fp16 &&
                                        spec.fusion == Fusion::hierarchical &&
                                        spec.key_rule != KeyRule::exact
                                    ? summary_rounding(spec, inputs, selection)
                                    : SummaryRounding{};
  std::optional<InputGradients<double>> flipped;  // softmax1 flipped, computed on demand
  const double scale = logit_scale(spec, inputs.d());
  for (const auto& field : kGradientFields) {
    const auto& ker = kernel.*field.kernel;
    if (ker.empty()) continue;
    const auto& tru = truth.*field.truth;
    if (tru.empty()) {
      TensorReport r;
      r.name = field.name;
      r.problems.push_back(format("%s: given, but %s", field.name, field.absent));
      reports.push_back(r);
      continue;
    }
    const double magnitude = std::max(max_abs(tru), std::numeric_limits<double>::min());
    const double absolute =
        subnormal_error(field.name, spec, inputs, upstream, chain, options.precision);
    auto r = compare_tensor(field.name, ker, tru, widen(baseline.*field.baseline), magnitude,
                            options.precision, field.row_label, {}, options.max_messages,
                            absolute / magnitude);
    if (absolute >= max_abs(tru) && max_abs(tru) > 0)  // a worst case beyond the gradient itself
      not_compared.push_back(format(
          "grads/%s beyond fp16's worst case: the floor's absolute term %.3g reaches the "
          "gradient's largest entry %.3g, so even zeros would pass; scale do up (loss scaling) to "
          "judge it (data/verify_format.md \"Gradients\")",
          field.name, absolute, max_abs(tru)));
    if (!r.passed && r.problems.size() == 1) {  // only the tolerance failed: look for a cause
      if (std::string(field.row_label) != "c")
        r.diagnosis = diagnose_zero_blocks(ker, tru, spec.S);
      if (r.diagnosis.empty()) r.diagnosis = diagnose_scaled(ker, tru, r.tolerance, scale);
      if (r.diagnosis.empty() && spec.fusion == Fusion::hierarchical) {
        if (!flipped) {
          MechanismSpec other = spec;
          other.softmax1 = !spec.softmax1;
          flipped = run_mechanism_backward(other, inputs, selection, upstream);
        }
        r.diagnosis = diagnose_softmax1(spec, ker, (*flipped).*field.truth, r.tolerance);
      }
    }
    reports.push_back(std::move(r));
  }
  return reports;
}

}  // namespace hils::oracle::detail
