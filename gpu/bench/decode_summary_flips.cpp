// How the decode cache's compact summaries change a decode step's selection on the benchmark's
// inputs (gpu/bench/bench_decode.py: k' and q bf16 from N(0, 1), b' from U(0, 3), K/V bf16 from
// N(0, 1); hils preset: sigma = 1/sqrt(d), max_normalized group rule, log Z_hat with the window's
// lse). Same distributions as the benchmark, not its numbers (std::mt19937_64, not torch's
// generator). For each (sequence, KV group) the K best chunks are selected from scores computed
// in double from k' as stored: bf16 (the exact reference here), fp8 e4m3 with the per-row
// power-of-two scale, int4 (-7..7) with the per-row fp32 scale max |k'| / 7
// (the oracle's fp8_row_scale, round_to_fp8_e4m3, int4_row_scale and int4_code, as `hils verify`
// reads them back). Prints how many selections differ, the worst swap's margin in the exact
// group score r against the oracle's margin bound for that precision (data/verify_format.md),
// and the share of the exact top-K's mass sum exp(r) that the chosen chunks keep.
// Built with the project (target decode_summary_flips, analysis/CMakeLists.txt; ~1 min at B = 8,
// 512K): ./build/bin/decode_summary_flips [B] [T]
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "hils/analysis/oracle.hpp"

