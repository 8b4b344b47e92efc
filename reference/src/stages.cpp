// Public stage functions: each runs its block-level stage over all query blocks.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "blocks.hpp"
#include "chunk_mass.hpp"
#include "selection.hpp"
#include "summary_prior.hpp"

namespace hils {

using detail::neg_inf;

Geometry geometry_of(const MechanismSpec& spec, int64_t T) {
  return Geometry(T, spec.S, spec.W, spec.landmarks);
}

double logit_scale(const MechanismSpec& spec, int64_t d) {
  return spec.scale > 0.0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(d));
}

namespace {

// Runs a block stage over every query block and stacks the [n x cols] results.
template <class Scalar, class Stage>
Matrix<Scalar> stack_blocks(const std::vector<int64_t>& queries, const Geometry& geometry,
                            int64_t cols, const Stage& stage) {
  const auto blocks = detail::partition_queries(queries, geometry);
  Matrix<Scalar> out = detail::large_output<Scalar>(static_cast<int64_t>(queries.size()), cols);
  detail::parallel_units(static_cast<int64_t>(blocks.size()), [&](int64_t b) {
    const auto& block = blocks[static_cast<size_t>(b)];
    out.middleRows(block.begin, block.size()) = stage(block);
  });
  return out;
}

template <class Scalar>
void require_key_shapes(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                        const Geometry& geometry) {
  require(q.rows() == geometry.T(), "q", std::to_string(geometry.T()) + " rows (T)",
          std::to_string(q.rows()));
  require(k.rows() == geometry.T() && k.cols() == q.cols(), "k",
          std::string("[") + std::to_string(geometry.T()) + " x " + std::to_string(q.cols()) + "]",
          std::string("[") + std::to_string(k.rows()) + " x " + std::to_string(k.cols()) + "]");
}

template <class Scalar>
WindowResult<Scalar> attention_over_blocks(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                                           const Matrix<Scalar>& v, const Geometry& geometry,
                                           Scalar scale, const std::vector<int64_t>& queries,
                                           bool window_only) {
  require_key_shapes(q, k, geometry);
  require(v.rows() == geometry.T(), "v", std::to_string(geometry.T()) + " rows (T)",
          std::to_string(v.rows()));
  const auto rows = detail::resolve_queries(queries, geometry.T());
  const auto blocks = detail::partition_queries(rows, geometry);
  const auto n = static_cast<int64_t>(rows.size());
  WindowResult<Scalar> out{detail::large_output<Scalar>(n, v.cols()),
                           Vector<Scalar>(n)};
  detail::parallel_units(static_cast<int64_t>(blocks.size()), [&](int64_t b) {
    const auto& block = blocks[static_cast<size_t>(b)];
    auto part = detail::block_attention(detail::gather_rows(q, rows, block), rows, block, k, v,
                                        geometry, scale, window_only);
    out.o.middleRows(block.begin, block.size()) = part.o;
    out.lse.segment(block.begin, block.size()) = part.lse;
  });
  return out;
}

}  // namespace

template <class Scalar>
WindowResult<Scalar> window_attention(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                                      const Matrix<Scalar>& v, const Geometry& geometry,
                                      Scalar scale, const std::vector<int64_t>& queries) {
  return attention_over_blocks(q, k, v, geometry, scale, queries, true);
}

template <class Scalar>
WindowResult<Scalar> full_attention(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                                    const Matrix<Scalar>& v, const Geometry& geometry,
                                    Scalar scale, const std::vector<int64_t>& queries) {
  return attention_over_blocks(q, k, v, geometry, scale, queries, false);
}

template <class Scalar>
Matrix<Scalar> exact_chunk_log_mass(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                                    const Geometry& geometry, Scalar scale,
                                    const std::vector<int64_t>& queries) {
  require_key_shapes(q, k, geometry);
  const auto rows = detail::resolve_queries(queries, geometry.T());
  const auto keys = detail::prepare_chunk_keys(k, geometry);
  return stack_blocks<Scalar>(rows, geometry, geometry.n_chunks(), [&](const auto& block) {
    return detail::block_chunk_log_mass(detail::gather_rows(q, rows, block), rows, block, keys,
                                        geometry, scale);
  });
}

