// Token-level quantities of candidate chunks that the reference's stages do not return, and the
// small pieces every study shares: query sampling, prior queries for landmark-free inputs,
// one KV group's inputs, flat fusion over a given selection, and the Taylor-gap = KL check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hils/attention.hpp"

namespace hils::analysis {

// Per query and candidate chunk, from the token logits s(t,j), j in T_c (reference/SEMANTICS.md §9,
// paper Eq. 5): [Tq x n_chunks] each, -inf (max, mean) or NaN (entropy) outside V(t).
struct ChunkLogitStats {
  Matrix<double> max_logit;   // max_j s(t,j): the "one logit dominates" regime; a max-logit score
  Matrix<double> mean_logit;  // mean_j s(t,j): what mean pooling scores (before log|T_c|)
  Matrix<double> entropy;     // H(softmax_j s(t,j)) in nats: intra-chunk entropy of the query
};
// q: [T x d] one query head, k: [T x d] its KV head.
ChunkLogitStats chunk_logit_stats(const Matrix<double>& q, const Matrix<double>& k,
                                  const Geometry& geometry, double scale,
                                  const std::vector<int64_t>& queries);

// Up to n query slots, evenly spaced and ascending, among real-token slots t with |V(t)| > K
// (so that selection is a real choice), always including the last slot; when no slot has more
// than K candidates, among slots with at least one candidate. Empty when none has any.
std::vector<int64_t> sample_queries(const Geometry& geometry, int64_t K, int64_t n);
// The last n real-token slots with at least one candidate, ascending (adjacent queries).
std::vector<int64_t> tail_queries(const Geometry& geometry, int64_t n);

// How a study supplies mu_c when the spec's prior rule needs inputs.prior.
enum class PriorSource {
  inputs,            // use inputs.prior as given
  chunk_mean_query,  // PriorRule::given: mean retrieval query over the chunk's tokens T_c
  chunk_last_query,  // PriorRule::given: retrieval query of the chunk's last attendable slot
};
std::string to_string(PriorSource);
PriorSource parse_prior_source(const std::string& text, const std::string& field);
// Fills inputs.prior (Hq x [n_chunks x d]) from the (already positioned) retrieval queries;
// no-op for PriorSource::inputs.
void fill_prior(AttentionInputs<double>& inputs, const Geometry& geometry, PriorSource source);

// The G query heads of KV group g and their KV head, as inputs with Hkv = 1.
AttentionInputs<double> group_inputs(const AttentionInputs<double>& inputs, int64_t g);

// Flat fusion (reference/SEMANTICS.md §5) over the window and the given selected chunks (-1 entries
// skipped): [Tq x dv]. For scores that are not a MechanismSpec, such as the max-logit score.
Matrix<double> flat_fusion_output(const Matrix<double>& q, const Matrix<double>& k,
                                  const Matrix<double>& v, const Geometry& geometry, double scale,
                                  const std::vector<int64_t>& queries,
                                  const IndexMatrix& selection);

// reference/SEMANTICS.md §3 identity: with the taylor key, entropy bias and q~ = q, L(t,c) -
// s_hat(t,c) = KL(p_mu || p_q) >= 0. Evaluated over every sampled (t, c in V(t)).
struct KlCheck {
  int64_t pairs = 0;                 // (t, c) pairs checked
  double max_abs_deviation = 0.0;    // max |(L - s_hat) - KL|
  double min_gap = 0.0;              // min (L - s_hat); >= 0 up to rounding
  double max_gap = 0.0;
};
// q: [T x d], k: [T x d], prior: [n_chunks x d] (mu_c, positioned like q and k).
KlCheck taylor_kl_check(const Matrix<double>& q, const Matrix<double>& k,
                        const Matrix<double>& prior, const Geometry& geometry, double scale,
                        const std::vector<int64_t>& queries);

}  // namespace hils::analysis
