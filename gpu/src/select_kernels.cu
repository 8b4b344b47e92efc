// Scoring and top-K per KV group (reference/SEMANTICS.md §4, Eq. 2, 8): one warp per (query slot t,
// group g). Pass 1 finds log Z_hat(t,h) per head, pass 2 ranks candidates by the group score and
// keeps the K best in shared memory; ties go to the lower chunk index.
#include "device_common.cuh"
#include "launch_params.hpp"

namespace hils::gpu::detail {
namespace {

constexpr GroupRule kGroupMaxNormalized = GroupRule::max_normalized,
                    kGroupSumProbabilities = GroupRule::sum_probabilities,
                    kGroupMaxRaw = GroupRule::max_raw;

// Per-warp shared buffers: q~ of the G heads, log Z_hat per head, the top-K list.
struct SelectScratch {
  float* q;       // [G, d]
  float* log_z;   // [G]
  float* value;   // [K]
  int32_t* index;  // [K]
};

__device__ SelectScratch scratch_of(float* smem, int64_t G, int64_t d, int64_t K) {
  const int64_t per_warp = G * d + G + 2 * K;
  float* base = smem + (threadIdx.x / kWarp) * per_warp;
  return SelectScratch{base, base + G * d, base + G * d + G,
                       reinterpret_cast<int32_t*>(base + G * d + G + K)};
}

// s_hat(t, h, c) of head `hg` of the group (0 <= hg < G).
struct ScoreSource {
  const LaunchParams& p;
  const float* key;
  const float* bias;
  const float* exact;
  const float* q;  // shared q~ [G, d]
  int64_t g, t, n_chunks, G;

  __device__ float operator()(int64_t hg, int64_t c) const {
    const int64_t h = g * G + hg;
    if (exact != nullptr) return exact[(h * p.T + t) * n_chunks + c];
    return p.scale * dot_row(q + hg * p.d, key + (h * n_chunks + c) * p.d, static_cast<int>(p.d)) +
           bias[h * n_chunks + c];
  }
};

// log Z_hat(t,h) = logaddexp(lse_swa, LSE over c < n_cand of s_hat), for each head of the group.
__device__ void group_normalizers(const ScoreSource& score, const float* lse_swa, int64_t n_cand,
                                  float* log_z) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t hg = 0; hg < score.G; ++hg) {
    float m = kNegInf, l = 0.0f;
    for (int64_t c = lane; c < n_cand; c += kWarp) {
      const float s = score(hg, c);
      const float m_new = fmaxf(m, s);
      l = l * exp_diff(m, m_new) + __expf(s - m_new);
      m = m_new;
    }
    const float m_all = fmaxf(warp_max(m), lse_swa[(score.g * score.G + hg) * score.p.T + score.t]);
    const float l_all = warp_sum(l * exp_diff(m, m_all)) +
                        exp_diff(lse_swa[(score.g * score.G + hg) * score.p.T + score.t], m_all);
    if (lane == 0) log_z[hg] = m_all + __logf(l_all);
  }
  __syncwarp();
}

// r(t,g,c) under the group rule.
__device__ float group_score(const ScoreSource& score, const float* log_z, GroupRule rule,
                            int64_t c) {
  float r = rule == kGroupSumProbabilities ? 0.0f : kNegInf;
  for (int64_t hg = 0; hg < score.G; ++hg) {
    const float s = score(hg, c);
    if (rule == kGroupMaxNormalized) r = fmaxf(r, s - log_z[hg]);
    else if (rule == kGroupSumProbabilities) r += __expf(s - log_z[hg]);
    else r = fmaxf(r, s);
  }
  return r;
}

// Position of the worst list entry: the lowest value, and of equal values the highest index.
__device__ int worst_entry(const SelectScratch& sc, int K) {
  const int lane = threadIdx.x % kWarp;
  float best_v = __builtin_huge_valf();
  int best_i = -1, best_pos = -1;
  for (int e = lane; e < K; e += kWarp) {
    const float v = sc.value[e];
    const int i = sc.index[e];
    if (v < best_v || (v == best_v && i > best_i)) best_v = v, best_i = i, best_pos = e;
  }
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best_v, off);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, off);
    const int pos = __shfl_xor_sync(0xffffffffu, best_pos, off);
    if (v < best_v || (v == best_v && i > best_i)) best_v = v, best_i = i, best_pos = pos;
  }
  return best_pos;
}

