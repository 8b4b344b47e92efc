#include "mutation_study.hpp"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <random>
#include <stdexcept>

namespace hils::oracle::testing {

namespace {

// printf-style formatting into a std::string.
template <class... Args>
std::string format(const char* pattern, Args... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, pattern, args...);
  return buffer;
}

// Inputs with the KV heads in reverse order: query head h then reads KV head Hkv-1-h/G, the
// bug of a kernel that maps heads to groups the wrong way round.
AttentionInputs<double> reversed_kv_heads(AttentionInputs<double> inputs) {
  std::reverse(inputs.k.begin(), inputs.k.end());
  std::reverse(inputs.v.begin(), inputs.v.end());
  return inputs;
}

// Adds N(0, (size x max|v|)^2) noise to every element of o, seeded from the kind's name.
void add_value_noise(KernelOutputs& out, const AttentionInputs<double>& inputs, double size) {
  double max_v = 0;
  for (const auto& v : inputs.v) max_v = std::max(max_v, v.cwiseAbs().maxCoeff());
  std::mt19937_64 rng(cases::seed_of("value noise"));
  std::normal_distribution<double> gauss(0.0, size * max_v);
  for (auto& o : out.o) o = o.unaryExpr([&](double x) { return x + gauss(rng); });
}

// The fusion of every row with its last selected chunk dropped, the reported selection kept.
void drop_last_chunk(const MechanismSpec& spec, const AttentionInputs<float>& kernel_in,
                     KernelOutputs& out) {
  std::vector<IndexMatrix> dropped = out.selection;
  for (auto& sel : dropped)
    for (Eigen::Index row = 0; row < sel.rows(); ++row)
      for (Eigen::Index i = sel.cols() - 1; i >= 0; --i)
        if (sel(row, i) != -1) {
          sel(row, i) = -1;
          break;
        }
  const auto fused = forced_fusion(spec, kernel_in, dropped, all_queries(kernel_in.T()));
  for (size_t h = 0; h < fused.size(); ++h) {
    out.o[h] = fused[h].o.cast<double>();
    out.lse[h] = fused[h].lse.cast<double>();
  }
}

}  // namespace

std::string failed_checks(const Verdict& verdict) {
  // verdict -> "lse logit scale 2.1x, o 1.3x, selection": what failed, by how much.
  std::string out;
  auto add = [&](const std::string& what) { out += (out.empty() ? "" : ", ") + what; };
  if (!verdict.selection.passed) add("selection");
  for (const auto& t : verdict.tensors) {
    if (t.headroom > 1) add(format("%s %.2gx", t.name.c_str(), t.headroom));
    for (const auto& test : t.shift_tests)
      if (!test.passed) add(format("%s %s %.2gx", t.name.c_str(), test.name.c_str(), test.headroom()));
    if (t.headroom <= 1 && t.shift_passed() && !t.problems.empty()) add(t.name + " (pattern)");
  }
  return out;
}

std::string Claim::label() const { return to_string(precision) + "/" + to_string(score_precision); }

std::vector<Claim> study_claims() {
  const auto fp32 = InputPrecision::fp32, bf16 = InputPrecision::bf16;
  return {{fp32, fp32}, {bf16, fp32}, {bf16, bf16}};
}

std::vector<BugKind> bug_kinds() {
  // Graded kinds: the sizes of issue 13's sixteen (0.1, 0.3, 1) and a finer and coarser grade
  // around them, so that the smallest size caught moves when a tolerance loosens.
  const std::vector<double> graded = {0.03, 0.1, 0.3, 1, 3, 10};
  return {{"logit scale", "% of sigma", graded},
          {"logit scale, too small", "% of sigma", graded},
          {"value noise", "% of max|v| (std)", graded},
          {"extra softmax1 logit", "", {1}},
          {"missing softmax1 logit", "", {1}},
          {"one wrong chunk", "row", {1}},
          {"window W+S", "", {1}},
          {"window W+1", "", {1}},
          {"entropy bias dropped", "", {1}},
          {"mean keys for taylor", "", {1}},
          {"KV heads reversed", "", {1}},
          {"last chunk not fused", "", {1}},
          {"lse in log2 units", "", {1}}};
}

