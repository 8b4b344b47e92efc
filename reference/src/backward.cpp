// run_mechanism_backward (reference/SEMANTICS.md §6): pass 1 over (KV group, query
// block) units writes dq, dq~ and per-row softmax statistics; pass 2 over (KV group,
// chunk-aligned key block) units accumulates dk, dv and the summaries' gradients. Each unit
// owns its outputs, so the bits do not depend on the thread count. In double with AVX-512 the
// window (or full) softmax's dq, dk and dv come instead from one fused pass between the two
// (fused_backward.hpp); passes 1 and 2 keep the chunks' parts.
#include "hils/backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "blocks.hpp"
#include "fused_backward.hpp"
#include "summary_prior.hpp"

namespace hils {
namespace {

using detail::neg_inf;
using detail::QueryBlock;

template <class Scalar>
constexpr Scalar pos_inf() {
  return std::numeric_limits<Scalar>::infinity();
}

// log of a fusion weight, +inf-safe: a zero weight gives lambda = +inf, i.e. P~ = 0.
template <class Scalar>
Scalar lambda_of(Scalar log_mass, Scalar weight) {
  return weight > Scalar(0) ? log_mass - std::log(weight) : pos_inf<Scalar>();
}

// What pass 1 saves for pass 2, per query head, for all T rows. Every softmax the row took
// part in is described by P~(t,j) = exp(s(t,j) - lambda) and dS = P~ (do.v_j - delta).
template <class Scalar>
struct RowStatistics {
  Vector<Scalar> window_lambda, window_delta;  // [T]: the window (or full / the one softmax)
  Matrix<Scalar> chunk_lambda, chunk_delta;    // [T x K]: per selected chunk, selection order
  Matrix<Scalar> dscore;                       // [T x K]: d s_hat, hierarchical summaries only
};

// logits(i, j) = -inf unless left[i] <= k0 + j <= right[i] and slot k0 + j is attendable.
template <class Scalar>
void mask_outside(Matrix<Scalar>& logits, const std::vector<int64_t>& left,
                  const std::vector<int64_t>& right, int64_t k0, const Geometry& geometry) {
  for (const int64_t j : detail::landmark_columns(geometry, k0, logits.cols()))
    logits.col(j).setConstant(neg_inf<Scalar>());
  for (int64_t i = 0; i < logits.rows(); ++i)
    detail::mask_outside_range(logits.row(i).data(), logits.cols(),
                               left[static_cast<size_t>(i)] - k0,
                               right[static_cast<size_t>(i)] - k0);
}

// P~ and dS of rows against keys: p = exp(logits - lambda), ds = p (do.v - delta). [n x width].
template <class Scalar>
void softmax_backward_tile(Matrix<Scalar>& p, Matrix<Scalar>& ds, const Matrix<Scalar>& do_rows,
                           const Eigen::Ref<const Matrix<Scalar>>& v_keys,
                           const Vector<Scalar>& lambda, const Vector<Scalar>& delta) {
  // exp(s - lambda) <= 1 (lambda >= the logits of its softmax); masked keys (-inf) and
  // zero-weight branches (lambda = +inf) get exactly 0.
  for (int64_t i = 0; i < p.rows(); ++i) {
    Scalar* row = p.row(i).data();
    const Scalar shift = lambda(i);
#pragma omp simd
    for (int64_t j = 0; j < p.cols(); ++j) row[j] = detail::exp_nonpositive(row[j] - shift);
  }
  ds.noalias() = do_rows * v_keys.transpose();
  ds.array().colwise() -= delta.array();
  ds.array() *= p.array();
}

// dq of the block's rows from the window (or full) softmax: sigma sum_j dS k_j. [n x d].
template <class Scalar>
Matrix<Scalar> block_softmax_dq(const Matrix<Scalar>& q_rows, const Matrix<Scalar>& do_rows,
                                const Vector<Scalar>& lambda, const Vector<Scalar>& delta,
                                const std::vector<int64_t>& queries, const QueryBlock& block,
                                const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                const Geometry& geometry, Scalar scale, bool window_only) {
  const int64_t n = block.size();
  std::vector<int64_t> left(static_cast<size_t>(n)), right(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = queries[static_cast<size_t>(block.begin + i)];
    left[static_cast<size_t>(i)] = window_only ? geometry.window_left(t) : 0;
    right[static_cast<size_t>(i)] = t;
  }
  const int64_t key_begin = *std::min_element(left.begin(), left.end());
  const int64_t key_end = *std::max_element(right.begin(), right.end()) + 1;
  Matrix<Scalar> dq = Matrix<Scalar>::Zero(n, q_rows.cols());
  Matrix<Scalar> p, ds;
  for (int64_t k0 = key_begin; k0 < key_end; k0 += detail::kKeyBlock) {
    const int64_t width = std::min(detail::kKeyBlock, key_end - k0);
    p.noalias() = (q_rows * scale) * k.middleRows(k0, width).transpose();
    mask_outside(p, left, right, k0, geometry);
    softmax_backward_tile<Scalar>(p, ds, do_rows, v.middleRows(k0, width), lambda, delta);
    dq.noalias() += scale * (ds * k.middleRows(k0, width));
  }
  return dq;
}

// Chunk c's rows of dk (S rows from slot cS, the landmark last) and d mu_c from dkey, dbias
// (Prop. 3.1: p = softmax(sigma mu.k_j), k' = sum p_j k_j, b' = H(p)). Adds into dk_chunk.
template <class Scalar>
Vector<Scalar> summary_chunk_backward(const Matrix<Scalar>& k,
                                      const Eigen::Ref<const Vector<Scalar>>& mu,
                                      KeyRule key_rule, BiasRule bias_rule,
                                      const Geometry& geometry, Scalar scale, int64_t c,
                                      const Vector<Scalar>& dkey, Scalar dbias,
                                      Eigen::Ref<Matrix<Scalar>> dk_chunk) {
  const int64_t tokens = geometry.tokens_per_chunk();
  const auto keys = k.middleRows(c * geometry.S(), tokens);
  Vector<Scalar> dmu = Vector<Scalar>::Zero(k.cols());
  switch (key_rule) {  // k' as a function of the chunk's keys (reference/SEMANTICS.md §3)
    case KeyRule::mean:
      dk_chunk.topRows(tokens).rowwise() += dkey.transpose() / static_cast<Scalar>(tokens);
      break;
    case KeyRule::landmark_key: dk_chunk.row(geometry.S() - 1) += dkey.transpose(); break;
    case KeyRule::taylor: break;  // k' = sum p_j k_j: below, with p's own dependence on k
    case KeyRule::exact: break;   // no summary
  }
  if (!detail::summary_needs_prior(key_rule, bias_rule)) return dmu;
  Vector<Scalar> ell = (keys * mu) * scale;
  const Scalar top = ell.maxCoeff();
  Vector<Scalar> p = (ell.array() - top).exp().matrix();
  p /= p.sum();
  Vector<Scalar> dell = Vector<Scalar>::Zero(tokens);
  if (key_rule == KeyRule::taylor) {
    const Vector<Scalar> summary_key = keys.transpose() * p;
    dk_chunk.topRows(tokens).noalias() += p * dkey.transpose();
    dell.array() += p.array() * ((keys * dkey).array() - summary_key.dot(dkey));
  }
  if (bias_rule == BiasRule::entropy)
    dell.array() -= dbias * p.array() * (ell.array() - p.dot(ell));
  dk_chunk.topRows(tokens).noalias() += (scale * dell) * mu.transpose();
  dmu.noalias() = scale * (keys.transpose() * dell);
  return dmu;
}

// Everything the backward needs besides the outputs, resolved once.
template <class Scalar>
struct Problem {
  const MechanismSpec& spec;
  const AttentionInputs<Scalar>& inputs;
  const std::vector<IndexMatrix>& selection;
  const OutputGradients<Scalar>& grads;
  Geometry geometry;
  Scalar scale;
  int64_t G;
  bool hierarchical_summaries;  // hierarchical fusion with a summary key rule: d s_hat flows
  const MechanismOutputs<Scalar>* forward;       // saved forward outputs, or nullptr
  std::vector<Matrix<Scalar>> prior;             // Hq x [n_chunks x d] (needs_prior only)
  std::vector<ChunkSummaries<Scalar>> summaries;  // Hq (hierarchical_summaries only)
  bool fused_window = false;  // the window softmax's gradients from fused_softmax_backward

