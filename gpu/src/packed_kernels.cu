// Tensor-core kernels with the paper's packing (§4.2): a block owns M = 64 / G adjacent queries
// times the G heads of one KV group (64 rows). The window kernel streams the union of their
// windows; the hierarchical kernel loads the union of their selected chunks once, with an
// intra-chunk softmax per (query, chunk) and the fusion with the window (Eq. 10).
// Fast path only: bf16 inputs, d = dv = 64, S = 64, G in {1, 2, 4, 8, 16}.
#include <climits>
#include <stdexcept>
#include <string>

#include <cuda.h>  // CUtensorMap (the encoder comes from cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>

#include "launch_params.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

namespace hils::gpu::detail {
namespace {

// The two rows a thread holds in C layout: (query slot, query head) of each, and validity.
template <int G>
struct ThreadRows {
  int64_t t[2], h[2];
  bool valid[2];
  int m[2];

  __device__ ThreadRows(int64_t t0, int64_t g, int64_t T) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp * 16 + lane / 4 + 8 * i;
      m[i] = r / G;
      t[i] = t0 + m[i];
      h[i] = g * G + r % G;
      valid[i] = t[i] < T;
    }
  }
};

// Scales logits, masks what the row may not see (-inf), returns per-row max over the tile.
template <class Visible>
__device__ __forceinline__ void mask_tile(float (&s)[8][4], float scale, int64_t key0,
                                          Visible visible, float (&row_max)[2]) {
  const int lane = threadIdx.x % kWarp;
  row_max[0] = row_max[1] = kNegInf;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int64_t j = key0 + nt * 8 + (lane % 4) * 2 + (e % 2);
      s[nt][e] = visible(i, j) ? s[nt][e] * scale : kNegInf;
      row_max[i] = fmaxf(row_max[i], s[nt][e]);
    }
  row_max[0] = quad_max(row_max[0]);
  row_max[1] = quad_max(row_max[1]);
}

// p = exp(s - m) in place (0 where masked); returns the per-row sums.
__device__ __forceinline__ void exponentiate(float (&s)[8][4], const float (&m)[2],
                                             float (&row_sum)[2]) {
  row_sum[0] = row_sum[1] = 0.0f;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      s[nt][e] = exp_diff(s[nt][e], m[i]);
      row_sum[i] += s[nt][e];
    }
  row_sum[0] = quad_sum(row_sum[0]);
  row_sum[1] = quad_sum(row_sum[1]);
}

// ---- window v9: 128 rows per block, masks only where a tile cuts a row's window ----------
// Block = 8 warps x 16 rows = M = 128 / G adjacent queries x the G heads of one KV group, so
// each K/V tile in shared memory serves 128 rows (mma_v4, removed in session 17: 64). Per warp and tile, from the bounds
// of its rows' windows: tiles outside them are skipped, tiles inside them run without the
// element mask (the landmark column only), and in the causal edge tile only the 8-key
// column groups up to the warp's last query are computed. The softmax runs in base 2 with the
// scale folded into one FFMA per score, row sums stay per thread until the end.
// 8 warps (mma_v10's 4, 64 rows per block, were removed in session 17: gpu/NOTES.md "Kernels
// removed in session 17"); 128 registers (16 warps per SM).
constexpr int kV9Warps = 8;

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The per-tile softmax and the epilogue shared by window_v9_kernel (mma.sync) and the wgmma
// kernels: a warp's 16 rows x 64 keys as s[8][4] in mma.sync's accumulator layout,
// which is also a warp's share of a wgmma m64n64 accumulator. Scores s are in units of the logit
// scale; c2 = scale * log2(e) (base-2 softmax), m the rows' running maxima of s.

// Raises the rows' maxima m to the tile's and rescales their sums l; alpha gets the factor the
// rows' outputs o must be scaled by (scale_rows), neg_max2 gets -m * c2 per row (0 for a row
// that has seen nothing).
__device__ __forceinline__ void raise_to_tile_max(const float (&s)[8][4], float c2, float (&m)[2],
                                                  float (&l)[2], float (&alpha)[2],
                                                  float (&neg_max2)[2]) {
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], quad_max(tile_max[i]));
    neg_max2[i] = m_new == kNegInf ? 0.0f : -m_new * c2;
    alpha[i] = exp2_approx(fmaf(m[i], c2, neg_max2[i]));  // 0 while m = -inf
    m[i] = m_new;
    l[i] *= alpha[i];
  }
}
__device__ __forceinline__ void scale_rows(float (&o)[8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] *= alpha[e / 2];
}
// Both: the rows' maxima raised to the tile's, their sums and outputs rescaled.
__device__ __forceinline__ void rescale_to_tile_max(const float (&s)[8][4], float c2, float (&m)[2],
                                                    float (&l)[2], float (&o)[8][4],
                                                    float (&neg_max2)[2]) {
  float alpha[2];
  raise_to_tile_max(s, c2, m, l, alpha, neg_max2);
  scale_rows(o, alpha);
}

// s -> the tile's probabilities 2^(s c2 - m c2), added into the rows' sums l; the 8-key groups
// from nt_end on (past the warp's last query) become 0.
__device__ __forceinline__ void exponentiate_tile(float (&s)[8][4], int nt_end, float c2,
                                                  const float (&neg_max2)[2], float (&l)[2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt >= nt_end) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      continue;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2_approx(fmaf(s[nt][e], c2, neg_max2[e / 2]));  // -inf -> 0
      l[e / 2] += s[nt][e];
    }
  }
}

