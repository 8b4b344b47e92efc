// Benchmark of the double reference: full causal attention, exact chunk log-masses and the
// backward (full attention; hils next to its forward) against an Eigen double matrix product
// measured in the same run (target: >= 80% of its rate at T=16384 for the forward stages;
// README "The reference's speed" has the measured ratios).
//
// Two ratios per stage: by wall time (what a user waits) and by CPU time of the process (all
// threads; OpenMP's waiting counts), which on a shared machine is far less sensitive to other
// programs taking the cores away mid-run than the wall-time ratio.
//
// usage: bench_reference [--quick]     (--quick: T = 4096 only)
#include <omp.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "hils/hils.hpp"

using namespace hils;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds of this process so far (every thread).
double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Linux: writing 5 to clear_refs resets the peak resident set (VmHWM) of this process.
void reset_peak_memory() { std::ofstream("/proc/self/clear_refs") << "5"; }

double peak_memory_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

Matrix<double> gaussian(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss;
  Matrix<double> m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = gauss(rng);
  return m;
}

// Every thread multiplies its own n x n matrices `reps` times: the machine's dgemm rate through
// Eigen with the same compiler flags as the reference. The products' outputs are written once
// before the clock starts: their first-touch page faults (~30 us per 4 KiB page in the VM this
// was measured on, ~0.15 s for 18 MiB) are not matrix-product time and would lower the rate.
struct Rate {
  double wall, cpu;  // GFLOP/s per wall second, GFLOP per CPU second (all threads)
};
Rate matmul_gflops(int64_t n, int reps) {
  const int threads = omp_get_max_threads();
  std::vector<Matrix<double>> a, b, c;
  for (int i = 0; i < threads; ++i) {
    a.push_back(gaussian(n, n, 11 + i));
    b.push_back(gaussian(n, n, 97 + i));
    c.push_back(Matrix<double>::Zero(n, n));
  }
  const double cpu_start = cpu_seconds();
  auto start = Clock::now();
#pragma omp parallel
  {
    const int id = omp_get_thread_num();
    for (int r = 0; r < reps; ++r) c[static_cast<size_t>(id)].noalias() = a[id] * b[id];
  }
  const double elapsed = seconds_since(start), cpu = cpu_seconds() - cpu_start;
  const double gflop = 2.0 * n * n * n * reps * threads / 1e9;
  return {gflop / elapsed, gflop / cpu};
}

struct Row {
  const char* what;
  int64_t T, d;
  double seconds, gflops, peak_mib;
  double cpu_gflops = 0;  // GFLOP per CPU second
};

Row time_full(int64_t T, int64_t d) {
  const Geometry g(T, 64, 512, false);
  auto q = gaussian(T, d, 1), k = gaussian(T, d, 2), v = gaussian(T, d, 3);
  reset_peak_memory();
  const double cpu_start = cpu_seconds();
  auto start = Clock::now();
  auto out = full_attention<double>(q, k, v, g, 1.0 / std::sqrt(double(d)), {});
  const double s = seconds_since(start), cpu = cpu_seconds() - cpu_start;
  // Causal: T(T+1)/2 logits, each 2d flops for q.k and 2d for p.v.
  const double flops = double(T) * double(T + 1) / 2.0 * 4.0 * double(d);
  if (!out.lse.allFinite()) std::printf("warning: non-finite lse\n");
  return {"full attention", T, d, s, flops / s / 1e9, peak_memory_mib(), flops / cpu / 1e9};
}

Row time_chunk_mass(int64_t T, int64_t d) {
  const Geometry g(T, 64, 512, false);
  auto q = gaussian(T, d, 4), k = gaussian(T, d, 5);
  reset_peak_memory();
  const double cpu_start = cpu_seconds();
  auto start = Clock::now();
  auto masses = exact_chunk_log_mass<double>(q, k, g, 1.0 / std::sqrt(double(d)), {});
  const double s = seconds_since(start), cpu = cpu_seconds() - cpu_start;
  // Useful work only: 2d flops per (query, token of a candidate chunk).
  double logits = 0;
  for (int64_t t = 0; t < T; ++t) logits += double(g.candidate_count(t) * g.tokens_per_chunk());
  if (masses.rows() != T) std::printf("warning: wrong shape\n");
  const double flops = 2.0 * double(d) * logits;
  return {"exact chunk log-mass", T, d, s, flops / s / 1e9, peak_memory_mib(), flops / cpu / 1e9};
}

// Upstream gradient and inputs of one head (Hq = Hkv = 1) for the backward rows.
struct OneHead {
  AttentionInputs<double> inputs;
  OutputGradients<double> grads;
};
OneHead one_head(int64_t T, int64_t d, uint64_t seed) {
  OneHead p;
  p.inputs.q = {gaussian(T, d, seed)};
  p.inputs.k = {gaussian(T, d, seed + 1)};
  p.inputs.v = {gaussian(T, d, seed + 2)};
  p.grads.d_o = {gaussian(T, d, seed + 3)};
  p.grads.d_lse = {Vector<double>(gaussian(T, 1, seed + 4))};
  return p;
}

