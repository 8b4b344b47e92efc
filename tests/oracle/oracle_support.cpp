#include "oracle_support.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "hils/backward.hpp"

namespace hils::oracle::testing {

AttentionInputs<float> to_float(const AttentionInputs<double>& in) {
  // inputs in double -> the same numbers rounded to float.
  AttentionInputs<float> out;
  for (const auto& x : in.q) out.q.push_back(x.cast<float>());
  for (const auto& x : in.k) out.k.push_back(x.cast<float>());
  for (const auto& x : in.v) out.v.push_back(x.cast<float>());
  for (const auto& x : in.q_retrieval) out.q_retrieval.push_back(x.cast<float>());
  for (const auto& x : in.prior) out.prior.push_back(x.cast<float>());
  return out;
}

namespace {

// Rounds every entry of a head list to bf16 (the store of a bf16 kernel); -inf stays.
template <class M>
void round_heads(std::vector<M>& heads, Bf16Rounding rounding) {
  for (auto& m : heads) m = m.unaryExpr([rounding](double x) { return round_to_bf16(x, rounding); });
}

}  // namespace

AttentionInputs<float> kernel_inputs(const AttentionInputs<double>& inputs, InputPrecision precision) {
  // inputs -> what a kernel of this precision computes from, in float.
  return to_float(precision == InputPrecision::bf16 ? round_inputs_to_bf16(inputs) : inputs);
}

void round_as_stored(const MechanismSpec& spec, KernelOutputs& out, InputPrecision precision,
                     InputPrecision score_precision, Bf16Rounding rounding) {
  // outputs -> the same outputs as a kernel of these precisions stores them.
  if (precision == InputPrecision::bf16) {
    round_heads(out.o, rounding);
    round_heads(out.o_window, rounding);
  }
  if (score_precision == InputPrecision::bf16) {
    round_heads(out.surrogate_scores, rounding);
    round_heads(out.summary_key, rounding);
    round_heads(out.summary_bias, rounding);
    if (spec.fusion == Fusion::hierarchical) {
      round_heads(out.lse, rounding);
      round_heads(out.fusion_weights, rounding);
    }
  }
}

KernelOutputs float_kernel(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                           InputPrecision precision, InputPrecision score_precision,
                           Bf16Rounding rounding) {
  // spec, inputs -> every stage of run_mechanism<float>, widened.
  const AttentionInputs<float> in = kernel_inputs(inputs, precision);
  RunOptions options;
  options.keep_surrogate_scores = spec.selects();
  options.keep_window = true;
  const auto run = run_mechanism(spec, in, options);
  KernelOutputs out;
  for (const auto& h : run.heads) {
    out.o.push_back(h.o.cast<double>());
    out.lse.push_back(h.lse.cast<double>());
    out.fusion_weights.push_back(h.fusion_weights.cast<double>());
    out.o_window.push_back(h.o_window.cast<double>());
    out.lse_window.push_back(h.lse_window.cast<double>());
    if (spec.selects()) out.surrogate_scores.push_back(h.surrogate_scores.cast<double>());
  }
  out.selection = run.selection;
  if (spec.selects() && spec.key_rule != KeyRule::exact) {
    const Geometry geometry = geometry_of(spec, in.T());
    const float scale = static_cast<float>(logit_scale(spec, in.d()));
    for (int64_t h = 0; h < in.Hq(); ++h) {
      const Matrix<float> prior =
          spec.needs_prior() ? resolve_prior(in, h, spec, geometry) : Matrix<float>();
      const auto s = summarize(in.k[h / (in.Hq() / in.Hkv())], prior, spec.key_rule,
                               spec.bias_rule, geometry, scale);
      out.summary_key.push_back(s.key.cast<double>());
      out.summary_bias.push_back(s.bias.cast<double>());
    }
  }
  round_as_stored(spec, out, precision, score_precision, rounding);
  return out;
}

KernelOutputs bf16_everywhere_kernel(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                     Bf16Rounding rounding) {
  // spec, inputs -> o, lse, selection of a kernel rounding at every point a bf16 one may.
  const auto bf16 = InputPrecision::bf16;
  KernelOutputs out = float_kernel(spec, inputs, bf16, bf16, rounding);
  const AttentionInputs<float> in = kernel_inputs(inputs, bf16);
  const Geometry geometry = geometry_of(spec, in.T());
  const float scale = static_cast<float>(logit_scale(spec, in.d()));
  const int64_t G = in.Hq() / in.Hkv(), tokens = geometry.tokens_per_chunk();
  auto to_bf16 = [rounding](double x) { return round_to_bf16(x, rounding); };
  auto round = [&](const auto& m) {
    return m.unaryExpr([&](float x) { return static_cast<float>(to_bf16(x)); }).eval();
  };
  std::vector<int64_t> all(static_cast<size_t>(in.T()));
  for (int64_t t = 0; t < in.T(); ++t) all[static_cast<size_t>(t)] = t;
  std::vector<Matrix<float>> scores;
  std::vector<Vector<float>> lse_window;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const Matrix<float>& k = in.k[h / G];
    const Matrix<float> prior =
        spec.needs_prior() ? resolve_prior(in, h, spec, geometry) : Matrix<float>();
    ChunkSummaries<float> s = summarize(k, prior, spec.key_rule, spec.bias_rule, geometry, scale);
    for (int64_t c = 0; c < geometry.n_chunks() && spec.key_rule == KeyRule::taylor; ++c) {
      const auto keys = k.middleRows(c * spec.S, tokens);
      const Vector<float> logits = scale * (keys * prior.row(c).transpose());
      Vector<float> p = (logits.array() - logits.maxCoeff()).exp().matrix();
      p = round(Vector<float>(p / p.sum()));
      s.key.row(c) = p.transpose() * keys;
    }
    s.key = round(s.key);
    s.bias = round(s.bias);
    scores.push_back(round(surrogate_scores(in.retrieval_query(h), s, geometry, scale, all)));
    lse_window.push_back(window_attention(in.q[h], k, in.v[h / G], geometry, scale, all).lse);
  }
  for (int64_t g = 0; g < in.Hkv(); ++g)
    out.selection[g] = select_chunks(
        std::vector<Matrix<float>>(scores.begin() + g * G, scores.begin() + (g + 1) * G),
        std::vector<Vector<float>>(lse_window.begin() + g * G, lse_window.begin() + (g + 1) * G),
        spec.group_rule, spec.K, geometry, all);
  const auto fused = forced_fusion(spec, in, out.selection, all);  // o of its own selection
  for (int64_t h = 0; h < in.Hq(); ++h) {
    out.o[h] = fused[h].o.cast<double>().unaryExpr(to_bf16);
    const IndexMatrix& sel = out.selection[h / G];
    for (int64_t t = 0; t < in.T(); ++t) {
      // lse = log(exp(lse_swa) + sum_selected exp(s_hat) [+ 1]) (Eq. 10), from rounded parts.
      std::vector<double> logits = {lse_window[h](t)};  // fp32, as the oracle holds lse_window
      for (Eigen::Index i = 0; i < sel.cols(); ++i)
        if (sel(t, i) >= 0) logits.push_back(scores[h](t, sel(t, i)));
      if (spec.softmax1) logits.push_back(0.0);
      const double top = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (double a : logits) sum += std::exp(a - top);
      out.lse[h](t) = to_bf16(top + std::log(sum));
    }
  }
  return out;
}