KernelOutputs minimal_outputs(const KernelOutputs& all) {
  KernelOutputs out;
  out.o = all.o;
  out.lse = all.lse;
  out.selection = all.selection;
  return out;
}

PlantedKernel planted_kernel(const BugKind& kind, double size, const MechanismSpec& spec,
                             const AttentionInputs<double>& inputs, const Claim& claim) {
  // bug, size, spec, inputs -> the declared spec and the buggy kernel's stored outputs.
  PlantedKernel planted{spec, {}};
  MechanismSpec run = spec;
  const std::string& k = kind.name;
  if (k == "logit scale") run.scale = (1.0 + size / 100.0) * logit_scale(spec, inputs.d());
  if (k == "logit scale, too small") run.scale = (1.0 - size / 100.0) * logit_scale(spec, inputs.d());
  if (k == "extra softmax1 logit") planted.declared.softmax1 = !(run.softmax1 = true);
  if (k == "missing softmax1 logit") planted.declared.softmax1 = !(run.softmax1 = false);
  if (k == "window W+S") run.W = spec.W + spec.S;
  if (k == "window W+1") run.W = spec.W + 1;
  if (k == "entropy bias dropped") run.bias_rule = BiasRule::none;
  if (k == "mean keys for taylor") run.key_rule = KeyRule::mean;
  const AttentionInputs<double> run_inputs = k == "KV heads reversed" ? reversed_kv_heads(inputs) : inputs;
  KernelOutputs out = float_kernel(run, run_inputs, claim.precision, claim.score_precision);
  const AttentionInputs<float> kernel_in = kernel_inputs(inputs, claim.precision);
  if (k == "value noise") add_value_noise(out, inputs, size / 100.0);
  if (k == "one wrong chunk") plant_wrong_chunk(spec, inputs, kernel_in, out);
  if (k == "last chunk not fused") drop_last_chunk(spec, kernel_in, out);
  if (k == "lse in log2 units")
    for (auto& lse : out.lse) lse *= 1.0 / std::log(2.0);
  planted.outputs = minimal_outputs(out);
  round_as_stored(spec, planted.outputs, claim.precision, claim.score_precision);
  return planted;
}

std::vector<PowerRow> power_study(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                                  const Claim& claim) {
  std::vector<PowerRow> rows;
  VerifyOptions options{claim.precision};
  options.score_precision = claim.score_precision;
  for (const auto& kind : bug_kinds()) {
    PowerRow row;
    row.kind = kind.name;
    row.unit = kind.unit;
    for (double size : kind.sizes) {
      const PlantedKernel planted = planted_kernel(kind, size, spec, inputs, claim);
      const Verdict verdict = verify(planted.declared, inputs, planted.outputs, options);
      const bool caught = !verdict.passed;
      bool caught_elementwise = !verdict.selection.passed;
      for (const auto& t : verdict.tensors) {
        size_t shift_failures = 0;
        for (const auto& test : t.shift_tests) shift_failures += test.passed ? 0 : 1;
        caught_elementwise = caught_elementwise || t.problems.size() > shift_failures;
      }
      if (caught_elementwise) row.caught_sizes_elementwise.push_back(size);
      if (caught_elementwise && row.smallest_caught_elementwise == 0)
        row.smallest_caught_elementwise = size;
      ++row.planted;
      if (caught) ++row.caught;
      if (caught) row.caught_sizes.push_back(size);
      if (caught && row.smallest_caught == 0) {
        row.smallest_caught = size;
        row.caught_by = failed_checks(verdict);
      }
    }
    rows.push_back(row);
  }
  return rows;
}

const PowerRow& row_of(const std::vector<PowerRow>& rows, const std::string& kind) {
  // rows, kind name -> that kind's row.
  for (const auto& r : rows)
    if (r.kind == kind) return r;
  throw std::logic_error("no bug kind " + kind);
}