// The rows' o_swa (o / sum) and lse_swa (m * scale + ln sum; -inf for an empty row); o_swa in
// fp16 (rounded to nearest from the fp32 value) where p.o_swa_rows is f16.
template <int G>
__device__ __forceinline__ void store_window_rows(const ThreadRows<G>& rows, const LaunchParams& p,
                                                  const float (&o)[8][4], const float (&l)[2],
                                                  const float (&m)[2], int lane, float* o_swa,
                                                  float* lse_swa) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = quad_sum(l[i]);
    if (!rows.valid[i]) continue;
    const int64_t row = (rows.h[i] * p.T + rows.t[i]) * kTileDim;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (p.o_swa_rows == RowType::f16) {
      __half* out = reinterpret_cast<__half*>(o_swa) + row;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = nt * 8 + (lane % 4) * 2;
        *reinterpret_cast<__half2*>(out + col) = __floats2half2_rn(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
      }
    } else {
      float* out = o_swa + row;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = nt * 8 + (lane % 4) * 2;
        *reinterpret_cast<float2*>(out + col) = make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
      }
    }
    if (lane % 4 == 0)
      lse_swa[rows.h[i] * p.T + rows.t[i]] = sum > 0.0f ? m[i] * p.scale + __logf(sum) : kNegInf;
  }
}

// The window columns of a thread's two rows (of a block of 16-row warps whose rows are the
// slots (query t0 + r / G, head g G + r % G)), relative to `first` (the block's leftmost window
// slot): row i sees [lo[i], hi[i]], a row past T nothing (lo INT_MAX, hi -1); lo_max / hi_min
// bound every valid row of the warp (a tile inside [lo_max, hi_min] is inside every row's window).
struct WindowRowBounds {
  int lo[2], hi[2];
  int lo_max, hi_min;
};
template <int G>
__device__ __forceinline__ WindowRowBounds window_row_bounds(const SlotGeometry& geo, int64_t T,
                                                             int64_t t0, int64_t g, int64_t first) {
  WindowRowBounds b;
  bool valid1;
  {
    const ThreadRows<G> rows(t0, g, T);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      b.lo[i] = rows.valid[i] ? static_cast<int>(geo.window_left(rows.t[i]) - first) : INT_MAX;
      b.hi[i] = rows.valid[i] ? static_cast<int>(rows.t[i] - first) : -1;
    }
    valid1 = rows.valid[1];
  }
  // Rows go down the block in slot order: row 1 valid implies row 0 valid.
  const unsigned all = 0xffffffffu;
  b.lo_max = __reduce_max_sync(all, valid1 ? b.lo[1] : (b.hi[0] >= 0 ? b.lo[0] : INT_MIN));
  b.hi_min = __reduce_min_sync(all, valid1 ? b.hi[0] : (b.hi[0] >= 0 ? b.hi[0] : INT_MAX));
  return b;
}

constexpr int kWindowRows = 16 * kV9Warps, kWindowThreads = kWarp * kV9Warps;

// Shared memory of window_v9_kernel: two K/V stages and the block's kWindowRows q rows (the q
// fragments are read per tile by ldmatrix instead of living in 16 registers through the loop).
struct WindowSmem {
  __nv_bfloat16 k[2][kTileDim][kTilePitch];
  __nv_bfloat16 v[2][kTileDim][kTilePitch];
  __nv_bfloat16 q[kWindowRows][kTilePitch];
};

template <int G>
__global__ void __launch_bounds__(kWindowThreads, 16 / kV9Warps)
    window_v9_kernel(LaunchParams p, float* o_swa, float* lse_swa) {
  constexpr int M = kWindowRows / G;
  extern __shared__ __align__(16) unsigned char window_smem[];
  auto& sm = *reinterpret_cast<WindowSmem*>(window_smem);
  auto& ks_tile = sm.k;
  auto& vs_tile = sm.v;
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const auto* k = static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim;
  const auto* v = static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim;
  // Columns relative to `first` (the block's leftmost window slot, a multiple of S = 64): row i
  // sees [lo_i, hi_i]; a row past T sees nothing. (The rows are derived again for the output:
  // fewer registers live through the loop.)
  const int64_t first = geo.window_left(t0);
  const int64_t t_last = t0 + M - 1 < p.T - 1 ? t0 + M - 1 : p.T - 1;
  const int n_tiles = static_cast<int>((t_last - first) / kTileDim + 1);
  const bool landmarks_complete = p.landmarks;
  const int complete_col = static_cast<int>((p.T / kTileDim) * kTileDim - first);
  // q rows r = (query t0 + r / G, head g G + r % G), zeros past T, with the first K/V tile.
  {
    const auto* q = static_cast<const __nv_bfloat16*>(p.q);
    for (int seg = threadIdx.x; seg < kWindowRows * 8; seg += kWindowThreads) {
      const int r = seg / 8, col = (seg % 8) * 8;
      const int64_t t = t0 + r / G, h = g * G + r % G;
      cp_async16(&sm.q[r][col], q + (t < p.T ? (h * p.T + t) * kTileDim + col : 0), t < p.T);
    }
  }
  const WindowRowBounds bounds = window_row_bounds<G>(geo, p.T, t0, g, first);
  const int(&lo)[2] = bounds.lo;
  const int(&hi)[2] = bounds.hi;
  const int lo_max = bounds.lo_max, hi_min = bounds.hi_min;
  const unsigned all = 0xffffffffu;
  const int lo_min = __reduce_min_sync(all, min(lo[0], lo[1]));
  const int hi_max = __reduce_max_sync(all, max(hi[0], hi[1]));
  const float c2 = p.scale * 1.4426950408889634f;  // logits in base 2
  const int lane = threadIdx.x % kWarp;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f}, o[8][4] = {};
  load_tile_async<kWindowThreads>(ks_tile[0], k, first, p.T);
  load_tile_async<kWindowThreads>(vs_tile[0], v, first, p.T);
  cp_async_commit();
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = it * kTileDim;
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < n_tiles) {
      load_tile_async<kWindowThreads>(ks_tile[(it + 1) % 2], k, first + key0 + kTileDim, p.T);
      load_tile_async<kWindowThreads>(vs_tile[(it + 1) % 2], v, first + key0 + kTileDim, p.T);
      cp_async_commit();
    }
    if (key0 > hi_max || key0 + kTileDim - 1 < lo_min) continue;  // no row of the warp sees it
    // 8-key column groups [0, nt_end) hold every column the warp's rows may see.
    const int nt_end = min(8, (hi_max - key0) / 8 + 1);
    const bool inside = lo_max <= key0 && hi_min >= key0 + kTileDim - 1;
    const bool landmark_col = landmarks_complete && key0 + kTileDim <= complete_col;
    const __nv_bfloat16(*kt)[kTilePitch] = ks_tile[it % 2];
    // A fragments of the warp's 16 q rows: matrices (rows 0-7 | 8-15) x (dims 0-7 | 8-15).
    uint32_t qa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ldmatrix_x4(qa[ks], &sm.q[(threadIdx.x / kWarp) * 16 + lane % 16][16 * ks + 8 * (lane / 16)]);
    float s[8][4];
    qk_tile(s, qa, kt, nt_end);
    if (inside) {
      if (landmark_col && lane % 4 == 3) s[7][1] = s[7][3] = kNegInf;
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2, col = key0 + nt * 8 + (lane % 4) * 2 + (e % 2);
          const bool landmark = landmark_col && (col % kTileDim) == kTileDim - 1;
          if (col < lo[i] || col > hi[i] || landmark) s[nt][e] = kNegInf;
        }
    }
    float neg_max2[2];
    rescale_to_tile_max(s, c2, m, l, o, neg_max2);
    exponentiate_tile(s, nt_end, c2, neg_max2, l);
    pv_tile(o, s, vs_tile[it % 2], (nt_end + 1) / 2);
  }
  store_window_rows(ThreadRows<G>(t0, g, p.T), p, o, l, m, lane, o_swa, lse_swa);
}

