// gpu/src/wgmma_common.cuh against fp64 and mma.sync: descriptors, swizzle, A from registers or
// shared memory, B K-major (keys) or N-major (values), N = 64 and 128, on random bf16 data.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "case_table.hpp"
#include "wgmma_check.hpp"

namespace {

using hils::gpu::testing::WgmmaShape;

uint16_t bf16_bits(float x) {  // round to nearest even (finite x)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
double bf16_value(uint16_t bits) {
  const uint32_t u = uint32_t{bits} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
std::vector<uint16_t> random_bf16(size_t count, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> out(count);
  for (auto& x : out) x = bf16_bits(normal(rng));
  return out;
}

}  // namespace

TEST_CASE("gpu wgmma helpers equal mma.sync and fp64", "[gpu]") {
  for (const WgmmaShape shape : {WgmmaShape{64, false, false}, WgmmaShape{64, true, false},
                                 WgmmaShape{64, false, true}, WgmmaShape{64, true, true},
                                 WgmmaShape{128, false, false}, WgmmaShape{128, true, true}}) {
    const std::string name = "wgmma n" + std::to_string(shape.n) +
                             (shape.a_in_smem ? " a_smem" : " a_regs") +
                             (shape.b_n_major ? " b_n_major" : " b_k_major");
    SECTION(name) {
      std::mt19937_64 rng(hils::cases::seed_of(name));
      const int n = shape.n, k_dim = 64;
      const auto a = random_bf16(64 * k_dim, rng), b = random_bf16(n * k_dim, rng);
      std::vector<float> d_wgmma, d_mma_sync;
      hils::gpu::testing::wgmma_product(shape, a, b, d_wgmma, d_mma_sync);
      // fp32 accumulation of 64 products: error <= ~64 * 2^-24 of sum |a b|; 3e-5 leaves 8x room,
      // while a wrong layout or swizzle is off by O(sum |a b|).
      double worst = 0.0;
      for (int i = 0; i < 64; ++i)
        for (int j = 0; j < n; ++j) {
          double exact = 0.0, magnitude = 0.0;
          for (int k = 0; k < k_dim; ++k) {
            const double bk = shape.b_n_major ? bf16_value(b[k * n + j]) : bf16_value(b[j * k_dim + k]);
            exact += bf16_value(a[i * k_dim + k]) * bk;
            magnitude += std::abs(bf16_value(a[i * k_dim + k]) * bk);
          }
          worst = std::max(worst, std::abs(d_wgmma[i * n + j] - exact) / magnitude);
        }
      INFO(name << ": largest error / sum |a b| = " << worst);
      CHECK(worst <= 3e-5);
      // The selection's wgmma kernel relies on this: the same bits as mma.sync (same k order).
      int differing = 0;
      for (size_t i = 0; i < d_wgmma.size(); ++i)
        differing += std::memcmp(&d_wgmma[i], &d_mma_sync[i], 4) != 0;
      INFO(name << ": elements differing from mma.sync " << differing << " of " << d_wgmma.size());
      CHECK(differing == 0);
      std::cout << name << ": error/sum|ab| " << worst << ", differing from mma.sync " << differing << "\n";
    }
  }
}