Row time_full_backward(int64_t T, int64_t d) {
  MechanismSpec spec = preset("full");
  const OneHead p = one_head(T, d, 7);
  const auto forward = run_mechanism(spec, p.inputs);  // saved o, lse, as a training step has
  reset_peak_memory();
  const double cpu_start = cpu_seconds();
  auto start = Clock::now();
  const auto g = run_mechanism_backward(spec, p.inputs, {}, p.grads, &forward);
  const double s = seconds_since(start), cpu = cpu_seconds() - cpu_start;
  // FlashAttention's count of useful backward work: per causal logit, 2d flops each for
  // q.k, do.v, dv, dq and dk (2.5 x the forward): what the fused double pass does
  // (reference/src/fused_backward.hpp); the Eigen path does 14d, q.k and do.v once for dq (pass 1)
  // and once more for dk, dv (pass 2), so that no two units write one output.
  const double flops = double(T) * double(T + 1) / 2.0 * 10.0 * double(d);
  if (!g.dq[0].allFinite()) std::printf("warning: non-finite dq\n");
  return {"backward, full", T, d, s, flops / s / 1e9, peak_memory_mib(), flops / cpu / 1e9};
}

// hils (S = 64, W = 512, K = 16, landmarks): backward seconds next to the forward's, by wall
// time and by CPU time.
void time_hils_backward(int64_t T, int64_t d) {
  MechanismSpec spec = preset("hils");
  spec.S = 64;
  spec.W = 512;
  spec.K = 16;
  const OneHead p = one_head(T, d, 17);
  RunOptions keep;
  keep.keep_window = true;  // the backward reads the window branch instead of recomputing it
  auto start = Clock::now();
  double cpu = cpu_seconds();
  const auto forward = run_mechanism(spec, p.inputs, keep);
  const double forward_s = seconds_since(start), forward_cpu = cpu_seconds() - cpu;
  start = Clock::now();
  cpu = cpu_seconds();
  const auto g = run_mechanism_backward(spec, p.inputs, forward.selection, p.grads, &forward);
  const double backward_s = seconds_since(start), backward_cpu = cpu_seconds() - cpu;
  if (!g.dk[0].allFinite()) std::printf("warning: non-finite dk\n");
  std::printf("hils T=%ld d=%ld (S=64 W=512 K=16): forward %.3f s, backward %.3f s (%.2fx); "
              "CPU seconds %.3f, %.3f (%.2fx)\n",
              long(T), long(d), forward_s, backward_s, backward_s / forward_s, forward_cpu,
              backward_cpu, backward_cpu / forward_cpu);
}

}  // namespace

int main(int argc, char** argv) {
  // Was: any argument but --quick (say --help) started the full benchmark, minutes long.
  const char* usage =
      "usage: bench_reference [--quick]\n"
      "  times full causal attention, the exact chunk log-masses and the backward (one head,\n"
      "  S = 64, W = 512; T = 4096 and 16384, d = 64 and 128) against an Eigen dgemm in the\n"
      "  same run, on all cores (OMP_NUM_THREADS); --quick: T = 4096 only\n";
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf("%s", usage);
    return 0;
  }
  if (argc > 2 || (argc == 2 && std::strcmp(argv[1], "--quick") != 0)) {
    std::fprintf(stderr, "bench_reference: unknown argument '%s'\n%s", argv[argc - 1], usage);
    return 2;
  }
  const bool quick = argc > 1;
  std::printf("threads: %d\n", omp_get_max_threads());
  const Rate gemm_before = matmul_gflops(1536, 3);
  std::vector<Row> rows;
  for (int64_t T : quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 16384})
    for (int64_t d : {64, 128}) {
      rows.push_back(time_full(T, d));
      rows.push_back(time_chunk_mass(T, d));
      rows.push_back(time_full_backward(T, d));
    }
  for (int64_t T : quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 16384})
    time_hils_backward(T, 64);
  const Rate gemm_after = matmul_gflops(1536, 3);
  const double gemm = 0.5 * (gemm_before.wall + gemm_after.wall);
  const double gemm_cpu = 0.5 * (gemm_before.cpu + gemm_after.cpu);
  std::printf("Eigen dgemm 1536^3: %.1f GFLOP/s before, %.1f after (mean %.1f); per CPU second "
              "%.1f, %.1f (mean %.1f)\n",
              gemm_before.wall, gemm_after.wall, gemm, gemm_before.cpu, gemm_after.cpu, gemm_cpu);
  std::printf("%-22s %6s %4s %9s %9s %9s %9s %10s\n", "stage", "T", "d", "seconds", "GFLOP/s",
              "of dgemm", "(by CPU)", "peak MiB");
  for (const auto& r : rows)
    std::printf("%-22s %6ld %4ld %9.3f %9.1f %8.0f%% %8.0f%% %10.1f\n", r.what, long(r.T),
                long(r.d), r.seconds, r.gflops, 100.0 * r.gflops / gemm,
                100.0 * r.cpu_gflops / gemm_cpu, r.peak_mib);
  return 0;
}