// A warp's masks of its 16 rows x 64 keys (columns relative to the block's first window slot):
// the rows' windows (a tile inside [lo_max, hi_min] needs only the landmark column);
// complete_col ends the complete chunks (their last slot is a landmark when `landmarks`).
struct WindowTileMask {
  const WindowRowBounds& rows;
  int complete_col;
  bool landmarks;
};
// Masked scores of the tile at key0 become -inf; so do the 8-key groups from nt_end on.
__device__ __forceinline__ void mask_window_tile(float (&s)[8][4], int key0, int nt_end,
                                                 const WindowTileMask& mask, int lane) {
  const bool inside = mask.rows.lo_max <= key0 && mask.rows.hi_min >= key0 + kTileDim - 1;
  const bool landmark_col = mask.landmarks && key0 + kTileDim <= mask.complete_col;
  if (inside) {
    if (landmark_col && lane % 4 == 3) s[7][1] = s[7][3] = kNegInf;
  } else {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, col = key0 + nt * 8 + (lane % 4) * 2 + (e % 2);
        const bool landmark = landmark_col && (col % kTileDim) == kTileDim - 1;
        if (nt >= nt_end || col < mask.rows.lo[i] || col > mask.rows.hi[i] || landmark)
          s[nt][e] = kNegInf;
      }
  }
}

// ---- the wgmma window kernels (sm_90a) ------------------------------------------------------
constexpr int kWgPanelBytes = kTileDim * wg::kPanelRowBytes;  // 64 rows of 128 bytes

// The block's 128 q rows r = (query t0 + r / G, head g G + r % G) into warpgroup r / 64's
// 128-byte-swizzled panel, row r % 64 (zeros past T): cp.async by 256 threads, not committed.
template <int G>
__device__ __forceinline__ void load_q_panels_async(unsigned char (&panels)[2][kWgPanelBytes],
                                                    const LaunchParams& p, int64_t t0, int64_t g) {
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  for (int seg = threadIdx.x; seg < 128 * 8; seg += 256) {
    const int r = seg / 8, col = (seg % 8) * 8;
    const int64_t t = t0 + r / G, h = g * G + r % G;
    cp_async16(panels[r / 64] + wg::sw128_offset(r % 64, col),
               q + (t < p.T ? (h * p.T + t) * kTileDim + col : 0), t < p.T);
  }
}

// A descriptor from its two words; the kernels keep the low word (start address) in a register and
// add the k16 step to it alone (no carry: the address field has 14 bits, the panels lie below
// 256 KB).
__device__ __forceinline__ uint64_t desc_of(uint32_t lo, uint32_t hi) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// ---- window v18: wgmma with the K/V tiles copied by the tensor memory accelerator ----------------
// mma_v9's block (128 rows = M = 128 / G queries x G heads, 8 warps) as two warpgroups of 64 rows
// (wgmma_v11 on). Per 64-key tile each warpgroup issues S = Q K^T as 4 wgmma m64n64k16 (Q and K
// from 128-byte-swizzled panels in shared memory) and O += P V as 4 more (P from registers in
// mma.sync's A layout, V an N-major panel), each waited at once (v13's step), the descriptors'
// low words worked out once and the k16 steps added to them alone (v13). The softmax is mma_v9's
// (per warp: tiles inside every row's window carry the landmark mask only; base 2). Tiles are
// skipped per warpgroup (a wgmma is issued by all 128 threads of its warpgroup). The copies
// (v18): the tensor memory accelerator (cp.async.bulk.tensor) writes a tile's K and V panels,
// 128-byte swizzled, two tiles ahead (v15), and completes on the stage's mbarrier; rows past T
// are zeros.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbarrier_expect_bytes(uint32_t bar, uint32_t bytes) {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile(
      "{\n.reg .pred done;\nHILS_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra HILS_MBAR_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// Rows [row, row + 64) of head g of a [Hkv, T, 64] bf16 tensor into the panel at `dst`.
__device__ __forceinline__ void tma_load_panel(uint32_t dst, const CUtensorMap& map, int row,
                                               int g, uint32_t bar) {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(0), "r"(row), "r"(g), "r"(bar)
      : "memory");
#endif
}

// The copies run kAhead = 2 tiles ahead: K and V have kAhead + 2 stages each, a tile's K and V
// panels completing on one mbarrier per stage.
struct WindowV18Smem {
  static constexpr int kAhead = 2, kStages = kAhead + 2;
  unsigned char q[2][kWgPanelBytes];        // the two warpgroups' 64 q rows
  unsigned char k[kStages][kWgPanelBytes];  // K stages
  unsigned char v[kStages][kWgPanelBytes];  // V stages
  uint64_t full[kStages];                   // stage s's K and V have landed
};
constexpr size_t kWindowV18SmemBytes = sizeof(WindowV18Smem) + wg::kAtomBytes;