// Keeps the K best of the ascending candidate stream 0..n_cand-1 in sc.value/sc.index.
__device__ int top_k(const ScoreSource& score, const SelectScratch& sc, GroupRule rule, int K,
                     int64_t n_cand) {
  const int lane = threadIdx.x % kWarp;
  int n = 0, worst = -1;
  for (int64_t base = 0; base < n_cand; base += kWarp) {
    const int64_t c = base + lane;
    const float r = c < n_cand ? group_score(score, sc.log_z, rule, c) : kNegInf;
    const float worst_v = n == K ? sc.value[worst] : kNegInf;
    unsigned cand = __ballot_sync(0xffffffffu, c < n_cand && (n < K || r > worst_v));
    while (cand != 0u) {
      const int src = __ffs(cand) - 1;
      cand &= cand - 1;
      const float rv = __shfl_sync(0xffffffffu, r, src);
      // Later candidates have higher indices: only a strictly larger score displaces.
      if (n < K) {
        if (lane == 0) sc.value[n] = rv, sc.index[n] = static_cast<int32_t>(base + src);
        ++n;
      } else if (rv > sc.value[worst]) {
        if (lane == 0) sc.value[worst] = rv, sc.index[worst] = static_cast<int32_t>(base + src);
      } else {
        continue;
      }
      __syncwarp();
      if (n == K) worst = worst_entry(sc, K);
      __syncwarp();
    }
  }
  return n;
}

template <class Tin>
__global__ void select_kernel(LaunchParams p, const float* key, const float* bias,
                              const float* exact, const float* lse_swa, int32_t* selection,
                              float* selected_score) {
  extern __shared__ float smem[];
  const SlotGeometry geo{p.T, p.S, p.W, p.landmarks};
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.T * p.Hkv) return;
  const int64_t g = item / p.T, t = item % p.T, G = p.Hq / p.Hkv;
  const int K = static_cast<int>(p.K);
  const int lane = threadIdx.x % kWarp;
  const SelectScratch sc = scratch_of(smem, G, p.d, p.K);
  if (exact == nullptr)
    for (int64_t hg = 0; hg < G; ++hg)
      load_row(sc.q + hg * p.d,
               static_cast<const Tin*>(p.q_retrieval) + ((g * G + hg) * p.T + t) * p.d,
               static_cast<int>(p.d));
  const ScoreSource score{p, key, bias, exact, sc.q, g, t, geo.n_chunks(), G};
  const int64_t n_cand = geo.candidate_count(t);
  if (p.group_rule != kGroupMaxRaw) group_normalizers(score, lse_swa, n_cand, sc.log_z);
  const int n = top_k(score, sc, p.group_rule, K, n_cand);
  __syncwarp();
  // Ascending output: each entry's rank is the number of smaller indices.
  for (int e = lane; e < K; e += kWarp) {
    if (e >= n) {
      selection[(g * p.T + t) * K + e] = -1;
      for (int64_t hg = 0; hg < G; ++hg) selected_score[((g * G + hg) * p.T + t) * K + e] = kNegInf;
      continue;
    }
    const int32_t c = sc.index[e];
    int rank = 0;
    for (int f = 0; f < n; ++f) rank += sc.index[f] < c;
    selection[(g * p.T + t) * K + rank] = c;
    for (int64_t hg = 0; hg < G; ++hg)
      selected_score[((g * G + hg) * p.T + t) * K + rank] = score(hg, c);
  }
}

}  // namespace

void launch_select(const LaunchParams& p, const float* key, const float* bias,
                   const float* exact, const float* lse_swa, int32_t* selection,
                   float* selected_score, cudaStream_t stream) {
  if (p.T * p.Hkv == 0 || p.K == 0) return;
  auto kernel = p.bf16 ? select_kernel<__nv_bfloat16> : select_kernel<float>;
  const int64_t G = p.Hq / p.Hkv;
  const size_t smem = kWarpsPerBlock * (G * p.d + G + 2 * p.K) * sizeof(float);
  const unsigned blocks =
      static_cast<unsigned>((p.T * p.Hkv + kWarpsPerBlock - 1) / kWarpsPerBlock);
  kernel<<<blocks, kWarpsPerBlock * kWarp, smem, stream>>>(p, key, bias, exact, lse_swa,
                                                           selection, selected_score);
}

}  // namespace hils::gpu::detail
