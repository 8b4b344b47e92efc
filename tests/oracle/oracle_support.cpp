#include "oracle_support.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
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

std::vector<int64_t> all_queries(int64_t T) {
  // T -> 0, 1, ..., T-1.
  std::vector<int64_t> all(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) all[static_cast<size_t>(t)] = t;
  return all;
}

void fuse_own_selection(const MechanismSpec& spec, const AttentionInputs<float>& in,
                        KernelOutputs& kernel) {
  // kernel.selection -> kernel.o, lse, fusion_weights fused from it in float on `in`.
  const auto fused = forced_fusion(spec, in, kernel.selection, all_queries(in.T()));
  kernel.o.resize(fused.size()), kernel.lse.resize(fused.size());
  kernel.fusion_weights.resize(fused.size());
  for (size_t h = 0; h < fused.size(); ++h) {
    kernel.o[h] = fused[h].o.cast<double>();
    kernel.lse[h] = fused[h].lse.cast<double>();
    kernel.fusion_weights[h] = fused[h].fusion_weights.cast<double>();
  }
}

ScorePath rounded_score_path(const MechanismSpec& spec, const AttentionInputs<float>& in,
                             const ScoreRounding& rounding) {
  // spec, float inputs, roundings -> s_hat, lse_swa, k', b' per head, selection per group.
  auto each = [](const auto& m, const std::function<float(float)>& f) {
    return m.unaryExpr([&f](float x) { return f(x); }).eval();
  };
  const Geometry geometry = geometry_of(spec, in.T());
  const float scale = static_cast<float>(logit_scale(spec, in.d()));
  const int64_t G = in.Hq() / in.Hkv(), tokens = geometry.tokens_per_chunk();
  const std::vector<int64_t> all = all_queries(in.T());
  ScorePath path;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const Matrix<float>& k = in.k[h / G];
    const Matrix<float> prior =
        spec.needs_prior() ? resolve_prior(in, h, spec, geometry) : Matrix<float>();
    ChunkSummaries<float> s = summarize(k, prior, spec.key_rule, spec.bias_rule, geometry, scale);
    for (int64_t c = 0; c < geometry.n_chunks() && spec.key_rule == KeyRule::taylor; ++c) {
      // k' = p^T k with the summary weights p rounded (Eq. 6's Taylor key).
      const auto keys = k.middleRows(c * spec.S, tokens);
      const Vector<float> logits = scale * (keys * prior.row(c).transpose());
      Vector<float> p = (logits.array() - logits.maxCoeff()).exp().matrix();
      p = each(Vector<float>(p / p.sum()), rounding.weights);
      s.key.row(c) = p.transpose() * keys;
    }
    s.key = rounding.keys(s.key);
    s.bias = each(s.bias, rounding.bias);
    path.summary_key.push_back(s.key);
    path.summary_bias.push_back(s.bias);
    path.scores.push_back(
        each(surrogate_scores(in.retrieval_query(h), s, geometry, scale, all), rounding.scores));
    path.lse_window.push_back(window_attention(in.q[h], k, in.v[h / G], geometry, scale, all).lse);
  }
  for (int64_t g = 0; g < in.Hkv(); ++g)
    path.selection.push_back(select_chunks(
        std::vector<Matrix<float>>(path.scores.begin() + g * G, path.scores.begin() + (g + 1) * G),
        std::vector<Vector<float>>(path.lse_window.begin() + g * G,
                                   path.lse_window.begin() + (g + 1) * G),
        spec.group_rule, spec.K, geometry, all));
  return path;
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
  return to_float(round_inputs_to(inputs, precision));
}

void round_as_stored(const MechanismSpec& spec, KernelOutputs& out, InputPrecision precision,
                     InputPrecision score_precision, Bf16Rounding rounding) {
  // outputs -> the same outputs as a kernel of these precisions stores them.
  if (precision == InputPrecision::bf16) {
    round_heads(out.o, rounding);
    round_heads(out.o_window, rounding);
  }
  if (precision == InputPrecision::fp16) {  // an fp16 kernel stores o as FlashAttention does
    for (auto* heads : {&out.o, &out.o_window})
      for (auto& m : *heads) m = m.unaryExpr([](double x) { return round_to_fp16(x); });
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
  auto to_bf16 = [rounding](double x) { return round_to_bf16(x, rounding); };
  const std::function<float(float)> round = [&](float x) { return static_cast<float>(to_bf16(x)); };
  ScoreRounding every;
  every.weights = every.bias = every.scores = round;
  every.keys = [&](const Matrix<float>& m) { return Matrix<float>(m.unaryExpr(round)); };
  const ScorePath path = rounded_score_path(spec, in, every);
  const auto& scores = path.scores;
  const auto& lse_window = path.lse_window;
  const int64_t G = in.Hq() / in.Hkv();
  out.selection = path.selection;
  const std::vector<int64_t> all = all_queries(in.T());
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

ChunkSwap swap_strongest_for_weakest(const MechanismSpec& spec,
                                    const AttentionInputs<double>& inputs, IndexMatrix& selection) {
  // group 0's selection -> its last row with the strongest chosen chunk swapped for the weakest
  // candidate left out (by the reference's group scores).
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
  int32_t* row = selection.row(t).data();
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
  return {t, best, worst};
}

std::string plant_wrong_chunk(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                              const AttentionInputs<float>& kernel_in, KernelOutputs& kernel) {
  // kernel outputs -> the same with one selection row wrong and o, lse, weights fused from it.
  const ChunkSwap swap = swap_strongest_for_weakest(spec, inputs, kernel.selection[0]);
  fuse_own_selection(spec, kernel_in, kernel);
  return "query t=" + std::to_string(swap.t) + ", group 0: chunk " + std::to_string(swap.worst) +
         " instead of " + std::to_string(swap.best);
}

KernelGradients float_gradients(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                const std::vector<IndexMatrix>& selection, uint64_t seed,
                                InputPrecision precision) {
  // spec, inputs, selection -> Gaussian do, dlse and run_mechanism_backward<float>, widened.
  const bool bf16 = precision == InputPrecision::bf16, fp16 = precision == InputPrecision::fp16;
  const AttentionInputs<float> in = kernel_inputs(inputs, precision);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  KernelGradients out;
  OutputGradients<float> up;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    Matrix<double> d_o(in.T(), in.dv());
    for (int64_t i = 0; i < d_o.size(); ++i) d_o.data()[i] = gauss(rng);
    if (bf16) d_o = d_o.unaryExpr([](double x) { return round_to_bf16(x); });
    if (fp16) d_o = d_o.unaryExpr([](double x) { return round_to_fp16(x); });
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
  for (auto* heads : {&out.dq, &out.dk, &out.dv, &out.dq_retrieval, &out.dprior}) {
    if (bf16) round_heads(*heads, Bf16Rounding::nearest);
    if (fp16)
      for (auto& m : *heads) m = m.unaryExpr([](double x) { return round_to_fp16(x); });
  }
  return out;
}

std::vector<MechanismSpec> specs_for(const cases::Case& c) {
  std::vector<MechanismSpec> presets;
  for (const auto& row : kPresets) presets.push_back(preset(row.name));
  std::vector<MechanismSpec> specs;
  for (MechanismSpec spec : cases::with_every_key_rule(presets, /*fused=*/false)) {
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