// The next stage's byte offset after `stage` in a ring of `stages` panels.
template <int stages>
__device__ __forceinline__ uint32_t next_stage(uint32_t stage) {
  return stage + kWgPanelBytes == stages * kWgPanelBytes ? 0u : stage + kWgPanelBytes;
}

// O += P V for one tile (V the N-major panel whose descriptor low word is v_lo), o first scaled by
// the rows' factors alpha; committed, not waited.
__device__ __forceinline__ void issue_pv(float (&o)[8][4], const uint32_t (&pa)[4][4],
                                         const float (&alpha)[2], uint32_t v_lo, uint32_t desc_hi) {
  scale_rows(o, alpha);
  wg::fence_operands(o);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wg::mma_rs<true>(o, pa[ks], desc_of(v_lo + 128 * ks, desc_hi), true);
  wg::commit();
}

template <int G>
__global__ void __launch_bounds__(256, 2)
    window_wgmma_v18_kernel(LaunchParams p, float* o_swa, float* lse_swa,
                            const __grid_constant__ CUtensorMap k_map,
                            const __grid_constant__ CUtensorMap v_map) {
  constexpr int kRows = 128, M = kRows / G;
  constexpr int kAhead = WindowV18Smem::kAhead, kStages = WindowV18Smem::kStages;
  extern __shared__ unsigned char window_wg_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(window_wg_raw));
  auto& sm = *reinterpret_cast<WindowV18Smem*>(window_wg_raw +
                                               (wg::kAtomBytes - base % wg::kAtomBytes) % wg::kAtomBytes);
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, group = warp / 4;
  const int64_t first = geo.window_left(t0);
  const int64_t t_last = t0 + M - 1 < p.T - 1 ? t0 + M - 1 : p.T - 1;
  const int n_tiles = static_cast<int>((t_last - first) / kTileDim + 1);
  const int complete_col = static_cast<int>((p.T / kTileDim) * kTileDim - first);
  load_q_panels_async<G>(sm.q, p, t0, g);
  // The warpgroup's tiles [it_begin, it_end]: its first query's window start to its last query;
  // empty when its rows start past T.
  const int64_t wg_t0 = t0 + group * 64 / G, wg_t1 = t0 + (group * 64 + 63) / G;
  const bool wg_rows = wg_t0 < p.T;
  const int it_begin = wg_rows ? static_cast<int>((geo.window_left(wg_t0) - first) / kTileDim) : 0;
  const int it_end = wg_rows ? static_cast<int>(((wg_t1 < p.T ? wg_t1 : p.T - 1) - first) / kTileDim) : -2;
  const WindowRowBounds bounds = window_row_bounds<G>(geo, p.T, t0, g, first);
  const float c2 = p.scale * 1.4426950408889634f;  // logits in base 2
  const uint32_t smem_k = static_cast<uint32_t>(__cvta_generic_to_shared(sm.k[0]));
  const uint32_t smem_v = static_cast<uint32_t>(__cvta_generic_to_shared(sm.v[0]));
  const uint64_t q_desc = wg::desc_k_major(sm.q[group]), k0_desc = wg::desc_k_major(smem_k),
                 v0_desc = wg::desc_n_major(smem_v, kWgPanelBytes);
  const uint32_t q_lo = static_cast<uint32_t>(q_desc), k0_lo = static_cast<uint32_t>(k0_desc),
                 v0_lo = static_cast<uint32_t>(v0_desc);
  const uint32_t desc_hi = static_cast<uint32_t>(k0_desc >> 32);
  uint32_t k_use = 0, v_use = 0;
  // Tile j's K and V into stage j % kStages, thread 0 issuing, completing on full[stage].
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.full[0]));
  auto load_tile_tma = [&](int j) {
    const uint32_t stage = static_cast<uint32_t>(j % kStages), bar = full0 + 8 * stage;
    mbarrier_expect_bytes(bar, 2 * kWgPanelBytes);
    tma_load_panel(smem_k + stage * kWgPanelBytes, k_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
    tma_load_panel(smem_v + stage * kWgPanelBytes, v_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) mbarrier_init(full0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (j < n_tiles) load_tile_tma(j);
  }
  cp_async_commit();  // the q rows
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f}, o[8][4] = {}, alpha[2] = {1.0f, 1.0f};
  uint32_t pa[4][4] = {};
  const WindowTileMask mask{bounds, complete_col, p.landmarks};
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = it * kTileDim;
    if (it == 0) {
      cp_async_wait_all();      // the q rows
      wg::fence_proxy_async();  // cp.async writes -> the tensor cores' reads
    }
    __syncthreads();  // every warpgroup is done with the stage refilled now
    if (threadIdx.x == 0 && it + kAhead < n_tiles) load_tile_tma(it + kAhead);
    mbarrier_wait(full0 + 8 * static_cast<uint32_t>(it % kStages), static_cast<uint32_t>(it / kStages) & 1u);
    const uint32_t k_lo = k0_lo + k_use / 16, v_lo = v0_lo + v_use / 16;
    k_use = next_stage<kStages>(k_use);
    v_use = next_stage<kStages>(v_use);
    if (it < it_begin || it > it_end) continue;  // uniform over the warpgroup
    float s[8][4];
    wg::fence_operands(s);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_ss<false>(s, desc_of(q_lo + 2 * ks, desc_hi), desc_of(k_lo + 2 * ks, desc_hi), ks > 0);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(s);
    mask_window_tile(s, key0, 8, mask, lane);
    float neg_max2[2];
    raise_to_tile_max(s, c2, m, l, alpha, neg_max2);
    exponentiate_tile(s, 8, c2, neg_max2, l);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(s[2 * ks][0], s[2 * ks][1]);
      pa[ks][1] = pack_bf16(s[2 * ks][2], s[2 * ks][3]);
      pa[ks][2] = pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    issue_pv(o, pa, alpha, v_lo, desc_hi);
    wg::wait<0>();
    wg::fence_operands(o);
  }
  store_window_rows(ThreadRows<G>(t0, g, p.T), p, o, l, m, lane, o_swa, lse_swa);
}

