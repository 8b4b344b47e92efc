// Internal building blocks of the reference: query blocks and the block-level stages that
// run_mechanism and the public stage functions share. Not installed; not part of the API.
#pragma once

#include <cstdint>
#include <exception>
#include <limits>
#include <vector>

#include "hils/attention.hpp"

namespace hils::detail {

// Query rows processed together by one matrix product.
inline constexpr int64_t kQueryBlock = 64;
// Keys per matrix product in the streaming loops.
inline constexpr int64_t kKeyBlock = 256;

template <class Scalar>
constexpr Scalar neg_inf() {
  return -std::numeric_limits<Scalar>::infinity();
}

// A run of consecutive entries [begin, end) of the query list.
struct QueryBlock {
  int64_t begin;
  int64_t end;
  int64_t size() const { return end - begin; }
};

// The query list to compute: all T slots when `queries` is empty, else `queries` after checking
// that it is strictly ascending inside [0, T).
std::vector<int64_t> resolve_queries(const std::vector<int64_t>& queries, int64_t T);

// Splits the query list into blocks of at most kQueryBlock rows whose windows overlap enough
// to share one key range (dense lists give full blocks, sparse samples give small ones).
std::vector<QueryBlock> partition_queries(const std::vector<int64_t>& queries,
                                          const Geometry& geometry);

// [n x cols]: rows queries[block] of x.
template <class Scalar>
Matrix<Scalar> gather_rows(const Matrix<Scalar>& x, const std::vector<int64_t>& queries,
                           const QueryBlock& block);

// Streaming softmax of the block's queries over keys j in [left(t), t] (attendable only):
// full attention when `window_only` is false, the window A(t) when true. o: [n x dv], lse: [n].
template <class Scalar>
WindowResult<Scalar> block_attention(const Matrix<Scalar>& q_rows,
                                     const std::vector<int64_t>& queries,
                                     const QueryBlock& block, const Matrix<Scalar>& k,
                                     const Matrix<Scalar>& v, const Geometry& geometry,
                                     Scalar scale, bool window_only);

// L(t,c) of the block's queries: [n x n_chunks], -inf outside V(t).
template <class Scalar>
Matrix<Scalar> block_chunk_log_mass(const Matrix<Scalar>& q_rows,
                                    const std::vector<int64_t>& queries,
                                    const QueryBlock& block, const Matrix<Scalar>& k,
                                    const Geometry& geometry, Scalar scale);

// s_hat of the block's queries from summaries: [n x n_chunks], -inf outside V(t).
template <class Scalar>
Matrix<Scalar> block_surrogate_scores(const Matrix<Scalar>& q_retrieval_rows,
                                      const std::vector<int64_t>& queries,
                                      const QueryBlock& block,
                                      const ChunkSummaries<Scalar>& summaries,
                                      const Geometry& geometry, Scalar scale);

// Softmax statistics of one query over one chunk's tokens T_c: L = LSE, o_c = softmax . V.
template <class Scalar>
struct ChunkAttention {
  Scalar log_mass;
  Vector<Scalar> o;
};
template <class Scalar>
ChunkAttention<Scalar> attend_chunk(const Eigen::Ref<const Vector<Scalar>>& q_row,
                                    const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                    int64_t chunk, const Geometry& geometry, Scalar scale);

// log(exp(a) + exp(b)) without overflow; -inf + -inf gives -inf.
template <class Scalar>
Scalar log_add_exp(Scalar a, Scalar b);

// Runs `body(unit)` for unit in [0, units) on OpenMP threads. Units must write disjoint
// outputs; their results then do not depend on the number of threads.
// An exception in a unit is rethrown on the calling thread after the loop.
template <class Body>
void parallel_units(int64_t units, const Body& body) {
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t unit = 0; unit < units; ++unit) {
    try {
      body(unit);
    } catch (...) {
#pragma omp critical(hils_parallel_units_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace hils::detail
