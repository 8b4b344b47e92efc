// The two-pass kernel (select_packed_kernel) and its template options (Offers, Scoring, Writer,
// Lean): pass 1 forms log2 Z_hat per head (and the buffered kernels' bound), pass 2 the group
// scores of each tile and their offers, then the writer. Each kept two-pass version (v4, v8, v15,
// v21, v22, v25) is one instance of it (select_kernel_of in select_packed.cu).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "select_packed/common.cuh"
#include "select_packed/lists.cuh"
#include "select_packed/writers.cuh"
#include "select_packed/buffers.cuh"
#include "select_packed/inputs.cuh"

namespace hils::gpu::detail {
namespace {

// The template options below are those of the kept kernels (attention.hpp SelectKernel); the
// versions between them were removed in session 17 (gpu/NOTES.md "Kernels removed in session 17",
// their code at commit ad5fb84), so a kept kernel is named by the version that introduced each of
// its options.
// How pass 2 hands a tile's group scores to the rows' top K: one row at a time into sorted
// lists (offer_tile, v4), or appended to per-row buffers without ranking (append_half, v8,
// K <= 32). The buffered kernels' pass 1 also forms the lower bound of each row's K-th group
// score over kBoundSlots slots (kth_largest) and pass 2 offers no candidate below it; the sorted
// lists (v4) form none (v6's did: removed in session 17).
enum class Offers { sorted, buffered };

// kScoring: mma.sync (qk_tile, v4, v8), or wgmma_q_smem (v10 on, sm_90a): the products by the
// warpgroup's wgmma from swizzled k' panels, 128 queries per block (two warpgroups sharing each
// k' panel), and pass 2's q~ (a new head every step) staged by cp.async into a swizzled panel per
// warpgroup instead of loaded as register fragments.
enum class Scoring { mma_sync, wgmma_q_smem };
// Which writer puts out the selected chunks and scores: write_selection (v4, v8), or
// write_selection_ahead (v11 on: its loads one unit ahead; K <= 32, buffered offers only), or only
// the selection, the scores by selected_scores_lean_kernel after it (v17 on).
enum class Writer { in_order, ahead, separate };
// Pass 2's steps as written first (v4, v8), or lean (v12 on: the copies' per-thread pieces and
// the wgmma descriptors worked out once, each tile's first head without the per-step reset
// selects; wgmma_q_smem scoring and buffered offers only), or v12's with 32-bit copy state (v16
// on: the q~ and k' copy sources worked out per step from the head index, the kernel's parameters
// and 32-bit offsets, shared addresses and descriptor low words in 32 bits, so that pass 2 keeps
// no 64-bit copy state in registers; v15 spills v12's 64-bit q~ copy pieces and reloads them
// every step), or v16's with the bias and log2 Z_hat folded into the products (v25,
// max_normalized: a fifth k16 step adds (b2 - z) / scale2 to s as three bf16 pieces each, so a
// step's epilogue is one FMNMX per element, r = scale2 max_h acc_h after the tile's G heads;
// FoldColumns).
enum class Lean { none, pass2, pass2_q32, pass2_fold };
template <Scoring kScoring>
constexpr int kBlockQueries = kScoring == Scoring::wgmma_q_smem ? 128 : 64;

template <int G, Offers kOffers, Scoring kScoring = Scoring::mma_sync, Writer kWriter = Writer::in_order,
          Lean kLeanSteps = Lean::none>
__global__ void __launch_bounds__(2 * kBlockQueries<kScoring>, kBlockQueries<kScoring> == 64 ? 4 : 2)
    select_packed_kernel(LaunchParams p, const float* key, const __nv_bfloat16* key_bf16,
                         const float* bias, const float* bias2, const float* lse_swa,
                         int32_t* selection, float* selected_score, int first_round) {
  constexpr bool kBuffered = kOffers == Offers::buffered;
  constexpr bool kWgmma = kScoring == Scoring::wgmma_q_smem;
  constexpr int kQueries = kBlockQueries<kScoring>, kThreads = 2 * kQueries;  // 16 rows per warp
  static_assert(kWgmma == (kLeanSteps != Lean::none), "the wgmma kernels are the lean ones (v15 on)");
  static_assert(kWriter == Writer::in_order || kBuffered, "the writer ahead takes v8's buffers (K <= 32)");
  constexpr bool kLean = kLeanSteps != Lean::none;
  constexpr bool kFold = kLeanSteps == Lean::pass2_fold;
  constexpr bool kQ32 = kLeanSteps == Lean::pass2_q32 || kFold;
  // Pass 1 one k' tile per step (mma.sync: v4, v8) or two (wgmma: v14 on, in panels 0-3, which
  // pass 1 has free; v12's copy pieces).
  constexpr bool kPairs = kWgmma;
  static_assert(!kLean || kBuffered, "the lean pass 2 is v10's with buffered offers");
  constexpr int kSlots = kBoundSlots;     // the bound's (v8 on: buffered offers only)
  constexpr int kParts = kSlots / kWarp;  // slot maxima per lane and row
  // Two stages of (k' tile, bias tile): step s + 1 streams in while step s is computed.
  __shared__ __align__(16) __nv_bfloat16 tile[2][kWgmma ? 1 : kTileDim][kTilePitch];
  __shared__ __align__(16) float bias_tile[kPairs ? 4 : 2][kTileDim];
  extern __shared__ __align__(16) float dyn[];
  const int K = static_cast<int>(p.K);
  // wgmma: four swizzled k' panels (pass 1: two stages of two tiles; pass 2: two stages, then one
  // q~ panel per warpgroup), on a 1024-byte boundary (select_smem_bytes adds the slack).
  unsigned char* panels = nullptr;
  float* cursor = dyn;
  if (kWgmma) {
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(dyn));
    panels = reinterpret_cast<unsigned char*>(dyn) + (wg::kAtomBytes - base % wg::kAtomBytes) % wg::kAtomBytes;
    cursor = reinterpret_cast<float*>(panels + 4 * kPanelBytes);
  }
  auto take = [&](int64_t count) { float* out = cursor; cursor += count; return out; };
  // v25: the k side of pass 2's fifth k16 step, two stages of 64 FoldRows (16 bytes each, no
  // swizzle), then 128 bytes that stay zero (the unused second core matrix along K of the last
  // 8 rows reads there: A's columns 8-15 are zero, so it only has to be finite; all of it is
  // zeroed first), on the panels' 1024-byte boundary.
  unsigned char* fold_panel = kFold ? reinterpret_cast<unsigned char*>(take(kFoldPanelFloats)) : nullptr;
  SelectShared sh;
  // v8: the rows of kBufPitch words (bound slots in pass 1, candidate buffers in pass 2) replace
  // the group-score tile and the lists.
  float* buf = kBuffered ? take(kQueries * kBufPitch) : nullptr;
  sh.r = kBuffered ? nullptr : take(kQueries * kRPitch);
  sh.log_z = take(G * kQueries);
  // v25 (max_normalized): pass 1 leaves the q side's pieces of x = -log2 Z_hat / scale2 instead of
  // log2 Z_hat: (x_hi, x_mid) as one word in sh.log_z's place, x_lo's bf16 bits here.
  auto* fold_lo = kFold ? reinterpret_cast<uint16_t*>(take(G * kQueries / 2)) : nullptr;
  sh.value = kBuffered ? nullptr : take(kQueries * K);
  sh.index = kBuffered ? nullptr : reinterpret_cast<int32_t*>(take(kQueries * K));
  sh.n_cand = reinterpret_cast<int32_t*>(take(kQueries));
  float* row_bound = take(kQueries);  // kSlots: lower bound of each row's K-th group score
  // Word of the bound's slot `slot` of row r in buf: V at +0, the running slot maximum at +kSlots.
  auto slot_word = [&](int r, int slot) { return r * kBufPitch + swizzled_slot(r, slot); };
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = block_t0(kQueries, first_round), g = blockIdx.y;
  const int64_t n_chunks = geo.n_chunks();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int row[2] = {warp * 16 + lane / 4, warp * 16 + lane / 4 + 8};
  const int64_t t[2] = {t0 + row[0], t0 + row[1]};
  // The bound needs pass 1's log2 Z_hat: not for max_raw. Its V rows live in the buffer rows (v8)
  // in pass 1 (the sorted lists with a bound were the removed v6's: gpu/NOTES.md "Kernels
  // removed in session 17").
  const bool bound = kBuffered && p.group_rule != GroupRule::max_raw && K <= kWarp;
  if (!kBuffered)
    for (int e = threadIdx.x; e < kQueries * K; e += kThreads) sh.value[e] = kNegInf, sh.index[e] = -1;
  if (bound)
    for (int e = threadIdx.x; e < kQueries * kBufPitch; e += kThreads) buf[e] = kNegInf;
  if (kFold) {
    for (int e = threadIdx.x; e < kFoldPanelFloats; e += kThreads) reinterpret_cast<float*>(fold_panel)[e] = 0.0f;
    wg::fence_proxy_async();
  }
  for (int q = threadIdx.x; q < kQueries; q += kThreads) {
    sh.n_cand[q] = t0 + q < p.T ? static_cast<int>(geo.candidate_count(t0 + q)) : 0;
  }
  __syncthreads();
  const int n_cand[2] = {sh.n_cand[row[0]], sh.n_cand[row[1]]};
  // Tiles below every row's count of the warp need no mask.
  int warp_min = n_cand[0] < n_cand[1] ? n_cand[0] : n_cand[1];
  for (int off = kWarp / 2; off > 0; off /= 2) warp_min = min(warp_min, __shfl_xor_sync(0xffffffffu, warp_min, off));
  const int64_t t_last = t0 + kQueries - 1 < p.T - 1 ? t0 + kQueries - 1 : p.T - 1;
  const int n_tiles = (sh.n_cand[t_last - t0] + kTileDim - 1) / kTileDim;
  const float scale2 = p.scale * kLog2e;
  // v25's fifth k-step for the default group rule (block-uniform); the row's largest |log2 Z_hat|
  // over its heads (its margin, kFoldMargin).
  const bool fold = kFold && p.group_rule == kGroupMaxNormalized;
  float fold_z_max[2] = {0.0f, 0.0f};
  // With fewer than K nonempty slots (kSlots / 8 per tile) the bound is -inf: not formed at all.
  const bool prune = bound && (kSlots / 8) * n_tiles >= K;
  // Stage `buf` <- k' and bias2 of head g G + hg, chunks [c0, c0 + 64) (mma.sync kernels).
  auto issue = [&](int hg, int c0, int buf) {
    const int64_t h = g * G + hg;
    issue_tile(tile[buf], bias_tile[buf], key_bf16 + h * n_chunks * kTileDim, bias2 + h * n_chunks,
               c0, static_cast<int>(n_chunks));
  };
  // The staged tile is complete and visible to the block (and, wgmma, to the tensor cores).
  auto await_tile = [&]() {
    cp_async_wait_all();
    if (kWgmma) wg::fence_proxy_async();
    __syncthreads();
  };
  // v12: the k' copy's per-thread pieces (rows tid / 8 + 32 j: the 128-byte swizzle of
  // row + 32 j is row's, 4096 bytes on; 32-bit element offsets inside the group) and the k'
  // panels' descriptor (panel 1: + kPanelBytes / 16), worked out once.
  const int nc = static_cast<int>(n_chunks), k_row = threadIdx.x / 8, k_col = (threadIdx.x % 8) * 8;
  const uint32_t k_dst = kLean ? wg::sw128_offset(k_row, k_col) : 0u;
  const __nv_bfloat16* key_g = key_bf16 + g * G * n_chunks * kTileDim;
  const float* bias_g = bias2 + g * G * n_chunks;
  // k' rows [c0, c0 + 64) and their biases of head g G + hg into stage `stage`, committed.
  auto copy_k = [&](int hg, int c0, int stage) {
    const __nv_bfloat16* head = key_g + hg * nc * kTileDim;
    unsigned char* dst = panels + stage * kPanelBytes + k_dst;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int rr = c0 + k_row + 32 * j;
      const bool valid = rr < nc;
      cp_async16(dst + 4096 * j, valid ? head + rr * kTileDim + k_col : head, valid);
    }
    if (threadIdx.x < kTileDim) {
      const int cc = c0 + static_cast<int>(threadIdx.x);
      const bool valid = cc < nc;
      cp_async4(&bias_tile[stage][threadIdx.x], bias_g + hg * nc + (valid ? cc : 0), valid);
    }
    cp_async_commit();
  };
  const uint64_t k_desc = kLean ? wg::desc_k_major(panels) : 0ull;
  uint32_t qa[4][4], qn[4][4];
  float s[8][4];
  // Pass 1, step = (head, tile): log2 Z_hat(t,h) = log2(2^lse_swa2 + sum over V(t) of 2^s2).
  // Folds a tile's lane maxima into this lane's running slot maxima (words kSlots + slot).
  auto update_slots = [&](int tile_i, const float (&lane_max)[2][kParts]) {
#pragma unroll
    for (int k = 0; k < kParts; ++k) {
      const int slot = (4 * kParts * tile_i + kParts * (lane % 4) + k) % kSlots;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float& cur = buf[slot_word(row[i], slot) + kSlots];
        cur = fmaxf(cur, lane_max[i][k]);
      }
    }
  };
  // End of head hg: log2 Z_hat into sh.log_z; V[slot] = max over heads of the slot's best term
  // (pass 2's arithmetic; a NaN from a row without any mass is ignored by fmaxf), and the slot
  // maxima restart for the next head. Each (row, slot) belongs to one thread: slots kParts
  // (lane % 4) + k + 4 kParts j.
  auto end_head = [&](int hg, const float (&m)[2], const float (&l)[2]) {
    const int64_t h = g * G + hg;
    float z[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float swa = t[i] < p.T ? lse_swa[h * p.T + t[i]] * kLog2e : kNegInf;
      z[i] = log2_normalizer(m[i], l[i], swa);
      if (kFold && fold) {
        fold_z_max[i] = fmaxf(fold_z_max[i], fabsf(z[i]));
        if (lane % 4 == 0) {
          // A row past T (z = -inf) gets zeros; its columns are masked.
          const Bf16Pieces x = bf16_pieces(isfinite(z[i]) ? -z[i] / scale2 : 0.0f);
          reinterpret_cast<uint32_t*>(sh.log_z)[hg * kQueries + row[i]] = x.hi | x.mid << 16;
          fold_lo[hg * kQueries + row[i]] = static_cast<uint16_t>(x.lo);
        }
      } else if (lane % 4 == 0) {
        sh.log_z[hg * kQueries + row[i]] = z[i];
      }
    }
    if (prune)
#pragma unroll
      for (int j = 0; j < kWarp / 4; ++j)
#pragma unroll
        for (int k = 0; k < kParts; ++k)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int word = slot_word(row[i], kParts * (lane % 4) + k + 4 * kParts * j);
            float& cur = buf[word + kSlots];
            const float x = cur - z[i];
            const float term = p.group_rule == kGroupSumProbabilities ? fast_exp2(x) : x;
            float& v = buf[word];
            v = fmaxf(v, term);
            cur = kNegInf;
          }
  };
  if (kPairs && p.group_rule != GroupRule::max_raw && n_tiles > 0) {
    // v14: two k' tiles per step (tiles 2 j and 2 j + 1 of a head; an odd count ends on a
    // phantom tile past every row's candidates, which leaves m, l and the slots as they are:
    // exactly what a row shorter than the block's longest sees in v12). One block barrier, one
    // copy commit and one wgmma wait per two tiles, and two independent tile maxima and ex2
    // sums per step for the schedulers; the mass of tile 2 j is accumulated before that of
    // 2 j + 1, as in v12 (the same bits).
    const int n_pairs = (n_tiles + 1) / 2;
    // k' tiles [c0, c0 + 128) of head hg into panels 2 stage, 2 stage + 1, one commit.
    auto copy_pair = [&](int hg, int c0, int stage) {
      const __nv_bfloat16* head = key_g + hg * nc * kTileDim;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        unsigned char* dst = panels + (2 * stage + half) * kPanelBytes + k_dst;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int rr = c0 + kTileDim * half + k_row + 32 * j;
          const bool valid = rr < nc;
          cp_async16(dst + 4096 * j, valid ? head + rr * kTileDim + k_col : head, valid);
        }
      }
      if (threadIdx.x < 2 * kTileDim) {
        const int cc = c0 + static_cast<int>(threadIdx.x);
        const bool valid = cc < nc;
        cp_async4(&bias_tile[2 * stage][threadIdx.x], bias_g + hg * nc + (valid ? cc : 0), valid);
      }
      cp_async_commit();
    };
    float m[2], l[2];
    float sb[8][4];
    copy_pair(0, 0, 0);
    for (int hg = 0, pair = 0, stage = 0; hg < G; stage ^= 1) {
      const int c0 = pair * 2 * kTileDim;
      const bool last_pair = pair + 1 == n_pairs;
      if (pair == 0) {
        load_query_fragments(qa, p, g * G + hg, t);
        m[0] = m[1] = kNegInf, l[0] = l[1] = 0.0f;
      }
      await_tile();
      if (!last_pair) copy_pair(hg, c0 + 2 * kTileDim, stage ^ 1);
      else if (hg + 1 < G) copy_pair(hg + 1, 0, stage ^ 1);
      {
        const uint64_t kd = k_desc + static_cast<uint64_t>(2 * stage * (kPanelBytes >> 4));
        const uint64_t kd1 = kd + static_cast<uint64_t>(kPanelBytes >> 4);
        wg::fence_operands(s);
        wg::fence_operands(sb);
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) wg::mma_rs<false>(s, qa[ks], wg::desc_advance(kd, 32 * ks), ks > 0);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) wg::mma_rs<false>(sb, qa[ks], wg::desc_advance(kd1, 32 * ks), ks > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_operands(s);
        wg::fence_operands(sb);
      }
      scale_and_mask(s, bias_tile[2 * stage], scale2, c0, n_cand, c0 + kTileDim <= warp_min);
      scale_and_mask(sb, bias_tile[2 * stage + 1], scale2, c0 + kTileDim, n_cand, c0 + 2 * kTileDim <= warp_min);
      if (prune) {
        float lane_max[2][kParts], lane_max_b[2][kParts];
        accumulate_mass<kParts>(s, m, l, lane_max);
        accumulate_mass<kParts>(sb, m, l, lane_max_b);
        update_slots(2 * pair, lane_max);
        update_slots(2 * pair + 1, lane_max_b);
      } else {
        accumulate_mass(s, m, l);
        accumulate_mass(sb, m, l);
      }
      if (last_pair) end_head(hg, m, l);
      if (last_pair) pair = 0, ++hg;
      else ++pair;
    }
  } else if (!kPairs && p.group_rule != GroupRule::max_raw && n_tiles > 0) {
    float m[2], l[2];
    issue(0, 0, 0);
    // (hg, tile_i): the step's head and tile, advanced by counters (no division per step).
    for (int hg = 0, tile_i = 0, buf = 0; hg < G; buf ^= 1) {
      const int c0 = tile_i * kTileDim;
      const int64_t h = g * G + hg;
      const bool last_tile = tile_i + 1 == n_tiles;
      if (tile_i == 0) {
        load_query_fragments(qa, p, h, t);
        m[0] = m[1] = kNegInf, l[0] = l[1] = 0.0f;
      }
      await_tile();
      if (!last_tile) issue(hg, c0 + kTileDim, buf ^ 1);
      else if (hg + 1 < G) issue(hg + 1, 0, buf ^ 1);
      qk_tile(s, qa, tile[buf]);
      scale_and_mask(s, bias_tile[buf], scale2, c0, n_cand, c0 + kTileDim <= warp_min);
      if (prune) {
        float lane_max[2][kParts];
        accumulate_mass<kParts>(s, m, l, lane_max);
        update_slots(tile_i, lane_max);
      } else {
        accumulate_mass(s, m, l);
      }
      if (last_tile) end_head(hg, m, l);
      if (last_tile) tile_i = 0, ++hg;
      else ++tile_i;
    }
  }
  __syncthreads();
  if (prune) {
    for (int j = 0; j < 16; ++j) {
      const int q = warp * 16 + j;
      const float kth = kth_largest(buf + q * kBufPitch, K);
      if (lane == 0) row_bound[q] = kth;
    }
    __syncwarp();
  }
  // Pass 2, step = (tile, head): group score per tile; rows with a score above their list's
  // threshold (held in registers) are offered to their top-K lists.
  int count[2] = {0, 0};  // v8: entries in the buffers of rows row[0], row[1]
  if constexpr (kLean) {
    // v12: v10's pass 2 (same products, same epilogue arithmetic and order), with the per-step
    // overhead v10's SASS showed (~330 instructions per step for 96 of score arithmetic) cut:
    // the per-thread pieces of the q~ panel copy (rows tq / 8 + 16 j) and of the k' copy (rows
    // tid / 8 + 32 j: the 128-byte swizzle of row + 16 j or + 32 j is row's, 2048 or 4096 bytes
    // on) and the wgmma descriptors are worked out once; 32-bit element offsets inside a group;
    // the loop runs (tile, head) with each tile's first head as its own code, so r needs no
    // reset selects on every step.
    if (n_tiles > 0) {
      const int steps = G * n_tiles;
      float r[8][4];
      float theta[2] = {prune ? floor_of(row_bound[row[0]]) : kNegInf, prune ? floor_of(row_bound[row[1]]) : kNegInf};
      // v25: the fifth k-step's k-side rows in the scratch after bias2, the margin on the bound.
      const int64_t n_bias = p.Hq * (p.T / p.S);
      const uint4* fold_rows = kFold ? reinterpret_cast<const uint4*>(bias2 + fold_rows_offset(n_bias)) : nullptr;
      if (kFold && fold && prune) {
        const float b_max = *reinterpret_cast<const float*>(fold_rows + n_bias);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float bound_i = row_bound[row[i]];
          const float eps = kFoldMargin * (fabsf(bound_i) + 1.0f + 2.0f * fold_z_max[i] + 3.0f * b_max);
          theta[i] = bound_i == kNegInf ? kNegInf : floor_of(bound_i - eps);
        }
      }
      const int wg_index = warp / 4;
      unsigned char* q_panel = panels + (2 + wg_index) * kPanelBytes;
      const int64_t wg_t0 = t0 + 64 * wg_index;
      const auto* q0 = static_cast<const __nv_bfloat16*>(p.q_retrieval) + g * G * p.T * kTileDim;
      const int64_t head_stride = p.T * kTileDim;
      const int tq = threadIdx.x % 128, q_row = tq / 8;
      unsigned char* const q_dst = q_panel + wg::sw128_offset(q_row, (tq % 8) * 8);
      const int64_t q_off = (wg_t0 + q_row) * kTileDim + (tq % 8) * 8;  // used only where valid
      const int64_t q_left = p.T - (wg_t0 + q_row);                      // row q_row + 16 j valid: 16 j < q_left
      // The warpgroup's q~ rows of head g G + hg (not committed).
      auto copy_q = [&](int hg) {
        const __nv_bfloat16* head = q0 + hg * head_stride;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool valid = 16 * j < q_left;
          cp_async16(q_dst + 2048 * j, valid ? head + q_off + 1024 * j : head, valid);
        }
      };
      // v16: pass 2's copies from 32-bit element offsets on the kernel's parameters (q~: Hq T 64
      // < 2^32, launch_select_packed checks; k': Hq n_chunks 64 < Hq T), worked out per step
      // from the head index, into 32-bit shared addresses, so that no 64-bit copy state stays
      // live across the steps (v15 spilled v12's and reloaded it after every wgmma). Every
      // warpgroup but the last block's has its 64 rows before T: no per-row test there.
      const uint32_t hq0 = blockIdx.y * G, T64 = static_cast<uint32_t>(p.T) * kTileDim;
      const uint32_t q_dst32 = kQ32 ? static_cast<uint32_t>(__cvta_generic_to_shared(q_dst)) : 0u;
      const uint32_t fold32 = kFold ? static_cast<uint32_t>(__cvta_generic_to_shared(fold_panel)) : 0u;
      const uint32_t k_dst32 = kQ32 ? static_cast<uint32_t>(__cvta_generic_to_shared(panels)) + k_dst : 0u;
      const uint32_t q_off32 = static_cast<uint32_t>(q_off);
      const int q_rows = q_left < 64 ? static_cast<int>(q_left) : 64;
      auto copy_q2 = [&](int hg) {
        if constexpr (kQ32) {
          const auto* q = static_cast<const __nv_bfloat16*>(p.q_retrieval);
          const uint32_t off = (hq0 + hg) * T64 + q_off32;
          if (q_rows == 64) {
#pragma unroll
            for (int j = 0; j < 4; ++j) cp_async16_at(q_dst32 + 2048 * j, q + off + 1024 * j, true);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const bool valid = 16 * j < q_rows;
              cp_async16_at(q_dst32 + 2048 * j, q + (valid ? off + 1024 * j : 0u), valid);
            }
          }
        } else {
          copy_q(hg);
        }
      };
      auto copy_k2 = [&](int hg, int c0, int stage) {
        if constexpr (kQ32) {
          const uint32_t head = (hq0 + hg) * static_cast<uint32_t>(nc);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int rr = c0 + k_row + 32 * j;
            const bool valid = rr < nc;
            cp_async16_at(k_dst32 + stage * kPanelBytes + 4096 * j,
                          key_bf16 + (valid ? (head + rr) * kTileDim + k_col : 0u), valid);
          }
          if (threadIdx.x < kTileDim) {
            const int cc = c0 + static_cast<int>(threadIdx.x);
            const bool valid = cc < nc;
            if (kFold && fold)  // v25: the chunks' k-side rows of the fifth k-step instead of the biases
              cp_async16_at(fold32 + stage * kFoldStageBytes + threadIdx.x * 16, fold_rows + (valid ? head + cc : 0u),
                            valid);
            else
              cp_async4(&bias_tile[stage][threadIdx.x], bias2 + (valid ? head + cc : 0u), valid);
          }
          cp_async_commit();
        } else {
          copy_k(hg, c0, stage);
        }
      };
      const uint64_t q_desc = wg::desc_k_major(q_panel);
      // v16: the descriptors' k16 steps on their low words only (the 14-bit address field of a
      // shared address below 228 KB, plus 6, does not carry; both high words are equal).
      const uint32_t q_lo = static_cast<uint32_t>(q_desc), k_lo = static_cast<uint32_t>(k_desc);
      auto product = [&](int stage) {
        wg::fence_operands(s);
        wg::fence();
        if constexpr (kQ32) {
          const uint32_t kd_lo = k_lo + static_cast<uint32_t>(stage * (kPanelBytes >> 4));
          wg::mma_ss_k_major<0>(s, q_lo, kd_lo, false);
          wg::mma_ss_k_major<1>(s, q_lo, kd_lo, true);
          wg::mma_ss_k_major<2>(s, q_lo, kd_lo, true);
          wg::mma_ss_k_major<3>(s, q_lo, kd_lo, true);
        } else {
          const uint64_t kd = k_desc + static_cast<uint64_t>(stage * (kPanelBytes >> 4));
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wg::mma_ss<false>(s, wg::desc_advance(q_desc, 32 * ks), wg::desc_advance(kd, 32 * ks), ks > 0);
        }
        wg::commit();
        wg::wait<0>();
        wg::fence_operands(s);
      };
      // v25: the four k16 steps of q~ . k' and the fifth (A: this thread's q-side pieces, B: the
      // stage's FoldRows; leading and stride offsets both 128 bytes, so the unused second core
      // matrix along K is the next 8 rows whatever the order of the two fields) into acc.
      const uint64_t fold_desc = kFold ? wg::desc_interleave(fold32, 128, 128) : 0ull;
      auto product_fold = [&](int stage, float (&acc)[8][4], const uint32_t (&a)[4]) {
        wg::fence_operands(acc);
        wg::fence();
        const uint32_t kd_lo = k_lo + static_cast<uint32_t>(stage * (kPanelBytes >> 4));
        wg::mma_ss_k_major<0>(acc, q_lo, kd_lo, false);
        wg::mma_ss_k_major<1>(acc, q_lo, kd_lo, true);
        wg::mma_ss_k_major<2>(acc, q_lo, kd_lo, true);
        wg::mma_ss_k_major<3>(acc, q_lo, kd_lo, true);
        wg::mma_rs<false>(acc, a, fold_desc + static_cast<uint64_t>(stage * (kFoldStageBytes >> 4)), true);
        wg::commit();
        wg::wait<0>();
        wg::fence_operands(acc);
      };
      // This thread's A fragment of the fifth k-step for head hg: columns 2 (lane % 4) + {0, 1} of
      // rows row[0] (a[0]) and row[1] (a[1]); columns 8-15 zero.
      const int quad = lane % 4;
      const uint32_t fold_ones = quad == 2 ? kBf16One | kBf16One << 16 : 0u;
      auto fold_a = [&](int hg, uint32_t (&a)[4]) {
        const auto* hi_mid = reinterpret_cast<const uint32_t*>(sh.log_z);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int idx = hg * kQueries + row[i];
          const uint32_t hm = hi_mid[idx], lo = fold_lo[idx];
          a[i] = quad == 0 ? hm : quad == 1 ? lo | kBf16One << 16 : fold_ones;
        }
        a[2] = a[3] = 0u;
      };
      copy_q2(0);  // committed with the first k' tile
      copy_k2(0, 0, 0);
      int step = 0;
      // Step (tile at c0, head hg): v10's step; kFirst: the tile's first head (r starts here).
      // The next step's k' tile into the other stage (v16 on: one copy with the next (head, tile)
      // selected, so that the next tile's addresses are not worked out ahead of the head loop and
      // kept live across it).
      auto copy_next_k = [&](int hg, int c0, int stage) {
        if constexpr (kQ32) {
          const bool next_tile = hg + 1 == G;
          copy_k2(next_tile ? 0 : hg + 1, next_tile ? c0 + kTileDim : c0, stage ^ 1);
        } else {
          if (hg + 1 < G) copy_k(hg + 1, c0, stage ^ 1);
          else copy_k(0, c0 + kTileDim, stage ^ 1);
        }
      };
      // The warpgroup's wgmma has read the q~ panel: it takes the next step's head (named barrier 1
      // or 2 per warpgroup, an immediate).
      auto hand_on_q_panel = [&](int hg) {
        if (wg_index == 0)
          asm volatile("bar.sync 1, 128;\n" ::: "memory");
        else
          asm volatile("bar.sync 2, 128;\n" ::: "memory");
        copy_q2(hg + 1 < G ? hg + 1 : 0);
        cp_async_commit();
      };
      auto head_step = [&](int hg, int c0, auto first) {
        constexpr bool kFirst = decltype(first)::value;
        const int stage = step & 1;
        await_tile();
        const bool more = step + 1 < steps;
        if (more) copy_next_k(hg, c0, stage);
        product(stage);
        if (G > 1 && more) hand_on_q_panel(hg);
        const float* b2 = bias_tile[stage];
        const float z[2] = {sh.log_z[hg * kQueries + row[0]], sh.log_z[hg * kQueries + row[1]]};
        const float init = p.group_rule == kGroupSumProbabilities ? 0.0f : kNegInf;
        if (p.group_rule == kGroupMaxNormalized) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
              r[nt][e] = fmaxf(kFirst ? init : r[nt][e], fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
            }
        } else if (p.group_rule == kGroupSumProbabilities) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
              r[nt][e] = (kFirst ? init : r[nt][e]) + fast_exp2(fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
            }
        } else {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
              r[nt][e] = fmaxf(kFirst ? init : r[nt][e], fmaf(s[nt][e], scale2, b2[col]));
            }
        }
        ++step;
      };
      // v25's step (max_normalized): the products with the bias and -log2 Z_hat / scale2 added
      // (acc); r = max over the tile's heads of acc, in place for the first head.
      auto fold_step = [&](int hg, int c0, auto first) {
        constexpr bool kFirst = decltype(first)::value;
        const int stage = step & 1;
        uint32_t a[4];
        fold_a(hg, a);
        await_tile();
        const bool more = step + 1 < steps;
        if (more) copy_next_k(hg, c0, stage);
        if constexpr (kFirst)
          product_fold(stage, r, a);
        else
          product_fold(stage, s, a);
        if (G > 1 && more) hand_on_q_panel(hg);
        if constexpr (!kFirst) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) r[nt][e] = fmaxf(r[nt][e], s[nt][e]);
        }
        ++step;
      };
      for (int tile_i = 0; tile_i < n_tiles; ++tile_i) {
        const int c0 = tile_i * kTileDim;
        bool folded = false;
        if constexpr (kFold) {
          if (fold) {
            fold_step(0, c0, std::true_type{});
            for (int hg = 1; hg < G; ++hg) fold_step(hg, c0, std::false_type{});
            // scale2 > 0 and rounding is monotone: fl(scale2 max_h acc_h) = max_h fl(scale2 acc_h).
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) r[nt][e] *= scale2;
            folded = true;
          }
        }
        if (!folded) {
          head_step(0, c0, std::true_type{});
          for (int hg = 1; hg < G; ++hg) head_step(hg, c0, std::false_type{});
        }
        // Sums of probabilities are ranked in the linear domain, the others in base 2.
        if (c0 + kTileDim > warp_min) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (c0 + nt * 8 + (lane % 4) * 2 + (e % 2) >= n_cand[e / 2]) r[nt][e] = kNegInf;
        }
        append_half<0>(r, theta, count, buf, row, c0, K);
        append_half<1>(r, theta, count, buf, row, c0, K);
      }
    }
  } else if (n_tiles > 0) {
    const int steps = G * n_tiles;
    float r[8][4];
    // A candidate must beat theta to enter: the sorted list's K-th value (v4), or the float
    // below the row's bound (v8's buffers, r > floor_of(bound) <=> r >= bound) until a compaction.
    float theta[2] = {prune ? floor_of(row_bound[row[0]]) : kNegInf, prune ? floor_of(row_bound[row[1]]) : kNegInf};
    // Rows of q~ for head g G (null past T); head g G + hg is hg T 64 elements further.
    const auto* q0 = static_cast<const __nv_bfloat16*>(p.q_retrieval) + g * G * p.T * kTileDim;
    const __nv_bfloat16* qrow[2] = {t[0] < p.T ? q0 + t[0] * kTileDim : nullptr,
                                    t[1] < p.T ? q0 + t[1] * kTileDim : nullptr};
    const int64_t head_stride = p.T * kTileDim;
    issue(0, 0, 0);
    load_q_fragments(qn, qrow[0], qrow[1]);
    for (int step = 0; step < steps; ++step) {
      const int hg = step % G;
      const int c0 = (step / G) * kTileDim;
      const int next_hg = (step + 1) % G;
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) qa[a][b] = qn[a][b];
      await_tile();
      if (step + 1 < steps) {
        issue(next_hg, ((step + 1) / G) * kTileDim, (step + 1) & 1);
        if (G > 1) {
          const int64_t off = next_hg * head_stride;
          load_q_fragments(qn, qrow[0] ? qrow[0] + off : nullptr, qrow[1] ? qrow[1] + off : nullptr);
        }
      }
      if (hg == 0) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) r[nt][e] = p.group_rule == kGroupSumProbabilities ? 0.0f : kNegInf;
      }
      qk_tile(s, qa, tile[step & 1]);
      const float* b2 = bias_tile[step & 1];
      const float z[2] = {sh.log_z[hg * kQueries + row[0]], sh.log_z[hg * kQueries + row[1]]};
      // One loop per group rule (the rule is uniform: no branch per element).
      if (p.group_rule == kGroupMaxNormalized) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
            r[nt][e] = fmaxf(r[nt][e], fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
          }
      } else if (p.group_rule == kGroupSumProbabilities) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
            r[nt][e] += fast_exp2(fmaf(s[nt][e], scale2, b2[col]) - z[e / 2]);
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + (lane % 4) * 2 + (e % 2);
            r[nt][e] = fmaxf(r[nt][e], fmaf(s[nt][e], scale2, b2[col]));
          }
      }
      if (hg != G - 1) continue;
      // Sums of probabilities are ranked in the linear domain, the others in base 2.
      if (c0 + kTileDim > warp_min) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (c0 + nt * 8 + (lane % 4) * 2 + (e % 2) >= n_cand[e / 2]) r[nt][e] = kNegInf;
      }
      if (kBuffered) {
        append_half<0>(r, theta, count, buf, row, c0, K);
        append_half<1>(r, theta, count, buf, row, c0, K);
        continue;
      }
      bool any[2] = {false, false};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) any[e / 2] |= r[nt][e] > theta[e / 2];
      // Row j (lane / 4) has a candidate if any lane of its quad has one: OR over the quad, one
      // ballot bit per quad (bits 4 j), compressed to bit j.
      const unsigned rows = flagged_rows(any);
      if (rows == 0u) continue;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sh.r[row[e / 2] * kRPitch + nt * 8 + (lane % 4) * 2 + (e % 2)] = r[nt][e];
      __syncwarp();
      // Each warp ranks its own 16 queries: no block barrier needed for sh.r rows.
      for (unsigned pending = rows; pending != 0u; pending &= pending - 1) {
        const int q = warp * 16 + __ffs(pending) - 1;
        offer_tile(sh.r + q * kRPitch, sh.value + q * K, sh.index + q * K, c0, sh.n_cand[q], K);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
        theta[i] = threshold_of(sh.value[row[i] * K + K - 1]);
    }
  }
  __syncthreads();
  if (kBuffered) {
    // Each row's K best of its buffer, the valid entries first and -1 after.
    for (int j = 0; j < 16; ++j) {
      const int q = warp * 16 + j;
      if (t0 + q >= p.T) continue;
      float* value = buf + q * kBufPitch;
      int32_t* index = reinterpret_cast<int32_t*>(value + kBufCap);
      int n = __shfl_sync(0xffffffffu, j < 8 ? count[0] : count[1], 4 * (j % 8));
      if (n > K) {
        keep_best(value, index, n, K);
        n = K;
      }
      if (lane >= n && lane < K) index[lane] = -1;
      __syncwarp();
      if constexpr (kWriter == Writer::ahead) {
        write_selection_ahead<G>(p, index, t0 + q, g, key, bias, selection, selected_score);
      } else if constexpr (kWriter == Writer::separate) {
        int rank_of[2];
        write_selected_chunks(p, index, t0 + q, g, selection, rank_of);
      } else
        write_selection(p, index, t0 + q, g, G, key, bias, selection, selected_score);
    }
  } else {
    for (int q = warp * 16; q < warp * 16 + 16; ++q) {
      if (t0 + q >= p.T) continue;
      write_selection(p, sh.index + q * K, t0 + q, g, G, key, bias, selection, selected_score);
    }
  }
}

}  // namespace
}  // namespace hils::gpu::detail
