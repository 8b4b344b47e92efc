// oracle::verify: the reference in double (truth) and float (baseline) against a kernel's
// outputs, stage by stage; selections as sets with a margin bound (see oracle.hpp).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "hils/analysis/oracle.hpp"
#include "oracle_gradients.hpp"
#include "text_format.hpp"

namespace hils::oracle {

namespace {

using detail::format;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Sizes that bound each compared quantity; the rounding floors scale with them.
struct Magnitudes {
  double value = 0;         // max |v|: o and o_c are convex combinations of value rows
  double key = 0;           // max |k|: summary keys are convex combinations of keys
  double logit = 0;         // max sigma sum_i |q_t,i| max_j |k_j,i| (logit_magnitude)
  double score = 0;         // bound on |s_hat| (retrieval query, summary key, bias)
  double bias = 0;          // entropy bias <= log |T_c|
  double lse = 0;           // bound on any log-normaliser: logits plus log of the term count
  double fused_lse = 0;     // hierarchical fusion's lse (add_score_conditioning); else = lse
  double fusion_weights = 1;  // scale of the fusion weights' rounding (add_score_conditioning)
};

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

// A head list of vectors as [n x 1] matrices, so one comparison serves both.
std::vector<Matrix<double>> as_columns(const std::vector<Vector<double>>& heads) {
  std::vector<Matrix<double>> out;
  for (const auto& x : heads) out.push_back(x);
  return out;
}

template <class Scalar, class Field>
std::vector<Matrix<double>> field_of(const std::vector<HeadOutputs<Scalar>>& heads, Field field) {
  std::vector<Matrix<double>> out;
  for (const auto& h : heads) out.push_back((h.*field).template cast<double>());
  return out;
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

// A fusion computed at its first use, once, whichever thread asks first (Verifier::verify is
// const and may run on several threads).
struct OnceFusion {
  std::once_flag once;
  std::vector<HeadOutputs<double>> heads;
};

// Everything verify() works on, computed once.
struct Context {
  MechanismSpec spec;
  VerifyOptions options;
  AttentionInputs<double> inputs;
  AttentionInputs<float> inputs_float;
  Geometry geometry;
  std::vector<int64_t> queries;
  Magnitudes magnitude;
  MechanismOutputs<double> truth;
  MechanismOutputs<float> baseline;
  int64_t G = 1;
  std::vector<Matrix<double>> conditioning;  // per KV group: score_conditioning
  // The fusion of the reference's own selection (truth.selection) in double and float, and in
  // double with the logit scale moved (lse_scale_sensitivity): a kernel's fusion takes their
  // rows wherever it selected as the reference did (fusion_from_own). own_truth and own_base
  // are filled by add_own_fusions; own_scaled by its first use (own_scaled_fusion), since only
  // a kernel that gives a bf16 lse needs it. Behind a pointer, so the context stays movable.
  std::vector<HeadOutputs<double>> own_truth;
  std::vector<HeadOutputs<float>> own_base;
  std::shared_ptr<OnceFusion> own_scaled = std::make_shared<OnceFusion>();
};

// Inputs in double -> the same inputs rounded to float (the baseline's inputs). A value beyond
// float's range would become Inf there: refused, naming it (a kernel's fp32 or bf16 inputs
// cannot hold it either).
AttentionInputs<float> to_float(const AttentionInputs<double>& in) {
  AttentionInputs<float> out;
  auto cast = [](const std::vector<Matrix<double>>& heads, const std::string& name) {
    constexpr double kFloatMax = std::numeric_limits<float>::max();
    std::vector<Matrix<float>> r;
    for (size_t h = 0; h < heads.size(); ++h) {
      const Matrix<double>& x = heads[h];
      if (x.size() > 0 && x.cwiseAbs().maxCoeff() > kFloatMax) {
        Eigen::Index i = 0, j = 0;
        x.cwiseAbs().maxCoeff(&i, &j);
        std::ostringstream found;
        found.precision(3);
        found << x(i, j);
        throw InvalidArgument(name + "[" + std::to_string(h) + "](" + std::to_string(i) + ", " +
                              std::to_string(j) + "): expected a value within float's range "
                              "(|x| <= 3.4e38: the kernel's inputs are fp32 or bf16), got " +
                              found.str());
      }
      r.push_back(x.cast<float>());
    }
    return r;
  };
  out.q = cast(in.q, "q");
  out.k = cast(in.k, "k");
  out.v = cast(in.v, "v");
  out.q_retrieval = cast(in.q_retrieval, "q_retrieval");
  out.prior = cast(in.prior, "prior");
  return out;
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

// spec, inputs, options -> validated context with the double and float reference runs.
Context make_context(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                     const VerifyOptions& options) {
  spec.validate();
  inputs.validate(spec);
  Context ctx{spec, options,
              options.precision == InputPrecision::bf16 ? round_inputs_to_bf16(inputs) : inputs,
              {}, geometry_of(spec, inputs.T()), resolve_queries(options.queries, inputs.T()),
              {}, {}, {}, inputs.Hq() / inputs.Hkv(), {}, {}, {}};
  ctx.inputs_float = to_float(ctx.inputs);
  ctx.magnitude = magnitudes_of(spec, ctx.inputs, ctx.geometry);
  RunOptions run;
  run.keep_surrogate_scores = spec.selects();
  run.keep_window = true;
  run.queries = ctx.queries;
  ctx.truth = run_mechanism(spec, ctx.inputs, run);
  ctx.baseline = run_mechanism(spec, ctx.inputs_float, run);
  return ctx;
}

// ---- summaries ------------------------------------------------------------------------------

// Summaries of query head h (reference/SEMANTICS.md §3) in Scalar, from the spec's prior rule.
template <class Scalar>
ChunkSummaries<Scalar> summaries_of(const Context& ctx, const AttentionInputs<Scalar>& inputs,
                                    int64_t h) {
  const Scalar scale = static_cast<Scalar>(logit_scale(ctx.spec, inputs.d()));
  const Matrix<Scalar> prior = ctx.spec.needs_prior()
                                   ? resolve_prior(inputs, h, ctx.spec, ctx.geometry)
                                   : Matrix<Scalar>();
  return summarize(inputs.k[h / ctx.G], prior, ctx.spec.key_rule, ctx.spec.bias_rule,
                   ctx.geometry, scale);
}

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

// Kernel o_window/lse_window [Hq x Tq (x dv)] -> reports, with a shifted-window diagnosis.
void compare_window(const Context& ctx, const KernelOutputs& kernel, Verdict& verdict) {
  using H = HeadOutputs<double>;
  using F = HeadOutputs<float>;
  if (!kernel.o_window.empty()) {
    auto r = compare_tensor("o_window", kernel.o_window, field_of(ctx.truth.heads, &H::o_window),
                            field_of(ctx.baseline.heads, &F::o_window), ctx.magnitude.value,
                            tensor_precision("o_window", ctx.spec, ctx.options),
                            "t", ctx.queries, ctx.options.max_messages);
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
// few u times A. With int4 scores the row's largest mass stands for every entry's
// (sigma sum_i |q~_t,i| max_i absolute_key_mass(c, i)): int4's error is half a step of the row.
// int4_h (data/verify_format.md) also reads b' in fp16: its error int4h_bias_error(log|T_c|)
// enters A as that error over u, so that u A holds it beside the code step's.
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
  const bool int4 = score == InputPrecision::int4 || score == InputPrecision::int4_h;
  for (int64_t h = g * ctx.G; h < (g + 1) * ctx.G; ++h) {
    const Matrix<double>& q = ctx.spec.key_rule == KeyRule::exact ? ctx.inputs.q[h]
                                                                  : ctx.inputs.retrieval_query(h);
    Matrix<double> rows(static_cast<Eigen::Index>(ctx.queries.size()), d);
    for (size_t i = 0; i < ctx.queries.size(); ++i) rows.row(i) = q.row(ctx.queries[i]).cwiseAbs();
    const Matrix<double> mass = absolute_key_mass(ctx, h);
    if (int4)  // half an int4 step is max_i |k'_c,i| / 14 on every entry of the row
      a = a.cwiseMax(scale * rows.rowwise().sum() * mass.rowwise().maxCoeff().transpose());
    else
      a = a.cwiseMax(scale * rows * mass.transpose());
  }
  if (score == InputPrecision::int4_h && bias > 0.0)  // b' = H(p) <= log|T_c| = bias - 1
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

// The spec with the logit scale sigma moved to sigma (1 + eta) (lse_scale_sensitivity).
constexpr double kScaleEta = 1e-6;  // forward difference: relative error ~ eta, rounding ~ 1e-10
MechanismSpec scale_moved(const Context& ctx) {
  MechanismSpec scaled = ctx.spec;
  scaled.scale = (1.0 + kScaleEta) * logit_scale(ctx.spec, ctx.inputs.d());
  return scaled;
}

// Whether compare_fused may run check_lse_shifts (it also needs the lse without problems).
bool lse_shifts_apply(const Context& ctx) {
  return ctx.spec.fusion == Fusion::hierarchical &&
         tensor_precision("lse", ctx.spec, ctx.options) == InputPrecision::bf16;
}

void add_own_fusions(Context& ctx) {
  if (!ctx.spec.selects()) return;
  const auto& selection = ctx.truth.selection;
  ctx.own_truth = forced_fusion(ctx.spec, ctx.inputs, selection, ctx.queries);
  ctx.own_base = forced_fusion(ctx.spec, ctx.inputs_float, selection, ctx.queries);
}

// The fusion of the reference's own selection with the logit scale moved (scale_moved),
// computed at the first call.
const std::vector<HeadOutputs<double>>& own_scaled_fusion(const Context& ctx) {
  OnceFusion& f = *ctx.own_scaled;
  std::call_once(f.once, [&] {
    f.heads = forced_fusion(scale_moved(ctx), ctx.inputs, ctx.truth.selection, ctx.queries);
  });
  return f.heads;
}

// forced_fusion(spec, inputs, selection, ctx.queries), given `own`, the same fusion of the
// reference's selection: only the query blocks (hils::query_blocks) where `selection` differs
// from the reference's in some row and KV group are fused again, whole, so that every row is
// what the full fusion gives, bit for bit; the other rows are own's.
template <class Scalar>
std::vector<HeadOutputs<Scalar>> fusion_from_own(const Context& ctx, const MechanismSpec& spec,
                                                 const AttentionInputs<Scalar>& inputs,
                                                 const std::vector<IndexMatrix>& selection,
                                                 const std::vector<HeadOutputs<Scalar>>& own) {
  const std::vector<IndexMatrix>& reference = ctx.truth.selection;
  const Eigen::Index Tq = static_cast<Eigen::Index>(ctx.queries.size());
  bool same_shape = selection.size() == reference.size();
  for (size_t g = 0; same_shape && g < selection.size(); ++g)
    same_shape = selection[g].rows() == Tq && selection[g].cols() == reference[g].cols();
  if (!same_shape || own.empty()) return forced_fusion(spec, inputs, selection, ctx.queries);
  auto differs = [&](Eigen::Index r) {
    for (size_t g = 0; g < selection.size(); ++g)
      if (selection[g].row(r) != reference[g].row(r)) return true;
    return false;
  };
  std::vector<Eigen::Index> rows;  // rows to fuse again: every row of a block with a difference
  for (const auto& [begin, end] : query_blocks(ctx.queries, ctx.geometry)) {
    bool any = false;
    for (int64_t r = begin; r < end && !any; ++r) any = differs(static_cast<Eigen::Index>(r));
    for (int64_t r = begin; any && r < end; ++r) rows.push_back(static_cast<Eigen::Index>(r));
  }
  if (rows.empty()) return own;
  std::vector<int64_t> queries;
  std::vector<IndexMatrix> rows_selection(selection.size());
  for (size_t g = 0; g < selection.size(); ++g)
    rows_selection[g].resize(static_cast<Eigen::Index>(rows.size()), selection[g].cols());
  for (size_t i = 0; i < rows.size(); ++i) {
    queries.push_back(ctx.queries[static_cast<size_t>(rows[i])]);
    for (size_t g = 0; g < selection.size(); ++g)
      rows_selection[g].row(static_cast<Eigen::Index>(i)) = selection[g].row(rows[i]);
  }
  const auto fused = forced_fusion(spec, inputs, rows_selection, queries);
  std::vector<HeadOutputs<Scalar>> out = own;
  for (size_t h = 0; h < out.size(); ++h)
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto row = static_cast<Eigen::Index>(i);
      out[h].o.row(rows[i]) = fused[h].o.row(row);
      out[h].lse(rows[i]) = fused[h].lse(row);
      out[h].fusion_weights.row(rows[i]) = fused[h].fusion_weights.row(row);
    }
  return out;
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

// Why a kernel selection row is malformed (empty when it is a valid top-k shape for V(t)).
std::string malformed_row(const IndexMatrix& sel, Eigen::Index row, int64_t t, int64_t g,
                          const Geometry& geometry, int64_t K) {
  const int64_t candidates = geometry.candidate_count(t);
  const int64_t expected = std::min(K, candidates);
  const std::string head = format("selection row t=%lld, group %lld: ", static_cast<long long>(t),
                                  static_cast<long long>(g));
  int64_t count = 0;
  for (Eigen::Index i = 0; i < sel.cols(); ++i) {
    const int64_t c = sel(row, i);
    if (c == -1) continue;
    if (c < 0 || c >= candidates)
      return head + format("chunk %lld is not a candidate (V(t) = [0, %lld))",
                           static_cast<long long>(c), static_cast<long long>(candidates));
    if (i != count)
      return head + "-1 padding must come after the chunks (entries ascending, -1 at the end)";
    if (count > 0 && sel(row, i - 1) >= c)
      return head + format("chunks must be distinct and ascending, got %lld after %lld",
                           static_cast<long long>(c), static_cast<long long>(sel(row, i - 1)));
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
    Vector<double> w = Vector<double>::Zero(tokens);
    if (ctx.spec.key_rule == KeyRule::mean) w.setConstant(1.0 / static_cast<double>(tokens));
    if (ctx.spec.key_rule == KeyRule::taylor) {
      const Vector<double> logits = scale * (keys * prior.row(c).transpose());
      w = (logits.array() - logits.maxCoeff()).exp().matrix();
      w /= w.sum();
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
  const bool per_group = ctx.spec.key_rule == KeyRule::mean || ctx.spec.key_rule == KeyRule::landmark_key;
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
    for (size_t h = 0; h < truth.size(); ++h)
      for (Eigen::Index r = 0; r < truth[h].lse.size(); ++r) {
        const double y = kernel.lse[h](r);
        if (!std::isfinite(y) || !std::isfinite(reference[h](r))) continue;
        test.value += a[h](r) * (y - reference[h](r));
        test.baseline += a[h](r) * (static_cast<double>(base[h].lse(r)) - truth[h].lse(r));
        fit_a += a[h](r) * fit_shape[h](r);
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
  std::vector<HeadOutputs<double>> truth = ctx.truth.heads;
  std::vector<HeadOutputs<float>> base = ctx.baseline.heads;
  if (ctx.spec.selects()) {
    // Both sides fuse the same chunks, so a near tie flipped by float rounding cannot inflate
    // the baseline's error.
    truth = fusion_from_own(ctx, ctx.spec, ctx.inputs, selection, ctx.own_truth);
    base = fusion_from_own(ctx, ctx.spec, ctx.inputs_float, selection, ctx.own_base);
  }
  const auto n = ctx.options.max_messages;
  auto precision = [&](const char* tensor) { return tensor_precision(tensor, ctx.spec, ctx.options); };
  if (!kernel.o.empty()) {
    auto r = compare_tensor("o", kernel.o, field_of(truth, &H::o), field_of(base, &F::o),
                            ctx.magnitude.value, precision("o"), "t", ctx.queries, n);
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
  for (auto& report : detail::compare_gradients(ctx.spec, ctx.inputs, ctx.inputs_float,
                                                selection, ctx.truth, ctx.baseline, grads,
                                                ctx.options))
    verdict.tensors.push_back(std::move(report));
}

}  // namespace

// The reference side of a verdict: everything make_context computes (Verifier's constructor).
struct VerifierState {
  Context ctx;
};

Verifier::Verifier(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                   const VerifyOptions& options) {
  require(options.precision != InputPrecision::fp8_e4m3 && options.precision != InputPrecision::int4 &&
              options.precision != InputPrecision::int4_h,
          "input_precision", "fp32 or bf16", to_string(options.precision) + " (a score precision only)");
  auto state = std::make_shared<VerifierState>(VerifierState{make_context(spec, inputs, options)});
  add_score_conditioning(state->ctx);
  add_own_fusions(state->ctx);
  state_ = std::move(state);
}

Verdict Verifier::verify(const KernelOutputs& kernel) const {
  // kernel stages -> verdict with one report per tensor given.
  const Context& ctx = state_->ctx;
  const MechanismSpec& spec = ctx.spec;
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