std::string plant_wrong_chunk(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                              const AttentionInputs<float>& kernel_in, KernelOutputs& kernel) {
  // kernel outputs -> the same with one selection row wrong and o, lse, weights fused from it.
  RunOptions keep;
  keep.keep_surrogate_scores = keep.keep_window = true;
  const auto truth = run_mechanism(spec, inputs, keep);
  const int64_t G = inputs.Hq() / inputs.Hkv(), t = inputs.T() - 1;
  std::vector<Matrix<double>> scores;
  std::vector<Vector<double>> lse;
  for (int64_t h = 0; h < G; ++h) {
    scores.push_back(truth.heads[h].surrogate_scores);
    lse.push_back(truth.heads[h].lse_window);
  }
  const Matrix<double> r = group_scores(scores, lse, spec.group_rule);
  IndexMatrix& sel = kernel.selection[0];
  int32_t* row = sel.row(t).data();
  int32_t* end = row + spec.K;
  const int64_t candidates = geometry_of(spec, inputs.T()).candidate_count(t);
  if (candidates <= spec.K || spec.K == 0)
    throw InvalidArgument("wrong_chunk: the last query needs more candidates than K");
  int32_t best = row[0], worst = -1;
  for (int32_t* p = row; p != end; ++p)
    if (r(t, *p) > r(t, best)) best = *p;
  for (int32_t c = 0; c < candidates; ++c)
    if (std::find(row, end, c) == end && (worst < 0 || r(t, c) < r(t, worst))) worst = c;
  std::replace(row, end, best, worst);
  std::sort(row, end);
  std::vector<int64_t> all(static_cast<size_t>(inputs.T()));
  for (int64_t q = 0; q < inputs.T(); ++q) all[static_cast<size_t>(q)] = q;
  const auto fused = forced_fusion(spec, kernel_in, kernel.selection, all);
  for (size_t h = 0; h < fused.size(); ++h) {
    kernel.o[h] = fused[h].o.cast<double>();
    kernel.lse[h] = fused[h].lse.cast<double>();
    kernel.fusion_weights[h] = fused[h].fusion_weights.cast<double>();
  }
  return "query t=" + std::to_string(t) + ", group 0: chunk " + std::to_string(worst) +
         " instead of " + std::to_string(best);
}