// ---- window v19, v20: fewer instructions per tile on v18's copies and step -------------------
// v18's step per tile and warpgroup (S = Q K^T, wait, masks and softmax, O += P V, wait) on its
// TMA copies (two tiles ahead, four stages, one "full" mbarrier per stage), with:
// - v19: the rows' maxima by a tree of fmaxf (v18: a chain of 16 per row), and the maximum that
//   the exponentials subtract raised only when a row's tile maximum passes it by more than 8 in
//   base 2 (FA4's rule): the probabilities stay <= 2^8, and the tiles that raise no maximum of
//   the warp's rows skip the factors and the rescale of o and of the sums (2 MUFU, 2 FFMA, 34
//   FMUL). Other rounding than v18 (another maximum subtracted). The descriptors are put
//   together inside the wgmma asm from 32-bit low words (mma_ss_k_major, mma_rs_n_major).
// - v20 (kBarrierFree): v19 without the block barrier per tile: each stage has an "empty"
//   mbarrier that every thread arrives at when its warpgroup is done with the tile there
//   (skipped tiles too); the thread that issues the copies waits for it before refilling the
//   stage. And the warpgroup's index made warp-uniform (__shfl_sync of lane 0's, as CUTLASS
//   does), so that q's descriptor word can live in a uniform register.
struct WindowV19Smem {
  static constexpr int kStages = 4, kAhead = 2;
  unsigned char q[2][kWgPanelBytes];        // the two warpgroups' 64 q rows
  unsigned char k[kStages][kWgPanelBytes];  // K stages
  unsigned char v[kStages][kWgPanelBytes];  // V stages
  uint64_t full[kStages];                   // stage s's K and V have landed
  uint64_t empty[kStages];                  // every thread is done with stage s (v20)
};
constexpr size_t kWindowV19SmemBytes = sizeof(WindowV19Smem) + wg::kAtomBytes;

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// The rows' tile maxima (over the quad) of s by a tree of fmaxf.
__device__ __forceinline__ void tile_row_max(const float (&s)[8][4], float (&tile_max)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float x[8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) x[nt] = fmaxf(s[nt][2 * i], s[nt][2 * i + 1]);
#pragma unroll
    for (int w = 4; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) x[j] = fmaxf(x[j], x[j + w]);
    tile_max[i] = quad_max(x[0]);
  }
}

// The lazy maximum: m (the maximum the exponentials subtract) is raised to the tile's only when
// some row of the warp passes its raise_at = m + 8 / c2; then the rows' factors rescale o and the
// sums l, and neg_max2 = -m c2 is renewed.
__device__ __forceinline__ void raise_lazily(const float (&tile_max)[2], float c2, float slack,
                                             float (&m)[2], float (&raise_at)[2], float (&l)[2],
                                             float (&o)[8][4], float (&neg_max2)[2]) {
  if (!__any_sync(0xffffffffu, tile_max[0] > raise_at[0] || tile_max[1] > raise_at[1])) return;
  float alpha[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], tile_max[i]);
    neg_max2[i] = m_new == kNegInf ? 0.0f : -m_new * c2;
    alpha[i] = exp2_approx(fmaf(m[i], c2, neg_max2[i]));  // 0 while m = -inf
    raise_at[i] = m_new == kNegInf ? kNegInf : m_new + slack;
    m[i] = m_new;
    l[i] *= alpha[i];
  }
  scale_rows(o, alpha);
}

