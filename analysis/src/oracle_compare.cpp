// The oracle's element-wise comparison of one tensor, its tolerances and the printed report.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "hils/analysis/oracle.hpp"
#include "text_format.hpp"

namespace hils::oracle {

namespace {

using detail::format;

std::string where(const std::string& row_label, const std::vector<int64_t>& row_ids, size_t h,
                  Eigen::Index row, Eigen::Index col) {
  const long long id = row_ids.empty() ? row : row_ids[static_cast<size_t>(row)];
  return format("h=%zu %s=%lld col=%lld", h, row_label.c_str(), id, static_cast<long long>(col));
}

// Running statistics of one comparison.
struct Accumulator {
  double max_abs = 0, max_rel = 0, sum_sq_err = 0, sum_sq_truth = 0, baseline_max_abs = 0;
  int64_t count = 0, nan_count = 0, inf_count = 0, zero_count = 0, truth_nonzero = 0;
  int64_t pattern_errors = 0;
  std::string first_nan, first_inf, worst_where;
  double worst_kernel = 0, worst_truth = 0;
  std::vector<std::string> pattern_messages;
};

// Folds element (h,row,col) into the statistics.
template <class WhereText>
void accumulate(Accumulator& acc, double kernel, double truth, double baseline, double rel_floor,
                const std::string& name, const WhereText& at, int64_t max_messages) {
  ++acc.count;
  if (kernel == 0.0) ++acc.zero_count;
  if (truth != 0.0) ++acc.truth_nonzero;
  if (std::isnan(kernel)) {
    if (acc.nan_count++ == 0) acc.first_nan = at();
    return;
  }
  if (std::isinf(truth) || std::isinf(kernel)) {
    // -inf marks "not a candidate": the kernel must agree exactly.
    if (kernel == truth) return;
    if (!std::isinf(truth)) {
      if (acc.inf_count++ == 0) acc.first_inf = at() + format(" (%g, reference %.9g)", kernel, truth);
      return;
    }
    if (acc.pattern_errors++ < max_messages)
      acc.pattern_messages.push_back(
          format("%s at %s should be %g (chunk outside V(t)), got %.9g", name.c_str(),
                 at().c_str(), truth, kernel));
    return;
  }
  const double err = std::fabs(kernel - truth);
  if (err > acc.max_abs || acc.worst_where.empty()) {
    acc.max_abs = err;
    acc.worst_where = at();
    acc.worst_kernel = kernel;
    acc.worst_truth = truth;
  }
  acc.max_rel = std::max(acc.max_rel, err / std::max(std::fabs(truth), rel_floor));
  acc.sum_sq_err += err * err;
  acc.sum_sq_truth += truth * truth;
  if (std::isfinite(baseline)) acc.baseline_max_abs = std::max(acc.baseline_max_abs, std::fabs(baseline - truth));
}

// The problems that fail a tensor regardless of the tolerance.
std::vector<std::string> problems_of(const Accumulator& acc, const std::string& name) {
  std::vector<std::string> problems;
  if (acc.nan_count > 0)
    problems.push_back(format("%s contains NaN at %s (%lld NaN elements)", name.c_str(),
                              acc.first_nan.c_str(), static_cast<long long>(acc.nan_count)));
  if (acc.inf_count > 0)
    problems.push_back(format("%s contains Inf where the reference is finite, first at %s "
                              "(%lld elements)", name.c_str(), acc.first_inf.c_str(),
                              static_cast<long long>(acc.inf_count)));
  for (const auto& m : acc.pattern_messages) problems.push_back(m);
  if (acc.pattern_errors > static_cast<int64_t>(acc.pattern_messages.size()))
    problems.push_back(format("%s: %lld elements disagree on -inf in total", name.c_str(),
                              static_cast<long long>(acc.pattern_errors)));
  if (acc.count > 0 && acc.zero_count == acc.count && acc.truth_nonzero > 0)
    problems.push_back(format("%s is all zeros (%lld elements) while the reference is not: "
                              "was the output written?", name.c_str(),
                              static_cast<long long>(acc.count)));
  return problems;
}

// Shape agreement of kernel heads with the truth; the problems found (empty when they agree).
std::vector<std::string> shape_problems(const std::string& name,
                                        const std::vector<Matrix<double>>& kernel,
                                        const std::vector<Matrix<double>>& truth) {
  if (kernel.size() != truth.size())
    return {format("%s: expected %zu heads, got %zu", name.c_str(), truth.size(), kernel.size())};
  for (size_t h = 0; h < truth.size(); ++h)
    if (kernel[h].rows() != truth[h].rows() || kernel[h].cols() != truth[h].cols())
      return {format("%s: head %zu has shape [%lld x %lld], expected [%lld x %lld]", name.c_str(), h,
                     static_cast<long long>(kernel[h].rows()), static_cast<long long>(kernel[h].cols()),
                     static_cast<long long>(truth[h].rows()), static_cast<long long>(truth[h].cols()))};
  return {};
}

}  // namespace

std::optional<Bf16Rounding> bf16_store_rounding(const std::vector<Matrix<double>>& kernel,
                                                const std::vector<Matrix<double>>& truth) {
  // kernel, truth (equal shapes) -> the rounding of a bf16 store, nullopt when not bf16.
  double lean = 0;  // sum of -(kernel - truth) sign(truth) / ulp(truth)
  int64_t count = 0;
  for (size_t h = 0; h < truth.size() && h < kernel.size(); ++h)
    for (Eigen::Index i = 0; i < truth[h].size() && i < kernel[h].size(); ++i) {
      const double k = kernel[h].data()[i], t = truth[h].data()[i];
      if (!std::isfinite(k) || !std::isfinite(t)) continue;
      if (round_to_bf16(k) != k) return std::nullopt;
      if (t == 0.0) continue;
      int exponent = 0;
      std::frexp(t, &exponent);
      lean -= (k - t) * std::copysign(1.0, t) / std::ldexp(1.0, exponent - 8);
      ++count;
    }
  if (count == 0) return std::nullopt;
  return lean / static_cast<double>(count) > 0.25 ? Bf16Rounding::toward_zero : Bf16Rounding::nearest;
}

std::string describe_store(const std::optional<Bf16Rounding>& rounding) {
  if (!rounding) return "fp32";
  return *rounding == Bf16Rounding::nearest ? "bf16 (to nearest)" : "bf16 (toward zero)";
}

std::string to_string(Bf16RoundingClaim claim) {
  switch (claim) {
    case Bf16RoundingClaim::detect: return "detect";
    case Bf16RoundingClaim::any: return "any";
    case Bf16RoundingClaim::nearest: return "nearest";
    case Bf16RoundingClaim::toward_zero: return "toward_zero";
  }
  return "detect";
}

Bf16RoundingClaim parse_bf16_rounding(const std::string& text, const std::string& field) {
  for (auto claim : {Bf16RoundingClaim::detect, Bf16RoundingClaim::any, Bf16RoundingClaim::nearest,
                     Bf16RoundingClaim::toward_zero})
    if (text == to_string(claim)) return claim;
  throw InvalidArgument(field + ": expected \"detect\", \"any\", \"nearest\" or \"toward_zero\", got \"" +
                        text + "\"");
}

PrecisionRow precision_row(InputPrecision precision) {
  // The units, each with its reason (data/verify_format.md "Floor" and its list of stores):
  //   fp32 2^-24, bf16 2^-8: half an ulp (24 and 8 significand bits incl. the implicit one);
  //   fp8_e4m3 2^-4 (4 significand bits; k' stored in e4m3 with a per-row power-of-two scale);
  //   int4 1/14 of the row's largest |entry| (4-bit codes -7..7 times the fp32 scale max |k'| /
  //     7: rounding to nearest is off by half a step on every entry);
  //   int4_h (1 + 2^-10) / 14 (int4's codes against s16, int4's s rounded up to fp16: s16 <
  //     s (1 + 2^-10); b' read in fp16 too).
  //   fp16 2^-11 (11 significand bits): an input precision only (its subnormals, below 2^-14,
  //     err absolutely: Tolerances::subnormal_probability_units).
  using enum InputPrecision;
  switch (precision) {
    case fp32: return {"fp32", 0x1p-24, true};
    case bf16: return {"bf16", 0x1p-8, true};
    case fp8_e4m3: return {"fp8_e4m3", 0x1p-4, false};
    case int4: return {"int4", 1.0 / 14.0, false, ErrorScale::row};
    case int4_h: return {"int4_h", (1.0 + 0x1p-10) / 14.0, false, ErrorScale::row, true};
    case fp16: return {"fp16", 0x1p-11, true, ErrorScale::entry, false, false};
  }
  return {};
}

std::vector<std::string> precision_names(bool inputs_only) {
  std::vector<std::string> names;
  for (int i = 0;; ++i) {
    const PrecisionRow row = precision_row(static_cast<InputPrecision>(i));
    if (row.name == nullptr) return names;
    if (inputs_only ? row.input : row.score) names.emplace_back(row.name);
  }
}

std::string input_precision_list() {
  std::string list;
  for (const auto& name : precision_names(true)) list += (list.empty() ? "" : ", ") + name;
  return list;
}

std::string to_string(InputPrecision precision) {
  const char* name = precision_row(precision).name;
  return name ? name : "fp32";
}

namespace {

// names -> `"a", "b" or "c"` (`"a" or "b"` for two).
std::string quoted_list(const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + ("\"" + names[i] + "\"");
  return list;
}

// text -> the precision of that name among `names`; InvalidArgument listing them otherwise.
InputPrecision parse_precision(const std::string& text, const std::string& field,
                               const std::vector<std::string>& names) {
  for (int i = 0; precision_row(static_cast<InputPrecision>(i)).name; ++i)
    if (text == precision_row(static_cast<InputPrecision>(i)).name &&
        std::find(names.begin(), names.end(), text) != names.end())
      return static_cast<InputPrecision>(i);
  throw InvalidArgument(field + ": expected " + quoted_list(names) + ", got \"" + text + "\"");
}

}  // namespace

InputPrecision parse_input_precision(const std::string& text, const std::string& field) {
  return parse_precision(text, field, precision_names(true));
}

InputPrecision parse_score_precision(const std::string& text, const std::string& field) {
  return parse_precision(text, field, precision_names());
}

double unit_roundoff(InputPrecision precision) {
  const PrecisionRow row = precision_row(precision);
  return row.name ? row.unit_roundoff : 0x1p-24;
}

const std::vector<std::string>& output_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    std::apply([&](const auto&... row) { (list.emplace_back(row.name), ...); }, kOutputTensors);
    return list;
  }();
  return names;
}

