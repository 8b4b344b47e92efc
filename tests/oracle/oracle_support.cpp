#include "oracle_support.hpp"

#include <random>
#include <stdexcept>

#include "hils/backward.hpp"

namespace hils::oracle::testing {

namespace {

AttentionInputs<float> to_float(const AttentionInputs<double>& in) {
  AttentionInputs<float> out;
  for (const auto& x : in.q) out.q.push_back(x.cast<float>());
  for (const auto& x : in.k) out.k.push_back(x.cast<float>());
  for (const auto& x : in.v) out.v.push_back(x.cast<float>());
  for (const auto& x : in.q_retrieval) out.q_retrieval.push_back(x.cast<float>());
  for (const auto& x : in.prior) out.prior.push_back(x.cast<float>());
  return out;
}

// Rounds every entry of a head list to bf16 (the store of a bf16 kernel); -inf stays.
template <class M>
void round_heads(std::vector<M>& heads) {
  for (auto& m : heads) m = m.unaryExpr([](double x) { return round_to_bf16(x); });
}

}  // namespace

KernelOutputs float_kernel(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                           InputPrecision precision, InputPrecision score_precision) {
  // spec, inputs -> every stage of run_mechanism<float>, widened.
  const bool bf16 = precision == InputPrecision::bf16;
  const AttentionInputs<float> in = to_float(bf16 ? round_inputs_to_bf16(inputs) : inputs);
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
  if (bf16) {
    round_heads(out.o);
    round_heads(out.o_window);
  }
  if (score_precision == InputPrecision::bf16) {
    round_heads(out.surrogate_scores);
    round_heads(out.summary_key);
    round_heads(out.summary_bias);
    if (spec.fusion == Fusion::hierarchical) {
      round_heads(out.lse);
      round_heads(out.fusion_weights);
    }
  }
  return out;
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
      round_heads(*heads);
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
