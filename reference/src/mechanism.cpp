// run_mechanism: one per-(group, query-block) loop for every spec (reference/SEMANTICS.md §7).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "blocks.hpp"
#include "chunk_mass.hpp"
#include "hils/memory.hpp"
#include "selection.hpp"

namespace hils {
namespace {

using detail::neg_inf;
using detail::QueryBlock;

// A count held in a double -> "%.4g" text (no int64 overflow for a K near its maximum).
std::string count_text(double count) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", count);
  return text;
}

// The values one head keeps per query row: o, lse, the K + 2 fusion weights and the kept
// outputs. In double: K + 2 overflows int64 for a K near its maximum.
double values_per_row(const MechanismSpec& spec, int64_t T, int64_t dv, const RunOptions& options) {
  const double chunks = static_cast<double>(T / spec.S);
  double per_row = static_cast<double>(dv) + 3.0 + static_cast<double>(spec.K);
  if (options.keep_surrogate_scores) per_row += chunks;
  if (options.keep_exact_scores) per_row += chunks;
  if (options.keep_window) per_row += static_cast<double>(dv + 1);
  return per_row;
}

// Refuses runs whose outputs cannot fit in the memory this process may use (hils/memory.hpp),
// before allocating anything.
// The message names the sizes a user sets (spec.K, the sampled queries, kept scores), not the
// C++ option struct: it reaches CLI and Python users too.
template <class Scalar>
void require_outputs_fit(const MechanismSpec& spec, const AttentionInputs<Scalar>& inputs,
                         const RunOptions& options, int64_t rows) {
  const double chunks = static_cast<double>(inputs.T() / spec.S);
  const double per_row = values_per_row(spec, inputs.T(), inputs.dv(), options);
  const double bytes =
      outputs_bytes(spec, inputs.T(), inputs.Hq(), inputs.dv(), options, rows, sizeof(Scalar));
  const MemoryLimit memory = memory_limit();
  if (bytes < 0.8 * memory.bytes) return;
  // fusion_weights hold K + 2 columns per row; a K beyond the chunk count selects nothing more.
  const bool k_dominates = static_cast<double>(spec.K) > chunks &&
                           static_cast<double>(spec.K) > 0.5 * per_row;
  const std::string advice =
      k_dominates ? "K = " + std::to_string(spec.K) + " is above the " +
                        std::to_string(inputs.T() / spec.S) +
                        " chunks of T; K >= the chunk count already selects every chunk"
                  : "sample fewer queries or keep fewer scores";
  require(false, k_dominates ? "spec.K" : "outputs",
          "outputs (" + std::to_string(rows) + " queries x " + std::to_string(inputs.Hq()) +
              " heads x " + count_text(per_row) +
              " values) within 80% of " + memory.text + " (" + advice + ")",
          bytes_text(bytes));
}

template <class Scalar>
MechanismOutputs<Scalar> allocate_outputs(const MechanismSpec& spec,
                                          const AttentionInputs<Scalar>& inputs,
                                          const RunOptions& options,
                                          std::vector<int64_t> queries, int64_t chunks) {
  const int64_t n = static_cast<int64_t>(queries.size());
  MechanismOutputs<Scalar> out;
  out.queries = std::move(queries);
  out.heads.resize(static_cast<size_t>(inputs.Hq()));
  for (auto& head : out.heads) {
    head.o.resize(n, inputs.dv());
    head.lse.resize(n);
    head.fusion_weights = Matrix<Scalar>::Zero(n, spec.K + 2);
    if (options.keep_surrogate_scores)
      head.surrogate_scores = Matrix<Scalar>::Constant(n, chunks, neg_inf<Scalar>());
    if (options.keep_exact_scores)
      head.exact_scores = Matrix<Scalar>::Constant(n, chunks, neg_inf<Scalar>());
    if (options.keep_window) {
      head.o_window.resize(n, inputs.dv());
      head.lse_window.resize(n);
    }
  }
  if (spec.selects())
    out.selection.assign(static_cast<size_t>(inputs.Hkv()), IndexMatrix::Constant(n, spec.K, -1));
  return out;
}

// The keys of every KV group as the chunk log-mass reads them (its panels built only when
// `needed`: they take as much memory as k).
template <class Scalar>
std::vector<detail::ChunkKeys<Scalar>> chunk_keys_of(const AttentionInputs<Scalar>& inputs,
                                                     const Geometry& geometry, bool needed) {
  std::vector<detail::ChunkKeys<Scalar>> keys;
  for (const auto& k : inputs.k) keys.push_back(detail::prepare_chunk_keys(k, geometry, needed));
  return keys;
}

// Full and window mechanisms: independent (head, block) units.
template <class Scalar>
void run_dense(const MechanismSpec& spec, const AttentionInputs<Scalar>& inputs,
               const RunOptions& options, const Geometry& geometry, Scalar scale,
               const std::vector<QueryBlock>& blocks, MechanismOutputs<Scalar>& out) {
  const int64_t G = inputs.Hq() / inputs.Hkv(), n_blocks = static_cast<int64_t>(blocks.size());
  const bool window_only = spec.fusion == Fusion::window;
  const auto chunk_keys = chunk_keys_of(inputs, geometry, options.keep_exact_scores);
  detail::parallel_units(inputs.Hq() * n_blocks, [&](int64_t unit) {
    const int64_t h = unit / n_blocks, g = h / G;
    const QueryBlock& block = blocks[static_cast<size_t>(unit % n_blocks)];
    const auto q_rows = detail::gather_rows(inputs.q[h], out.queries, block);
    auto& head = out.heads[static_cast<size_t>(h)];
    auto result = detail::block_attention(q_rows, out.queries, block, inputs.k[g], inputs.v[g],
                                          geometry, scale, window_only);
    head.o.middleRows(block.begin, block.size()) = result.o;
    head.lse.segment(block.begin, block.size()) = result.lse;
    head.fusion_weights.col(spec.K).segment(block.begin, block.size()).setOnes();
    if (options.keep_window) {
      auto window = window_only ? result
                                : detail::block_attention(q_rows, out.queries, block, inputs.k[g],
                                                          inputs.v[g], geometry, scale, true);
      head.o_window.middleRows(block.begin, block.size()) = window.o;
      head.lse_window.segment(block.begin, block.size()) = window.lse;
    }
    if (options.keep_exact_scores)
      head.exact_scores.middleRows(block.begin, block.size()) = detail::block_chunk_log_mass(
          q_rows, out.queries, block, chunk_keys[static_cast<size_t>(g)], geometry, scale);
  });
}

// Everything one head of a group knows about one query block before fusion.
template <class Scalar>
struct HeadBlock {
  Matrix<Scalar> q_rows;
  WindowResult<Scalar> window;
  Matrix<Scalar> scores;  // s_hat, [n x n_chunks]
};

// Selecting mechanisms: independent (KV group, block) units; heads of a group share selection.
template <class Scalar>
void run_selecting(const MechanismSpec& spec, const AttentionInputs<Scalar>& inputs,
                   const RunOptions& options, const Geometry& geometry, Scalar scale,
                   const std::vector<QueryBlock>& blocks,
                   const std::vector<ChunkSummaries<Scalar>>& summaries,
                   MechanismOutputs<Scalar>& out) {
  const int64_t G = inputs.Hq() / inputs.Hkv(), n_blocks = static_cast<int64_t>(blocks.size());
  const bool need_exact = spec.key_rule == KeyRule::exact || options.keep_exact_scores;
  const auto chunk_keys = chunk_keys_of(inputs, geometry, need_exact);
  detail::parallel_units(inputs.Hkv() * n_blocks, [&](int64_t unit) {
    const int64_t g = unit / n_blocks;
    const QueryBlock& block = blocks[static_cast<size_t>(unit % n_blocks)];
    const auto& k = inputs.k[g];
    const auto& v = inputs.v[g];
    std::vector<HeadBlock<Scalar>> heads(static_cast<size_t>(G));
    for (int64_t j = 0; j < G; ++j) {
      const int64_t h = g * G + j;
      auto& hb = heads[static_cast<size_t>(j)];
      hb.q_rows = detail::gather_rows(inputs.q[h], out.queries, block);
      hb.window = detail::block_attention(hb.q_rows, out.queries, block, k, v, geometry, scale, true);
      Matrix<Scalar> exact;
      if (need_exact)
        exact = detail::block_chunk_log_mass(hb.q_rows, out.queries, block,
                                             chunk_keys[static_cast<size_t>(g)], geometry, scale);
      hb.scores = spec.key_rule == KeyRule::exact
                      ? exact
                      : detail::block_surrogate_scores(
                            detail::gather_rows(inputs.retrieval_query(h), out.queries, block),
                            out.queries, block, summaries[static_cast<size_t>(h)], geometry, scale);
      auto& head = out.heads[static_cast<size_t>(h)];
      if (options.keep_exact_scores) head.exact_scores.middleRows(block.begin, block.size()) = exact;
      if (options.keep_surrogate_scores)
        head.surrogate_scores.middleRows(block.begin, block.size()) = hb.scores;
      if (options.keep_window) {
        head.o_window.middleRows(block.begin, block.size()) = hb.window.o;
        head.lse_window.segment(block.begin, block.size()) = hb.window.lse;
      }
    }
    std::vector<const Scalar*> score_rows(static_cast<size_t>(G));
    std::vector<Scalar> lse_rows(static_cast<size_t>(G));
    std::vector<const int32_t*> selected(static_cast<size_t>(block.size()));
    for (int64_t i = 0; i < block.size(); ++i) {
      const int64_t row = block.begin + i;
      for (int64_t j = 0; j < G; ++j) {
        score_rows[static_cast<size_t>(j)] = heads[static_cast<size_t>(j)].scores.row(i).data();
        lse_rows[static_cast<size_t>(j)] = heads[static_cast<size_t>(j)].window.lse(i);
      }
      int32_t* row_selection = out.selection[static_cast<size_t>(g)].row(row).data();
      detail::select_row(score_rows, lse_rows,
                         geometry.candidate_count(out.queries[static_cast<size_t>(row)]),
                         spec.group_rule, spec.K, row_selection);
      selected[static_cast<size_t>(i)] = row_selection;
    }
    // The group's heads share the selection: grouped once, each chunk attended once per head.
    const auto selections = detail::group_selections(selected, spec.K, geometry.n_chunks());
    for (int64_t j = 0; j < G; ++j) {
      const HeadBlock<Scalar>& hb = heads[static_cast<size_t>(j)];
      auto& head = out.heads[static_cast<size_t>(g * G + j)];
      const auto chunks = detail::attend_selected(hb.q_rows, selections, k, v, geometry, scale);
      for (int64_t i = 0; i < block.size(); ++i) {
        const int64_t row = block.begin + i;
        const FusionRow<Scalar> fusion_row{hb.q_rows.row(i).transpose(),
                                           selected[static_cast<size_t>(i)],
                                           spec.K,
                                           hb.scores.row(i).data(),
                                           hb.window.lse(i),
                                           hb.window.o.row(i)};
        detail::fuse_selected<Scalar>(spec, fusion_row, selections, chunks, i, head.o.row(row),
                                      head.lse(row), head.fusion_weights.row(row));
      }
    }
  });
}

// The largest |v| over every KV head (0 without values).
template <class Scalar>
Scalar max_abs_value(const AttentionInputs<Scalar>& inputs) {
  Scalar top = 0;
  for (const auto& v : inputs.v)
    if (v.size() > 0) top = std::max(top, v.cwiseAbs().maxCoeff());
  return top;
}

// The power of two that brings `top` (the largest |v|) at least 2^64 below the largest Scalar,
// or 1. The weighted sums over keys then cannot overflow (their weights sum to at most the key
// count), and multiplying by a power of two is exact (reference/SEMANTICS.md §11.2).
template <class Scalar>
Scalar value_downscale(Scalar top) {
  constexpr int kHeadroomBits = 64;
  const int allowed = std::numeric_limits<Scalar>::max_exponent - 1 - kHeadroomBits;
  if (top == 0 || std::ilogb(top) <= allowed) return Scalar(1);
  return std::ldexp(Scalar(1), allowed - std::ilogb(top));
}

// Undoes value_downscale on the outputs that are linear in v. o is a convex combination of
// rows of v, so |o| <= top: clamping to it first removes only the rounding of the weights
// (their sum can be 1 + ulp), which would otherwise overflow o when |v| is the largest Scalar.
template <class Scalar>
void upscale_values(MechanismOutputs<Scalar>& out, Scalar downscale, Scalar top) {
  const Scalar up = Scalar(1) / downscale;  // a power of two: exact
  const Scalar bound = top * downscale;     // exact, as |v| was scaled
  for (auto& head : out.heads) {
    for (auto* o : {&head.o, &head.o_window})
      *o = o->cwiseMax(-bound).cwiseMin(bound) * up;
  }
}

// run_mechanism after validation.
template <class Scalar>
MechanismOutputs<Scalar> run_validated(const MechanismSpec& spec,
                                       const AttentionInputs<Scalar>& inputs,
                                       const RunOptions& options) {
  const Geometry geometry = geometry_of(spec, inputs.T());
  const Scalar scale = static_cast<Scalar>(logit_scale(spec, inputs.d()));
  auto queries = detail::resolve_queries(options.queries, inputs.T());
  require_outputs_fit(spec, inputs, options, static_cast<int64_t>(queries.size()));
  const auto blocks = detail::partition_queries(queries, geometry);
  auto out = allocate_outputs(spec, inputs, options, std::move(queries), geometry.n_chunks());
  if (!spec.selects()) {
    run_dense(spec, inputs, options, geometry, scale, blocks, out);
    return out;
  }
  std::vector<ChunkSummaries<Scalar>> summaries(static_cast<size_t>(inputs.Hq()));
  if (spec.key_rule != KeyRule::exact) {
    const int64_t G = inputs.Hq() / inputs.Hkv();
    detail::parallel_units(inputs.Hq(), [&](int64_t h) {
      const Matrix<Scalar> prior = spec.needs_prior() ? resolve_prior(inputs, h, spec, geometry)
                                                      : Matrix<Scalar>();
      summaries[static_cast<size_t>(h)] = summarize(inputs.k[h / G], prior, spec.key_rule,
                                                    spec.bias_rule, geometry, scale);
    });
  }
  run_selecting(spec, inputs, options, geometry, scale, blocks, summaries, out);
  return out;
}

}  // namespace

