// Hopper warpgroup MMA (wgmma, sm_90a) helpers: bf16 in, fp32 accumulate, m64nNk16 with N = 64
// or 128, A from registers or shared memory, B from shared memory in the 128-byte swizzle.
// Tested against mma.sync and fp64 by tests/gpu/test_gpu_wgmma.cpp (wgmma_check.cu).
//
// Who issues: a warpgroup = 4 consecutive warps whose first warp index is a multiple of 4; all
// 128 threads execute every wgmma/fence/commit/wait (".sync.aligned": no divergence around them).
//
// Register layouts (the reason mma.sync epilogues carry over): warp w of the warpgroup owns rows
// 16w .. 16w+15 of the 64-row product. Its accumulator d[j][0..3] (j = 0 .. N/8-1) is exactly
// the C fragment of an mma.sync m16n8 tile for columns 8j .. 8j+7: d[j][0], d[j][1] at row
// 16w + lane/4, columns 8j + 2(lane%4) + {0, 1}; d[j][2], d[j][3] the same columns at row + 8.
// An A operand in registers (a[4] per k16 step) is mma.sync m16n8k16's A fragment of the warp's
// 16 rows (load_q_fragments in mma_common.cuh builds it).
//
// Shared-memory operands: "panels" of rows of 64 bf16 (128 bytes). Row r's 16-byte chunk c sits
// at chunk c ^ (r % 8) (sw128_offset); 8 rows form a 1024-byte atom, and a panel must start on
// a 1024-byte boundary (the hardware applies the XOR to address bits 4-6 with bits 7-9).
// - K-major operand (A, or B given as [n][k] like keys): panel rows = M or N index, 64 k values
//   per row (d = 64: one panel). desc_k_major(panel); k16 step s: desc_advance(desc, 32 * s).
// - N-major B (given as [k][n] like values, for P.V): panel rows = k index, 64 n values per row;
//   columns 64..127 (N = 128) in a second panel panel_stride bytes later.
//   desc_n_major(panel, panel_stride); k16 step s: desc_advance(desc, 16 * 128 * s); pass
//   kTransB = true to the mma.
// Ordering: shared memory written by ordinary stores or cp.async and then read by wgmma needs
// fence_proxy_async() in every writing thread before the barrier that publishes it. Registers:
// call fence() before the first wgmma of a batch (and whenever the accumulators or A registers
// were touched by other code since), commit() after the batch, wait<n>() before reading the
// accumulators, then fence_operands(d) so the compiler does not move reads above the wait.
//
// Built only for sm_90a (gpu/CMakeLists.txt: HILS_CUDA_ARCHITECTURES "90a"); compiled for any
// other target the instructions are replaced by a trap, so such a build compiles; the host
// never launches them there (wgmma_probe.cu: the default selection falls back to v8, a wgmma
// kernel named by the caller is refused with an error).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hils::gpu::detail::wg {

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HILS_WGMMA_UNAVAILABLE 1
#endif

constexpr int kPanelCols = 64;      // bf16 per panel row (128 bytes)
constexpr int kPanelRowBytes = 128;
constexpr int kAtomBytes = 1024;    // 8 rows: the swizzle's period and the panel alignment

// Byte offset of bf16 element (row, col) inside a 128-byte-swizzled panel (col < 64).
__device__ __forceinline__ uint32_t sw128_offset(int row, int col) {
  return static_cast<uint32_t>(row * kPanelRowBytes + ((((col >> 3) ^ row) & 7) << 4) +
                               ((col & 7) << 1));
}

