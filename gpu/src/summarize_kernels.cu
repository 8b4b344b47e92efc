// Chunk summaries (reference/SEMANTICS.md §3, Eq. 6 and Prop. 3.1): key k'_c and bias b'_c per
// (chunk, query head), and the surrogate scores s_hat = sigma q~ . k'_c + b'_c. One warp per item.
#include "device_common.cuh"
#include "key_rules.hpp"
#include "launch_params.hpp"

namespace hils::gpu::detail {
namespace {

// summarize_kernel's branches, one per rule of the GPU's list (key_rules.hpp), which the host
// checks before any launch: a rule added there needs its branch here, and a branch here its rule
// there (README "Adding a mechanism").
constexpr KeyRule kKeyTaylor = kGpuSummaryKeyRules[0], kKeyMean = kGpuSummaryKeyRules[1],
                  kKeyLandmark = kGpuSummaryKeyRules[2];
static_assert(kGpuSummaryKeyRuleCount == 3,
              "summarize_kernel has a branch for 3 summary key rules: give the new rule of "
              "kGpuSummaryKeyRules its branch, then count it here");
constexpr BiasRule kBiasEntropy = BiasRule::entropy;
constexpr PriorRule kPriorLandmarkQuery = PriorRule::landmark_query;

// mu_c of query head h: q~ at the landmark slot, or the given/shared prior row.
template <class Tin>
__device__ const Tin* prior_row(const LaunchParams& p, int64_t h, int64_t c) {
  if (p.prior_rule == kPriorLandmarkQuery)
    return static_cast<const Tin*>(p.q_retrieval) + (h * p.T + (c + 1) * p.S - 1) * p.d;
  const int64_t row = p.prior_rows == 1 ? 0 : c;
  return static_cast<const Tin*>(p.prior) + (h * p.prior_rows + row) * p.d;
}

// key [d] = mean of k_j over the attendable slots of chunk c (lanes own dims).
template <class Tin>
__device__ void mean_key(const LaunchParams& p, const SlotGeometry& geo, const Tin* k, int64_t c,
                         float* key) {
  const int lane = threadIdx.x % kWarp;
  for (int dim = lane; dim < p.d; dim += kWarp) {
    float acc = 0.0f;
    int count = 0;
    for (int64_t j = c * p.S; j < (c + 1) * p.S; ++j) {
      if (!geo.attendable(j)) continue;
      acc += to_float(k[j * p.d + dim]);
      ++count;
    }
    key[dim] = acc / static_cast<float>(count);
  }
}

template <class Tin>
__global__ void summarize_kernel(LaunchParams p, float* key_out, float* bias_out) {
  extern __shared__ float smem[];
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t n_chunks = geo.n_chunks();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= n_chunks * p.Hq) return;
  const int64_t h = item / n_chunks, c = item % n_chunks;
  const int64_t g = h / (p.Hq / p.Hkv);
  const int lane = threadIdx.x % kWarp;
  const int d = static_cast<int>(p.d);
  const Tin* k = static_cast<const Tin*>(p.k) + g * p.T * p.d;
  float* key = key_out + (h * n_chunks + c) * p.d;
  // p = softmax over T_c of sigma mu_c . k_j, with k itself as the values (the taylor key).
  WarpSoftmax st;
  const bool need_p = p.key_rule == kKeyTaylor || p.bias_rule == kBiasEntropy;
  if (need_p) {
    float* mu = smem + (threadIdx.x / kWarp) * p.d;
    load_row(mu, prior_row<Tin>(p, h, c), d);
    attend_range(st, mu, k, p.key_rule == kKeyTaylor ? k : nullptr, d, d, c * p.S,
                 c * p.S + p.S - 1, p.scale, geo);
  }
  if (p.key_rule == kKeyTaylor) {
#pragma unroll
    for (int r = 0; r < kDimRegs; ++r) {
      const int dim = lane + kWarp * r;
      if (dim < d) key[dim] = st.o[r] / st.l;
    }
  } else if (p.key_rule == kKeyMean) {
    mean_key(p, geo, k, c, key);
  } else if (p.key_rule == kKeyLandmark) {
    for (int dim = lane; dim < d; dim += kWarp) key[dim] = to_float(k[((c + 1) * p.S - 1) * p.d + dim]);
  }
  if (lane == 0) bias_out[h * n_chunks + c] = p.bias_rule == kBiasEntropy ? st.entropy() : 0.0f;
}

// s_hat(t,h,c) for c < |V(t)|, -inf elsewhere; one warp per (t, h), lanes over chunks.
template <class Tin>
__global__ void surrogate_kernel(LaunchParams p, const float* key, const float* bias,
                                 float* scores) {
  extern __shared__ float smem[];
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.T * p.Hq) return;
  const int64_t h = item / p.T, t = item % p.T;
  const int64_t n_chunks = geo.n_chunks();
  const int64_t n_cand = geo.candidate_count(t);
  float* q = smem + (threadIdx.x / kWarp) * p.d;
  load_row(q, static_cast<const Tin*>(p.q_retrieval) + (h * p.T + t) * p.d, static_cast<int>(p.d));
  float* row = scores + (h * p.T + t) * n_chunks;
  for (int64_t c = threadIdx.x % kWarp; c < n_chunks; c += kWarp) {
    const float* kc = key + (h * n_chunks + c) * p.d;
    row[c] = c < n_cand ? p.scale * dot_row(q, kc, static_cast<int>(p.d)) + bias[h * n_chunks + c]
                        : kNegInf;
  }
}

