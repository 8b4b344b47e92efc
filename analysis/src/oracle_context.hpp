// The oracle's working state, private to the oracle: Context, everything verify() works on,
// computed once (make_context, oracle.cpp), and the helpers over it that oracle.cpp and
// oracle_rounding.cpp both use: head lists as matrices (field_of, as_columns), summaries_of, the
// logit scale moved (scale_moved) and the fusions of the reference's own selection
// (fusion_from_own, own_scaled_fusion).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hils/analysis/oracle.hpp"

namespace hils::oracle::detail {

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

// The most slots a chunk-aligned window holds, W + S - 1 (reference/SEMANTICS.md section 2): also
// the most queries whose window reads one key.
inline int64_t window_slots(const MechanismSpec& spec) { return spec.W + spec.S - 1; }

// The most keys one softmax of the mechanism sums: every slot for full attention, else at most
// the window (W + S - 1 slots: it starts at a chunk boundary, reference/SEMANTICS.md section 2)
// and the K selected chunks (flat fusion's one softmax). The fp16 floors' count of
// probabilities below fp16's normal range (Tolerances::subnormal_probability_units for o and
// o_window, subnormal_gradient_error for dq).
inline int64_t keys_per_softmax(const MechanismSpec& spec, int64_t T) {
  if (spec.fusion == Fusion::full) return T;
  return std::min<int64_t>(T, window_slots(spec) + (spec.selects() ? spec.K * spec.S : 0));
}

// A head list of vectors as [n x 1] matrices, so one comparison serves both.
inline std::vector<Matrix<double>> as_columns(const std::vector<Vector<double>>& heads) {
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

// The spec with the logit scale sigma moved to sigma (1 + eta) (lse_scale_sensitivity).
constexpr double kScaleEta = 1e-6;  // forward difference: relative error ~ eta, rounding ~ 1e-10
inline MechanismSpec scale_moved(const Context& ctx) {
  MechanismSpec scaled = ctx.spec;
  scaled.scale = (1.0 + kScaleEta) * logit_scale(ctx.spec, ctx.inputs.d());
  return scaled;
}

// The fusion of the reference's own selection with the logit scale moved (scale_moved),
// computed at the first call.
inline const std::vector<HeadOutputs<double>>& own_scaled_fusion(const Context& ctx) {
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

}  // namespace hils::oracle::detail