  Scalar d_lse(int64_t h, int64_t t) const {
    return grads.d_lse.empty() ? Scalar(0) : grads.d_lse[static_cast<size_t>(h)](t);
  }
};

// Pass 1's chunk statistics of one head's block rows, chunk by chunk as
// detail::group_selections groups the block's selections (each chunk's keys and values read
// once per block and head).
template <class Scalar>
struct BlockChunks {
  // Per chunk of the block's selections: [its selections x tokens], sigma q.k_j and do.v_j.
  std::vector<Matrix<Scalar>> logits, dov;
  Matrix<Scalar> mass, do_dot_o;  // [n x K]: L(t, c) and do.o_c of each selection
};

// Logits and do.v of every selected chunk's tokens for the rows that selected it, and from them
// L(t, c) and do.o_c (o_c = softmax over the chunk's tokens . V).
template <class Scalar>
BlockChunks<Scalar> selected_chunks(const Problem<Scalar>& pb, int64_t g,
                                    const detail::BlockSelections& selections, int64_t n,
                                    const Matrix<Scalar>& q_rows, const Matrix<Scalar>& do_rows) {
  const int64_t S = pb.geometry.S(), tokens = pb.geometry.tokens_per_chunk();
  const auto& k = pb.inputs.k[static_cast<size_t>(g)];
  const auto& v = pb.inputs.v[static_cast<size_t>(g)];
  BlockChunks<Scalar> out;
  out.mass = Matrix<Scalar>::Constant(n, pb.spec.K, neg_inf<Scalar>());
  out.do_dot_o = Matrix<Scalar>::Zero(n, pb.spec.K);
  out.logits.resize(selections.chunks.size());
  out.dov.resize(selections.chunks.size());
  for (size_t c = 0; c < selections.chunks.size(); ++c) {
    const auto& ch = selections.chunks[c];
    auto& logits = out.logits[c];
    auto& dov = out.dov[c];
    logits = detail::chunk_logits(detail::gather_selected(q_rows, selections, ch.selections), k,
                                  ch.chunk, pb.geometry, pb.scale);
    dov.noalias() = detail::gather_selected(do_rows, selections, ch.selections) *
                    v.middleRows(ch.chunk * S, tokens).transpose();
    for (int64_t r = 0; r < logits.rows(); ++r) {
      const Scalar top = logits.row(r).maxCoeff();
      const RowVector<Scalar> p = (logits.row(r).array() - top).exp().matrix();
      const Scalar total = p.sum();
      const auto e = static_cast<size_t>(ch.selections[static_cast<size_t>(r)]);
      out.mass(selections.row[e], selections.slot[e]) = top + std::log(total);
      out.do_dot_o(selections.row[e], selections.slot[e]) = p.dot(dov.row(r)) / total;
    }
  }
  return out;
}

// One query row of one head of a selecting mechanism: recomputes the fusion (Eq. 3, 10) with
// the given selection from its chunks' statistics, saves the row's softmax statistics and adds
// its dq~ (reference/SEMANTICS.md §6). The chunks' dq comes after, from selected_chunks_dq.
template <class Scalar>
void selected_row_backward(const Problem<Scalar>& pb, int64_t h, int64_t t, const int32_t* selected,
                           const WindowResult<Scalar>& window, int64_t i,
                           const BlockChunks<Scalar>& chunks, const Matrix<Scalar>& do_rows,
                           RowStatistics<Scalar>& stats, Eigen::Ref<Matrix<Scalar>> dqr_rows) {
  const auto& spec = pb.spec;
  const int64_t K = spec.K;
  const bool flat = spec.fusion == Fusion::flat;
  Vector<Scalar> logits = Vector<Scalar>::Constant(K + 2, neg_inf<Scalar>());
  Vector<Scalar> do_dot_o = Vector<Scalar>::Zero(K + 2);
  for (int64_t s = 0; s < K; ++s) {
    if (selected[s] < 0) continue;
    if (flat || spec.key_rule == KeyRule::exact) {
      logits(s) = chunks.mass(i, s);
    } else {
      const auto& summary = pb.summaries[static_cast<size_t>(h)];
      logits(s) = pb.scale * pb.inputs.retrieval_query(h).row(t).dot(summary.key.row(selected[s])) +
                  summary.bias(selected[s]);
    }
    do_dot_o(s) = chunks.do_dot_o(i, s);
  }
  logits(K) = window.lse(i);
  do_dot_o(K) = do_rows.row(i).dot(window.o.row(i));
  if (spec.softmax1) logits(K + 1) = Scalar(0);
  const Scalar top = logits.maxCoeff();
  const Scalar lse = top + std::log((logits.array() - top).exp().sum());
  const Vector<Scalar> weights = (logits.array() - lse).exp().matrix();
  // D = do.o with o = sum_s w_s o_c + w_K o_window (the softmax1 slot has o = 0).
  const Scalar delta = weights.head(K + 1).dot(do_dot_o.head(K + 1)) - pb.d_lse(h, t);

  stats.window_lambda(t) = flat ? lse : lambda_of(window.lse(i), weights(K));
  stats.window_delta(t) = delta;
  for (int64_t s = 0; s < K; ++s) {
    if (selected[s] < 0) continue;
    stats.chunk_lambda(t, s) = flat ? lse : lambda_of(chunks.mass(i, s), weights(s));
    stats.chunk_delta(t, s) = flat || spec.key_rule == KeyRule::exact ? delta : do_dot_o(s);
    if (pb.hierarchical_summaries) {
      // d s_hat = d z_c = w_c (do.o_c - D); s_hat = sigma q~.k' + b'.
      const Scalar dscore = weights(s) * (do_dot_o(s) - delta);
      stats.dscore(t, s) = dscore;
      dqr_rows.row(i).noalias() +=
          (pb.scale * dscore) * pb.summaries[static_cast<size_t>(h)].key.row(selected[s]);
    }
  }
}

// The chunks' part of dq of head h's block rows, chunk by chunk:
// sigma sum_j P~ (do.v_j - delta) k_j with P~ = exp(s - lambda) from the row statistics.
template <class Scalar>
void selected_chunks_dq(const Problem<Scalar>& pb, int64_t g, const std::vector<int64_t>& rows,
                        const QueryBlock& block, const detail::BlockSelections& selections,
                        const BlockChunks<Scalar>& chunks, const RowStatistics<Scalar>& stats,
                        Matrix<Scalar>& dq_rows) {
  const auto& k = pb.inputs.k[static_cast<size_t>(g)];
  const int64_t S = pb.geometry.S(), tokens = pb.geometry.tokens_per_chunk();
  for (size_t c = 0; c < selections.chunks.size(); ++c) {
    const auto& ch = selections.chunks[c];
    const auto& logits = chunks.logits[c];
    const auto& dov = chunks.dov[c];
    const auto m = static_cast<int64_t>(ch.selections.size());
    Matrix<Scalar> ds(m, tokens);
    for (int64_t r = 0; r < m; ++r) {
      const auto e = static_cast<size_t>(ch.selections[static_cast<size_t>(r)]);
      const int64_t t = rows[static_cast<size_t>(block.begin + selections.row[e])];
      const int64_t s = selections.slot[e];
      ds.row(r) = ((logits.row(r).array() - stats.chunk_lambda(t, s)).exp() *
                   (dov.row(r).array() - stats.chunk_delta(t, s)))
                      .matrix();
    }
    const Matrix<Scalar> dq_sel = pb.scale * (ds * k.middleRows(ch.chunk * S, tokens));
    for (int64_t r = 0; r < m; ++r)
      dq_rows.row(selections.row[static_cast<size_t>(ch.selections[static_cast<size_t>(r)])]) +=
          dq_sel.row(r);
  }
}

// The window (or, for full fusion, full) softmax of head h's block rows: read from the saved
// forward when there is one, else recomputed as the forward computes it.
template <class Scalar>
WindowResult<Scalar> block_window(const Problem<Scalar>& pb, int64_t h,
                                  const std::vector<int64_t>& rows, const QueryBlock& block,
                                  const Matrix<Scalar>& q_rows) {
  if (pb.forward) {
    const auto& head = pb.forward->heads[static_cast<size_t>(h)];
    const bool selects = pb.spec.selects();
    const auto& o = selects ? head.o_window : head.o;
    const auto& lse = selects ? head.lse_window : head.lse;
    return {o.middleRows(block.begin, block.size()), lse.segment(block.begin, block.size())};
  }
  const int64_t g = h / pb.G;
  return detail::block_attention(q_rows, rows, block, pb.inputs.k[static_cast<size_t>(g)],
                                 pb.inputs.v[static_cast<size_t>(g)], pb.geometry, pb.scale,
                                 pb.spec.fusion != Fusion::full);
}

// Pass 1, one (KV group, query block) unit.
template <class Scalar>
void query_block_backward(const Problem<Scalar>& pb, int64_t g, const std::vector<int64_t>& rows,
                          const QueryBlock& block, std::vector<RowStatistics<Scalar>>& stats,
                          InputGradients<Scalar>& out, std::vector<Matrix<Scalar>>& dqr) {
  const auto& spec = pb.spec;
  const auto& k = pb.inputs.k[static_cast<size_t>(g)];
  const auto& v = pb.inputs.v[static_cast<size_t>(g)];
  const bool window_only = spec.fusion != Fusion::full;
  detail::BlockSelections selections;  // the group's heads share the selection: grouped once
  if (spec.selects()) {
    const auto& selection = pb.selection[static_cast<size_t>(g)];
    std::vector<const int32_t*> selected;
    for (int64_t i = 0; i < block.size(); ++i)
      selected.push_back(selection.row(rows[static_cast<size_t>(block.begin + i)]).data());
    selections = detail::group_selections(selected, spec.K, pb.geometry.n_chunks());
  }
  for (int64_t j = 0; j < pb.G; ++j) {
    const int64_t h = g * pb.G + j;
    auto& st = stats[static_cast<size_t>(h)];
    const auto q_rows = detail::gather_rows(pb.inputs.q[static_cast<size_t>(h)], rows, block);
    const auto do_rows = detail::gather_rows(pb.grads.d_o[static_cast<size_t>(h)], rows, block);
    const auto window = block_window(pb, h, rows, block, q_rows);
    Matrix<Scalar> dq_rows = Matrix<Scalar>::Zero(block.size(), q_rows.cols());
    Matrix<Scalar> dqr_rows = Matrix<Scalar>::Zero(block.size(), q_rows.cols());
    if (!spec.selects()) {
      for (int64_t i = 0; i < block.size(); ++i) {
        const int64_t t = rows[static_cast<size_t>(block.begin + i)];
        st.window_lambda(t) = window.lse(i);
        st.window_delta(t) = do_rows.row(i).dot(window.o.row(i)) - pb.d_lse(h, t);
      }
    } else {
      const auto chunks = selected_chunks(pb, g, selections, block.size(), q_rows, do_rows);
      for (int64_t i = 0; i < block.size(); ++i) {
        const int64_t t = rows[static_cast<size_t>(block.begin + i)];
        selected_row_backward<Scalar>(pb, h, t, pb.selection[static_cast<size_t>(g)].row(t).data(),
                                      window, i, chunks, do_rows, st, dqr_rows);
      }
      selected_chunks_dq(pb, g, rows, block, selections, chunks, st, dq_rows);
    }
    const Vector<Scalar> lambda = st.window_lambda.segment(block.begin, block.size());
    const Vector<Scalar> delta = st.window_delta.segment(block.begin, block.size());
    if (!pb.fused_window)
      dq_rows += block_softmax_dq(q_rows, do_rows, lambda, delta, rows, block, k, v, pb.geometry,
                                  pb.scale, window_only);
    out.dq[static_cast<size_t>(h)].middleRows(block.begin, block.size()) = dq_rows;
    dqr[static_cast<size_t>(h)].middleRows(block.begin, block.size()) = dqr_rows;
  }
}

// (query slot, selection position) of every query of a KV group that selected chunk c.
struct Selector {
  int64_t t;
  int64_t s;
};
std::vector<std::vector<Selector>> selectors_by_chunk(const IndexMatrix& selection,
                                                      int64_t n_chunks) {
  std::vector<std::vector<Selector>> by_chunk(static_cast<size_t>(n_chunks));
  for (int64_t t = 0; t < selection.rows(); ++t)
    for (int64_t s = 0; s < selection.cols(); ++s)
      if (selection(t, s) >= 0) by_chunk[static_cast<size_t>(selection(t, s))].push_back({t, s});
  return by_chunk;
}

// Pass 2, the window (or full) softmax's contribution to keys [a, b) from head h.
template <class Scalar>
void key_block_window_backward(const Problem<Scalar>& pb, int64_t h, int64_t a, int64_t b,
                               const RowStatistics<Scalar>& st, Matrix<Scalar>& dk_block,
                               Matrix<Scalar>& dv_block) {
  const int64_t g = h / pb.G, T = pb.geometry.T();
  const bool window_only = pb.spec.fusion != Fusion::full;
  // A key j is in A(t) only if t <= j + W + S - 2 (l(t) >= t - W - S + 2).
  const int64_t t_end = window_only ? std::min(T, b + pb.geometry.W() + pb.geometry.S()) : T;
  const auto& q = pb.inputs.q[static_cast<size_t>(h)];
  const auto& d_o = pb.grads.d_o[static_cast<size_t>(h)];
  const auto keys = pb.inputs.k[static_cast<size_t>(g)].middleRows(a, b - a);
  const auto values = pb.inputs.v[static_cast<size_t>(g)].middleRows(a, b - a);
  Matrix<Scalar> p, ds;
  for (int64_t t0 = a; t0 < t_end; t0 += detail::kQueryBlock) {
    const int64_t n = std::min(detail::kQueryBlock, t_end - t0);
    std::vector<int64_t> left(static_cast<size_t>(n)), right(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      left[static_cast<size_t>(i)] = window_only ? pb.geometry.window_left(t0 + i) : 0;
      right[static_cast<size_t>(i)] = t0 + i;
    }
    const Matrix<Scalar> q_rows = q.middleRows(t0, n);
    const Matrix<Scalar> do_rows = d_o.middleRows(t0, n);
    p.noalias() = (q_rows * pb.scale) * keys.transpose();
    mask_outside(p, left, right, a, pb.geometry);
    softmax_backward_tile<Scalar>(p, ds, do_rows, values, st.window_lambda.segment(t0, n),
                                  st.window_delta.segment(t0, n));
    dv_block.noalias() += p.transpose() * do_rows;
    dk_block.noalias() += pb.scale * (ds.transpose() * q_rows);
  }
}

// Pass 2, chunk c's tokens (and its summary) from the queries of head h that selected it.
template <class Scalar>
void chunk_backward(const Problem<Scalar>& pb, int64_t h, int64_t c,
                    const std::vector<Selector>& selectors, const RowStatistics<Scalar>& st,
                    Eigen::Ref<Matrix<Scalar>> dk_chunk, Eigen::Ref<Matrix<Scalar>> dv_chunk,
                    Eigen::Ref<Matrix<Scalar>> dmu) {
  if (selectors.empty()) return;
  const int64_t g = h / pb.G, n = static_cast<int64_t>(selectors.size());
  const int64_t tokens = pb.geometry.tokens_per_chunk(), d = pb.inputs.d();
  const auto& q = pb.inputs.q[static_cast<size_t>(h)];
  const auto& d_o = pb.grads.d_o[static_cast<size_t>(h)];
  Matrix<Scalar> q_rows(n, d), do_rows(n, d_o.cols());
  Vector<Scalar> lambda(n), delta(n), dscore(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto& sel = selectors[static_cast<size_t>(i)];
    q_rows.row(i) = q.row(sel.t);
    do_rows.row(i) = d_o.row(sel.t);
    lambda(i) = st.chunk_lambda(sel.t, sel.s);
    delta(i) = st.chunk_delta(sel.t, sel.s);
    dscore(i) = pb.hierarchical_summaries ? st.dscore(sel.t, sel.s) : Scalar(0);
  }
  const auto keys = pb.inputs.k[static_cast<size_t>(g)].middleRows(c * pb.geometry.S(), tokens);
  const auto values = pb.inputs.v[static_cast<size_t>(g)].middleRows(c * pb.geometry.S(), tokens);
  Matrix<Scalar> p = (q_rows * pb.scale) * keys.transpose(), ds;
  softmax_backward_tile<Scalar>(p, ds, do_rows, values, lambda, delta);
  dv_chunk.topRows(tokens).noalias() += p.transpose() * do_rows;
  dk_chunk.topRows(tokens).noalias() += pb.scale * (ds.transpose() * q_rows);
  if (!pb.hierarchical_summaries) return;
  // d k'_c = sigma sum_t d s_hat q~_t, d b'_c = sum_t d s_hat.
  const auto& q_retrieval = pb.inputs.retrieval_query(h);
  Vector<Scalar> dkey = Vector<Scalar>::Zero(d);
  for (int64_t i = 0; i < n; ++i)
    dkey.noalias() += dscore(i) * q_retrieval.row(selectors[static_cast<size_t>(i)].t).transpose();
  dkey *= pb.scale;
  const Matrix<Scalar>& prior = pb.prior[static_cast<size_t>(h)];
  const Vector<Scalar> mu = pb.spec.needs_prior() ? Vector<Scalar>(prior.row(c).transpose())
                                                  : Vector<Scalar>::Zero(d);
  dmu.row(c) += summary_chunk_backward<Scalar>(pb.inputs.k[static_cast<size_t>(g)], mu,
                                               pb.spec.key_rule, pb.spec.bias_rule, pb.geometry,
                                               pb.scale, c, dkey, dscore.sum(), dk_chunk)
                    .transpose();
}

// Pass 2, one (KV group, key block) unit: keys [a, b), chunks [c0, c1) (only whole chunks).
template <class Scalar>
void key_block_backward(const Problem<Scalar>& pb, int64_t g, int64_t a, int64_t b,
                        const std::vector<std::vector<Selector>>& selectors,
                        const std::vector<RowStatistics<Scalar>>& stats,
                        InputGradients<Scalar>& out, std::vector<Matrix<Scalar>>& dmu) {
  const int64_t S = pb.geometry.S();
  auto& dk = out.dk[static_cast<size_t>(g)];
  auto& dv = out.dv[static_cast<size_t>(g)];
  // The fused pass has already put the window softmax's part there.
  Matrix<Scalar> dk_block = pb.fused_window ? Matrix<Scalar>(dk.middleRows(a, b - a))
                                            : Matrix<Scalar>::Zero(b - a, pb.inputs.d());
  Matrix<Scalar> dv_block = pb.fused_window ? Matrix<Scalar>(dv.middleRows(a, b - a))
                                            : Matrix<Scalar>::Zero(b - a, pb.inputs.dv());
  for (int64_t j = 0; j < pb.G; ++j) {
    const int64_t h = g * pb.G + j;
    const auto& st = stats[static_cast<size_t>(h)];
    if (!pb.fused_window) key_block_window_backward(pb, h, a, b, st, dk_block, dv_block);
    if (!pb.spec.selects()) continue;
    for (int64_t c = a / S; c < std::min(b / S, pb.geometry.n_chunks()); ++c)
      chunk_backward<Scalar>(pb, h, c, selectors[static_cast<size_t>(c)], st,
                     dk_block.middleRows(c * S - a, S), dv_block.middleRows(c * S - a, S),
                     dmu[static_cast<size_t>(h)]);
  }
  dk.middleRows(a, b - a) = dk_block;
  dv.middleRows(a, b - a) = dv_block;
}

// Whether fused_softmax_backward runs for this scalar type in this build.
template <class Scalar>
constexpr bool fused_window_built() {
#ifdef HILS_FUSED_KERNELS
  return std::is_same_v<Scalar, double>;
#else
  return false;
#endif
}

// Between the passes: the window (or full) softmax's dq, dk and dv of every head, fused.
template <class Scalar>
void fused_window_pass(const Problem<Scalar>& pb, const std::vector<RowStatistics<Scalar>>& stats,
                       InputGradients<Scalar>& out) {
#ifdef HILS_FUSED_KERNELS
  if constexpr (std::is_same_v<Scalar, double>) {
    std::vector<const Vector<double>*> lambda, delta;
    for (const auto& st : stats) {
      lambda.push_back(&st.window_lambda);
      delta.push_back(&st.window_delta);
    }
    detail::fused_softmax_backward({pb.inputs.q, pb.grads.d_o, pb.inputs.k, pb.inputs.v, lambda,
                                    delta, pb.geometry, pb.scale, pb.spec.fusion != Fusion::full},
                                   out.dq, out.dk, out.dv);
  }
#else
  (void)pb, (void)stats, (void)out;
#endif
}

// The saved forward, when given: Hq heads of all T queries, with the window branch for a
// selecting spec.
template <class Scalar>
void validate_forward(const Problem<Scalar>& pb) {
  if (!pb.forward) return;
  const int64_t T = pb.inputs.T(), Hq = pb.inputs.Hq(), dv = pb.inputs.dv();
  const auto& f = *pb.forward;
  require(static_cast<int64_t>(f.heads.size()) == Hq, "forward", std::to_string(Hq) + " heads",
          std::to_string(f.heads.size()));
  bool all_queries = f.queries.empty() || static_cast<int64_t>(f.queries.size()) == T;
  for (size_t i = 0; all_queries && i < f.queries.size(); ++i)
    all_queries = f.queries[i] == static_cast<int64_t>(i);
  require(all_queries, "forward.queries", "all T = " + std::to_string(T) + " slots in order",
          std::to_string(f.queries.size()) + " slots");
  const bool selects = pb.spec.selects();
  for (size_t h = 0; h < f.heads.size(); ++h) {
    const auto& o = selects ? f.heads[h].o_window : f.heads[h].o;
    const auto& lse = selects ? f.heads[h].lse_window : f.heads[h].lse;
    require(o.rows() == T && o.cols() == dv && lse.size() == T,
            "forward.heads[" + std::to_string(h) + (selects ? "].o_window" : "].o"),
            "[" + std::to_string(T) + " x " + std::to_string(dv) + "] with its lse" +
                (selects ? " (run the forward with keep_window)" : ""),
            "[" + std::to_string(o.rows()) + " x " + std::to_string(o.cols()) + "]");
  }
}

template <class Scalar>
void validate_backward_arguments(const Problem<Scalar>& pb) {
  const int64_t T = pb.inputs.T(), Hq = pb.inputs.Hq();
  auto shape = [](int64_t r, int64_t c) {
    return std::string("[") + std::to_string(r) + " x " + std::to_string(c) + "]";
  };
  validate_forward(pb);
  require(static_cast<int64_t>(pb.grads.d_o.size()) == Hq, "d_o", std::to_string(Hq) + " heads",
          std::to_string(pb.grads.d_o.size()));
  for (size_t h = 0; h < pb.grads.d_o.size(); ++h) {
    const auto& m = pb.grads.d_o[h];
    const std::string name = "d_o[" + std::to_string(h) + "]";
    require(m.rows() == T && m.cols() == pb.inputs.dv(), name, shape(T, pb.inputs.dv()),
            shape(m.rows(), m.cols()));
    require(m.allFinite(), name, "finite values", "NaN or Inf");
  }
  require(pb.grads.d_lse.empty() || static_cast<int64_t>(pb.grads.d_lse.size()) == Hq, "d_lse",
          "none or " + std::to_string(Hq) + " heads", std::to_string(pb.grads.d_lse.size()));
  for (size_t h = 0; h < pb.grads.d_lse.size(); ++h) {
    const std::string name = "d_lse[" + std::to_string(h) + "]";
    require(pb.grads.d_lse[h].size() == T, name, std::to_string(T) + " entries",
            std::to_string(pb.grads.d_lse[h].size()));
    require(pb.grads.d_lse[h].allFinite(), name, "finite values", "NaN or Inf");
  }
  if (!pb.spec.selects()) return;
  require(static_cast<int64_t>(pb.selection.size()) == pb.inputs.Hkv(), "selection",
          std::to_string(pb.inputs.Hkv()) + " KV heads", std::to_string(pb.selection.size()));
  for (size_t g = 0; g < pb.selection.size(); ++g) {
    const auto& sel = pb.selection[g];
    const std::string name = "selection[" + std::to_string(g) + "]";
    require(sel.rows() == T && sel.cols() == pb.spec.K, name, shape(T, pb.spec.K),
            shape(sel.rows(), sel.cols()));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t candidates = pb.geometry.candidate_count(t);
      for (int64_t s = 0; s < sel.cols(); ++s) {
        const int32_t c = sel(t, s);
        const std::string where = name + "(" + std::to_string(t) + "," + std::to_string(s) + ")";
        require(c >= -1 && c < candidates, where,
                "-1 or a chunk of V(t) in [0, " + std::to_string(candidates) + ")",
                std::to_string(c));
        for (int64_t r = 0; r < s && c >= 0; ++r)
          require(sel(t, r) != c, where, "a chunk not already selected in this row",
                  std::to_string(c));
      }
    }
  }
}

}  // namespace