// The packed shapes (bf16, d = S = 64, taylor key): one block per (chunk, KV group) holds the
// chunk's 64 key rows in shared memory once for the G heads of the group; each warp folds one
// head at a time with lanes over keys for the logits (keys lane, lane + 32) and lanes over dims
// for k' (dims 2 lane, 2 lane + 1): about 0.4 k instructions per (chunk, head) against the
// generic kernel's serial per-key loop (gpu/NOTES.md, v9).
constexpr int kSummaryDim = 64;
constexpr int kSummaryPitch = 66;  // bf16 per row (33 words): lanes over rows or over words hit 32 banks

__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t word) {
  __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&word);
  return __bfloat1622float2(v);
}

__global__ void __launch_bounds__(kWarpsPerBlock * kWarp)
    summarize_packed_kernel(LaunchParams p, float* key_out, float* bias_out) {
  __shared__ __align__(16) __nv_bfloat16 ks[kSummaryDim][kSummaryPitch];
  __shared__ float mu[kWarpsPerBlock][kSummaryDim];
  __shared__ float pr[kWarpsPerBlock][kSummaryDim];
  const int64_t n_chunks = p.T / kSummaryDim, c = blockIdx.x, g = blockIdx.y;
  const int G = static_cast<int>(p.Hq / p.Hkv);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const auto* src = reinterpret_cast<const uint32_t*>(static_cast<const __nv_bfloat16*>(p.k) +
                                                      (g * p.T + c * kSummaryDim) * kSummaryDim);
  for (int w = threadIdx.x; w < kSummaryDim * kSummaryDim / 2; w += kWarpsPerBlock * kWarp)
    reinterpret_cast<uint32_t*>(ks[w / 32])[w % 32] = src[w];
  __syncthreads();
  for (int hh = warp; hh < G; hh += kWarpsPerBlock) {
    const int64_t h = g * G + hh;
    const float2 m2 =
        bf16x2_to_float2(reinterpret_cast<const uint32_t*>(prior_row<__nv_bfloat16>(p, h, c))[lane]);
    mu[warp][2 * lane] = m2.x, mu[warp][2 * lane + 1] = m2.y;
    __syncwarp();
    // Logits of keys lane and lane + 32 (the chunk is complete: with landmarks its slot 63 is
    // the landmark, not attendable); the same fmaf order over dims as dot_row.
    float s[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = lane + kWarp * r;
      const auto* row = reinterpret_cast<const uint32_t*>(ks[j]);
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kSummaryDim / 2; ++i) {
        const float2 kv = bf16x2_to_float2(row[i]);
        acc = fmaf(mu[warp][2 * i], kv.x, acc);
        acc = fmaf(mu[warp][2 * i + 1], kv.y, acc);
      }
      s[r] = p.landmarks && j == kSummaryDim - 1 ? kNegInf : p.scale * acc;
    }
    const float m = warp_max(fmaxf(s[0], s[1]));
    float pj[2], sum = 0.0f, ps = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      pj[r] = exp_diff(s[r], m);
      sum += pj[r];
      if (pj[r] > 0.0f) ps += pj[r] * (s[r] - m);
    }
    const float l = warp_sum(sum);
    ps = warp_sum(ps);
    pr[warp][lane] = pj[0], pr[warp][lane + kWarp] = pj[1];
    __syncwarp();
    // k' = sum_j p_j k_j / l, lanes over dims.
    float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll 16
    for (int j = 0; j < kSummaryDim; ++j) {
      const float2 kv = bf16x2_to_float2(reinterpret_cast<const uint32_t*>(ks[j])[lane]);
      acc.x = fmaf(pr[warp][j], kv.x, acc.x);
      acc.y = fmaf(pr[warp][j], kv.y, acc.y);
    }
    *reinterpret_cast<float2*>(key_out + (h * n_chunks + c) * kSummaryDim + 2 * lane) =
        make_float2(acc.x / l, acc.y / l);
    if (lane == 0)
      bias_out[h * n_chunks + c] = p.bias_rule == kBiasEntropy ? __logf(l) - ps / l : 0.0f;
    __syncwarp();  // mu and pr are rewritten for the next head
  }
}

}  // namespace

void launch_summarize(const LaunchParams& p, float* key, float* bias, cudaStream_t stream) {
  const int64_t items = (p.T / p.S) * p.Hq;
  if (items == 0) return;
  auto kernel = p.bf16 ? summarize_kernel<__nv_bfloat16> : summarize_kernel<float>;
  const unsigned blocks = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  kernel<<<blocks, kWarpsPerBlock * kWarp, kWarpsPerBlock * p.d * sizeof(float), stream>>>(
      p, key, bias);
}

bool summarize_packed_applies(const LaunchParams& p) {
  return p.bf16 && p.d == kSummaryDim && p.S == kSummaryDim && p.key_rule == kKeyTaylor;
}

void launch_summarize_packed(const LaunchParams& p, float* key, float* bias, cudaStream_t stream) {
  const int64_t n_chunks = p.T / p.S;
  if (n_chunks == 0) return;
  const dim3 grid(static_cast<unsigned>(n_chunks), static_cast<unsigned>(p.Hkv));
  summarize_packed_kernel<<<grid, kWarpsPerBlock * kWarp, 0, stream>>>(p, key, bias);
}

void launch_surrogate(const LaunchParams& p, const float* key, const float* bias, float* scores,
                      cudaStream_t stream) {
  if (p.T * p.Hq == 0 || p.T / p.S == 0) return;
  auto kernel = p.bf16 ? surrogate_kernel<__nv_bfloat16> : surrogate_kernel<float>;
  const unsigned blocks =
      static_cast<unsigned>((p.T * p.Hq + kWarpsPerBlock - 1) / kWarpsPerBlock);
  kernel<<<blocks, kWarpsPerBlock * kWarp, kWarpsPerBlock * p.d * sizeof(float), stream>>>(
      p, key, bias, scores);
}

}  // namespace hils::gpu::detail
