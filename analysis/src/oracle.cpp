// oracle::verify: the reference in double (truth) and float (baseline) against a kernel's
// outputs, stage by stage; selections as sets with a margin bound (see oracle.hpp). The context
// it works on is in oracle_context.hpp, the bf16-rounding analysis of the lse in
// oracle_rounding.cpp, the gradients in oracle_gradients.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "hils/analysis/oracle.hpp"
#include "oracle_context.hpp"
#include "oracle_gradients.hpp"
#include "oracle_rounding.hpp"
#include "text_format.hpp"

namespace hils::oracle {

namespace {

using detail::format;
using detail::as_columns;
using detail::check_lse_shifts;
using detail::Context;
using detail::field_of;
using detail::fusion_from_own;
using detail::Magnitudes;
using detail::summaries_of;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Heads -> max |x| over all of them.
double max_abs(const std::vector<Matrix<double>>& heads) {
  double m = 0;
  for (const auto& x : heads) m = std::max(m, x.size() ? x.cwiseAbs().maxCoeff() : 0.0);
  return m;
}

// max_t sigma sum_i |q_t,i| max_j |k_j,i| over heads: bounds |s(t,j)| and the condition of its
// dot product, the quantity whose rounding every logit-based stage inherits.
double logit_magnitude(const std::vector<Matrix<double>>& q, const std::vector<Matrix<double>>& k,
                       double scale) {
  double m = 0;
  const size_t G = q.size() / k.size();
  for (size_t h = 0; h < q.size(); ++h) {
    const Vector<double> key_max = k[h / G].cwiseAbs().colwise().maxCoeff().transpose();
    m = std::max(m, scale * (q[h].cwiseAbs() * key_max).maxCoeff());
  }
  return m;
}

// spec, inputs -> the magnitudes of every stage's quantities (score is refined per chunk later).
Magnitudes magnitudes_of(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                         const Geometry& geometry) {
  const double scale = logit_scale(spec, inputs.d());
  Magnitudes m;
  m.value = max_abs(inputs.v);
  m.key = max_abs(inputs.k);
  m.logit = logit_magnitude(inputs.q, inputs.k, scale);
  m.bias = std::log(std::max<double>(geometry.tokens_per_chunk(), 2.0));
  const double retrieval = inputs.q_retrieval.empty()
                               ? m.logit
                               : logit_magnitude(inputs.q_retrieval, inputs.k, scale);
  m.score = (spec.key_rule == KeyRule::exact ? m.logit : retrieval) + m.bias;
  m.lse = std::max(m.logit, m.score) + std::log(std::max<double>(inputs.T(), 2.0));
  m.fused_lse = m.lse;
  return m;
}

// Drops a kernel's trailing partial-chunk columns (ceil(T/S) layout) after checking that they
// are -inf; a problem is recorded otherwise.
std::vector<Matrix<double>> trim_chunk_columns(const std::string& name,
                                               const std::vector<Matrix<double>>& heads,
                                               int64_t n_chunks, std::vector<std::string>& problems) {
  std::vector<Matrix<double>> out;
  for (size_t h = 0; h < heads.size(); ++h) {
    const Matrix<double>& x = heads[h];
    if (x.cols() <= n_chunks) {
      out.push_back(x);
      continue;
    }
    for (Eigen::Index i = 0; i < x.rows(); ++i)
      for (Eigen::Index c = n_chunks; c < x.cols(); ++c)
        if (x(i, c) != -kInf && problems.size() < 8)
          problems.push_back(format("%s: head %zu row %lld column %lld is past the last complete "
                                    "chunk and must be -inf, got %.9g", name.c_str(), h,
                                    static_cast<long long>(i), static_cast<long long>(c), x(i, c)));
    out.push_back(x.leftCols(n_chunks));
  }
  return out;
}

// Every entry of `heads` within `limit` in magnitude; otherwise InvalidArgument naming the first
// largest entry and `range` (what the kernel's input precision can hold).
void require_within(const std::vector<Matrix<double>>& heads, const std::string& name, double limit,
                    const std::string& range) {
  for (size_t h = 0; h < heads.size(); ++h) {
    const Matrix<double>& x = heads[h];
    if (x.size() == 0 || !(x.cwiseAbs().maxCoeff() > limit)) continue;
    Eigen::Index i = 0, j = 0;
    x.cwiseAbs().maxCoeff(&i, &j);
    std::ostringstream found;
    found.precision(3);
    found << x(i, j);
    throw InvalidArgument(name + "[" + std::to_string(h) + "](" + std::to_string(i) + ", " +
                          std::to_string(j) + "): expected a value within " + range + ", got " +
                          found.str());
  }
}

// Each input array with `check(heads, name)`.
template <class Check>
void for_each_input(const AttentionInputs<double>& in, Check check) {
  check(in.q, "q");
  check(in.k, "k");
  check(in.v, "v");
  check(in.q_retrieval, "q_retrieval");
  check(in.prior, "prior");
}

// Inputs in double -> the same inputs rounded to float (the baseline's inputs). A value beyond
// float's range would become Inf there: refused, naming it (a kernel's fp32, bf16 or fp16 inputs
// cannot hold it either).
AttentionInputs<float> to_float(const AttentionInputs<double>& in) {
  for_each_input(in, [](const auto& heads, const std::string& name) {
    require_within(heads, name, std::numeric_limits<float>::max(),
                   "float's range (|x| <= 3.4e38: the kernel's inputs are fp32, bf16 or fp16)");
  });
  auto cast = [](const std::vector<Matrix<double>>& heads) {
    std::vector<Matrix<float>> r;
    for (const auto& x : heads) r.push_back(x.cast<float>());
    return r;
  };
  AttentionInputs<float> out;
  out.q = cast(in.q);
  out.k = cast(in.k);
  out.v = cast(in.v);
  out.q_retrieval = cast(in.q_retrieval);
  out.prior = cast(in.prior);
  return out;
}

// A kernel's inputs rounded to its input precision (round_inputs_to). fp16 holds no value of
// magnitude 65520 or more (rounding gives Inf there): refused, naming it.
AttentionInputs<double> kernel_inputs(const AttentionInputs<double>& inputs, InputPrecision precision) {
  if (precision == InputPrecision::fp16)
    for_each_input(inputs, [](const auto& heads, const std::string& name) {
      require_within(heads, name, 65504.0,
                     "fp16's range (|x| <= 65504: input_precision is fp16)");
    });
  return round_inputs_to(inputs, precision);
}

// The query list (empty = all T) -> explicit slots, checked strictly ascending in [0, T).
std::vector<int64_t> resolve_queries(const std::vector<int64_t>& queries, int64_t T) {
  if (queries.empty()) {
    std::vector<int64_t> all(static_cast<size_t>(T));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  for (size_t i = 0; i < queries.size(); ++i)
    require(queries[i] >= 0 && queries[i] < T && (i == 0 || queries[i] > queries[i - 1]),
            "queries[" + std::to_string(i) + "]",
            "strictly ascending slots in [0, " + std::to_string(T) + ")",
            std::to_string(queries[i]));
  return queries;
}

// Tells the caller (VerifyOptions::on_step) that `what` starts.
void step(const VerifyOptions& options, const char* what) {
  if (options.on_step) options.on_step(what);
}

// Validated inputs and options -> the sizes oracle_bytes reads (gradients: not known yet).
ProblemShape shape_of(const AttentionInputs<double>& inputs, const VerifyOptions& options) {
  ProblemShape shape;
  shape.T = inputs.T(), shape.Hq = inputs.Hq(), shape.Hkv = inputs.Hkv();
  shape.d = inputs.d(), shape.dv = inputs.dv();
  shape.queries = options.queries.empty() ? inputs.T() : static_cast<int64_t>(options.queries.size());
  shape.q_retrieval = !inputs.q_retrieval.empty();
  shape.prior_rows = inputs.prior.empty() ? 0 : inputs.prior.front().rows();
  return shape;
}

// spec, inputs, options -> validated context with the double and float reference runs.
Context make_context(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                     const VerifyOptions& options) {
  spec.validate();
  inputs.validate(spec);
  require_oracle_fits(spec, shape_of(inputs, options), 0.0, "inputs", "queries");
  Context ctx{spec, options,
              kernel_inputs(inputs, options.precision),
              {}, geometry_of(spec, inputs.T()), resolve_queries(options.queries, inputs.T()),
              {}, {}, {}, inputs.Hq() / inputs.Hkv(), {}, {}, {}};
  ctx.inputs_float = to_float(ctx.inputs);
  ctx.magnitude = magnitudes_of(spec, ctx.inputs, ctx.geometry);
  RunOptions run;
  run.keep_surrogate_scores = spec.selects();
  run.keep_window = true;
  run.queries = ctx.queries;
  step(options, "the reference in double");
  ctx.truth = run_mechanism(spec, ctx.inputs, run);
  step(options, "the reference in float (the baseline)");
  ctx.baseline = run_mechanism(spec, ctx.inputs_float, run);
  return ctx;
}

// ---- summaries ------------------------------------------------------------------------------

// Compares summary keys and biases; the kernel may give them per query head or per KV head.
void compare_summaries(const Context& ctx, const KernelOutputs& kernel, Verdict& verdict) {
  if (!ctx.spec.selects() || ctx.spec.key_rule == KeyRule::exact) return;
  if (kernel.summary_key.empty() && kernel.summary_bias.empty()) return;
  const size_t heads = std::max(kernel.summary_key.size(), kernel.summary_bias.size());
  const bool per_group = static_cast<int64_t>(heads) == ctx.inputs.Hkv() && ctx.G > 1;
  std::vector<Matrix<double>> key, key_f, bias, bias_f;
  const int64_t n = per_group ? ctx.inputs.Hkv() : ctx.inputs.Hq();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t h = per_group ? i * ctx.G : i;
    const auto truth = summaries_of(ctx, ctx.inputs, h);
    const auto base = summaries_of(ctx, ctx.inputs_float, h);
    key.push_back(truth.key);
    key_f.push_back(base.key.template cast<double>());
    bias.push_back(truth.bias);
    bias_f.push_back(base.bias.template cast<double>());
  }
  std::vector<int64_t> chunks(static_cast<size_t>(ctx.geometry.n_chunks()));
  std::iota(chunks.begin(), chunks.end(), 0);
  const auto p = tensor_precision("summary_key", ctx.spec, ctx.options);
  if (!kernel.summary_key.empty()) {
    verdict.tensors.push_back(compare_tensor("summary_key", kernel.summary_key, key, key_f,
                                             ctx.magnitude.key, p, "c", chunks,
                                             ctx.options.max_messages));
    if (per_group && ctx.spec.needs_prior())
      verdict.tensors.back().diagnosis =
          "summaries given per KV head, but the spec's prior is per query head; compared "
          "against the first head of each group";
  }
  if (!kernel.summary_bias.empty())
    verdict.tensors.push_back(compare_tensor("summary_bias", as_columns(kernel.summary_bias),
                                             bias, bias_f, std::max(ctx.magnitude.bias, 1.0), p,
                                             "c", chunks, ctx.options.max_messages));
}

// ---- window ---------------------------------------------------------------------------------

// Which window size W' (a shifted edge) the kernel's window output matches, if any.
std::string diagnose_window(const Context& ctx, const std::vector<Matrix<double>>& kernel,
                            bool lse, double tolerance) {
  const int64_t W = ctx.spec.W, S = ctx.spec.S;
  const double scale = logit_scale(ctx.spec, ctx.inputs.d());
  for (int64_t shifted : {W - S, W - 1, W + 1, W + S}) {
    if (shifted < 1 || shifted == W) continue;
    const Geometry geometry(ctx.inputs.T(), S, shifted, ctx.spec.landmarks);
    bool matches = kernel.size() == static_cast<size_t>(ctx.inputs.Hq());
    for (int64_t h = 0; matches && h < ctx.inputs.Hq(); ++h) {
      const auto w = window_attention(ctx.inputs.q[h], ctx.inputs.k[h / ctx.G],
                                      ctx.inputs.v[h / ctx.G], geometry, scale, ctx.queries);
      const Matrix<double> expected = lse ? Matrix<double>(w.lse) : w.o;
      matches = expected.rows() == kernel[h].rows() && expected.cols() == kernel[h].cols() &&
                (expected - kernel[h]).cwiseAbs().maxCoeff() <= tolerance;
    }
    if (matches)
      return format("matches a sliding window of W=%lld instead of W=%lld: the window edge "
                    "tau(t) = floor((t-W+1)/S) is shifted", static_cast<long long>(shifted),
                    static_cast<long long>(W));
  }
  return "";
}

// The floor's subnormal term of o or o_window (0 but for fp16 inputs).
double subnormal_units(const Context& ctx, const char* tensor) {
  return Tolerances::subnormal_probability_units(tensor_precision(tensor, ctx.spec, ctx.options),
                                                 detail::keys_per_softmax(ctx.spec, ctx.inputs.T()));
}

// Kernel o_window/lse_window [Hq x Tq (x dv)] -> reports, with a shifted-window diagnosis.
void compare_window(const Context& ctx, const KernelOutputs& kernel, Verdict& verdict) {
  using H = HeadOutputs<double>;
  using F = HeadOutputs<float>;
  if (!kernel.o_window.empty()) {
    auto r = compare_tensor("o_window", kernel.o_window, field_of(ctx.truth.heads, &H::o_window),
                            field_of(ctx.baseline.heads, &F::o_window), ctx.magnitude.value,
                            tensor_precision("o_window", ctx.spec, ctx.options),
                            "t", ctx.queries, ctx.options.max_messages, subnormal_units(ctx, "o_window"));
    if (!r.passed) r.diagnosis = diagnose_window(ctx, kernel.o_window, false, r.tolerance);
    verdict.tensors.push_back(r);
  }
  if (!kernel.lse_window.empty()) {
    auto r = compare_tensor("lse_window", as_columns(kernel.lse_window),
                            field_of(ctx.truth.heads, &H::lse_window),
                            field_of(ctx.baseline.heads, &F::lse_window), ctx.magnitude.lse,
                            tensor_precision("lse_window", ctx.spec, ctx.options),
                            "t", ctx.queries, ctx.options.max_messages);
    if (!r.passed) r.diagnosis = diagnose_window(ctx, as_columns(kernel.lse_window), true, r.tolerance);
    verdict.tensors.push_back(r);
  }
}

// ---- scores and selection -------------------------------------------------------------------

// Kernel s_hat [Hq x Tq x n_chunks (+1)] -> one report; -inf outside V(t) must match.
void compare_scores(const Context& ctx, const KernelOutputs& kernel, Verdict& verdict) {
  if (!ctx.spec.selects() || kernel.surrogate_scores.empty()) return;
  std::vector<std::string> problems;
  const auto trimmed = trim_chunk_columns("surrogate_scores", kernel.surrogate_scores,
                                          ctx.geometry.n_chunks(), problems);
  using H = HeadOutputs<double>;
  using F = HeadOutputs<float>;
  auto r = compare_tensor("surrogate_scores", trimmed,
                          field_of(ctx.truth.heads, &H::surrogate_scores),
                          field_of(ctx.baseline.heads, &F::surrogate_scores), ctx.magnitude.score,
                          tensor_precision("surrogate_scores", ctx.spec, ctx.options), "t",
                          ctx.queries, ctx.options.max_messages);
  r.problems.insert(r.problems.end(), problems.begin(), problems.end());
  r.passed = r.problems.empty();
  verdict.tensors.push_back(r);
}

// r(t,g,c) of every group from a run's surrogate scores and window lse.
template <class Scalar>
std::vector<Matrix<double>> group_scores_of(const Context& ctx,
                                            const MechanismOutputs<Scalar>& run) {
  std::vector<Matrix<double>> r;
  for (int64_t g = 0; g < ctx.inputs.Hkv(); ++g) {
    std::vector<Matrix<Scalar>> scores;
    std::vector<Vector<Scalar>> lse;
    for (int64_t h = g * ctx.G; h < (g + 1) * ctx.G; ++h) {
      scores.push_back(run.heads[h].surrogate_scores);
      lse.push_back(run.heads[h].lse_window);
    }
    r.push_back(group_scores(scores, lse, ctx.spec.group_rule));
  }
  return r;
}

// Per chunk and dim, the size of what the summary key is made of: sum_j w_j |k_j,i| with the
// key rule's weights w (taylor: p of the prior, mean: 1/|T_c|, landmark_key: the landmark's
// key, exact: max_j |k_j,i| since L mixes single logits). Rounding p or k' to a unit u moves
// k'_i by at most u times this. [n_chunks x d].
Matrix<double> absolute_key_mass(const Context& ctx, int64_t h) {
  const int64_t chunks = ctx.geometry.n_chunks(), tokens = ctx.geometry.tokens_per_chunk();
  const Matrix<double>& k = ctx.inputs.k[h / ctx.G];
  const double scale = logit_scale(ctx.spec, ctx.inputs.d());
  Matrix<double> prior;
  if (ctx.spec.key_rule == KeyRule::taylor)
    prior = resolve_prior(ctx.inputs, h, ctx.spec, ctx.geometry);
  Matrix<double> mass(chunks, ctx.inputs.d());
  for (int64_t c = 0; c < chunks; ++c) {
    const Matrix<double> keys = k.middleRows(c * ctx.spec.S, tokens).cwiseAbs();
    switch (ctx.spec.key_rule) {
      case KeyRule::exact: mass.row(c) = keys.colwise().maxCoeff(); break;
      case KeyRule::mean: mass.row(c) = keys.colwise().mean(); break;
      case KeyRule::landmark_key: mass.row(c) = k.row(ctx.geometry.landmark_slot(c)).cwiseAbs(); break;
      case KeyRule::taylor: {
        const Vector<double> logits = scale * (k.middleRows(c * ctx.spec.S, tokens) * prior.row(c).transpose());
        Vector<double> p = (logits.array() - logits.maxCoeff()).exp().matrix();
        p /= p.sum();
        mass.row(c) = p.transpose() * keys;
        break;
      }
    }
  }
  return mass;
}

// Conditioning of s_hat(t,h,c) for every query row and chunk of one KV group, max over its
// heads: A = sigma sum_i |q~_t,i| absolute_key_mass(c, i) + (log|T_c| + 1 with the entropy
// bias, whose rounding moves it by at most u (H + 1)). The kernel's score error is at most a
// few u times A. With a score precision whose error scales by the row (ErrorScale::row: int4,
// int4_h) the row's largest mass stands for every entry's (sigma sum_i |q~_t,i| max_i
// absolute_key_mass(c, i)): int4's error is half a step of the row. One that reads b' in fp16
// (bias_fp16: int4_h, data/verify_format.md) adds its error int4h_bias_error(log|T_c|) to A as
// that error over u, so that u A holds it beside the code step's.
// [Tq x n_chunks].
Matrix<double> score_conditioning(const Context& ctx, int64_t g) {
  const int64_t chunks = ctx.geometry.n_chunks(), d = ctx.inputs.d();
  const double scale = logit_scale(ctx.spec, d);
  const double bias = ctx.spec.key_rule != KeyRule::exact && ctx.spec.bias_rule == BiasRule::entropy
                          ? std::log(static_cast<double>(ctx.geometry.tokens_per_chunk())) + 1.0
                          : 0.0;
  Matrix<double> a = Matrix<double>::Zero(static_cast<Eigen::Index>(ctx.queries.size()), chunks);
  if (chunks == 0) return a;
  const InputPrecision score = tensor_precision("selection", ctx.spec, ctx.options);
  const bool row_error = precision_row(score).error == ErrorScale::row;
  for (int64_t h = g * ctx.G; h < (g + 1) * ctx.G; ++h) {
    const Matrix<double>& q = ctx.spec.key_rule == KeyRule::exact ? ctx.inputs.q[h]
                                                                  : ctx.inputs.retrieval_query(h);
    Matrix<double> rows(static_cast<Eigen::Index>(ctx.queries.size()), d);
    for (size_t i = 0; i < ctx.queries.size(); ++i) rows.row(i) = q.row(ctx.queries[i]).cwiseAbs();
    const Matrix<double> mass = absolute_key_mass(ctx, h);
    if (row_error)  // e.g. half an int4 step is max_i |k'_c,i| / 14 on every entry of the row
      a = a.cwiseMax(scale * rows.rowwise().sum() * mass.rowwise().maxCoeff().transpose());
    else
      a = a.cwiseMax(scale * rows * mass.transpose());
  }
  if (precision_row(score).bias_fp16 && bias > 0.0)  // b' = H(p) <= log|T_c| = bias - 1
    return a.array() + bias + int4h_bias_error(bias - 1.0) / unit_roundoff(score);
  return a.array() + bias;
}

// Computes the score conditioning of every group and refines the score, fused-lse and
// fusion-weight magnitudes with it (selecting mechanisms only).
void add_score_conditioning(Context& ctx) {
  if (!ctx.spec.selects() || ctx.geometry.n_chunks() == 0) return;
  double largest = 0;
  for (int64_t g = 0; g < ctx.inputs.Hkv(); ++g) {
    ctx.conditioning.push_back(score_conditioning(ctx, g));
    if (ctx.conditioning.back().size()) largest = std::max(largest, ctx.conditioning.back().maxCoeff());
  }
  ctx.magnitude.score = largest;
  if (ctx.spec.fusion != Fusion::hierarchical) return;
  // The fused lse inherits the score path's error of the selected s_hat (<= u A) and the fp32
  // error of lse_swa (<= u32 x logit magnitude, written in units of the score precision).
  const double u_score = unit_roundoff(tensor_precision("lse", ctx.spec, ctx.options));
  ctx.magnitude.fused_lse =
      std::max(largest + std::log(static_cast<double>(ctx.spec.K + 2)),
               ctx.magnitude.lse * unit_roundoff(InputPrecision::fp32) / u_score);
  // omega = softmax(a): |d omega| <= omega (1 - omega) x 2 max|d a| <= max|d a| / 2.
  ctx.magnitude.fusion_weights = std::max(1.0, ctx.magnitude.fused_lse / 2);
}

// Whether compare_fused may run check_lse_shifts (it also needs the lse without problems).
bool lse_shifts_apply(const Context& ctx) {
  return ctx.spec.fusion == Fusion::hierarchical &&
         tensor_precision("lse", ctx.spec, ctx.options) == InputPrecision::bf16;
}

void add_own_fusions(Context& ctx) {
  if (!ctx.spec.selects()) return;
  const auto& selection = ctx.truth.selection;
  // The runs kept their windows and the fusion's scores (make_context): read, not recomputed.
  ctx.own_truth = forced_fusion(ctx.spec, ctx.inputs, selection, ctx.truth);
  ctx.own_base = forced_fusion(ctx.spec, ctx.inputs_float, selection, ctx.baseline);
}

// The margin bound of one swap (kernel chose `chosen` where the reference has `missed`):
// kBaselineFactor x float's max error in r, plus margin_units x u x the conditioning of both
// scores (and, when G > 1, of the largest score, for the log Z_hat of the two heads that may
// differ); x G for the probability rule, whose r sums G terms of at most their log error.
double swap_bound(const Context& ctx, const SelectionReport& report, const Matrix<double>& a,
                  Eigen::Index row, int64_t chosen, int64_t missed) {
  double conditioning = a(row, chosen) + a(row, missed);
  if (ctx.G > 1) conditioning += a.row(row).maxCoeff();
  if (ctx.spec.group_rule == GroupRule::sum_probabilities) conditioning *= static_cast<double>(ctx.G);
  return Tolerances::kBaselineFactor * report.baseline_r_error +
         Tolerances::margin_units(tensor_precision("selection", ctx.spec, ctx.options)) *
             unit_roundoff(tensor_precision("selection", ctx.spec, ctx.options)) * conditioning;
}

// Whether the row holds `expected` distinct candidates and -1 padding in some order: a top-k
// set written unsorted (torch.topk's score order), which only its order makes malformed.
bool is_set_in_another_order(const IndexMatrix& sel, Eigen::Index row, int64_t candidates,
                             int64_t expected) {
  std::set<int64_t> chunks;
  for (Eigen::Index i = 0; i < sel.cols(); ++i) {
    const int64_t c = sel(row, i);
    if (c == -1) continue;
    if (c < 0 || c >= candidates || !chunks.insert(c).second) return false;
  }
  return static_cast<int64_t>(chunks.size()) == expected;
}

// " (255 is uint8's largest value: ...)" for a chunk id that is an unsigned type's largest
// value: a -1 padding stored in uint8 or uint16 arrives as 255 or 65535, which the report named
// only as "chunk 255 is not a candidate".
std::string unsigned_padding_hint(int64_t c) {
  const char* type = c == 0xFF         ? "uint8"
                     : c == 0xFFFF       ? "uint16"
                     : c == 0xFFFFFFFFLL ? "uint32"
                                         : nullptr;
  if (type == nullptr) return "";
  return format(" (%lld is %s's largest value: a -1 padding stored in an unsigned type? store "
                "the selection in a signed integer type)",
                static_cast<long long>(c), type);
}

// Why a kernel selection row is malformed (empty when it is a valid top-k shape for V(t)).
std::string malformed_row(const IndexMatrix& sel, Eigen::Index row, int64_t t, int64_t g,
                          const Geometry& geometry, int64_t K) {
  const int64_t candidates = geometry.candidate_count(t);
  const int64_t expected = std::min(K, candidates);
  const std::string head = format("selection row t=%lld, group %lld: ", static_cast<long long>(t),
                                  static_cast<long long>(g));
  // Only the order is wrong: say how to give it (the verify file's rows are sorted).
  const std::string order_hint =
      is_set_in_another_order(sel, row, candidates, expected)
          ? format(" (the row is a set of %lld distinct candidates in another order: sort each "
                   "row, -1 last, or from Python pass selection_order=\"any\")",
                   static_cast<long long>(expected))
          : "";
  int64_t count = 0;
  for (Eigen::Index i = 0; i < sel.cols(); ++i) {
    const int64_t c = sel(row, i);
    if (c == -1) continue;
    if (c < 0 || c >= candidates)
      return head + format("chunk %lld is not a candidate (V(t) = [0, %lld))",
                           static_cast<long long>(c), static_cast<long long>(candidates)) +
             unsigned_padding_hint(c);
    if (i != count)
      return head + "-1 padding must come after the chunks (entries ascending, -1 at the end)" +
             order_hint;
    if (count > 0 && sel(row, i - 1) >= c)
      return head + format("chunks must be distinct and ascending, got %lld after %lld",
                           static_cast<long long>(c), static_cast<long long>(sel(row, i - 1))) +
             order_hint;
    ++count;
  }
  if (count != expected)
    return head + format("%lld chunks selected, expected min(K=%lld, |V(t)|=%lld) = %lld",
                         static_cast<long long>(count), static_cast<long long>(K),
                         static_cast<long long>(candidates), static_cast<long long>(expected));
  return "";
}

// One selection row -> its set of chunks (without the -1 padding).
std::set<int64_t> row_set(const IndexMatrix& sel, Eigen::Index row) {
  std::set<int64_t> s;
  for (Eigen::Index i = 0; i < sel.cols(); ++i)
    if (sel(row, i) != -1) s.insert(sel(row, i));
  return s;
}

// Set comparison of one (query, group) row; updates the report and returns whether the kernel
// row may replace the reference row.
bool compare_row(const Context& ctx, const IndexMatrix& ref, const IndexMatrix& ker,
                 Eigen::Index row, int64_t g, const Matrix<double>& r, const Matrix<double>& a,
                 SelectionReport& report) {
  const int64_t t = ctx.queries[static_cast<size_t>(row)];
  ++report.rows;
  auto fail = [&](const std::string& message) {
    report.passed = false;
    if (static_cast<int64_t>(report.problems.size()) < ctx.options.max_messages)
      report.problems.push_back(message);
    return false;
  };
  const std::string malformed = malformed_row(ker, row, t, g, ctx.geometry, ctx.spec.K);
  if (!malformed.empty()) return fail(malformed);
  const std::set<int64_t> want = row_set(ref, row), got = row_set(ker, row);
  if (want == got) return true;
  ++report.rows_differing;
  // The worst swap: the weakest chunk the kernel chose against the strongest it missed.
  int64_t chosen = -1, missed = -1;
  for (int64_t c : got)
    if (!want.count(c) && (chosen < 0 || r(row, c) < r(row, chosen))) chosen = c;
  for (int64_t c : want)
    if (!got.count(c) && (missed < 0 || r(row, c) > r(row, missed))) missed = c;
  const double margin = r(row, missed) - r(row, chosen);
  const double bound = swap_bound(ctx, report, a, row, chosen, missed);
  report.worst_margin = std::max(report.worst_margin, margin);
  report.bound = std::max(report.bound, bound);
  if (margin > bound)
    return fail(format("selection row t=%lld, group %lld: chunk %lld chosen instead of %lld, "
                       "reference margin %.3g > bound %.3g (r = %.9g vs %.9g)",
                       static_cast<long long>(t), static_cast<long long>(g),
                       static_cast<long long>(chosen), static_cast<long long>(missed), margin,
                       bound, r(row, missed), r(row, chosen)));
  ++report.rows_accepted;
  report.max_accepted_margin = std::max(report.max_accepted_margin, margin);
  return true;
}

// Compares selections as sets; returns the selection the fused outputs are checked against:
// the reference's, with the kernel's rows where they differ within the margin bound.
std::vector<IndexMatrix> compare_selection(const Context& ctx, const KernelOutputs& kernel,
                                           SelectionReport& report) {
  std::vector<IndexMatrix> merged = ctx.truth.selection;
  if (!ctx.spec.selects() || kernel.selection.empty()) return merged;
  report.compared = true;
  const Eigen::Index Tq = static_cast<Eigen::Index>(ctx.queries.size());
  if (static_cast<int64_t>(kernel.selection.size()) != ctx.inputs.Hkv()) {
    report.passed = false;
    report.problems.push_back(format("selection: expected %lld KV groups, got %zu",
                                     static_cast<long long>(ctx.inputs.Hkv()),
                                     kernel.selection.size()));
    return merged;
  }
  const auto r = group_scores_of(ctx, ctx.truth);
  const auto r_float = group_scores_of(ctx, ctx.baseline);
  for (size_t g = 0; g < r.size(); ++g)
    for (Eigen::Index i = 0; i < r[g].size(); ++i)
      if (std::isfinite(r[g](i)) && std::isfinite(r_float[g](i)))
        report.baseline_r_error = std::max(report.baseline_r_error,
                                           std::fabs(r_float[g](i) - r[g](i)));
  for (int64_t g = 0; g < ctx.inputs.Hkv(); ++g) {
    const IndexMatrix& ker = kernel.selection[g];
    if (ker.rows() != Tq || ker.cols() != ctx.spec.K) {
      report.passed = false;
      report.problems.push_back(format("selection: group %lld has shape [%lld x %lld], expected "
                                       "[%lld x K=%lld]", static_cast<long long>(g),
                                       static_cast<long long>(ker.rows()),
                                       static_cast<long long>(ker.cols()),
                                       static_cast<long long>(Tq),
                                       static_cast<long long>(ctx.spec.K)));
      continue;
    }
    for (Eigen::Index row = 0; row < Tq; ++row)
      if (compare_row(ctx, ctx.truth.selection[g], ker, row, g, r[g], ctx.conditioning[g], report))
        merged[g].row(row) = ker.row(row);
  }
  return merged;
}

// ---- fused outputs --------------------------------------------------------------------------

// Whether the kernel's fused lse/o match the reference with softmax1 flipped.
std::string diagnose_softmax1(const Context& ctx, const std::vector<IndexMatrix>& selection,
                              const std::vector<Matrix<double>>& kernel, bool lse,
                              double tolerance) {
  if (ctx.spec.fusion != Fusion::hierarchical) return "";
  MechanismSpec flipped = ctx.spec;
  flipped.softmax1 = !ctx.spec.softmax1;
  const auto heads = forced_fusion(flipped, ctx.inputs, selection, ctx.queries);
  using H = HeadOutputs<double>;
  const auto expected = lse ? field_of(heads, &H::lse) : field_of(heads, &H::o);
  if (expected.size() != kernel.size()) return "";
  for (size_t h = 0; h < kernel.size(); ++h)
    if (expected[h].rows() != kernel[h].rows() || expected[h].cols() != kernel[h].cols() ||
        !((expected[h] - kernel[h]).cwiseAbs().maxCoeff() <= tolerance))
      return "";
  return ctx.spec.softmax1
             ? "matches the fusion without the softmax1 zero logit: the kernel is missing the "
               "softmax1 logit (spec.softmax1 = true)"
             : "matches the fusion with an extra softmax1 zero logit that the spec does not "
               "have (spec.softmax1 = false)";
}

// Kernel o, lse, fusion weights -> reports against the fusion of `selection` (Eq. 3, 10).
void compare_fused(const Context& ctx, const KernelOutputs& kernel,
                   const std::vector<IndexMatrix>& selection, Verdict& verdict) {
  using H = HeadOutputs<double>;
  using F = HeadOutputs<float>;
  // A selecting mechanism's references are the fusions of `selection`: both sides fuse the same
  // chunks, so a near tie flipped by float rounding cannot inflate the baseline's error. The
  // others' are the runs themselves, read in place (a copy of every head's outputs, the chunk
  // scores included, was made here and dropped at once for a selecting mechanism).
  std::vector<HeadOutputs<double>> fused_truth;
  std::vector<HeadOutputs<float>> fused_base;
  if (ctx.spec.selects()) {
    fused_truth = fusion_from_own(ctx, ctx.spec, ctx.inputs, selection, ctx.own_truth);
    fused_base = fusion_from_own(ctx, ctx.spec, ctx.inputs_float, selection, ctx.own_base);
  }
  const auto& truth = ctx.spec.selects() ? fused_truth : ctx.truth.heads;
  const auto& base = ctx.spec.selects() ? fused_base : ctx.baseline.heads;
  const auto n = ctx.options.max_messages;
  auto precision = [&](const char* tensor) { return tensor_precision(tensor, ctx.spec, ctx.options); };
  if (!kernel.o.empty()) {
    auto r = compare_tensor("o", kernel.o, field_of(truth, &H::o), field_of(base, &F::o),
                            ctx.magnitude.value, precision("o"), "t", ctx.queries, n,
                            subnormal_units(ctx, "o"));
    if (!r.passed && ctx.spec.selects())
      r.diagnosis = diagnose_softmax1(ctx, selection, kernel.o, false, r.tolerance);
    verdict.tensors.push_back(r);
  }
  if (!kernel.lse.empty()) {
    auto r = compare_tensor("lse", as_columns(kernel.lse), field_of(truth, &H::lse),
                            field_of(base, &F::lse), ctx.magnitude.fused_lse, precision("lse"), "t",
                            ctx.queries, n);
    if (lse_shifts_apply(ctx) && r.problems.empty())
      check_lse_shifts(ctx, selection, truth, base, kernel, r);
    if (!r.passed && ctx.spec.selects())
      r.diagnosis = diagnose_softmax1(ctx, selection, as_columns(kernel.lse), true, r.tolerance);
    verdict.tensors.push_back(r);
  }
  if (!kernel.fusion_weights.empty())
    verdict.tensors.push_back(compare_tensor("fusion_weights", kernel.fusion_weights,
                                             field_of(truth, &H::fusion_weights),
                                             field_of(base, &F::fusion_weights),
                                             ctx.magnitude.fusion_weights,
                                             precision("fusion_weights"), "t", ctx.queries, n));
}

// ---- gradients ------------------------------------------------------------------------------

// The kernel's gradients (oracle_gradients.cpp), the selection held at the kernel's own.
void compare_backward(const Context& ctx, const KernelOutputs& kernel, Verdict& verdict) {
  const KernelGradients& grads = kernel.gradients;
  if (!grads.any_returned()) {
    if (!grads.d_o.empty())
      verdict.not_compared.push_back("inputs/do (no gradient of the kernel to compare it with)");
    return;
  }
  require(!grads.d_o.empty(), "inputs/do",
          "the upstream gradient the kernel's backward was given (required with gradients)",
          "none");
  require(static_cast<int64_t>(ctx.queries.size()) == ctx.inputs.T(), "queries",
          "all T = " + std::to_string(ctx.inputs.T()) +
              " slots when gradients are given (the backward sums over every query)",
          std::to_string(ctx.queries.size()) + " slots");
  const auto& selection =
      ctx.spec.selects() && !kernel.selection.empty() ? kernel.selection : ctx.truth.selection;
  step(ctx.options, "the backward in double and float");
  for (auto& report : detail::compare_gradients(ctx.spec, ctx.inputs, ctx.inputs_float,
                                                selection, ctx.truth, ctx.baseline, grads,
                                                ctx.options, verdict.not_compared))
    verdict.tensors.push_back(std::move(report));
}

}  // namespace

// The reference side of a verdict: everything make_context computes (Verifier's constructor).
struct VerifierState {
  Context ctx;
};

Verifier::Verifier(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                   const VerifyOptions& options) {
  require(precision_row(options.precision).input, "input_precision",
          "an input precision (" + input_precision_list() + ")",
          to_string(options.precision) + " (a score precision only)");
  auto state = std::make_shared<VerifierState>(VerifierState{make_context(spec, inputs, options)});
  if (spec.selects()) step(options, "the selection's margins and the fusions of its own selection");
  add_score_conditioning(state->ctx);
  add_own_fusions(state->ctx);
  state_ = std::move(state);
}

Verdict Verifier::verify(const KernelOutputs& kernel) const {
  // kernel stages -> verdict with one report per tensor given.
  const Context& ctx = state_->ctx;
  const MechanismSpec& spec = ctx.spec;
  step(ctx.options, "comparing the kernel's outputs");
  Verdict verdict;
  verdict.precision = ctx.options.precision;
  verdict.score_precision = ctx.options.score_precision;
  verdict.spec_description = describe(spec);
  compare_summaries(ctx, kernel, verdict);
  compare_scores(ctx, kernel, verdict);
  compare_window(ctx, kernel, verdict);
  const auto selection = compare_selection(ctx, kernel, verdict.selection);
  compare_fused(ctx, kernel, selection, verdict);
  compare_backward(ctx, kernel, verdict);
  // A prior the spec does not read: the kernel's author may think it was used.
  const bool reads_prior = spec.needs_prior() && (spec.prior_rule == PriorRule::shared ||
                                                  spec.prior_rule == PriorRule::given);
  if (!ctx.inputs.prior.empty() && !reads_prior)
    verdict.not_compared.push_back("inputs/prior (the spec's prior rule " +
                                   to_string(spec.prior_rule) + " with key rule " +
                                   to_string(spec.key_rule) + " does not read it)");
  verdict.passed = verdict.selection.passed;
  for (const auto& t : verdict.tensors) verdict.passed = verdict.passed && t.passed;
  if (verdict.tensors.empty() && !verdict.selection.compared) {
    verdict.passed = false;
    verdict.selection.problems.push_back("the kernel outputs are empty: nothing to compare");
  }
  return verdict;
}

Verdict verify(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
               const KernelOutputs& kernel, const VerifyOptions& options) {
  return Verifier(spec, inputs, options).verify(kernel);
}

}  // namespace hils::oracle