template <class Scalar>
Matrix<Scalar> resolve_prior(const AttentionInputs<Scalar>& inputs, int64_t h,
                             const MechanismSpec& spec, const Geometry& geometry) {
  // The head and the geometry first: q~'s rows are read at the geometry's landmark slots (a
  // longer geometry read past their end, a segfault), and q~ or the prior of head h.
  require(h >= 0 && h < inputs.Hq(), "h",
          "a query head in [0, " + std::to_string(inputs.Hq()) + ")", std::to_string(h));
  require(inputs.T() == geometry.T() && inputs.retrieval_query(h).rows() == geometry.T(),
          "geometry.T", "the inputs' " + std::to_string(inputs.T()) + " slots",
          std::to_string(geometry.T()));
  const int64_t chunks = geometry.n_chunks();
  switch (spec.prior_rule) {
    case PriorRule::landmark_query: {
      require(geometry.landmarks(), "prior_rule", "shared or given without landmarks",
              "landmark_query");
      Matrix<Scalar> prior(chunks, inputs.d());
      const auto& q_retrieval = inputs.retrieval_query(h);
      for (int64_t c = 0; c < chunks; ++c) prior.row(c) = q_retrieval.row(geometry.landmark_slot(c));
      return prior;
    }
    case PriorRule::shared:
    case PriorRule::given: {
      require(static_cast<int64_t>(inputs.prior.size()) == inputs.Hq(), "prior",
              "one matrix per query head (prior_rule " + to_string(spec.prior_rule) +
                  " reads it)",
              std::to_string(inputs.prior.size()));
      const auto& p = inputs.prior[static_cast<size_t>(h)];
      return p.rows() == 1 ? Matrix<Scalar>(p.replicate(chunks, 1)) : p;
    }
  }
  throw InvalidArgument("prior_rule: unknown value");
}

template <class Scalar>
ChunkSummaries<Scalar> summarize(const Matrix<Scalar>& k, const Matrix<Scalar>& prior,
                                 KeyRule key_rule, BiasRule bias_rule, const Geometry& geometry,
                                 Scalar scale) {
  require(key_rule != KeyRule::exact, "key_rule", "a key rule with a summary (any but exact)", "exact");
  // The chunks' key rows are read by the geometry's slots: a longer geometry read past k's end.
  require(k.rows() == geometry.T(), "k",
          "T = " + std::to_string(geometry.T()) + " rows (the geometry's slots)",
          std::to_string(k.rows()));
  require(key_rule != KeyRule::landmark_key || geometry.landmarks(), "key_rule",
          "landmarks on for landmark_key", "landmarks off");
  const int64_t chunks = geometry.n_chunks(), tokens = geometry.tokens_per_chunk();
  const bool needs_p = detail::summary_needs_prior(key_rule, bias_rule);
  if (needs_p)
    require(prior.rows() == chunks && prior.cols() == k.cols(), "prior",
            std::string("[") + std::to_string(chunks) + " x " + std::to_string(k.cols()) + "]",
            std::string("[") + std::to_string(prior.rows()) + " x " + std::to_string(prior.cols()) + "]");
  ChunkSummaries<Scalar> out{Matrix<Scalar>(chunks, k.cols()), Vector<Scalar>::Zero(chunks)};
  for (int64_t c = 0; c < chunks; ++c) {
    const auto keys = k.middleRows(c * geometry.S(), tokens);
    Vector<Scalar> p;
    if (needs_p) {
      // p = softmax_{j in T_c}(sigma mu_c . k_j) (Prop. 3.1).
      Vector<Scalar> logits = (keys * prior.row(c).transpose()) * scale;
      const Scalar top = logits.maxCoeff();
      p = (logits.array() - top).exp().matrix();
      const Scalar total = p.sum();
      p /= total;
      if (bias_rule == BiasRule::entropy) {
        // H(p) = LSE(logits) - sum_j p_j logits_j, free of log(0) for vanishing p_j.
        out.bias(c) = top + std::log(total) - p.dot(logits);
      }
    }
    switch (key_rule) {
      case KeyRule::mean: out.key.row(c) = keys.colwise().mean(); break;
      case KeyRule::landmark_key: out.key.row(c) = k.row(geometry.landmark_slot(c)); break;
      case KeyRule::taylor: out.key.row(c) = p.transpose() * keys; break;
      case KeyRule::exact: break;
    }
  }
  return out;
}

