// Tensor-core helpers (mma.sync m16n8k16, bf16 in, fp32 accumulate) for the packed kernels:
// 64 rows (M queries x G heads) per block, 16 rows per warp, 64-key tiles in shared memory,
// d = dv = 64. Fragment layouts are PTX's: lane/4 picks the row (and +8), lane%4 the column pair.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "device_common.cuh"

namespace hils::gpu::detail {

constexpr int kTileDim = 64;         // d = dv = 64 and 64 keys per tile
constexpr int kTilePitch = 72;       // bf16 per smem row: +16 bytes against bank conflicts
constexpr int kPackedRows = 64;      // rows (query, head) per block
constexpr int kPackedThreads = 128;  // 4 warps x 16 rows

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_raw(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

// Rows [row0, row0 + 64) of a [rows_total, 64] bf16 matrix into smem (zeros past rows_total).
__device__ __forceinline__ void load_tile(__nv_bfloat16 (*dst)[kTilePitch],
                                          const __nv_bfloat16* src, int64_t row0,
                                          int64_t rows_total) {
  for (int seg = threadIdx.x; seg < kTileDim * 8; seg += kPackedThreads) {
    const int row = seg / 8, col = (seg % 8) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row0 + row < rows_total)
      value = *reinterpret_cast<const uint4*>(src + (row0 + row) * kTileDim + col);
    *reinterpret_cast<uint4*>(&dst[row][col]) = value;
  }
}

// A fragments of the warp's 16 rows of q (4 k-steps of 16 dims); row_ptr0/1 are null for
// rows past the end (zeros).
__device__ __forceinline__ void load_q_fragments(uint32_t (&qa)[4][4],
                                                 const __nv_bfloat16* row_ptr0,
                                                 const __nv_bfloat16* row_ptr1) {
  const int col = (threadIdx.x % kWarp % 4) * 2;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    auto word = [&](const __nv_bfloat16* row, int c) {
      return row == nullptr ? 0u : *reinterpret_cast<const uint32_t*>(row + c);
    };
    qa[ks][0] = word(row_ptr0, 16 * ks + col);
    qa[ks][1] = word(row_ptr1, 16 * ks + col);
    qa[ks][2] = word(row_ptr0, 16 * ks + col + 8);
    qa[ks][3] = word(row_ptr1, 16 * ks + col + 8);
  }
}

// Four 8x8 b16 matrices from shared memory (lanes 8i..8i+7 give the row addresses of matrix i).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// s[nt] = q (16 x 64) . K_tile^T for keys nt*8 .. nt*8+7 (C layout, unscaled). The B fragments
// come from ldmatrix over key rows: matrix j of a load = dims 8j .. 8j+7 of 8 keys. Groups of 8
// keys from nt_end on are not computed and read -inf (a caller whose later keys are all masked
// passes fewer; the default 8 unrolls without a test).
__device__ __forceinline__ void qk_tile(float (&s)[8][4], const uint32_t (&qa)[4][4],
                                        const __nv_bfloat16 (*ks_tile)[kTilePitch], int nt_end = 8) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt >= nt_end) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = kNegInf;
      continue;
    }
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    const __nv_bfloat16* key = ks_tile[nt * 8 + lane % 8] + 8 * (lane / 8);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t b[4];
      ldmatrix_x4(b, key + 32 * half);
      mma_16816(s[nt], qa[2 * half], b[0], b[1]);
      mma_16816(s[nt], qa[2 * half + 1], b[2], b[3]);
    }
  }
}

// o[nt] += P (16 x 64 keys, C layout in p) . V_tile (64 keys x 64 dims). The B fragments come
// from transposing ldmatrix over value rows: keys 16ks + (0..7 | 8..15) x dims of nt, nt + 1.
// Only the first ks_end of the four 16-key steps are taken (a caller whose later keys are all
// masked passes fewer; the default 4 unrolls without a test).
__device__ __forceinline__ void pv_tile(float (&o)[8][4], const float (&p)[8][4],
                                        const __nv_bfloat16 (*vs_tile)[kTilePitch], int ks_end = 4) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    if (ks >= ks_end) continue;
    const uint32_t a[4] = {pack_bf16(p[2 * ks][0], p[2 * ks][1]),
                           pack_bf16(p[2 * ks][2], p[2 * ks][3]),
                           pack_bf16(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                           pack_bf16(p[2 * ks + 1][2], p[2 * ks + 1][3])};
    const __nv_bfloat16* row = vs_tile[16 * ks + lane % 8 + 8 * ((lane / 8) % 2)] + 8 * (lane / 16);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, row + 16 * np);
      mma_16816(o[2 * np], a, b[0], b[1]);
      mma_16816(o[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// Max and sum over the 4 lanes of a quad (the lanes holding one row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace hils::gpu::detail

namespace hils::gpu::detail {

// 16-byte asynchronous copy global -> shared (zero-filled when !valid; src must still point
// into an allocation).
// The destination as a shared-memory address (__cvta_generic_to_shared) or as a pointer.
__device__ __forceinline__ void cp_async16_at(unsigned smem, const void* gmem, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  cp_async16_at(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// load_tile through the copy engine: rows [row0, row0 + 64) of a [rows_total, 64] bf16 matrix,
// by the kThreads threads of the block.
template <int kThreads = kPackedThreads>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16 (*dst)[kTilePitch],
                                                const __nv_bfloat16* src, int64_t row0,
                                                int64_t rows_total) {
  for (int seg = threadIdx.x; seg < kTileDim * 8; seg += kThreads) {
    const int row = seg / 8, col = (seg % 8) * 8;
    const bool valid = row0 + row < rows_total;
    cp_async16(&dst[row][col], src + (valid ? (row0 + row) * kTileDim + col : 0), valid);
  }
}

}  // namespace hils::gpu::detail