// Matrix descriptor (PTX "matrix-descriptor-encode"): start address, leading and stride byte
// offsets (>> 4, 14 bits each), base offset 0, swizzle mode 1 = 128 bytes.
// The panel given by its shared-memory address (__cvta_generic_to_shared) or by a pointer.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t panel, uint32_t leading_bytes,
                                               uint32_t stride_bytes) {
  return ((panel & 0x3FFFF) >> 4) | (static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t desc_sw128(const void* panel, uint32_t leading_bytes,
                                               uint32_t stride_bytes) {
  return desc_sw128(static_cast<uint32_t>(__cvta_generic_to_shared(panel)), leading_bytes,
                    stride_bytes);
}
// K-major panel: the next 8 rows (M or N) 1024 bytes on; the leading offset is unused.
template <class Panel>
__device__ __forceinline__ uint64_t desc_k_major(Panel panel) {
  return desc_sw128(panel, 16, kAtomBytes);
}
// N-major panel (B as [k][n]): the next 8 k rows 1024 bytes on, the next 64 n columns
// panel_stride bytes on.
template <class Panel>
__device__ __forceinline__ uint64_t desc_n_major(Panel panel, uint32_t panel_stride) {
  return desc_sw128(panel, panel_stride, kAtomBytes);
}
// A K-major operand of one k16 step without swizzle (swizzle mode 0, "interleave"): 8 x 16-byte
// core matrices, rows 16 bytes apart inside one; the next core matrix along K `leading_bytes`
// on, the next 8 rows (M or N) `stride_bytes` on; 16-byte aligned (two_pass_v25's bias k16 step).
__device__ __forceinline__ uint64_t desc_interleave(uint32_t panel, uint32_t leading_bytes,
                                                   uint32_t stride_bytes) {
  return ((panel & 0x3FFFF) >> 4) | (static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32);
}
// The same descriptor `bytes` further on (bytes a multiple of 16; within the 18-bit address).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// Makes this thread's ordinary (generic-proxy) shared-memory writes visible to wgmma.
__device__ __forceinline__ void fence_proxy_async() {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence() {
#ifdef HILS_WGMMA_UNAVAILABLE
  __trap();
#else
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most `pending` committed batches of this warpgroup are still in flight.
template <int pending>
__device__ __forceinline__ void wait() {
#ifndef HILS_WGMMA_UNAVAILABLE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
#endif
}
// Pins the accumulators in place across the asynchronous MMA (no reads or writes moved across).
template <int tiles>
__device__ __forceinline__ void fence_operands(float (&d)[tiles][4]) {
#pragma unroll
  for (int j = 0; j < tiles; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
}

// The same for other values computed while a wgmma runs: pinned before the next wait, so that
// the compiler does not sink their computation below it.
template <int n>
__device__ __forceinline__ void fence_values(float (&x)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(x[i])::"memory");
}

#define HILS_WG_ACC(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define HILS_WG_ACC64(d)                                                                       \
  HILS_WG_ACC(d, 0), HILS_WG_ACC(d, 1), HILS_WG_ACC(d, 2), HILS_WG_ACC(d, 3), HILS_WG_ACC(d, 4), \
      HILS_WG_ACC(d, 5), HILS_WG_ACC(d, 6), HILS_WG_ACC(d, 7)
#define HILS_WG_ACC128(d)                                                                       \
  HILS_WG_ACC64(d), HILS_WG_ACC(d, 8), HILS_WG_ACC(d, 9), HILS_WG_ACC(d, 10), HILS_WG_ACC(d, 11), \
      HILS_WG_ACC(d, 12), HILS_WG_ACC(d, 13), HILS_WG_ACC(d, 14), HILS_WG_ACC(d, 15)
#define HILS_WG_D64                                                                              \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25," \
  "%26,%27,%28,%29,%30,%31}"
#define HILS_WG_D128                                                                             \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25," \
  "%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,"    \
  "%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// d (64 x N, fp32) = A (64 x 16) . B (16 x N) + (accumulate ? d : 0), one k16 step, A in
// registers (this warp's mma.sync A fragment), B from shared memory (kTransB: N-major).
template <bool kTransB>
__device__ __forceinline__ void mma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b,
                                       bool accumulate) {
#ifdef HILS_WGMMA_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HILS_WG_D64
      ", {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : HILS_WG_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
        "n"(static_cast<int>(kTransB)));
#endif
}
template <bool kTransB>
__device__ __forceinline__ void mma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b,
                                       bool accumulate) {
#ifdef HILS_WGMMA_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HILS_WG_D128
      ", {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
      : HILS_WG_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
        "n"(static_cast<int>(kTransB)));
#endif
}
// The same with A (64 x 16) from a K-major shared-memory panel too.
template <bool kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[8][4], uint64_t a, uint64_t b, bool accumulate) {
#ifdef HILS_WGMMA_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HILS_WG_D64
      ", %32, %33, p, 1, 1, 0, %35;\n}\n"
      : HILS_WG_ACC64(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(kTransB)));
#endif
}
// The same with both operands K-major panels given by their descriptors' low words (a K-major
// descriptor's high word, kKMajorDescHi, is the same for every panel) and the k16 step
// kStep (0..3: 32 bytes each, within the 14-bit address field). The words are put together
// inside the asm, so that the compiler keeps one 32-bit value per operand, not four 64-bit
// descriptors, across a loop.
constexpr uint32_t kKMajorDescHi = ((kAtomBytes >> 4) & 0x3FFF) | (1u << 30);
template <int kStep>
__device__ __forceinline__ void mma_ss_k_major(float (&d)[8][4], uint32_t a_lo, uint32_t b_lo,
                                               bool accumulate) {
#ifdef HILS_WGMMA_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\n.reg .b32 al, bl;\n.reg .b64 da, db;\nsetp.ne.b32 p, %34, 0;\n"
      "add.u32 al, %32, %35;\nadd.u32 bl, %33, %35;\n"
      "mov.b64 da, {al, %36};\nmov.b64 db, {bl, %36};\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HILS_WG_D64
      ", da, db, p, 1, 1, 0, 0;\n}\n"
      : HILS_WG_ACC64(d)
      : "r"(a_lo), "r"(b_lo), "r"(static_cast<int>(accumulate)), "n"(2 * kStep), "r"(kKMajorDescHi));
#endif
}
// O += A . B with A from registers and B an N-major panel given by its descriptor's low word
// b_lo (start address and leading offset; the high word is kKMajorDescHi's: stride 1024 bytes,
// 128-byte swizzle) and the k16 step kStep (0..3: 16 panel rows, 2048 bytes each), put together
// inside the asm as mma_ss_k_major does (N = 64).
template <int kStep>
__device__ __forceinline__ void mma_rs_n_major(float (&d)[8][4], const uint32_t (&a)[4], uint32_t b_lo) {
#ifdef HILS_WGMMA_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\n.reg .b32 bl;\n.reg .b64 db;\nsetp.ne.b32 p, 1, 0;\n"
      "add.u32 bl, %36, %37;\nmov.b64 db, {bl, %38};\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HILS_WG_D64
      ", {%32,%33,%34,%35}, db, p, 1, 1, 1;\n}\n"
      : HILS_WG_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b_lo), "n"(128 * kStep), "r"(kKMajorDescHi));
#endif
}
template <bool kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[16][4], uint64_t a, uint64_t b,
                                       bool accumulate) {
#ifdef HILS_WGMMA_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HILS_WG_D128
      ", %64, %65, p, 1, 1, 0, %67;\n}\n"
      : HILS_WG_ACC128(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(kTransB)));
#endif
}

#undef HILS_WG_ACC
#undef HILS_WG_ACC64
#undef HILS_WG_ACC128
#undef HILS_WG_D64
#undef HILS_WG_D128

}  // namespace hils::gpu::detail::wg