int sixteen_caught(const std::vector<PowerRow>& rows, bool elementwise_only) {
  int caught = 0;
  for (const auto& r : rows)
    if (r.kind != "logit scale, too small")  // not one of issue 13's sixteen
    for (double size : elementwise_only ? r.caught_sizes_elementwise : r.caught_sizes)
      if (r.unit.find('%') == std::string::npos || size == 0.1 || size == 0.3 || size == 1.0) ++caught;
  return caught;
}

std::string format_power(const std::string& title, const std::vector<PowerRow>& rows) {
  auto smallest = [](const PowerRow& r, double size) {
    return size == 0 ? std::string("none") : r.unit.empty() ? std::string("yes") : format("%g %s", size, r.unit.c_str());
  };
  std::string out = title + "\n" + format("  %-24s %-22s %7s   %-22s %s\n", "bug", "smallest caught", "caught",
                                           "element-wise only", "failed at the smallest caught");
  for (const auto& r : rows)
    out += format("  %-24s %-22s %4d/%d   %-22s %s\n", r.kind.c_str(), smallest(r, r.smallest_caught).c_str(),
                  r.caught, r.planted, smallest(r, r.smallest_caught_elementwise).c_str(),
                  r.caught_by.c_str());
  return out;
}

CorrectCount correct_kernels(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                             const Claim& claim) {
  // spec, inputs, claim -> how many of the claim's correct kernels pass, and the worst.
  VerifyOptions options{claim.precision};
  options.score_precision = claim.score_precision;
  const bool bf16 = claim.precision == InputPrecision::bf16 || claim.score_precision == InputPrecision::bf16;
  const bool everywhere = claim.precision == InputPrecision::bf16 &&
                          claim.score_precision == InputPrecision::bf16 &&
                          spec.fusion == Fusion::hierarchical && spec.key_rule != KeyRule::exact;
  CorrectCount count;
  auto judge = [&](const std::string& what, const KernelOutputs& outputs) {
    const Verdict verdict = verify(spec, inputs, minimal_outputs(outputs), options);
    ++count.total;
    if (verdict.passed) ++count.passed;
    else count.failures += (count.failures.empty() ? "" : "; ") + what + ": " + failed_checks(verdict);
    for (const auto& t : verdict.tensors) {
      count.worst_elementwise = std::max(count.worst_elementwise, t.headroom);
      for (const auto& test : t.shift_tests)
        if (test.headroom() > count.worst_shift) {
          count.worst_shift = test.headroom();
          count.worst_shift_kernel = what + " (" + test.name + ")";
        }
    }
  };
  for (const auto rounding : {Bf16Rounding::nearest, Bf16Rounding::toward_zero}) {
    if (rounding == Bf16Rounding::toward_zero && !bf16) continue;
    const std::string how = rounding == Bf16Rounding::nearest ? "to nearest" : "truncating";
    judge("stores " + how, float_kernel(spec, inputs, claim.precision, claim.score_precision, rounding));
    if (everywhere) judge("bf16 everywhere " + how, bf16_everywhere_kernel(spec, inputs, rounding));
  }
  return count;
}

std::string format_summary(const std::string& title, const std::vector<SummaryRow>& rows) {
  std::string out = title + "\n" + format("  %-10s %-18s %-16s %-18s %s\n", "claim", "issue 13's bugs",
                                           "all mutants", "correct kernels", "worst headroom of a correct kernel");
  for (const auto& r : rows) {
    int caught = 0, planted = 0;
    for (const auto& p : r.power) {
      caught += p.caught;
      planted += p.planted;
    }
    out += format("  %-10s %2d/16 caught      %3d/%-3d caught   %2d/%-2d passed      "
                  "element-wise %.3g, statistics %.3g %s%s%s\n",
                  r.claim.label().c_str(), sixteen_caught(r.power), caught, planted,
                  r.correct.passed, r.correct.total, r.correct.worst_elementwise,
                  r.correct.worst_shift, r.correct.worst_shift_kernel.c_str(),
                  r.correct.failures.empty() ? "" : "; FAILED: ",
                  r.correct.failures.c_str());
  }
  return out;
}

}  // namespace hils::oracle::testing
