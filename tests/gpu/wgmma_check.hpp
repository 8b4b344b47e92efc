// Device side of the wgmma test (wgmma_check.cu): one 64 x N x 64 bf16 product computed with the
// helpers of gpu/src/wgmma_common.cuh and, for comparison, with mma.sync m16n8k16.
#pragma once

#include <cstdint>
#include <vector>

namespace hils::gpu::testing {

struct WgmmaShape {
  int n;            // 64 or 128
  bool a_in_smem;   // A from a shared-memory panel (else from registers)
  bool b_n_major;   // B given as [k = 64][n] (values, kTransB) instead of [n][k = 64] (keys)
};

// a: [64][64] bf16 bits (rows x k); b: [n][64] (K-major) or [64][n] (N-major) bf16 bits.
// Returns D = A . B^(T) as [64][n] fp32 from wgmma (d_wgmma) and from mma.sync (d_mma_sync),
// the k steps accumulated in the same order (k = 0..15, 16..31, ...).
void wgmma_product(const WgmmaShape& shape, const std::vector<uint16_t>& a,
                   const std::vector<uint16_t>& b, std::vector<float>& d_wgmma,
                   std::vector<float>& d_mma_sync);

}  // namespace hils::gpu::testing