template <int G, bool kBarrierFree>
__global__ void __launch_bounds__(256, 2)
    window_wgmma_v19_kernel(LaunchParams p, float* o_swa, float* lse_swa,
                            const __grid_constant__ CUtensorMap k_map,
                            const __grid_constant__ CUtensorMap v_map) {
  constexpr bool kEmpty = kBarrierFree;
  constexpr int kRows = 128, M = kRows / G;
  constexpr int kStages = WindowV19Smem::kStages, kAhead = WindowV19Smem::kAhead;
  extern __shared__ unsigned char window_wg_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(window_wg_raw));
  auto& sm = *reinterpret_cast<WindowV19Smem*>(
      window_wg_raw + (wg::kAtomBytes - base % wg::kAtomBytes) % wg::kAtomBytes);
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const int lane = threadIdx.x % kWarp;
  const int group = kBarrierFree
                        ? __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0)
                        : static_cast<int>(threadIdx.x / 128);
  const int64_t first = geo.window_left(t0);
  const int64_t t_last = t0 + M - 1 < p.T - 1 ? t0 + M - 1 : p.T - 1;
  const int n_tiles = static_cast<int>((t_last - first) / kTileDim + 1);
  const int complete_col = static_cast<int>((p.T / kTileDim) * kTileDim - first);
  load_q_panels_async<G>(sm.q, p, t0, g);
  cp_async_commit();
  // The warpgroup's tiles [it_begin, it_end] (v13's); empty when its rows start past T.
  const int64_t wg_t0 = t0 + group * 64 / G, wg_t1 = t0 + (group * 64 + 63) / G;
  const bool wg_rows = wg_t0 < p.T;
  const int it_begin = wg_rows ? static_cast<int>((geo.window_left(wg_t0) - first) / kTileDim) : 0;
  const int it_end = wg_rows ? static_cast<int>(((wg_t1 < p.T ? wg_t1 : p.T - 1) - first) / kTileDim) : -1;
  const WindowRowBounds bounds = window_row_bounds<G>(geo, p.T, t0, g, first);
  const float c2 = p.scale * 1.4426950408889634f;  // logits in base 2
  const float slack = 8.0f / c2;                   // raise m when a tile passes it by 2^8
  const uint32_t smem_k = static_cast<uint32_t>(__cvta_generic_to_shared(sm.k[0]));
  const uint32_t smem_v = static_cast<uint32_t>(__cvta_generic_to_shared(sm.v[0]));
  const uint32_t smem_q = static_cast<uint32_t>(__cvta_generic_to_shared(sm.q[0]));
  // Descriptor low words: q's panel, stage 0's K panel, stage 0's V panel.
  const uint32_t q_lo = static_cast<uint32_t>(wg::desc_k_major(smem_q + group * kWgPanelBytes));
  const uint32_t k0_lo = static_cast<uint32_t>(wg::desc_k_major(smem_k));
  const uint32_t v0_lo = static_cast<uint32_t>(wg::desc_n_major(smem_v, kWgPanelBytes));
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.full[0]));
  const uint32_t empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.empty[0]));
  auto load_tile = [&](int j) {  // thread 0: tile j's K and V into stage j % kStages
    const uint32_t stage = static_cast<uint32_t>(j % kStages), bar = full0 + 8 * stage;
    if (kEmpty && j >= kStages)  // the stage's previous tile, j - kStages, is done everywhere
      mbarrier_wait(empty0 + 8 * stage, static_cast<uint32_t>(j / kStages - 1) & 1u);
    mbarrier_expect_bytes(bar, 2 * kWgPanelBytes);
    tma_load_panel(smem_k + stage * kWgPanelBytes, k_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
    tma_load_panel(smem_v + stage * kWgPanelBytes, v_map, static_cast<int>(first) + j * kTileDim,
                   static_cast<int>(g), bar);
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full0 + 8 * s, 1);
      if constexpr (kEmpty) mbarrier_init(empty0 + 8 * s, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cp_async_wait_all();      // the q rows
  wg::fence_proxy_async();  // cp.async writes -> the tensor cores' reads
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (j < n_tiles) load_tile(j);
  }
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f}, o[8][4] = {};
  float raise_at[2] = {kNegInf, kNegInf}, neg_max2[2] = {0.0f, 0.0f};
  const WindowTileMask mask{bounds, complete_col, p.landmarks};
  uint32_t use = 0;  // this tile's stage offset
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = it * kTileDim;
    if constexpr (!kEmpty) __syncthreads();  // every warpgroup is done with the stage refilled now
    if (threadIdx.x == 0 && it + kAhead < n_tiles) load_tile(it + kAhead);
    const uint32_t k_lo = k0_lo + use / 16, v_lo = v0_lo + use / 16;
    const uint32_t stage = use / kWgPanelBytes;
    use = use + kWgPanelBytes == kStages * kWgPanelBytes ? 0u : use + kWgPanelBytes;
    // Every thread waits for every tile, skipped ones too: v20's arrivals for tile it must not
    // come before every thread's for tile it - kStages (the stage's previous phase), and tile
    // it lands only after those (the copying thread waits for them). Without this wait a
    // warpgroup without rows (a ragged last block) arrived for every tile at once, completed
    // the stages' phases by itself and left the copying thread waiting (session 14, run 2).
    mbarrier_wait(full0 + 8 * stage, static_cast<uint32_t>(it / kStages) & 1u);
    if (it < it_begin || it > it_end) {  // uniform over the warpgroup
      if constexpr (kEmpty) mbarrier_arrive(empty0 + 8 * stage);
      continue;
    }
    float s[8][4];
    wg::fence_operands(s);
    wg::fence();
    wg::mma_ss_k_major<0>(s, q_lo, k_lo, false);
    wg::mma_ss_k_major<1>(s, q_lo, k_lo, true);
    wg::mma_ss_k_major<2>(s, q_lo, k_lo, true);
    wg::mma_ss_k_major<3>(s, q_lo, k_lo, true);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(s);
    mask_window_tile(s, key0, 8, mask, lane);
    float tile_max[2];
    tile_row_max(s, tile_max);
    raise_lazily(tile_max, c2, slack, m, raise_at, l, o, neg_max2);
    uint32_t pa[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2_approx(fmaf(s[nt][e], c2, neg_max2[e / 2]));  // -inf -> 0
        l[e / 2] += s[nt][e];
      }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack_bf16(s[2 * ks][0], s[2 * ks][1]);
      pa[ks][1] = pack_bf16(s[2 * ks][2], s[2 * ks][3]);
      pa[ks][2] = pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[ks][3] = pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    wg::fence_operands(o);
    wg::fence();
    wg::mma_rs_n_major<0>(o, pa[0], v_lo);
    wg::mma_rs_n_major<1>(o, pa[1], v_lo);
    wg::mma_rs_n_major<2>(o, pa[2], v_lo);
    wg::mma_rs_n_major<3>(o, pa[3], v_lo);
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(o);
    if constexpr (kEmpty) mbarrier_arrive(empty0 + 8 * stage);
  }
  store_window_rows<G>(ThreadRows<G>(t0, g, p.T), p, o, l, m, lane, o_swa, lse_swa);
}

// Shared scratch of the hierarchical kernel: the block's selections and their union.
struct UnionScratch {
  int32_t* selection;  // [M, K]
  uint32_t* bitmap;    // [words]
  int32_t* chunks;     // [M * K], ascending
  int32_t* count;      // [1]
};

// Builds the ascending union of the M queries' selections (-1 entries ignored).
template <int M>
__device__ void build_union(const LaunchParams& p, const int32_t* selection, int64_t t0,
                            int64_t g, int words, const UnionScratch& sc) {
  const int K = static_cast<int>(p.K);
  for (int w = threadIdx.x; w < words; w += kPackedThreads) sc.bitmap[w] = 0u;
  for (int e = threadIdx.x; e < M * K; e += kPackedThreads) {
    const int64_t t = t0 + e / K;
    sc.selection[e] = t < p.T ? selection[(g * p.T + t) * K + e % K] : -1;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < M * K; e += kPackedThreads) {
    const int32_t c = sc.selection[e];
    if (c >= 0) atomicOr(&sc.bitmap[c / 32], 1u << (c % 32));
  }
  __syncthreads();
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    int running = 0;
    for (int base = 0; base < words; base += kWarp) {
      uint32_t word = base + lane < words ? sc.bitmap[base + lane] : 0u;
      const int n = __popc(word);
      int prefix = n;
      for (int off = 1; off < kWarp; off *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, prefix, off);
        if (lane >= off) prefix += up;
      }
      int at = running + prefix - n;
      while (word != 0u) {
        const int bit = __ffs(word) - 1;
        word &= word - 1;
        sc.chunks[at++] = (base + lane) * 32 + bit;
      }
      running += __shfl_sync(0xffffffffu, prefix, kWarp - 1);
    }
    if (lane == 0) *sc.count = running;
  }
  __syncthreads();
}