namespace {

// The row of kOutputTensors named `name` -> its stage and floor precision; nullopt for none.
std::optional<std::pair<OutputStage, FloorPrecision>> output_row(const std::string& name) {
  std::optional<std::pair<OutputStage, FloorPrecision>> found;
  std::apply(
      [&](const auto&... row) {
        ((name == row.name ? (void)(found = std::pair(row.stage, row.precision)) : void()), ...);
      },
      kOutputTensors);
  return found;
}

}  // namespace

std::optional<OutputStage> output_stage(const std::string& name) {
  const auto row = output_row(name);
  return row ? std::optional(row->first) : std::nullopt;
}

InputPrecision tensor_precision(const std::string& tensor, const MechanismSpec& spec,
                                const VerifyOptions& options) {
  // tensor name -> the precision its floor uses (kOutputTensors; the table in oracle.hpp).
  const auto row = output_row(tensor);
  if (!row) return InputPrecision::fp32;
  switch (row->second) {
    case FloorPrecision::input: return options.precision;
    case FloorPrecision::score: return options.score_precision;
    case FloorPrecision::score_if_hierarchical:
      return spec.fusion == Fusion::hierarchical ? options.score_precision : InputPrecision::fp32;
    case FloorPrecision::fp32: break;
  }
  return InputPrecision::fp32;
}

