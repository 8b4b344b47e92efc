// A kernel author's harness in miniature: the reference run in float stands in for "my kernel";
// the oracle (data/verify_format.md, "The policy, in one place") must PASS it and FAIL the same
// outputs with one element of o moved, and PASS it on every hard case (hard_cases.hpp) of the
// spec's geometry. Exit 0 only when every verdict is as expected.
#include <cstdio>
#include <random>

#include "hils/analysis/hard_cases.hpp"
#include "hils/analysis/oracle.hpp"
#include "hils/hils.hpp"

namespace {

// Hq x [T x d] of normal numbers from `rng`.
std::vector<hils::Matrix<double>> random_heads(int64_t heads, int64_t T, int64_t d,
                                               std::mt19937& rng) {
  std::normal_distribution<double> normal;
  std::vector<hils::Matrix<double>> out(static_cast<size_t>(heads), hils::Matrix<double>(T, d));
  for (auto& m : out)
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return out;
}

// The "kernel": run_mechanism in float on the same inputs, widened to double for the oracle.
hils::oracle::KernelOutputs float_kernel(const hils::MechanismSpec& spec,
                                         const hils::AttentionInputs<double>& in) {
  hils::AttentionInputs<float> in32;
  for (const auto& x : in.q) in32.q.push_back(x.cast<float>());
  for (const auto& x : in.k) in32.k.push_back(x.cast<float>());
  for (const auto& x : in.v) in32.v.push_back(x.cast<float>());
  const auto out = hils::run_mechanism(spec, in32);
  hils::oracle::KernelOutputs kernel;
  for (const auto& head : out.heads) {
    kernel.o.push_back(head.o.cast<double>());
    kernel.lse.push_back(head.lse.cast<double>());
  }
  kernel.selection = out.selection;
  return kernel;
}

}  // namespace

int main() {
  hils::MechanismSpec spec = hils::preset("hils");
  spec.S = 16, spec.W = 32, spec.K = 4;
  std::mt19937 rng(19);
  hils::AttentionInputs<double> in;
  in.q = random_heads(4, 256, 32, rng), in.k = random_heads(2, 256, 32, rng);
  in.v = random_heads(2, 256, 32, rng);

  const hils::oracle::Verifier oracle(spec, in);
  hils::oracle::KernelOutputs kernel = float_kernel(spec, in);
  const hils::oracle::Verdict good = oracle.verify(kernel);
  kernel.o[1](200, 3) += 1e-3;  // one element, far above float's rounding
  const hils::oracle::Verdict bad = oracle.verify(kernel);
  std::printf("float reference as the kernel:\n%s\none element of o moved by 1e-3:\n%s\n",
              good.report().c_str(), bad.report().c_str());
  if (!good.passed || bad.passed) {
    std::printf("unexpected verdicts: %s, %s\n", good.passed ? "PASS" : "FAIL",
                bad.passed ? "PASS" : "FAIL");
    return 1;
  }
  const auto hard = hils::oracle::hard_cases(spec, {4, 2, 32, 32}, {hils::oracle::InputPrecision::fp32, 1, 1024});
  for (const auto& c : hard.cases) {
    const hils::oracle::Verdict verdict = hils::oracle::verify(spec, c.inputs, float_kernel(spec, c.inputs));
    if (!verdict.passed) {
      std::printf("hard case %s:\n%s\n", c.name.c_str(), verdict.report().c_str());
      return 1;
    }
  }
  std::printf("consumer: the oracle passes the float reference (also on %zu hard cases) and fails "
              "the moved output\n", hard.cases.size());
  return 0;
}
