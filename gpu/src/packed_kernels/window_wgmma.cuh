// What the wgmma window kernels (v18, v19, v20; sm_90a) share besides the per-tile steps: the
// q rows into two 128-byte-swizzled panels (kWgPanelBytes, load_q_panels_async), a descriptor
// from its two words (desc_of), the mbarrier operations (init, expect_tx, wait, arrive) and the
// tensor memory accelerator's copy of a 64-row panel (tma_load_panel).
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "launch_params.hpp"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

namespace hils::gpu::detail {
namespace {

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
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
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

}  // namespace
}  // namespace hils::gpu::detail