double Tolerances::subnormal_probability_units(InputPrecision precision, int64_t keys) {
  return precision == InputPrecision::fp16 ? static_cast<double>(keys) * 0x1p-25 : 0.0;
}

double Tolerances::subnormal_gradient_error(InputPrecision precision,
                                            std::initializer_list<SubnormalTerm> terms) {
  if (precision != InputPrecision::fp16) return 0.0;
  double sum = 1.0;  // the store's own rounding
  for (const auto& term : terms) sum += term.products * term.factor;
  return sum * 0x1p-25;
}

double Tolerances::floor_units(InputPrecision precision) {
  return precision == InputPrecision::fp32 ? kFloorUnitsFp32 : kFloorUnitsBf16;
}

double Tolerances::fp32_lse_approximation(int64_t terms) {
  const double log_terms = std::log(static_cast<double>(std::max<int64_t>(terms, 2)));
  int exponent = 0;
  std::frexp(log_terms, &exponent);  // log_terms in [2^(exponent-1), 2^exponent)
  const double fp32_ulp = std::ldexp(1.0, exponent - 24);
  return std::exp2(-21.41) + 3.0 * fp32_ulp + 2.0 * std::exp2(-22.0);
}

double Tolerances::margin_units(InputPrecision precision) {
  return precision == InputPrecision::fp32 ? kMarginUnitsFp32 : kMarginUnitsBf16;
}

