// A C++ program on the installed hils::gpu (static, with cudart): workspace_bytes is host
// arithmetic, so it runs without a GPU. Exit 0 only on the bytes that gpu/src/api.cpp's sum
// gives for this shape.
#include <cstdio>

#include "hils/gpu/attention.hpp"

int main() {
  hils::MechanismSpec spec;  // taylor key: no exact-score buffer
  spec.S = 64, spec.W = 512, spec.K = 32;
  const hils::gpu::Shape shape{8192, 16, 2, 64, 64};
  // 128 chunks; o, lse, k', b', selection [Hkv, T, K] and its weights [Hq, T, K], all fp32 or
  // int32 and multiples of 256 bytes: 4 (16*8192*64 + 16*8192 + 16*128*64 + 16*128
  // + 2*8192*32 + 16*8192*32) = 53485568.
  const size_t bytes = hils::gpu::workspace_bytes(spec, shape);
  std::printf("hils::gpu::workspace_bytes = %zu\n", bytes);
  return bytes == 53485568 ? 0 : 1;
}