KernelGradients float_gradients(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                const std::vector<IndexMatrix>& selection, uint64_t seed,
                                InputPrecision precision) {
  // spec, inputs, selection -> Gaussian do, dlse and run_mechanism_backward<float>, widened.
  const bool bf16 = precision == InputPrecision::bf16;
  const AttentionInputs<float> in = to_float(bf16 ? round_inputs_to_bf16(inputs) : inputs);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  KernelGradients out;
  OutputGradients<float> up;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    Matrix<double> d_o(in.T(), in.dv());
    for (int64_t i = 0; i < d_o.size(); ++i) d_o.data()[i] = gauss(rng);
    if (bf16) d_o = d_o.unaryExpr([](double x) { return round_to_bf16(x); });
    Vector<double> d_lse(in.T());
    for (int64_t i = 0; i < d_lse.size(); ++i) d_lse(i) = static_cast<float>(gauss(rng));
    up.d_o.push_back(d_o.cast<float>());
    up.d_lse.push_back(d_lse.cast<float>());
    out.d_o.push_back(d_o.cast<float>().cast<double>());
    out.d_lse.push_back(d_lse);
  }
  const auto grads = run_mechanism_backward(spec, in, selection, up);
  out.dq = widen(grads.dq);
  out.dk = widen(grads.dk);
  out.dv = widen(grads.dv);
  out.dq_retrieval = widen(grads.dq_retrieval);
  out.dprior = widen(grads.dprior);
  if (bf16)
    for (auto* heads : {&out.dq, &out.dk, &out.dv, &out.dq_retrieval, &out.dprior})
      round_heads(*heads, Bf16Rounding::nearest);
  return out;
}

std::vector<MechanismSpec> specs_for(const cases::Case& c) {
  std::vector<MechanismSpec> specs;
  for (const char* name : {"full", "swa", "naive_bsa", "nsa", "lmk", "hils"}) {
    MechanismSpec spec = preset(name);
    const bool needs_landmarks = spec.key_rule == KeyRule::landmark_key ||
                                 (spec.needs_prior() && spec.prior_rule == PriorRule::landmark_query);
    if (needs_landmarks && !c.landmarks) {
      if (spec.key_rule == KeyRule::landmark_key) continue;
      spec.prior_rule = PriorRule::shared;
    }
    specs.push_back(cases::with_case_geometry(spec, c));
  }
  return specs;
}

}  // namespace hils::oracle::testing