TensorReport compare_tensor(const std::string& name, const std::vector<Matrix<double>>& kernel,
                            const std::vector<Matrix<double>>& truth,
                            const std::vector<Matrix<double>>& baseline, double magnitude,
                            InputPrecision precision, const std::string& row_label,
                            const std::vector<int64_t>& row_ids, int64_t max_messages,
                            double subnormal_units) {
  // Hq x [rows x cols] kernel, truth, float baseline -> one report (module comment: policy).
  TensorReport report;
  report.name = name;
  report.precision = precision;
  report.magnitude = std::max(magnitude, std::numeric_limits<double>::min());
  report.floor = (Tolerances::floor_units(precision) * unit_roundoff(precision) + subnormal_units) *
                 report.magnitude;
  report.problems = shape_problems(name, kernel, truth);
  require(shape_problems(name, baseline, truth).empty(), name + " baseline",
          "the truth's shape", "a different shape");
  if (!report.problems.empty()) {
    report.tolerance = report.floor;
    return report;
  }
  // A bf16 tensor stored by truncation errs by up to one ulp (2u |x|) at each rounding where
  // rounding to nearest errs by half (u |x|), so its floor doubles.
  if (precision == InputPrecision::bf16) {
    const auto rounding = bf16_store_rounding(kernel, truth);
    report.stored_as = describe_store(rounding);
    if (rounding == Bf16Rounding::toward_zero) report.floor *= 2.0;
  }
  const double rel_floor = Tolerances::kRelFloorFraction * report.magnitude;
  Accumulator acc;
  for (size_t h = 0; h < truth.size(); ++h)
    for (Eigen::Index i = 0; i < truth[h].rows(); ++i)
      for (Eigen::Index j = 0; j < truth[h].cols(); ++j)
        accumulate(acc, kernel[h](i, j), truth[h](i, j), baseline[h](i, j), rel_floor, name,
                   [&] { return where(row_label, row_ids, h, i, j); }, max_messages);
  report.count = acc.count;
  report.max_abs = acc.max_abs;
  report.max_rel = acc.max_rel;
  report.nmse = acc.sum_sq_truth > 0 ? acc.sum_sq_err / acc.sum_sq_truth
                                     : (acc.sum_sq_err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  report.worst_where = acc.worst_where;
  report.worst_kernel = acc.worst_kernel;
  report.worst_truth = acc.worst_truth;
  report.baseline_max_abs = acc.baseline_max_abs;
  report.tolerance = Tolerances::kBaselineFactor * report.baseline_max_abs + report.floor;
  report.headroom = report.max_abs / report.tolerance;
  report.problems = problems_of(acc, name);
  if (report.max_abs > report.tolerance)
    report.problems.push_back(format(
        "%s: max abs error %.3g at %s (kernel %.9g, reference %.9g) exceeds the tolerance %.3g "
        "= %g x float error %.3g + floor %.3g", name.c_str(), report.max_abs,
        report.worst_where.c_str(), report.worst_kernel, report.worst_truth, report.tolerance,
        Tolerances::kBaselineFactor, report.baseline_max_abs, report.floor));
  report.passed = report.problems.empty();
  return report;
}

bool TensorReport::shift_passed() const {
  for (const auto& test : shift_tests)
    if (!test.passed) return false;
  return true;
}

void check_shift(TensorReport& report, ShiftTest test, const MeanShiftBound& bound) {
  // report, the statistic, what a correct kernel's rounding does to it -> the test applied.
  test.model_standard_error = bound.standard_error;
  const double standard_error = std::max(test.model_standard_error, test.spread_standard_error);
  test.tolerance = Tolerances::kBaselineFactor * std::fabs(test.baseline) +
                   Tolerances::kMeanSigmas * standard_error + test.approximation_allowance;
  test.passed = test.value >= test.low() - test.tolerance && test.value <= test.high() + test.tolerance;
  if (!test.passed) {
    report.problems.push_back(format(
        "%s: %s statistic %.3g%s over %lld elements lies outside [%.3g, %.3g] (%.3g times the "
        "way to its edge): rounding's range [%.3g, %.3g] (roundings [%.3g, %.3g], bf16 store "
        "[%.3g, %.3g]) +- tolerance %.3g = %g x float's %.3g + %g x the standard error %.3g "
        "(bf16 rounding model %.3g, residual spread %.3g) + fp32 exp/log approximation %.3g%s",
        report.name.c_str(),
        test.name.c_str(), test.value, test.unit.c_str(), static_cast<long long>(report.count),
        test.low() - test.tolerance, test.high() + test.tolerance, test.headroom(), test.low(),
        test.high(), test.rounding_low, test.rounding_high, test.store_low, test.store_high,
        test.tolerance, Tolerances::kBaselineFactor, test.baseline, Tolerances::kMeanSigmas,
        standard_error, test.model_standard_error, test.spread_standard_error,
        test.approximation_allowance,
        test.name == "mean" ? ": a shift of every element alike"
                            : ": the error grows with d lse / d log(sigma), as a wrong logit "
                              "scale makes it"));
    report.passed = false;
  }
  report.shift_tests.push_back(test);
}

std::string Verdict::report() const {
  // -> the printable multi-line report; every tensor gets its line, pass or fail.
  std::ostringstream out;
  out << "oracle: " << spec_description << " | kernel inputs " << to_string(precision)
      << " (u = " << format("%.3g", unit_roundoff(precision)) << "), selection scores "
      << to_string(score_precision) << "\n";
  out << format("  %-18s %10s %10s %10s %10s %10s %9s %5s  %-24s %s\n", "tensor", "max_abs",
                "max_rel", "nmse", "float_err", "tolerance", "headroom", "floor", "worst",
                "verdict");
  // Report order: the stages before the selection, the selection, the fused outputs, the
  // gradients.
  auto is_fused = [](const TensorReport& t) {
    return output_stage(t.name) == OutputStage::fused;
  };
  auto is_gradient = [](const TensorReport& t) {
    return t.name == "gradients" || t.name == "dq" || t.name == "dq_retrieval" ||
           t.name == "dk" || t.name == "dv" || t.name == "dprior";
  };
  auto is_stage = [&](const TensorReport& t) { return !is_fused(t) && !is_gradient(t); };
  auto line = [&](const TensorReport& t) {
    out << format("  %-18s %10.3g %10.3g %10.3g %10.3g %10.3g %9.3g %5s  %-24s %s\n",
                  t.name.c_str(), t.max_abs, t.max_rel, t.nmse, t.baseline_max_abs, t.tolerance,
                  t.headroom, to_string(t.precision).c_str(), t.worst_where.c_str(),
                  t.passed ? "PASS" : "FAIL");
  };
  for (const auto& t : tensors)
    if (is_stage(t)) line(t);
  if (selection.compared)
    out << format("  %-18s %lld rows, %lld differ, %lld accepted (max accepted margin %.3g, "
                  "largest bound used %.3g, float r error %.3g) %s\n", "selection",
                  static_cast<long long>(selection.rows),
                  static_cast<long long>(selection.rows_differing),
                  static_cast<long long>(selection.rows_accepted), selection.max_accepted_margin,
                  selection.bound, selection.baseline_r_error, selection.passed ? "PASS" : "FAIL");
  for (const auto& t : tensors)
    if (is_fused(t)) line(t);
  for (const auto& t : tensors)
    for (const auto& test : t.shift_tests)
      out << format("  %-18s %.3g%s, accepted [%.3g, %.3g]: roundings [%.3g, %.3g] + bf16 "
                    "store [%.3g, %.3g] +- %.3g (float's %.3g, standard error %.3g model / %.3g "
                    "spread, fp32 exp/log %.3g; stored %s, conversions %s), headroom %.3g %s\n",
                    (t.name + " (" + test.name + ")").c_str(), test.value, test.unit.c_str(),
                    test.low() - test.tolerance, test.high() + test.tolerance,
                    test.rounding_low, test.rounding_high, test.store_low, test.store_high,
                    test.tolerance, test.baseline, test.model_standard_error,
                    test.spread_standard_error, test.approximation_allowance,
                    t.stored_as.c_str(), t.conversions.c_str(), test.headroom(),
                    test.passed ? "PASS" : "FAIL");
  for (const auto& t : tensors)
    if (is_gradient(t)) line(t);
  for (const auto& what : not_compared) out << "  not compared: " << what << "\n";
  // Problems in pipeline order: stages before the selection, the selection, the fused outputs.
  auto problems = [&](const TensorReport& t) {
    for (const auto& p : t.problems) out << "  FAIL: " << p << "\n";
    if (!t.diagnosis.empty()) out << "  diagnosis: " << t.name << " " << t.diagnosis << "\n";
  };
  for (const auto& t : tensors)
    if (is_stage(t)) problems(t);
  for (const auto& p : selection.problems) out << "  FAIL: " << p << "\n";
  for (const auto& t : tensors)
    if (is_fused(t)) problems(t);
  for (const auto& t : tensors)
    if (is_gradient(t)) problems(t);
  out << (passed ? "PASS" : "FAIL") << "\n";
  return out.str();
}

std::optional<std::size_t> first_guard_violation(const void* data, std::size_t bytes,
                                                 unsigned char pattern) {
  // guard region -> offset of the first overwritten byte, if any.
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i)
    if (p[i] != pattern) return i;
  return std::nullopt;
}

}  // namespace hils::oracle