template <class Scalar>
SummaryGradients<Scalar> summarize_backward(const Matrix<Scalar>& k, const Matrix<Scalar>& prior,
                                            KeyRule key_rule, BiasRule bias_rule,
                                            const Geometry& geometry, Scalar scale,
                                            const Matrix<Scalar>& dkey,
                                            const Vector<Scalar>& dbias) {
  require(key_rule != KeyRule::exact, "key_rule", "a key rule with a summary (any but exact)", "exact");
  const int64_t chunks = geometry.n_chunks(), d = k.cols();
  require(dkey.rows() == chunks && dkey.cols() == d && dbias.size() == chunks, "dkey",
          "[" + std::to_string(chunks) + " x " + std::to_string(d) + "] with as many dbias",
          "[" + std::to_string(dkey.rows()) + " x " + std::to_string(dkey.cols()) + "]");
  const bool needs_prior = detail::summary_needs_prior(key_rule, bias_rule);
  if (needs_prior)
    require(prior.rows() == chunks && prior.cols() == d, "prior",
            "[" + std::to_string(chunks) + " x " + std::to_string(d) + "]",
            "[" + std::to_string(prior.rows()) + " x " + std::to_string(prior.cols()) + "]");
  SummaryGradients<Scalar> out{Matrix<Scalar>::Zero(k.rows(), d), Matrix<Scalar>::Zero(chunks, d)};
  for (int64_t c = 0; c < chunks; ++c) {
    const Vector<Scalar> mu = needs_prior ? Vector<Scalar>(prior.row(c).transpose())
                                          : Vector<Scalar>::Zero(d);
    out.dprior.row(c) = summary_chunk_backward<Scalar>(
                            k, mu, key_rule, bias_rule, geometry, scale, c,
                            dkey.row(c).transpose(), dbias(c), out.dk.middleRows(c * geometry.S(), geometry.S()))
                            .transpose();
  }
  return out;
}