template <class Scalar>
Matrix<Scalar> surrogate_scores(const Matrix<Scalar>& q_retrieval,
                                const ChunkSummaries<Scalar>& summaries,
                                const Geometry& geometry, Scalar scale,
                                const std::vector<int64_t>& queries) {
  require(q_retrieval.rows() == geometry.T(), "q_retrieval",
          std::to_string(geometry.T()) + " rows (T)", std::to_string(q_retrieval.rows()));
  require(summaries.key.rows() == geometry.n_chunks() && summaries.key.cols() == q_retrieval.cols(),
          "summaries.key", "one row of dim d per complete chunk",
          std::to_string(summaries.key.rows()) + " rows");
  const auto rows = detail::resolve_queries(queries, geometry.T());
  return stack_blocks<Scalar>(rows, geometry, geometry.n_chunks(), [&](const auto& block) {
    return detail::block_surrogate_scores(detail::gather_rows(q_retrieval, rows, block), rows,
                                          block, summaries, geometry, scale);
  });
}

template <class Scalar>
IndexMatrix select_chunks(const std::vector<Matrix<Scalar>>& scores,
                          const std::vector<Vector<Scalar>>& lse_window, GroupRule rule,
                          int64_t K, const Geometry& geometry,
                          const std::vector<int64_t>& queries) {
  require(!scores.empty() && scores.size() == lse_window.size(), "scores",
          "one score matrix and one lse_window per head of the group",
          std::to_string(scores.size()) + " and " + std::to_string(lse_window.size()));
  require(K >= 0, "K", "at least 0", std::to_string(K));
  const auto rows = detail::resolve_queries(queries, geometry.T());
  const int64_t n = static_cast<int64_t>(rows.size());
  for (size_t h = 0; h < scores.size(); ++h) {
    require(scores[h].rows() == n && scores[h].cols() == geometry.n_chunks(),
            "scores[" + std::to_string(h) + "]",
            std::string("[") + std::to_string(n) + " x " + std::to_string(geometry.n_chunks()) + "]",
            std::string("[") + std::to_string(scores[h].rows()) + " x " + std::to_string(scores[h].cols()) + "]");
    require(lse_window[h].size() == n, "lse_window[" + std::to_string(h) + "]",
            std::to_string(n) + " entries", std::to_string(lse_window[h].size()));
  }
  IndexMatrix selection(n, K);
  std::vector<const Scalar*> score_rows(scores.size());
  std::vector<Scalar> lse_rows(scores.size());
  for (int64_t i = 0; i < n; ++i) {
    for (size_t h = 0; h < scores.size(); ++h) {
      score_rows[h] = scores[h].row(i).data();
      lse_rows[h] = lse_window[h](i);
    }
    detail::select_row(score_rows, lse_rows, geometry.candidate_count(rows[static_cast<size_t>(i)]),
                       rule, K, selection.row(i).data());
  }
  return selection;
}

#define HILS_INSTANTIATE_STAGES(S)                                                           \
  template WindowResult<S> window_attention<S>(const Matrix<S>&, const Matrix<S>&,           \
                                               const Matrix<S>&, const Geometry&, S,         \
                                               const std::vector<int64_t>&);                 \
  template WindowResult<S> full_attention<S>(const Matrix<S>&, const Matrix<S>&,             \
                                             const Matrix<S>&, const Geometry&, S,           \
                                             const std::vector<int64_t>&);                   \
  template Matrix<S> exact_chunk_log_mass<S>(const Matrix<S>&, const Matrix<S>&,             \
                                             const Geometry&, S, const std::vector<int64_t>&); \
  template Matrix<S> resolve_prior<S>(const AttentionInputs<S>&, int64_t,                    \
                                      const MechanismSpec&, const Geometry&);                \
  template ChunkSummaries<S> summarize<S>(const Matrix<S>&, const Matrix<S>&, KeyRule,       \
                                          BiasRule, const Geometry&, S);                     \
  template Matrix<S> surrogate_scores<S>(const Matrix<S>&, const ChunkSummaries<S>&,         \
                                         const Geometry&, S, const std::vector<int64_t>&);   \
  template IndexMatrix select_chunks<S>(const std::vector<Matrix<S>>&,                       \
                                        const std::vector<Vector<S>>&, GroupRule, int64_t,   \
                                        const Geometry&, const std::vector<int64_t>&);

HILS_INSTANTIATE_STAGES(float)
HILS_INSTANTIATE_STAGES(double)
HILS_INSTANTIATE_STAGES(long double)

}  // namespace hils