// Running softmax over fusion logits, two rows per thread, values in C layout.
struct PackedFusion {
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.0f, 0.0f};
  float o[8][4] = {};

  // Adds logit a for row i with value weight * x (x in C layout, row i's half).
  __device__ __forceinline__ void add(int i, float a, float value_scale, const float (&x)[8][4]) {
    const float m_new = fmaxf(m[i], a);
    const float alpha = exp_diff(m[i], m_new);
    const float w = exp_diff(a, m_new);
    l[i] = l[i] * alpha + w;
    m[i] = m_new;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        o[nt][2 * i + e] = o[nt][2 * i + e] * alpha + w * value_scale * x[nt][2 * i + e];
  }
};

template <int G>
__global__ void __launch_bounds__(kPackedThreads)
    fuse_packed_kernel(LaunchParams p, const int32_t* selection, const float* selected_score,
                       const float* o_swa, const float* lse_swa, float* o_out, float* lse_out) {
  constexpr int M = kPackedRows / G;
  // Two K/V stages: the next union chunk streams in while this one is computed.
  __shared__ __align__(16) __nv_bfloat16 ks_tile[2][kTileDim][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 vs_tile[2][kTileDim][kTilePitch];
  extern __shared__ int32_t dyn[];
  const int K = static_cast<int>(p.K);
  const int words = static_cast<int>((p.T / p.S) / 32 + 1);
  const UnionScratch sc{dyn, reinterpret_cast<uint32_t*>(dyn + M * K), dyn + M * K + words,
                        dyn + 2 * M * K + words};
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * M, g = blockIdx.y;
  const ThreadRows<G> rows(t0, g, p.T);
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k) + g * p.T * kTileDim;
  const auto* v = static_cast<const __nv_bfloat16*>(p.v) + g * p.T * kTileDim;
  build_union<M>(p, selection, t0, g, words, sc);
  uint32_t qa[4][4];
  load_q_fragments(qa, rows.valid[0] ? q + (rows.h[0] * p.T + rows.t[0]) * kTileDim : nullptr,
                   rows.valid[1] ? q + (rows.h[1] * p.T + rows.t[1]) * kTileDim : nullptr);
  PackedFusion fused;
  int next[2] = {0, 0};  // position in each row's ascending selection
  const int n_union = *sc.count;
  if (n_union > 0) {
    load_tile_async(ks_tile[0], k, static_cast<int64_t>(sc.chunks[0]) * p.S, p.T);
    load_tile_async(vs_tile[0], v, static_cast<int64_t>(sc.chunks[0]) * p.S, p.T);
    cp_async_commit();
  }
  for (int u = 0; u < n_union; ++u) {
    const int32_t c = sc.chunks[u];
    int pick[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int32_t* sel = sc.selection + rows.m[i] * K;
      pick[i] = next[i] < K && sel[next[i]] == c ? next[i]++ : -1;
    }
    // Stage u % 2 has landed and every warp is done with stage (u + 1) % 2.
    cp_async_wait_all();
    __syncthreads();
    if (u + 1 < n_union) {
      const int64_t next_row = static_cast<int64_t>(sc.chunks[u + 1]) * p.S;
      load_tile_async(ks_tile[(u + 1) % 2], k, next_row, p.T);
      load_tile_async(vs_tile[(u + 1) % 2], v, next_row, p.T);
      cp_async_commit();
    }
    const __nv_bfloat16(*k_stage)[kTilePitch] = ks_tile[u % 2];
    const __nv_bfloat16(*v_stage)[kTilePitch] = vs_tile[u % 2];
    // Warps whose rows did not select this chunk skip the tensor-core work.
    if (!__any_sync(0xffffffffu, pick[0] >= 0 || pick[1] >= 0)) continue;
    float s[8][4], tile_max[2], tile_sum[2], oc[8][4] = {};
    qk_tile(s, qa, k_stage);
    mask_tile(s, p.scale, 0,
              [&](int i, int64_t j) { return pick[i] >= 0 && !(p.landmarks && j == p.S - 1); },
              tile_max);
    exponentiate(s, tile_max, tile_sum);
    pv_tile(oc, s, v_stage);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (pick[i] >= 0)
        fused.add(i, selected_score[(rows.h[i] * p.T + rows.t[i]) * K + pick[i]],
                  1.0f / tile_sum[i], oc);
  }
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!rows.valid[i]) continue;
    const int64_t row = rows.h[i] * p.T + rows.t[i];
    float x[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 w = *reinterpret_cast<const float2*>(o_swa + row * kTileDim + nt * 8 + (lane % 4) * 2);
      x[nt][2 * i] = w.x, x[nt][2 * i + 1] = w.y;
    }
    fused.add(i, lse_swa[row], 1.0f, x);
    if (p.softmax1) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) x[nt][2 * i] = x[nt][2 * i + 1] = 0.0f;
      fused.add(i, 0.0f, 1.0f, x);
    }
    const float inv = 1.0f / fused.l[i];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<float2*>(o_out + row * kTileDim + nt * 8 + (lane % 4) * 2) =
          make_float2(fused.o[nt][2 * i] * inv, fused.o[nt][2 * i + 1] * inv);
    if (lane % 4 == 0) lse_out[row] = fused.m[i] + __logf(fused.l[i]);
  }
}

template <int G>
void launch_window_v9_g(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  constexpr int M = kWindowRows / G;
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  static const bool raised = cudaFuncSetAttribute(window_v9_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  sizeof(WindowSmem)) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  window_v9_kernel<G><<<grid, kWindowThreads, sizeof(WindowSmem), stream>>>(p, o, lse);
}