namespace {

constexpr int kHq = 16, kHkv = 2, kG = kHq / kHkv, kD = 64, kS = 64, kK = 32, kW = 512;

// The benchmark draws fp32 values and rounds them to bf16 (torch's conversion); the oracle's
// rounding applied to the fp32 value does the same.
double round_to_bf16(double x) { return hils::oracle::round_to_bf16(static_cast<float>(x)); }

using hils::oracle::fp8_row_scale;
using hils::oracle::int4_code;
using hils::oracle::int4_row_scale;
using hils::oracle::round_to_fp8_e4m3;

enum Store { kBf16, kFp8, kInt4, kStores };
const char* const kNames[kStores] = {"bf16", "fp8_e4m3", "int4"};

std::vector<int> top_k(const std::vector<double>& r) {
  std::vector<int> order(r.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + kK, order.end(),
                    [&](int a, int b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
  order.resize(kK);
  std::sort(order.begin(), order.end());
  return order;
}

double log_sum_exp(const std::vector<double>& x, double extra) {
  double top = extra;
  for (double v : x) top = std::max(top, v);
  double sum = std::exp(extra - top);
  for (double v : x) sum += std::exp(v - top);
  return top + std::log(sum);
}

}  // namespace

// argv[i] as an integer in [lo, hi], or exit 2 naming the argument and the expected range.
int64_t integer_argument(const char* text, const char* name, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < lo || value > hi) {
    std::fprintf(stderr, "decode_summary_flips: %s: expected an integer in [%lld, %lld], got '%s'\n",
                 name, static_cast<long long>(lo), static_cast<long long>(hi), text);
    std::exit(2);
  }
  return value;
}

int main(int argc, char** argv) {
  if (argc > 3 || (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0))) {
    std::printf("usage: decode_summary_flips [B] [T]\n  B sequences (default 8, 1..1024), T cache slots "
                "(default 524288, %d..%d):\n  how fp8 and int4 summaries change a decode step's "
                "selection on bench_decode.py's inputs.\n", kW + (kK + 1) * kS, 1 << 24);
    return argc > 3 ? 2 : 0;
  }
  // T: enough candidates for K + 1 chunks; at most 2^24 slots (~100 MB of keys per head group).
  const int B = static_cast<int>(argc > 1 ? integer_argument(argv[1], "B", 1, 1024) : 8);
  const int64_t T = argc > 2 ? integer_argument(argv[2], "T", kW + (kK + 1) * kS, int64_t{1} << 24) : 524288;
  const int64_t n_cand = (T - kW) / kS;  // chunks wholly before the window (the decode kernels' V)
  const double sigma = 1.0 / std::sqrt(static_cast<double>(kD));
  const double entropy_bias = std::log(static_cast<double>(kS)) + 1.0;  // the oracle's bias term
  std::mt19937_64 rng(0x5eed15);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 3.0);
  int64_t differs[kStores] = {}, chunks_differ[kStores] = {}, beyond_bound[kStores] = {};
  int64_t int4_vs_fp8 = 0, groups = 0;
  double worst_margin[kStores] = {}, smallest_bound[kStores] = {1e300, 1e300, 1e300};
  double min_recall[kStores] = {1, 1, 1}, sum_recall[kStores] = {};
  std::vector<double> key(static_cast<size_t>(n_cand) * kD), stored(key.size());
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < kHkv; ++g) {
      std::vector<std::vector<double>> r(kStores, std::vector<double>(n_cand, -INFINITY));
      std::vector<double> a_elem(n_cand, 0.0), a_row(n_cand, 0.0);  // conditioning A, A_row
      std::vector<std::vector<double>> window_keys(kW, std::vector<double>(kD));
      for (auto& k : window_keys)
        for (double& x : k) x = round_to_bf16(gauss(rng));
      for (int h = 0; h < kG; ++h) {
        double q[kD], q_abs_sum = 0;
        for (double& x : q) x = round_to_bf16(gauss(rng)), q_abs_sum += std::fabs(x);
        for (double& x : key) x = round_to_bf16(gauss(rng));
        std::vector<double> bias(n_cand);
        for (double& x : bias) x = uniform(rng);
        std::vector<double> window_logits;
        for (const auto& k : window_keys) {
          double dot = 0;
          for (int i = 0; i < kD; ++i) dot += q[i] * k[i];
          window_logits.push_back(sigma * dot);
        }
        const double lse_window = log_sum_exp(window_logits, -INFINITY);
        for (int store = 0; store < kStores; ++store) {
          std::vector<double> s(n_cand);
          for (int64_t c = 0; c < n_cand; ++c) {
            const double* row = &key[c * kD];
            double amax = 0;
            for (int i = 0; i < kD; ++i) amax = std::max(amax, std::fabs(row[i]));
            double dot = 0, dot_abs = 0;
            const double s8 = fp8_row_scale(amax);
            const float s4 = int4_row_scale(amax);
            for (int i = 0; i < kD; ++i) {
              const double k = store == kBf16  ? row[i]
                               : store == kFp8 ? round_to_fp8_e4m3(row[i] / s8) * s8
                                               : int4_code(row[i], s4) * static_cast<double>(s4);
              dot += q[i] * k;
              dot_abs += std::fabs(q[i] * row[i]);
            }
            s[c] = sigma * dot + bias[c];
            if (store == kBf16) {
              a_elem[c] = std::max(a_elem[c], sigma * dot_abs + entropy_bias);
              a_row[c] = std::max(a_row[c], sigma * q_abs_sum * amax + entropy_bias);
            }
          }
          const double log_z = log_sum_exp(s, lse_window);
          for (int64_t c = 0; c < n_cand; ++c) r[store][c] = std::max(r[store][c], s[c] - log_z);
        }
      }
      ++groups;
      const std::vector<int> exact = top_k(r[kBf16]);
      double exact_mass = 0;
      for (int c : exact) exact_mass += std::exp(r[kBf16][c]);
      const double max_a_elem = *std::max_element(a_elem.begin(), a_elem.end());
      const double max_a_row = *std::max_element(a_row.begin(), a_row.end());
      std::vector<int> chosen[kStores];
      for (int store = 0; store < kStores; ++store) {
        chosen[store] = top_k(r[store]);
        double mass = 0;
        for (int c : chosen[store]) mass += std::exp(r[kBf16][c]);
        min_recall[store] = std::min(min_recall[store], mass / exact_mass);
        sum_recall[store] += mass / exact_mass;
        if (chosen[store] == exact) continue;
        ++differs[store];
        // The worst swap: the weakest chosen chunk against the strongest missed one (exact r).
        double weakest = INFINITY, strongest = -INFINITY;
        int w = -1, m = -1;
        for (int c : chosen[store])
          if (!std::binary_search(exact.begin(), exact.end(), c)) {
            ++chunks_differ[store];
            if (r[kBf16][c] < weakest) weakest = r[kBf16][c], w = c;
          }
        for (int c : exact)
          if (!std::binary_search(chosen[store].begin(), chosen[store].end(), c) && r[kBf16][c] > strongest)
            strongest = r[kBf16][c], m = c;
        const double margin = strongest - weakest;
        // The oracle's bound (margin units 2, G > 1: + the largest A), float's own error left out.
        const double bound = store == kFp8 ? 2 * 0x1p-4 * (a_elem[w] + a_elem[m] + max_a_elem)
                                           : 2 * (1.0 / 14.0) * (a_row[w] + a_row[m] + max_a_row);
        worst_margin[store] = std::max(worst_margin[store], margin);
        smallest_bound[store] = std::min(smallest_bound[store], bound);
        beyond_bound[store] += margin > bound;
      }
      int4_vs_fp8 += chosen[kInt4] != chosen[kFp8];
    }
  std::printf("B = %d, T = %lld (%lld candidates), Hq %d, Hkv %d, d %d, S %d, K %d, W %d: %lld group "
              "selections\n", B, static_cast<long long>(T), static_cast<long long>(n_cand), kHq, kHkv,
              kD, kS, kK, kW, static_cast<long long>(groups));
  for (int store = kFp8; store < kStores; ++store)
    std::printf("%-8s: %lld of %lld selections differ from bf16's (%lld of %lld chunks), worst swap "
                "margin %.3f (oracle bound there >= %.3f; %lld swaps beyond it); kept share of the "
                "exact top-K's mass: mean %.5f, min %.5f\n",
                kNames[store], static_cast<long long>(differs[store]), static_cast<long long>(groups),
                static_cast<long long>(chunks_differ[store]), static_cast<long long>(groups * kK),
                worst_margin[store], differs[store] ? smallest_bound[store] : 0.0,
                static_cast<long long>(beyond_bound[store]), sum_recall[store] / groups,
                min_recall[store]);
  std::printf("int4 against fp8: %lld of %lld selections differ\n", static_cast<long long>(int4_vs_fp8),
              static_cast<long long>(groups));
  return 0;
}
