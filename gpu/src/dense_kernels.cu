// Window branch, full causal attention and exact chunk log-masses (reference/SEMANTICS.md §2, §3,
// §5): one warp per (query slot t, query head h), fp32 arithmetic on fp32 or bf16 inputs.
#include "device_common.cuh"
#include "launch_params.hpp"

namespace hils::gpu::detail {
namespace {

// The (t, h) work item of this warp, or false past the end.
__device__ __forceinline__ bool warp_item(const LaunchParams& p, int64_t& t, int64_t& h) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.T * p.Hq) return false;
  h = item / p.T;
  t = item % p.T;
  return true;
}

__device__ __forceinline__ SlotGeometry geometry_of(const LaunchParams& p) {
  return SlotGeometry{p.T, p.S, p.W, p.landmarks};
}

// Writes the warp's softmax as o [dv] (normalized) and lse.
__device__ __forceinline__ void store_softmax(const WarpSoftmax& st, int dv, float* o_row,
                                              float* lse) {
  const int lane = threadIdx.x % kWarp;
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
#pragma unroll
  for (int r = 0; r < kDimRegs; ++r) {
    const int dim = lane + kWarp * r;
    if (dim < dv) o_row[dim] = st.o[r] * inv;
  }
  if (lane == 0) *lse = st.lse();
}

// o, lse of the flat softmax over the attendable slots of [lo(t), t]; full: lo = 0.
template <class Tin, bool kWindow>
__global__ void range_attention_kernel(LaunchParams p, float* o, float* lse) {
  extern __shared__ float smem[];
  int64_t t, h;
  if (!warp_item(p, t, h)) return;
  const SlotGeometry geo = geometry_of(p);
  const int64_t g = h / (p.Hq / p.Hkv);
  float* q = smem + (threadIdx.x / kWarp) * p.d;
  load_row(q, static_cast<const Tin*>(p.q) + (h * p.T + t) * p.d, static_cast<int>(p.d));
  const Tin* k = static_cast<const Tin*>(p.k) + g * p.T * p.d;
  const Tin* v = static_cast<const Tin*>(p.v) + g * p.T * p.dv;
  WarpSoftmax st;
  const int64_t lo = kWindow ? geo.window_left(t) : 0;
  attend_range(st, q, k, v, static_cast<int>(p.d), static_cast<int>(p.dv), lo, t, p.scale, geo);
  store_softmax(st, static_cast<int>(p.dv), o + (h * p.T + t) * p.dv, lse + h * p.T + t);
}

// L(t,c) = LSE over T_c of the logits, for c < |V(t)|; -inf for the other chunk columns.
template <class Tin>
__global__ void exact_mass_kernel(LaunchParams p, float* exact) {
  extern __shared__ float smem[];
  int64_t t, h;
  if (!warp_item(p, t, h)) return;
  const SlotGeometry geo = geometry_of(p);
  const int64_t g = h / (p.Hq / p.Hkv);
  float* q = smem + (threadIdx.x / kWarp) * p.d;
  load_row(q, static_cast<const Tin*>(p.q) + (h * p.T + t) * p.d, static_cast<int>(p.d));
  const Tin* k = static_cast<const Tin*>(p.k) + g * p.T * p.d;
  const int64_t n_chunks = geo.n_chunks();
  const int64_t n_cand = geo.candidate_count(t);
  float* row = exact + (h * p.T + t) * n_chunks;
  const int lane = threadIdx.x % kWarp;
  for (int64_t c = 0; c < n_cand; ++c) {
    WarpSoftmax st;
    attend_range<Tin>(st, q, k, nullptr, static_cast<int>(p.d), 0, c * p.S, c * p.S + p.S - 1,
                      p.scale, geo);
    if (lane == 0) row[c] = st.lse();
  }
  for (int64_t c = n_cand + lane; c < n_chunks; c += kWarp) row[c] = kNegInf;
}

unsigned blocks_for(const LaunchParams& p) {
  return static_cast<unsigned>((p.T * p.Hq + kWarpsPerBlock - 1) / kWarpsPerBlock);
}
size_t q_smem_bytes(const LaunchParams& p) { return kWarpsPerBlock * p.d * sizeof(float); }

}  // namespace

void launch_window(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  if (p.T * p.Hq == 0) return;
  auto kernel = p.bf16 ? range_attention_kernel<__nv_bfloat16, true>
                       : range_attention_kernel<float, true>;
  kernel<<<blocks_for(p), kWarpsPerBlock * kWarp, q_smem_bytes(p), stream>>>(p, o, lse);
}

void launch_full(const LaunchParams& p, float* o, float* lse, cudaStream_t stream) {
  if (p.T * p.Hq == 0) return;
  auto kernel = p.bf16 ? range_attention_kernel<__nv_bfloat16, false>
                       : range_attention_kernel<float, false>;
  kernel<<<blocks_for(p), kWarpsPerBlock * kWarp, q_smem_bytes(p), stream>>>(p, o, lse);
}

void launch_exact(const LaunchParams& p, float* exact, cudaStream_t stream) {
  if (p.T * p.Hq == 0) return;
  auto kernel = p.bf16 ? exact_mass_kernel<__nv_bfloat16> : exact_mass_kernel<float>;
  kernel<<<blocks_for(p), kWarpsPerBlock * kWarp, q_smem_bytes(p), stream>>>(p, exact);
}

}  // namespace hils::gpu::detail
