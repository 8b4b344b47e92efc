// Device helpers shared by the kernels: element loads, warp reductions, the slot geometry
// re-derived from reference/SEMANTICS.md §1–2 (never the reference's code), and a warp-wide online
// softmax.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace hils::gpu::detail {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
// Output dims a lane owns (lane, lane+32, ...): dv and d are limited to 32 * kDimRegs.
constexpr int kDimRegs = 8;
constexpr int kMaxDim = kWarp * kDimRegs;
constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kNaN = __builtin_nanf("");

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float warp_max(float x) {
  for (int off = kWarp / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int off = kWarp / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
// exp(a - b) that is 0 for a = -inf (also when b = -inf).
__device__ __forceinline__ float exp_diff(float a, float b) {
  return a == kNegInf ? 0.0f : __expf(a - b);
}

// Slot geometry of reference/SEMANTICS.md §1–2, computed from scratch in every kernel.
struct SlotGeometry {
  int64_t T, S, W;
  bool landmarks;

  __device__ __forceinline__ int64_t n_chunks() const { return T / S; }
  // Landmark slots are (c+1)S-1 of complete chunks only.
  __device__ __forceinline__ bool attendable(int64_t j) const {
    return !(landmarks && j < n_chunks() * S && (j % S) == S - 1);
  }
  // tau(t) = floor((t - W + 1) / S), floor division for negative numerators too.
  __device__ __forceinline__ int64_t window_edge_chunk(int64_t t) const {
    int64_t num = t - W + 1;
    return num >= 0 ? num / S : -((-num + S - 1) / S);
  }
  __device__ __forceinline__ int64_t window_left(int64_t t) const {
    int64_t tau = window_edge_chunk(t);
    return tau > 0 ? tau * S : 0;
  }
  // |V(t)| = max(0, min(tau(t), n_chunks)).
  __device__ __forceinline__ int64_t candidate_count(int64_t t) const {
    int64_t tau = window_edge_chunk(t);
    int64_t n = tau < n_chunks() ? tau : n_chunks();
    return n > 0 ? n : 0;
  }
};

// Running softmax of one warp over keys: max m, sum l = sum exp(s - m), o = sum exp(s - m) v
// (lane owns dims lane + 32 i), and ps = sum exp(s - m) (s - m) for the entropy.
struct WarpSoftmax {
  float m = kNegInf;
  float l = 0.0f;
  float ps = 0.0f;
  float o[kDimRegs] = {};

  __device__ __forceinline__ float lse() const { return l > 0.0f ? m + __logf(l) : kNegInf; }
  // H(p) = log l - ps / l.
  __device__ __forceinline__ float entropy() const { return l > 0.0f ? __logf(l) - ps / l : 0.0f; }
};

// q [d] (fp32, shared) . row [d] of `keys`.
template <class Tin>
__device__ __forceinline__ float dot_row(const float* q, const Tin* row, int d) {
  float acc = 0.0f;
  for (int i = 0; i < d; ++i) acc = fmaf(q[i], to_float(row[i]), acc);
  return acc;
}

// Folds the attendable slots of [lo, hi] into `st`: logits scale * q . k_j, values v_j
// (v may be null: masses only). One warp, 32 keys per step.
template <class Tin>
__device__ void attend_range(WarpSoftmax& st, const float* q, const Tin* k, const Tin* v, int d,
                             int dv, int64_t lo, int64_t hi, float scale,
                             const SlotGeometry& geo) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t base = lo; base <= hi; base += kWarp) {
    const int64_t j = base + lane;
    const bool valid = j <= hi && geo.attendable(j);
    const float s = valid ? scale * dot_row(q, k + j * d, d) : kNegInf;
    const float batch_max = warp_max(s);
    if (batch_max == kNegInf) continue;
    const float m_new = fmaxf(st.m, batch_max);
    const float alpha = exp_diff(st.m, m_new);
    const float p = valid ? __expf(s - m_new) : 0.0f;
    const float shift = st.m == kNegInf ? 0.0f : st.m - m_new;
    st.ps = alpha * (st.ps + st.l * shift) + warp_sum(valid ? p * (s - m_new) : 0.0f);
    st.l = st.l * alpha + warp_sum(p);
    st.m = m_new;
#pragma unroll
    for (int r = 0; r < kDimRegs; ++r) st.o[r] *= alpha;
    if (v == nullptr) continue;
    const int steps = hi - base + 1 < kWarp ? static_cast<int>(hi - base + 1) : kWarp;
    for (int jj = 0; jj < steps; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      if (pj == 0.0f) continue;
      const Tin* vrow = v + (base + jj) * dv;
#pragma unroll
      for (int r = 0; r < kDimRegs; ++r) {
        const int dim = lane + kWarp * r;
        if (dim < dv) st.o[r] = fmaf(pj, to_float(vrow[dim]), st.o[r]);
      }
    }
  }
}

// Copies row [d] of `src` into the warp's shared q buffer as fp32.
template <class Tin>
__device__ __forceinline__ void load_row(float* dst, const Tin* src, int d) {
  const int lane = threadIdx.x % kWarp;
  for (int i = lane; i < d; i += kWarp) dst[i] = to_float(src[i]);
  __syncwarp();
}

// Host side: kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization when after_previous, so that the kernel's blocks may launch while the previous
// kernel of the stream finishes (they wait for it in griddepcontrol.wait; CUDA graphs capture
// the edge). Returns the launch's error for the caller to report.
template <class... Params, class... Args>
cudaError_t launch_programmatic(bool after_previous, void (*kernel)(Params...), dim3 grid,
                                unsigned block, size_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = after_previous ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

// Host side: the current device's streaming multiprocessors. Throws, naming `who`, when the
// device cannot be queried (a kernel launched next could not run either).
inline int device_sm_count(const char* who) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess || sms <= 0)
    throw std::runtime_error(std::string(who) + ": cannot read the device's SM count: " +
                             (err != cudaSuccess ? cudaGetErrorString(err) : "0 SMs"));
  return sms;
}

// How many blocks of one kernel the device holds at once: what a persistent grid (one block per
// slot) or a one-wave grid sizes itself by.
struct Residency {
  int sms = 0;            // the device's streaming multiprocessors
  int blocks_per_sm = 0;  // the kernel's blocks one SM holds (0: it cannot launch with this shape)
  int64_t blocks() const { return static_cast<int64_t>(sms) * blocks_per_sm; }
};

// Host side: the Residency of `kernel` launched with `threads` threads and `smem` bytes of
// dynamic shared memory (its MaxDynamicSharedMemorySize attribute must already allow `smem`).
// Throws, naming `who`, when a query fails.
template <class Kernel>
Residency kernel_residency(Kernel kernel, int threads, size_t smem, const char* who) {
  Residency r;
  r.sms = device_sm_count(who);
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, kernel, threads, smem);
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(who) + ": occupancy query: " + cudaGetErrorString(err));
  return r;
}

}  // namespace hils::gpu::detail
