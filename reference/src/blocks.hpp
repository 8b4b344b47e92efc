// Internal building blocks of the reference: query blocks and the block-level stages that
// run_mechanism and the public stage functions share. Not installed; not part of the API.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <vector>

#include "hils/attention.hpp"
#include "hils/threads.hpp"

namespace hils::detail {

// Query rows processed together by one matrix product.
inline constexpr int64_t kQueryBlock = 64;
// Keys per matrix product in the streaming loops.
inline constexpr int64_t kKeyBlock = 256;

template <class Scalar>
constexpr Scalar neg_inf() {
  return -std::numeric_limits<Scalar>::infinity();
}

// (bytes at data) -> nothing: asks Linux to back the 2 MiB-aligned part of a large, not yet
// written buffer (a stage's output) with transparent huge pages. First writes then fault once
// per 2 MiB instead of once per 4 KiB page; in the VM this was measured on, a 4 KiB fault cost
// ~30 us, which made a T=16384 chunk log-mass output (32 MiB) cost ~0.25 s of ~0.55 s.
// A hint only: no effect elsewhere, or when the kernel declines.
void prefer_huge_pages(void* data, size_t bytes);

template <class Scalar>
Matrix<Scalar> large_output(int64_t rows, int64_t cols) {
  Matrix<Scalar> out(rows, cols);
  prefer_huge_pages(out.data(), static_cast<size_t>(out.size()) * sizeof(Scalar));
  return out;
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

// L(t,c) of the block's queries: block_chunk_log_mass in chunk_mass.hpp.

// s_hat of the block's queries from summaries: [n x n_chunks], -inf outside V(t).
template <class Scalar>
Matrix<Scalar> block_surrogate_scores(const Matrix<Scalar>& q_retrieval_rows,
                                      const std::vector<int64_t>& queries,
                                      const QueryBlock& block,
                                      const ChunkSummaries<Scalar>& summaries,
                                      const Geometry& geometry, Scalar scale);

// The chunk selections of a query block's rows (reference/SEMANTICS.md §5, §6): selection e is
// (block row i, slot s) for every slot s of row i that holds a chunk (-1 padding is skipped),
// numbered row by row in slot order, and the same selections grouped chunk by chunk. The
// forward's fusion and the backward's pass 1 attend each group's chunk with Eigen products over
// the rows that selected it, so each selected chunk's keys and values are read once per block
// and head; matrix-vector products row by row, each reading the chunk from memory, took ~55% of
// the hils forward and ~80% of the backward's pass 1 at T = 16384 (perf).
struct BlockSelections {
  std::vector<int64_t> row, slot;  // [E]: block row i and slot s of selection e
  std::vector<int64_t> row_begin;  // [n + 1]: row i's selections are [row_begin[i], row_begin[i+1])
  struct Chunk {
    int64_t chunk;
    std::vector<int64_t> selections;  // the selections e of this chunk, ascending
  };
  std::vector<Chunk> chunks;  // in order of first selection (row, then slot)
};

// selected[i]: the K slots of block row i (-1 for padding, anywhere). Throws InvalidArgument
// for a chunk outside [0, n_chunks).
BlockSelections group_selections(const std::vector<const int32_t*>& selected, int64_t K,
                                 int64_t n_chunks);

// [m x cols]: row `row[e]` of x_rows (a block's rows) for each selection e of `selections`.
template <class Scalar>
Matrix<Scalar> gather_selected(const Matrix<Scalar>& x_rows, const BlockSelections& block,
                               const std::vector<int64_t>& selections);

// [m x tokens]: sigma q.k_j of the m rows q_selected over chunk `chunk`'s tokens T_c.
template <class Scalar>
Matrix<Scalar> chunk_logits(const Matrix<Scalar>& q_selected, const Matrix<Scalar>& k,
                            int64_t chunk, const Geometry& geometry, Scalar scale);

// Softmax statistics of every selection of a block (one head) over its chunk's tokens T_c:
// L = LSE (log_mass [E]) and o_c = softmax . V (o [E x dv]), each chunk's keys and values read
// once. E <= block rows x chunks, so o holds at most (block rows / S) times a KV head's values.
template <class Scalar>
struct SelectedAttention {
  Vector<Scalar> log_mass;
  Matrix<Scalar> o;
};
template <class Scalar>
SelectedAttention<Scalar> attend_selected(const Matrix<Scalar>& q_rows,
                                          const BlockSelections& block,
                                          const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                          const Geometry& geometry, Scalar scale);

// attend_selected's work for one chunk of `block`: its selections' log-masses and outputs into
// `out` (sized for all of block's selections). attend_selected runs it for each chunk of one
// block; fuse_rows for the chunks of several one-row blocks, chunk by chunk.
template <class Scalar>
void attend_chunk(const Matrix<Scalar>& q_rows, const BlockSelections& block,
                  const BlockSelections::Chunk& chunk, const Matrix<Scalar>& k,
                  const Matrix<Scalar>& v, const Geometry& geometry, Scalar scale,
                  SelectedAttention<Scalar>& out);

// The fusion (Eq. 3, 10) of block row i from its selections' statistics: fuse's mathematics,
// for run_mechanism (a block's rows together) and fuse (one row).
template <class Scalar>
void fuse_selected(const MechanismSpec& spec, const FusionRow<Scalar>& row,
                   const BlockSelections& block, const SelectedAttention<Scalar>& chunks,
                   int64_t i, Eigen::Ref<RowVector<Scalar>> o, Scalar& lse,
                   Eigen::Ref<RowVector<Scalar>> weights);

// The columns j in [0, n) of a block of keys from slot k0 that are landmark slots (masked in
// every row), ascending.
std::vector<int64_t> landmark_columns(const Geometry& geometry, int64_t k0, int64_t n);

// Sets row[j] = -inf for the columns j in [0, n) outside [first, last] (the row's attendable
// key range, relative to the block's first key; either end may lie outside [0, n)).
template <class Scalar>
void mask_outside_range(Scalar* row, int64_t n, int64_t first, int64_t last) {
  const int64_t begin = std::clamp<int64_t>(first, 0, n);
  const int64_t end = std::clamp<int64_t>(last + 1, begin, n);
  std::fill(row, row + begin, neg_inf<Scalar>());
  std::fill(row + end, row + n, neg_inf<Scalar>());
}

// exp(x) for x <= 0 (a logit minus its row maximum): the softmax's exponential. For double, a
// branch-free polynomial the compiler vectorizes (Cody-Waite reduction x = n ln2 + r, |r| <=
// ln2/2, degree-13 Taylor series of exp(r), times 2^n) within 1 ulp of std::exp; below
// -708 (where 2^n would leave the normal range, and for -inf) it returns exactly 0, so masked
// keys add nothing. Other scalar types use std::exp.
template <class Scalar>
inline Scalar exp_nonpositive(Scalar x) {
  return std::exp(x);
}
template <>
inline double exp_nonpositive<double>(double x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2, first 32 bits: n * kLn2Hi is exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
  constexpr double kRoundingShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  constexpr double kUnderflow = -708.0;
  const double clamped = x < kUnderflow ? kUnderflow : x;
  const double shifted = std::fma(clamped, kLog2e, kRoundingShift);
  const double n = shifted - kRoundingShift;
  const double r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, clamped));
  // Horner's rule on 1/13!, 1/12!, ..., 1/1!, 1/0!, written out so the loop around it vectorizes.
  double p = 1.0 / 6227020800.0;
  p = std::fma(p, r, 1.0 / 479001600.0);
  p = std::fma(p, r, 1.0 / 39916800.0);
  p = std::fma(p, r, 1.0 / 3628800.0);
  p = std::fma(p, r, 1.0 / 362880.0);
  p = std::fma(p, r, 1.0 / 40320.0);
  p = std::fma(p, r, 1.0 / 5040.0);
  p = std::fma(p, r, 1.0 / 720.0);
  p = std::fma(p, r, 1.0 / 120.0);
  p = std::fma(p, r, 1.0 / 24.0);
  p = std::fma(p, r, 1.0 / 6.0);
  p = std::fma(p, r, 0.5);
  p = std::fma(p, r, 1.0);
  p = std::fma(p, r, 1.0);
  // 2^n built from its exponent bits; the low bits of `shifted` hold n.
  const int64_t n_bits = std::bit_cast<int64_t>(shifted) - std::bit_cast<int64_t>(kRoundingShift);
  const double two_to_n = std::bit_cast<double>((n_bits + 1023) << 52);
  // Below the range, the bits of p 2^n masked to those of +0.0: no branch, so that a loop
  // around this vectorizes (GCC moves a product needed on one side of a selection into a branch
  // and then does not if-convert it, -ftrapping-math). NaN keeps its bits, as before.
  const uint64_t keep = x < kUnderflow ? 0 : ~uint64_t(0);
  return std::bit_cast<double>(std::bit_cast<uint64_t>(p * two_to_n) & keep);
}

// log(exp(a) + exp(b)) without overflow; -inf + -inf gives -inf.
template <class Scalar>
Scalar log_add_exp(Scalar a, Scalar b);

// parallel_units: hils/threads.hpp (the oracle runs its own units on it too).

}  // namespace hils::detail