namespace detail {

template <class Scalar>
InputGradients<Scalar> mechanism_backward(const MechanismSpec& spec,
                                          const AttentionInputs<Scalar>& inputs,
                                          const std::vector<IndexMatrix>& selection,
                                          const OutputGradients<Scalar>& grads,
                                          const MechanismOutputs<Scalar>* forward, bool fused) {
  spec.validate();
  inputs.validate(spec);
  Problem<Scalar> pb{spec, inputs, selection, grads, geometry_of(spec, inputs.T()),
                     static_cast<Scalar>(logit_scale(spec, inputs.d())),
                     inputs.Hq() / inputs.Hkv(),
                     spec.fusion == Fusion::hierarchical && spec.key_rule != KeyRule::exact,
                     forward, {}, {}};
  pb.fused_window = fused && fused_window_built<Scalar>();
  validate_backward_arguments(pb);
  const int64_t T = inputs.T(), Hq = inputs.Hq(), Hkv = inputs.Hkv(), d = inputs.d(), K = spec.K;
  const int64_t chunks = pb.geometry.n_chunks();
  pb.prior.resize(static_cast<size_t>(Hq));
  pb.summaries.resize(static_cast<size_t>(Hq));
  if (pb.hierarchical_summaries)
    detail::parallel_units(Hq, [&](int64_t h) {
      if (spec.needs_prior()) pb.prior[static_cast<size_t>(h)] = resolve_prior(inputs, h, spec, pb.geometry);
      pb.summaries[static_cast<size_t>(h)] =
          summarize(inputs.k[static_cast<size_t>(h / pb.G)], pb.prior[static_cast<size_t>(h)],
                    spec.key_rule, spec.bias_rule, pb.geometry, pb.scale);
    });

  InputGradients<Scalar> out;
  out.dq.assign(static_cast<size_t>(Hq), Matrix<Scalar>::Zero(T, d));
  out.dk.assign(static_cast<size_t>(Hkv), Matrix<Scalar>::Zero(T, d));
  out.dv.assign(static_cast<size_t>(Hkv), Matrix<Scalar>::Zero(T, inputs.dv()));
  std::vector<Matrix<Scalar>> dqr(static_cast<size_t>(Hq), Matrix<Scalar>::Zero(T, d));
  std::vector<Matrix<Scalar>> dmu(static_cast<size_t>(Hq), Matrix<Scalar>::Zero(chunks, d));
  std::vector<RowStatistics<Scalar>> stats(static_cast<size_t>(Hq));
  for (auto& st : stats) {
    st.window_lambda = Vector<Scalar>::Constant(T, pos_inf<Scalar>());
    st.window_delta = Vector<Scalar>::Zero(T);
    st.chunk_lambda = Matrix<Scalar>::Constant(T, K, pos_inf<Scalar>());
    st.chunk_delta = Matrix<Scalar>::Zero(T, K);
    if (pb.hierarchical_summaries) st.dscore = Matrix<Scalar>::Zero(T, K);
  }

  // Pass 1: (KV group, query block) units.
  const auto rows = detail::resolve_queries({}, T);
  const auto blocks = detail::partition_queries(rows, pb.geometry);
  const int64_t n_blocks = static_cast<int64_t>(blocks.size());
  detail::parallel_units(Hkv * n_blocks, [&](int64_t unit) {
    query_block_backward(pb, unit / n_blocks, rows, blocks[static_cast<size_t>(unit % n_blocks)],
                         stats, out, dqr);
  });
  if (pb.fused_window) fused_window_pass(pb, stats, out);

  // Pass 2: (KV group, key block) units over chunk-aligned key blocks; the last takes the tail.
  std::vector<std::vector<std::vector<Selector>>> selectors(static_cast<size_t>(Hkv));
  if (spec.selects())
    detail::parallel_units(Hkv, [&](int64_t g) {
      selectors[static_cast<size_t>(g)] = selectors_by_chunk(selection[static_cast<size_t>(g)], chunks);
    });
  const int64_t span = pb.geometry.S() * std::max<int64_t>(1, detail::kKeyBlock / pb.geometry.S());
  const int64_t key_blocks = (T + span - 1) / span;
  if (spec.selects() || !pb.fused_window)  // else the fused pass did all of dk and dv
    detail::parallel_units(Hkv * key_blocks, [&](int64_t unit) {
      const int64_t g = unit / key_blocks, a = (unit % key_blocks) * span;
      key_block_backward(pb, g, a, std::min(T, a + span), selectors[static_cast<size_t>(g)],
                         stats, out, dmu);
    });

  // The prior's gradient: into q~ at the landmark slots, or into the given/shared prior.
  const bool has_qr = !inputs.q_retrieval.empty();
  for (int64_t h = 0; h < Hq; ++h) {
    auto& dmu_h = dmu[static_cast<size_t>(h)];
    if (spec.needs_prior() && spec.prior_rule == PriorRule::landmark_query)
      for (int64_t c = 0; c < chunks; ++c) dqr[static_cast<size_t>(h)].row(pb.geometry.landmark_slot(c)) += dmu_h.row(c);
    if (has_qr)
      out.dq_retrieval.push_back(std::move(dqr[static_cast<size_t>(h)]));
    else
      out.dq[static_cast<size_t>(h)] += dqr[static_cast<size_t>(h)];
  }
  for (size_t h = 0; h < inputs.prior.size(); ++h) {
    const auto& prior = inputs.prior[h];
    const bool used = spec.needs_prior() && spec.prior_rule != PriorRule::landmark_query;
    if (!used) {
      out.dprior.push_back(Matrix<Scalar>::Zero(prior.rows(), prior.cols()));
    } else if (prior.rows() == 1 && chunks != 1) {
      out.dprior.push_back(chunks == 0 ? Matrix<Scalar>::Zero(1, d)
                                       : Matrix<Scalar>(dmu[h].colwise().sum()));
    } else {
      out.dprior.push_back(dmu[h]);
    }
  }
  return out;
}

}  // namespace detail

