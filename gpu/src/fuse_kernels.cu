// Fusion of the selected chunks with the window (reference/SEMANTICS.md §5): hierarchical (Eq. 10:
// intra-chunk softmax per (query, chunk), then a softmax over [s_hat..., lse_swa (, 0)]) and flat
// (Eq. 3: one softmax over the window and the selected chunks' tokens). One warp per (t, h).
#include "device_common.cuh"
#include "launch_params.hpp"

namespace hils::gpu::detail {
namespace {

// Running softmax over fusion logits a_i with values x_i (lane owns dims lane + 32 r).
struct FusionState {
  float m = kNegInf;
  float l = 0.0f;
  float o[kDimRegs] = {};

  // Adds logit a with value x = scale_x * src (src given per lane-owned dim).
  __device__ __forceinline__ void add(float a, const float (&x)[kDimRegs]) {
    const float m_new = fmaxf(m, a);
    const float alpha = exp_diff(m, m_new);
    const float w = exp_diff(a, m_new);
    l = l * alpha + w;
#pragma unroll
    for (int r = 0; r < kDimRegs; ++r) o[r] = o[r] * alpha + w * x[r];
    m = m_new;
  }
};

__device__ __forceinline__ void store_fused(const FusionState& f, int dv, float* o_row,
                                            float* lse) {
  const int lane = threadIdx.x % kWarp;
  const float inv = f.l > 0.0f ? 1.0f / f.l : 0.0f;
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    if (dim < dv) o_row[dim] = f.o[r] * inv;
  }
  if (lane == 0) *lse = f.l > 0.0f ? f.m + __logf(f.l) : kNegInf;
}

template <class Tin>
__global__ void fuse_hierarchical_kernel(LaunchParams p, const int32_t* selection,
                                         const float* selected_score, const float* o_swa,
                                         const float* lse_swa, float* o, float* lse) {
  extern __shared__ float smem[];
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.T * p.Hq) return;
  const int64_t h = item / p.T, t = item % p.T, G = p.Hq / p.Hkv, g = h / G;
  const int lane = threadIdx.x % kWarp;
  const int d = static_cast<int>(p.d), dv = static_cast<int>(p.dv);
  float* q = smem + (threadIdx.x / kWarp) * p.d;
  load_row(q, static_cast<const Tin*>(p.q) + (h * p.T + t) * p.d, d);
  const Tin* k = static_cast<const Tin*>(p.k) + g * p.T * p.d;
  const Tin* v = static_cast<const Tin*>(p.v) + g * p.T * p.dv;
  FusionState fused;
  float x[kDimRegs];
  for (int64_t i = 0; i < p.K; ++i) {
    const int32_t c = selection[(g * p.T + t) * p.K + i];
    if (c < 0) continue;
    WarpSoftmax st;
    attend_range(st, q, k, v, d, dv, c * p.S, c * p.S + p.S - 1, p.scale, geo);
#pragma unroll
    for (int r = 0; r < kDimRegs; ++r) x[r] = st.o[r] / st.l;
    fused.add(selected_score[(h * p.T + t) * p.K + i], x);
  }
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    x[r] = dim < dv ? o_swa[(h * p.T + t) * p.dv + dim] : 0.0f;
  }
  fused.add(lse_swa[h * p.T + t], x);
  if (p.softmax1) {
#pragma unroll
    for (int r = 0; r < kDimRegs; ++r) x[r] = 0.0f;
    fused.add(0.0f, x);
  }
  store_fused(fused, dv, o + (h * p.T + t) * p.dv, lse + h * p.T + t);
}

template <class Tin>
__global__ void fuse_flat_kernel(LaunchParams p, const int32_t* selection, float* o, float* lse) {
  extern __shared__ float smem[];
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.T * p.Hq) return;
  const int64_t h = item / p.T, t = item % p.T, G = p.Hq / p.Hkv, g = h / G;
  const int lane = threadIdx.x % kWarp;
  const int d = static_cast<int>(p.d), dv = static_cast<int>(p.dv);
  float* q = smem + (threadIdx.x / kWarp) * p.d;
  load_row(q, static_cast<const Tin*>(p.q) + (h * p.T + t) * p.d, d);
  const Tin* k = static_cast<const Tin*>(p.k) + g * p.T * p.d;
  const Tin* v = static_cast<const Tin*>(p.v) + g * p.T * p.dv;
  WarpSoftmax st;
  for (int64_t i = 0; i < p.K; ++i) {
    const int32_t c = selection[(g * p.T + t) * p.K + i];
    if (c >= 0) attend_range(st, q, k, v, d, dv, c * p.S, c * p.S + p.S - 1, p.scale, geo);
  }
  attend_range(st, q, k, v, d, dv, geo.window_left(t), t, p.scale, geo);
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
  float* o_row = o + (h * p.T + t) * p.dv;
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    if (dim < dv) o_row[dim] = st.o[r] * inv;
  }
  if (lane == 0) lse[h * p.T + t] = st.lse();
}

unsigned blocks_for(const LaunchParams& p) {
  return static_cast<unsigned>((p.T * p.Hq + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void launch_fuse_hierarchical(const LaunchParams& p, const int32_t* selection,
                              const float* selected_score, const float* o_swa,
                              const float* lse_swa, float* o, float* lse, cudaStream_t stream) {
  if (p.T * p.Hq == 0) return;
  auto kernel = p.bf16 ? fuse_hierarchical_kernel<__nv_bfloat16> : fuse_hierarchical_kernel<float>;
  kernel<<<blocks_for(p), kWarpsPerBlock * kWarp, kWarpsPerBlock * p.d * sizeof(float), stream>>>(
      p, selection, selected_score, o_swa, lse_swa, o, lse);
}

void launch_fuse_flat(const LaunchParams& p, const int32_t* selection, float* o, float* lse,
                      cudaStream_t stream) {
  if (p.T * p.Hq == 0) return;
  auto kernel = p.bf16 ? fuse_flat_kernel<__nv_bfloat16> : fuse_flat_kernel<float>;
  kernel<<<blocks_for(p), kWarpsPerBlock * kWarp, kWarpsPerBlock * p.d * sizeof(float), stream>>>(
      p, selection, o, lse);
}

}  // namespace hils::gpu::detail
