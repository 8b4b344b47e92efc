// Inputs, outputs and the stages window -> summarize -> score -> select -> fuse
// (reference/SEMANTICS.md §2–5).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "hils/geometry.hpp"
#include "hils/positional.hpp"
#include "hils/spec.hpp"
#include "hils/types.hpp"

namespace hils {

// One layer's vectors. Query head h reads KV head h / G, G = Hq / Hkv.
template <class Scalar>
struct AttentionInputs {
  std::vector<Matrix<Scalar>> q;            // Hq x [T x d]
  std::vector<Matrix<Scalar>> k;            // Hkv x [T x d]
  std::vector<Matrix<Scalar>> v;            // Hkv x [T x dv]
  std::vector<Matrix<Scalar>> q_retrieval;  // empty (q~ = q) or Hq x [T x d]
  std::vector<Matrix<Scalar>> prior;        // PriorRule::shared: Hq x [1 x d] (or n_chunks rows
                                            // once positioned); PriorRule::given: Hq x [n_chunks x d]

  int64_t Hq() const { return static_cast<int64_t>(q.size()); }
  int64_t Hkv() const { return static_cast<int64_t>(k.size()); }
  int64_t T() const { return q.empty() ? 0 : q.front().rows(); }
  int64_t d() const { return q.empty() ? 0 : q.front().cols(); }
  int64_t dv() const { return v.empty() ? 0 : v.front().cols(); }
  const Matrix<Scalar>& retrieval_query(int64_t h) const {
    return q_retrieval.empty() ? q[h] : q_retrieval[h];
  }
  // Throws InvalidArgument on empty heads, mismatched shapes, Hq % Hkv != 0, NaN or Inf, and on
  // a prior that the spec needs but the inputs lack.
  void validate(const MechanismSpec& spec) const;
};

// Rotates q, k, q~ by the geometry's position ids. The prior follows `prior_rule`, never its
// row count: under PriorRule::shared each head's 1-row prior becomes one row per chunk rotated at
// the position id of slot (c+1)S-1; a given prior is left as given (reference/SEMANTICS.md §8).
template <class Scalar>
AttentionInputs<Scalar> apply_positional_encoding(const AttentionInputs<Scalar>& raw,
                                                  const Geometry& geometry,
                                                  const PositionalEncoding& pe,
                                                  PriorRule prior_rule);
// The same for inputs without a prior (throws InvalidArgument naming `prior` otherwise).
template <class Scalar>
AttentionInputs<Scalar> apply_positional_encoding(const AttentionInputs<Scalar>& raw,
                                                  const Geometry& geometry,
                                                  const PositionalEncoding& pe);

// Eq. 11: q~ = q + W_up W_down h. q: [T x d], hidden: [T x d_model], W_up: [d x r],
// W_down: [r x d_model].
template <class Scalar>
Matrix<Scalar> calibrated_query(const Matrix<Scalar>& q, const Matrix<Scalar>& hidden,
                                const Matrix<Scalar>& w_up, const Matrix<Scalar>& w_down);

// What to compute besides o, lse, selections and fusion weights.
struct RunOptions {
  bool keep_surrogate_scores = false;  // s_hat(t,h,c), -inf outside V(t)
  bool keep_exact_scores = false;      // L(t,h,c), -inf outside V(t)
  bool keep_window = false;            // o_swa, lse_swa
  // Query slots to compute (strictly ascending); empty means all T. Outputs have one row per
  // listed query, so long contexts can be studied on sampled queries in O(T d) memory.
  std::vector<int64_t> queries;
};

template <class Scalar>
struct HeadOutputs {
  Matrix<Scalar> o;    // [Tq x dv]
  Vector<Scalar> lse;  // [Tq] log-normalizer of the final softmax
  // [Tq x (K+2)]: weight of each selected chunk in selection order (0 for -1 padding), then
  // the window, then the softmax1 zero logit (0 when off). For flat fusion these are the shares
  // of the one softmax's mass; for full and window fusion the window column holds 1.
  Matrix<Scalar> fusion_weights;
  Matrix<Scalar> surrogate_scores;  // [Tq x n_chunks] on request
  Matrix<Scalar> exact_scores;      // [Tq x n_chunks] on request
  Matrix<Scalar> o_window;          // [Tq x dv] on request
  Vector<Scalar> lse_window;        // [Tq] on request
};

template <class Scalar>
struct MechanismOutputs {
  std::vector<int64_t> queries;        // the query slots, one per output row
  std::vector<HeadOutputs<Scalar>> heads;  // Hq
  std::vector<IndexMatrix> selection;  // Hkv x [Tq x K], ascending, -1 padded; empty if none
};

// The query blocks the stages below compute together, one matrix product each, as [begin, end)
// ranges of indices into `queries` (strictly ascending slots): a row's outputs depend on its own
// block's queries alone. Given a union of whole blocks as its query list, a stage gives the
// rows it gives with all the queries, bit for bit; a subset that splits a block may differ in
// the last bits (the oracle fuses only a kernel's differing blocks again on this promise).
std::vector<std::pair<int64_t, int64_t>> query_blocks(const std::vector<int64_t>& queries,
                                                      const Geometry& geometry);

// ---- Stages, each callable alone -------------------------------------------------------

// Window branch (reference/SEMANTICS.md §2): o_swa, lse_swa of one query head for the listed
// queries.
template <class Scalar>
struct WindowResult {
  Matrix<Scalar> o;    // [Tq x dv]
  Vector<Scalar> lse;  // [Tq]
};
template <class Scalar>
WindowResult<Scalar> window_attention(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                                      const Matrix<Scalar>& v, const Geometry& geometry,
                                      Scalar scale, const std::vector<int64_t>& queries);

// Full causal attention of one query head (flat softmax over every attendable j <= t).
template <class Scalar>
WindowResult<Scalar> full_attention(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                                    const Matrix<Scalar>& v, const Geometry& geometry,
                                    Scalar scale, const std::vector<int64_t>& queries);

// Exact chunk log-masses L(t,c) = LSE_{j in T_c} s(t,j) for c in V(t), -inf elsewhere.
// [Tq x n_chunks].
template <class Scalar>
Matrix<Scalar> exact_chunk_log_mass(const Matrix<Scalar>& q, const Matrix<Scalar>& k,
                                    const Geometry& geometry, Scalar scale,
                                    const std::vector<int64_t>& queries);

// Chunk summaries of one query head (reference/SEMANTICS.md §3): key [n_chunks x d] and bias
// [n_chunks].
template <class Scalar>
struct ChunkSummaries {
  Matrix<Scalar> key;
  Vector<Scalar> bias;
};
// `prior` is [n_chunks x d] (already resolved from the prior rule); it is ignored by rules that
// need none. The exact rule has no summary and is rejected here.
template <class Scalar>
ChunkSummaries<Scalar> summarize(const Matrix<Scalar>& k, const Matrix<Scalar>& prior,
                                 KeyRule key_rule, BiasRule bias_rule, const Geometry& geometry,
                                 Scalar scale);
// The prior rows mu_c of query head h under the spec's prior rule: [n_chunks x d].
template <class Scalar>
Matrix<Scalar> resolve_prior(const AttentionInputs<Scalar>& inputs, int64_t h,
                             const MechanismSpec& spec, const Geometry& geometry);

// Surrogate scores s_hat(t,c) = sigma q~_t . k'_c + b'_c for c in V(t), -inf elsewhere.
// [Tq x n_chunks].
template <class Scalar>
Matrix<Scalar> surrogate_scores(const Matrix<Scalar>& q_retrieval,
                                const ChunkSummaries<Scalar>& summaries,
                                const Geometry& geometry, Scalar scale,
                                const std::vector<int64_t>& queries);

// Selection of one KV group (reference/SEMANTICS.md §4, Eq. 2, 8). scores: G x [Tq x n_chunks]
// (-inf outside V), lse_window: G x [Tq]. Returns [Tq x K], the min(K, |V(t)|) best chunks
// ascending, -1 padded; ties go to the lower chunk index.
template <class Scalar>
IndexMatrix select_chunks(const std::vector<Matrix<Scalar>>& scores,
                          const std::vector<Vector<Scalar>>& lse_window, GroupRule rule,
                          int64_t K, const Geometry& geometry,
                          const std::vector<int64_t>& queries);

// One query row of one head as the fusion stage sees it.
template <class Scalar>
struct FusionRow {
  Eigen::Ref<const Vector<Scalar>> q;  // the query q_t [d] (attention inside each chunk)
  const int32_t* selected;             // the K selected chunks, -1 for padding (anywhere)
  int64_t K;
  const Scalar* scores;  // s_hat(t, .) [n_chunks]: the hierarchical fusion's chunk logits;
                         // unread (may be null) for flat fusion
  Scalar lse_window;     // lse_swa(t)
  Eigen::Ref<const RowVector<Scalar>> o_window;  // o_swa(t) [dv]
};
// Fusion stage (reference/SEMANTICS.md §5): attends each selected chunk, then one softmax over
// [chunk logits, lse_swa (, 0 with softmax1)] where a chunk's logit is its exact log-mass L (flat,
// Eq. 3) or s_hat (hierarchical, Eq. 10). Writes o [dv], lse and the K+2 fusion weights (0 for
// padding). The one implementation: run_mechanism and the oracle's forced fusion both call it.
template <class Scalar>
void fuse(const MechanismSpec& spec, const FusionRow<Scalar>& row, const Matrix<Scalar>& k,
          const Matrix<Scalar>& v, const Geometry& geometry, Scalar scale,
          Eigen::Ref<RowVector<Scalar>> o, Scalar& lse, Eigen::Ref<RowVector<Scalar>> weights);

// The whole mechanism over all heads (OpenMP over independent (group, query-block) units;
// the same bits for any number of threads).
// Whether run_mechanism runs these inputs on their values scaled down by a power of two (max|v|
// within 2^64 of the top of Scalar's range, reference/SEMANTICS.md §11.2): its o and o_window are
// then the scaled run's outputs scaled back, not always the bits of an unscaled stage (e.g.
// window_attention). Its other outputs do not read v.
template <class Scalar>
bool scales_values_down(const AttentionInputs<Scalar>& inputs);

template <class Scalar>
MechanismOutputs<Scalar> run_mechanism(const MechanismSpec& spec,
                                       const AttentionInputs<Scalar>& inputs,
                                       const RunOptions& options = {});

// The bytes of run_mechanism's outputs for `rows` queries of Hq heads with values of width dv
// over T slots, in a scalar of `scalar_bytes` bytes, the outputs `options` keeps included.
// run_mechanism refuses (InvalidArgument naming spec.K or the outputs) a run whose outputs
// exceed 80% of memory_limit(); a caller that knows the sizes before the inputs exist can make
// the same check first.
double outputs_bytes(const MechanismSpec& spec, int64_t T, int64_t Hq, int64_t dv,
                     const RunOptions& options, int64_t rows, int64_t scalar_bytes);

// Geometry of a spec over T slots.
Geometry geometry_of(const MechanismSpec& spec, int64_t T);
// sigma: spec.scale, or 1/sqrt(d) when 0.
double logit_scale(const MechanismSpec& spec, int64_t d);

}  // namespace hils