double outputs_bytes(const MechanismSpec& spec, int64_t T, int64_t Hq, int64_t dv,
                     const RunOptions& options, int64_t rows, int64_t scalar_bytes) {
  return static_cast<double>(rows) * static_cast<double>(Hq) *
         values_per_row(spec, T, dv, options) * static_cast<double>(scalar_bytes);
}

template <class Scalar>
bool scales_values_down(const AttentionInputs<Scalar>& inputs) {
  return value_downscale(max_abs_value(inputs)) != Scalar(1);
}

template <class Scalar>
MechanismOutputs<Scalar> run_mechanism(const MechanismSpec& spec,
                                       const AttentionInputs<Scalar>& inputs,
                                       const RunOptions& options) {
  spec.validate();
  inputs.validate(spec);
  // Values near the top of the Scalar range: run on v scaled by an exact power of two and scale
  // o back, so that o (a convex combination of rows of v) is the finite true output.
  const Scalar top = max_abs_value(inputs);
  if (const Scalar downscale = value_downscale(top); downscale != Scalar(1)) {
    AttentionInputs<Scalar> scaled = inputs;
    for (auto& v : scaled.v) v *= downscale;
    MechanismOutputs<Scalar> out = run_validated(spec, scaled, options);
    upscale_values(out, downscale, top);
    return out;
  }
  return run_validated(spec, inputs, options);
}

template bool scales_values_down<float>(const AttentionInputs<float>&);
template bool scales_values_down<double>(const AttentionInputs<double>&);
template bool scales_values_down<long double>(const AttentionInputs<long double>&);
template MechanismOutputs<float> run_mechanism<float>(const MechanismSpec&,
                                                      const AttentionInputs<float>&,
                                                      const RunOptions&);
template MechanismOutputs<double> run_mechanism<double>(const MechanismSpec&,
                                                        const AttentionInputs<double>&,
                                                        const RunOptions&);
template MechanismOutputs<long double> run_mechanism<long double>(
    const MechanismSpec&, const AttentionInputs<long double>&, const RunOptions&);

}  // namespace hils