template <class Scalar>
InputGradients<Scalar> run_mechanism_backward(const MechanismSpec& spec,
                                              const AttentionInputs<Scalar>& inputs,
                                              const std::vector<IndexMatrix>& selection,
                                              const OutputGradients<Scalar>& grads,
                                              const MechanismOutputs<Scalar>* forward) {
  return detail::mechanism_backward(spec, inputs, selection, grads, forward, true);
}

#define HILS_INSTANTIATE_BACKWARD(S)                                                        \
  template InputGradients<S> detail::mechanism_backward<S>(                                 \
      const MechanismSpec&, const AttentionInputs<S>&, const std::vector<IndexMatrix>&,     \
      const OutputGradients<S>&, const MechanismOutputs<S>*, bool);                         \
  template InputGradients<S> run_mechanism_backward<S>(                                     \
      const MechanismSpec&, const AttentionInputs<S>&, const std::vector<IndexMatrix>&,     \
      const OutputGradients<S>&, const MechanismOutputs<S>*);                               \
  template SummaryGradients<S> summarize_backward<S>(const Matrix<S>&, const Matrix<S>&,    \
                                                     KeyRule, BiasRule, const Geometry&, S, \
                                                     const Matrix<S>&, const Vector<S>&);

HILS_INSTANTIATE_BACKWARD(float)
HILS_INSTANTIATE_BACKWARD(double)
HILS_INSTANTIATE_BACKWARD(long double)

}  // namespace hils