template <int G>
void launch_fuse_g(const LaunchParams& p, const int32_t* selection, const float* selected_score,
                   const float* o_swa, const float* lse_swa, float* o, float* lse,
                   cudaStream_t stream) {
  constexpr int M = kPackedRows / G;
  const int words = static_cast<int>((p.T / p.S) / 32 + 1);
  const size_t smem = (2 * M * p.K + words + 1) * sizeof(int32_t);
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  // Static K/V stages plus this dynamic scratch may pass the 48 KB default: raise the limit.
  cudaFuncSetAttribute(fuse_packed_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  fuse_packed_kernel<G><<<grid, kPackedThreads, smem, stream>>>(p, selection, selected_score,
                                                                o_swa, lse_swa, o, lse);
}

}  // namespace

bool packed_path_applies(const LaunchParams& p) {
  const int64_t G = p.Hq / p.Hkv;
  const bool shape_ok = p.bf16 && p.d == kTileDim && p.dv == kTileDim && p.S == kTileDim &&
                        (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
  if (!shape_ok) return false;
  // The fusion's union scratch must fit beside its two static K/V stages.
  const int64_t scratch = (2 * (kPackedRows / G) * p.K + (p.T / p.S) / 32 + 2) * 4;
  return scratch + 2 * 2 * kTileDim * kTilePitch * 2 <= 200 * 1024;
}

void launch_window_v9(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_window_v9_g<1>(p, o, lse, stream);
    case 2: return launch_window_v9_g<2>(p, o, lse, stream);
    case 4: return launch_window_v9_g<4>(p, o, lse, stream);
    case 8: return launch_window_v9_g<8>(p, o, lse, stream);
    default: return launch_window_v9_g<16>(p, o, lse, stream);
  }
}

// v18's tensor maps: K or V as a [Hkv, T, 64] bf16 tensor, boxes of 64 rows x 64 dims written
// 128-byte swizzled, rows past T read as zeros. The encoder is the driver's, found through the
// runtime (no link against libcuda).
CUtensorMap kv_tensor_map(const void* kv, const LaunchParams& p) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  if (encode == nullptr)
    throw std::runtime_error("window_kernel wgmma_v18: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kTileDim), static_cast<cuuint64_t>(p.T),
                              static_cast<cuuint64_t>(p.Hkv)};
  const cuuint64_t strides[2] = {kTileDim * 2, static_cast<cuuint64_t>(p.T) * kTileDim * 2};
  const cuuint32_t box[3] = {kTileDim, kTileDim, 1}, unit[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(kv), dims,
                            strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("window_kernel wgmma_v18: cuTensorMapEncodeTiled failed (" +
                             std::to_string(static_cast<int>(r)) + ")");
  return map;
}

template <int G>
void launch_window_v18_g(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  constexpr int M = 128 / G;
  constexpr int smem = static_cast<int>(kWindowV18SmemBytes);
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  static const bool raised = cudaFuncSetAttribute(window_wgmma_v18_kernel<G>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  smem) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  window_wgmma_v18_kernel<G><<<grid, 256, smem, stream>>>(p, o, lse, kv_tensor_map(p.k, p), kv_tensor_map(p.v, p));
}

template <int G, bool kBarrierFree>
void launch_window_v19_g(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  constexpr int M = 128 / G;
  constexpr int smem = static_cast<int>(kWindowV19SmemBytes);
  const dim3 grid(static_cast<unsigned>((p.T + M - 1) / M), static_cast<unsigned>(p.Hkv));
  static const bool raised = cudaFuncSetAttribute(window_wgmma_v19_kernel<G, kBarrierFree>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  smem) == cudaSuccess;
  (void)raised;  // a failure surfaces as the launch's error
  window_wgmma_v19_kernel<G, kBarrierFree>
      <<<grid, 256, smem, stream>>>(p, o, lse, kv_tensor_map(p.k, p), kv_tensor_map(p.v, p));
}

template <bool kBarrierFree>
void launch_window_v19(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_window_v19_g<1, kBarrierFree>(p, o, lse, stream);
    case 2: return launch_window_v19_g<2, kBarrierFree>(p, o, lse, stream);
    case 4: return launch_window_v19_g<4, kBarrierFree>(p, o, lse, stream);
    case 8: return launch_window_v19_g<8, kBarrierFree>(p, o, lse, stream);
    default: return launch_window_v19_g<16, kBarrierFree>(p, o, lse, stream);
  }
}

void launch_window_v18(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_window_v18_g<1>(p, o, lse, stream);
    case 2: return launch_window_v18_g<2>(p, o, lse, stream);
    case 4: return launch_window_v18_g<4>(p, o, lse, stream);
    case 8: return launch_window_v18_g<8>(p, o, lse, stream);
    default: return launch_window_v18_g<16>(p, o, lse, stream);
  }
}

void launch_window_wgmma(const LaunchParams& p, WindowKernel kernel, float* o, float* lse,
                         cudaStream_t stream) {
  switch (kernel) {
    case WindowKernel::wgmma_v18: return launch_window_v18(p, o, lse, stream);
    case WindowKernel::wgmma_v19: return launch_window_v19<false>(p, o, lse, stream);
    case WindowKernel::wgmma_v20: return launch_window_v19<true>(p, o, lse, stream);
    case WindowKernel::mma_v9: break;  // not a wgmma kernel (window_attention_rows runs it)
  }
  throw std::invalid_argument(std::string("window_kernel: ") + window_kernel_name(kernel) + " is not a wgmma kernel");
}

void launch_fuse_packed(const LaunchParams& p, const int32_t* selection,
                        const float* selected_score, const float* o_swa, const float* lse_swa,
                        float* o, float* lse, cudaStream_t stream) {
  switch (p.Hq / p.Hkv) {
    case 1: return launch_fuse_g<1>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    case 2: return launch_fuse_g<2>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    case 4: return launch_fuse_g<4>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    case 8: return launch_fuse_g<8>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    default: return launch_fuse_g<16>(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
  }
}

}  // namespace hils::gpu::detail
