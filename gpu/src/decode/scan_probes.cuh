// The scan's read floor (decode_scan_probe in decode_kernels.cu, ScanProbe in decode.hpp;
// bench_decode.py --scan-floor and --handoffs): kernels that read what launch 1 reads, or the
// summary arrays end to end, or wait as the tails do, and do no work. d25_scan and
// tail_handoffs launch the step's own launch 1 (decode/scan.cuh) first.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "decode/scan.cuh"

namespace hils::gpu {
namespace detail {
namespace {

// ---- the scan's read floor (decode_scan_probe, ScanProbe) ---------------------------------------
// Folds the words of u into x (what the probes read must not be dead code).
__device__ __forceinline__ void fold(uint32_t& x, const uint4& u) { x ^= u.x ^ u.y ^ u.z ^ u.w; }
// The probes store only when the fold hits this value (they read, they do not write).
constexpr uint32_t kProbeNeverValue = 0x9e3779b9u;
// The probes load the summary arrays as d25 does (ld.global.cs): with plain loads they were
// ~10% slower than d25's launch 1 itself on the H100 (session 12 run 2), no floor then.
constexpr ScanLoads kStream = ScanLoads::streaming;

// ScanProbe::loads_only: fused_window_score_kernel's grid and global loads (the fast window tile
// with its value rows, kEarly; the coalesced score tile: rows, b', row scales, as d25 loads
// them), nothing else.
template <class Summary>
__global__ void __launch_bounds__(kFastThreads) scan_loads_only_kernel(DecodeParams p,
                                                                       uint32_t* sink) {
  constexpr int D = kFastDim;
  const int64_t n_win_blocks = p.n_win_tiles * p.B * p.Hkv, block = blockIdx.x;
  uint32_t x = 0;
  if (block < n_win_blocks) {
    constexpr int kPieces = kDecodeTileSlots * D / 8 / kFastThreads;
    const int64_t tile = block % p.n_win_tiles, bg = block / p.n_win_tiles;
    const int64_t lo = p.win_lo + tile * kDecodeTileSlots;
    const int64_t hi = min(p.T - 1, lo + kDecodeTileSlots - 1);
    const __nv_bfloat16* k = p.k + bg * p.slot_cap * D;
    const __nv_bfloat16* v = p.v + bg * p.slot_cap * D;
    const int64_t slot = lo + threadIdx.x % D;
    uint4 u[D / 8 + kPieces];
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      u[i] = slot <= hi ? __ldg(reinterpret_cast<const uint4*>(k + slot * D) + i) : uint4{};
#pragma unroll
    for (int e = 0; e < kPieces; ++e) {
      const int piece = threadIdx.x + kFastThreads * e, row = piece / (D / 8);
      u[D / 8 + e] = lo + row <= hi
                         ? __ldg(reinterpret_cast<const uint4*>(v + (lo + row) * D) + piece % (D / 8))
                         : uint4{};
    }
#pragma unroll
    for (const uint4& piece : u) fold(x, piece);
  } else {
    constexpr int kLanesPerRow = kCoalescedDim / Summary::kPerLoad;
    constexpr int kRowsPerStep = kWarp / kLanesPerRow;
    constexpr int kWarps = kFastThreads / kWarp;
    constexpr int kSteps = kScoreThreads / kRowsPerStep / kWarps;
    constexpr int kPerThread = kScoreThreads / kFastThreads;
    const int64_t j = block - n_win_blocks, item = j / p.n_score_tiles;
    const int64_t tile_first = j % p.n_score_tiles * kScoreThreads;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, part = lane % kLanesPerRow;
    const uint4* rows = reinterpret_cast<const uint4*>(
        static_cast<const typename Summary::Elem*>(p.summary_key) + item * p.chunk_cap * p.d / Summary::kPerElem);
    uint4 u[kSteps];
    float extra[2 * kPerThread];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int64_t cc = tile_first + warp * (kSteps * kRowsPerStep) + step * kRowsPerStep +
                         lane / kLanesPerRow;
      u[step] = cc < p.n_cand ? scan_load<kStream>(rows + cc * kLanesPerRow + part) : uint4{};
    }
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int64_t c = tile_first + threadIdx.x + r * kFastThreads, row = item * p.chunk_cap + c;
      extra[2 * r] = c < p.n_cand ? scan_load<kStream>(p.summary_bias + row) : 0.0f;
      extra[2 * r + 1] =
          c < p.n_cand && p.summary_scale ? scan_load<kStream>(p.summary_scale + row) : 1.0f;
    }
#pragma unroll
    for (const uint4& piece : u) fold(x, piece);
#pragma unroll
    for (float f : extra) x ^= __float_as_uint(f);
  }
  if (x == kProbeNeverValue) sink[0] = x;
}

// ScanProbe::flat_read: n 16-byte words from `a`, 4 loads per thread in flight per step.
__device__ void read_flat(const uint4* a, int64_t n, uint32_t& x) {
  constexpr int kInFlight = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kInFlight - 1) * stride < n; i += kInFlight * stride) {
    uint4 u[kInFlight];
#pragma unroll
    for (int e = 0; e < kInFlight; ++e) u[e] = scan_load<kStream>(a + i + e * stride);
#pragma unroll
    for (int e = 0; e < kInFlight; ++e) fold(x, u[e]);
  }
  for (; i < n; i += stride) fold(x, scan_load<kStream>(a + i));
}

// ScanProbe::tail_handoffs: a tail kernel without work (waits for the previous grid, lets the
// next one launch).
__global__ void empty_tail_kernel() {
  wait_for_previous_grid();
  allow_next_grid();
}

__global__ void flat_read_kernel(const uint4* a, int64_t na, const uint4* b, int64_t nb,
                                 const uint4* c, int64_t nc, uint32_t* sink) {
  uint32_t x = 0;
  read_flat(a, na, x);
  read_flat(b, nb, x);
  read_flat(c, nc, x);
  if (x == kProbeNeverValue) sink[0] = x;
}

}  // namespace
}  // namespace detail
}  // namespace hils::gpu
