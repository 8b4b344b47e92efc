// The oracle (data/verify_format.md, "The policy, in one place"): compares a kernel's outputs,
// stage by stage, with the reference run in double (the truth) and in float (the same-precision
// baseline), and returns a verdict with a printable report per tensor.
//
// Policy, per tensor: the kernel passes when
//     max_abs(kernel - double) <= kBaselineFactor * max_abs(float - double) + floor,
//     floor = floor_units(p) * u(p) * magnitude(tensor),   p = tensor_precision(tensor),
// where u is the unit roundoff of the kernel's input precision (value path) or score precision
// (summaries, scores) and `magnitude` bounds the size of the quantity (see Tolerances below:
// every constant has its one-line reason there; data/verify_format.md lists the magnitudes).
// For bf16 inputs the oracle rounds the inputs to bf16 first, so that double, float and the
// kernel all see the same numbers; the floor then covers the kernel's bf16 intermediates.
// Where that floor is a worst case far above a correct kernel's rounding (the hierarchical lse
// under bf16 scores), a mean test adds statistics over all rows: a shift of every row (a wrong
// logit scale, an extra softmax1 logit) fails when the mean error exceeds what unbiased bf16
// rounding at the kernel's rounding points gives (Tolerances::kMeanSigmas, MeanShiftBound).
//
// Selections are compared as sets per (query, KV group). A kernel row that differs from the
// reference passes only if the reference group scores r(t,g,c) of the swapped chunks differ by
// at most the margin bound (see Tolerances, "Selection margin"); then o, lse and the fusion
// weights of that row are re-checked against the reference fused with the kernel's own
// selection (forced_fusion below), not against the reference's selection.
//
// Typical use from a GPU test:
//   oracle::KernelOutputs out;                 // fill what the kernel produced, widened to double
//   out.o = ...; out.lse = ...; out.selection = ...;
//   auto verdict = oracle::verify(spec, inputs, out, {oracle::InputPrecision::fp32});
//   std::cout << verdict.report();            // printed whether it passes or not
//   REQUIRE(verdict.passed);
#pragma once

#include <cstddef>
#include <cstdint>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "hils/attention.hpp"
#include "hils/spec.hpp"

namespace hils::oracle {

// Precision of the numbers the kernel computes from (its inputs and its rounding unit). Each
// value has its row in precision_row (its name, unit roundoff, whether it is an input precision;
// oracle_compare.cpp), where the build stops (-Werror=switch) until a value added here has one;
// the values count up from 0 in this order (precision_names lists them so). The score
// precisions beyond fp32 and bf16 are the stores of data/verify_format.md (README "Adding a
// score precision"); fp16 is an input precision only (its floors are derived for the forward,
// data/verify_format.md "The policy").
enum class InputPrecision { fp32, bf16, fp8_e4m3, int4, int4_h, fp16 };

// How a precision's rounding error scales: relative to each entry (floating point: |x - r(x)| <=
// u |x|), or absolute across a row (integer codes times a per-row scale: half a step, u max_i
// |x_i|, on every entry of the row).
enum class ErrorScale { entry, row };

// One precision: its name in verify files, hils.verify and reports; its unit roundoff u; whether
// a kernel's inputs may have it (fp32, bf16, fp16) or it is a score precision only (how k' is
// stored); how its error scales; whether the scores read b' in fp16 too (int4h_bias_error);
// whether it may be a score precision (every row but fp16, whose subnormals the margin bound's
// relative unit does not cover).
struct PrecisionRow {
  const char* name = nullptr;
  double unit_roundoff = 0.0;
  bool input = false;
  ErrorScale error = ErrorScale::entry;
  bool bias_fp16 = false;
  bool score = true;
};
// The row of `precision`; a row without a name for a number that is no value of InputPrecision.
PrecisionRow precision_row(InputPrecision precision);
// The names of the score precisions (every row whose `score` is set), or of the input precisions
// only, in the enum's order.
std::vector<std::string> precision_names(bool inputs_only = false);
// The input precisions' names as a message lists them: "fp32, bf16, fp16".
std::string input_precision_list();

std::string to_string(InputPrecision);
// An input precision's name ("fp32", "bf16" or "fp16"); InvalidArgument listing them for any
// other text.
InputPrecision parse_input_precision(const std::string& text,
                                     const std::string& field = "input_precision");
// A score precision's name (a row whose `score` is set); InvalidArgument listing them for any
// other text.
InputPrecision parse_score_precision(const std::string& text,
                                     const std::string& field = "score_precision");

// The row's unit roundoff (precision_row: fp32 2^-24, bf16 2^-8 and so on, each with its reason).
double unit_roundoff(InputPrecision precision);
// What fp16 b' adds to each int4_h score: |b' - fp16(b')| <= 2^-11 |b'| + 2^-25 (to nearest, 11
// significant bits; 2^-25 is half fp16's subnormal spacing), with |b'| <= log|T_c| for the
// entropy bias (b' = H(p)); 0 for bias rule none (b' = 0 is exact).
double int4h_bias_error(double max_abs_bias);

struct VerifyOptions;
// The rounding unit each tensor's floor uses, given the kernel's input and score precisions
// (an output's FloorPrecision in kOutputTensors; fp32 for any other name):
//   o, o_window                        input precision: a bf16 kernel multiplies bf16 P by V
//   summary_key, summary_bias,         score precision: the summaries and scores the kernel
//   surrogate_scores, selection margin   selects with
//   lse, fusion_weights                score precision for hierarchical fusion (its logits are
//                                        s_hat), fp32 otherwise
//   lse_window                         fp32: logits of bf16 (or fp32) inputs accumulate in fp32
//                                        on any tensor core, and the oracle rounds the inputs
InputPrecision tensor_precision(const std::string& tensor, const MechanismSpec& spec,
                                const VerifyOptions& options);

// Rounds to the nearest bf16 (ties to even) and back; NaN stays NaN. The oracle applies this to
// every input when the kernel's precision is bf16.
double round_to_bf16(double x);
// The two ways kernels convert to bf16: to nearest (ties to even; __float2bfloat16) and toward
// zero (keeping a float's upper 16 bits, a truncating conversion). Both are correct kernels.
enum class Bf16Rounding { nearest, toward_zero };
double round_to_bf16(double x, Bf16Rounding mode);
// Rounds to the nearest fp8 e4m3 number (ties to even; 4 significand bits, subnormal spacing
// 2^-9, saturating at +-448 as a SATFINITE conversion does); NaN stays NaN.
double round_to_fp8_e4m3(double x);
// The per-row scale of an fp8 e4m3 summary row whose largest |entry| is `amax`: the smallest
// power of two s with amax / s <= 448 (1 for amax = 0). Row entries are stored as
// round_to_fp8_e4m3(x / s) and read back as that times s.
double fp8_row_scale(double amax);
// The per-row scale of an int4 summary row whose largest |entry| is `amax`: float(amax) / 7 in
// fp32 (1 for amax = 0 or not finite). Row entries are stored as int4_code(x, s) and read back
// as that times s.
float int4_row_scale(double amax);
// Rounds to the nearest fp16 number (ties to even; 11 significant bits, subnormal spacing
// 2^-24; +-inf beyond 65520, as __float2half_rn); NaN stays NaN.
double round_to_fp16(double x);
// The per-row scale of an int4_h summary row (SummaryType::int4_h): s16 = int4_row_scale(amax)
// rounded up to the next fp16 number (__float2half_ru), so that float(k') / s16 <= 7; the row
// is stored as int4_code(x, s16) and read back as that times s16. Throws InvalidArgument for a
// row the store refuses: s below fp16's normal range (0 < amax < ~7 x 2^-14), s16 above 65504,
// or amax not finite.
float int4h_row_scale(double amax);
// round(float(x) / s) to nearest (ties to even), clamped to [-7, 7]; the division in fp32 as the
// device quantizer does it (__fdiv_rn).
int int4_code(double x, float s);
AttentionInputs<double> round_inputs_to_bf16(const AttentionInputs<double>& inputs);
// x rounded to an input precision the way the oracle rounds a kernel's inputs: to the nearest
// bf16 or fp16 number; fp32 inputs are taken as given (x unchanged).
double round_to_input_precision(double x, InputPrecision precision);
// Every entry of q, k, v, q~ and the prior rounded so (a copy; unchanged for fp32).
AttentionInputs<double> round_inputs_to(const AttentionInputs<double>& inputs,
                                        InputPrecision precision);

// Every tolerance of the oracle, in one place, each with its reason.
struct Tolerances {
  // The kernel may be at most this many times as wrong as the plain float reference
  // (FlashAttention's rule: a different summation order may double the rounding error).
  static constexpr double kBaselineFactor = 2.0;
  // fp32 floor: each stage is a handful of dot products, exps and a log-sum-exp; 32 unit
  // roundoffs of the tensor's magnitude covers a different but sane order of these roundings
  // (and fast-math exp/log of a few ulps) when the float baseline happens to be (nearly)
  // exact, e.g. on tiny cases.
  static constexpr double kFloorUnitsFp32 = 32.0;
  // bf16 floor: a bf16 kernel rounds P (probabilities) and/or its stored outputs to bf16, each
  // costing <= u * magnitude; 4 allows P, o_c, the fused output and the store.
  static constexpr double kFloorUnitsBf16 = 4.0;
  // Max rel error is |k - t| / max(|t|, kRelFloorFraction * magnitude), so elements near zero
  // do not dominate the report (it is reported, never the verdict).
  static constexpr double kRelFloorFraction = 1e-3;
  // Selection margin of a swap (kernel chose c where the reference has m): tolerated when
  //   r(m) - r(c) <= kBaselineFactor * (float's max error in r)
  //                  + margin_units * u * (A(t,c) + A(t,m) [+ max_c' A(t,c') when G > 1]),
  // A(t,c) = max_{h in g} sigma sum_i |q~_t,i| sum_j w_j |k_j,i| (+ log|T_c| + 1 with the
  // entropy bias): the condition number of the dot product behind s_hat(t,h,c), w the key rule's
  // weights (taylor: p, mean: 1/|T_c|, landmark: the landmark; exact: max_j |k_j,i|), so that
  // rounding p or k' to u moves s_hat by at most u A; the extra term for G > 1 covers log Z_hat
  // of two different heads. x G for sum_probabilities (G terms).
  static constexpr double kMarginUnitsFp32 = 32.0;
  // A bf16 score path rounds once in the summary (p or k') and at most once in the stored
  // score, each moving s_hat by at most u A. fp8_e4m3 scores use the bf16 units with u = 2^-4
  // (k' rounded once to e4m3; the second unit covers p in bf16 and e4m3's subnormals, which
  // a per-row scale keeps below 2^-14 of the row's largest entry). int4 scores use the bf16
  // units with u = 1/14 and, in place of A, A_row(t,c) = max_{h in g} sigma sum_i |q~_t,i| x
  // max_i sum_j w_j |k_j,i|: an int4 row's rounding error is absolute (half a step, max |k'| / 14,
  // on every entry), not relative to each entry.
  static constexpr double kMarginUnitsBf16 = 2.0;

  // Mean test (hierarchical lse with bf16 scores, where the worst-case floor sits far above
  // what a correct kernel's rounding does): the mean error within kBaselineFactor x |float's
  // mean error| + kMeanSigmas x SE of where biased roundings can centre it (ShiftTest), SE the
  // standard error of the mean that unbiased
  // bf16 rounding at the kernel's rounding points gives (MeanShiftBound). 6 sigmas: a correct kernel
  // fails with probability ~2e-9 under the central limit theorem; a systematic shift of every
  // row (a wrong logit scale, an extra softmax1 logit) stands out in the mean of thousands.
  static constexpr double kMeanSigmas = 6.0;
  // What a correct fp32 kernel's approximate exp and log can do to every lse row alike, n the
  // most terms a row's softmax sum l can hold: lse = m + log(l) with log as CUDA's __logf (2^-21.41
  // absolute for arguments in [0.5, 2], 3 ulps elsewhere; log(l) <= log(n): both counted), the
  // terms' exps within 2 ulps (ex2.approx.f32: 2^-22 of l), and as much again for an online
  // softmax's rescaling exps. These errors need not average out over rows (our packed window
  // moved the mean lse by -1.6e-7 at T = 40, where no bf16 rounding is left to model), so the
  // statistics allow them in every row: sum_r |a_r| x this (data/verify_format.md).
  static double fp32_lse_approximation(int64_t terms);
  // Round-to-nearest leaves an error uniform within +-ulp(x)/2: variance ulp^2 / 12.
  static constexpr double kRoundingVariance = 1.0 / 12.0;

  // fp16 inputs: a kernel that rounds its probabilities P to fp16 (FlashAttention's fp16 path
  // does before P V) rounds each P below fp16's normal range (2^-14) with an absolute error of
  // up to 2^-25, which the relative unit does not cover; over the `keys` of one softmax (its
  // sum l >= 1, the largest P being 1) that moves o by at most keys x 2^-25 x max |v|. The floor
  // of o and o_window adds this many magnitudes (0 for the other precisions).
  static double subnormal_probability_units(InputPrecision precision, int64_t keys);
  // fp16 gradients, the same rounding in the backward (data/verify_format.md "Gradients"): a
  // kernel that rounds P (before dV = P^T dO) and dS = P (dP - D) (before dQ = sigma dS K and
  // dK = sigma dS^T Q) to fp16 errs by up to 2^-25 on each one below 2^-14, and its fp16 store
  // of the gradient by up to 2^-25 more: an entry that sums `products` of them with factors of
  // at most `factor` (max |do|; sigma max |k|; sigma max |q|) moves by at most
  // (products x factor + 1) x 2^-25. A hierarchical fusion's entries sum several kinds of
  // rounded intermediates (d s_hat, the summaries' gradients, the prior's d ell), one term
  // each: (sum of products x factor + 1) x 2^-25. The absolute error a gradient's floor adds
  // (0 for the other precisions).
  struct SubnormalTerm {
    double products = 0;  // how many rounded intermediates the entry sums
    double factor = 0;    // the most any one of them is multiplied by on its way there
  };
  static double subnormal_gradient_error(InputPrecision precision,
                                         std::initializer_list<SubnormalTerm> terms);

  static double floor_units(InputPrecision precision);
  static double margin_units(InputPrecision precision);
};

// How a bf16-score kernel converts its summaries and scores to bf16 (the shift tests' rounding
// model): `detect` (default) reads it from the values the kernel stored in bf16 (lse, else o)
// and allows either where it stored none in bf16; `any` allows either (a kernel that rounds
// some values to nearest and truncates others); `nearest` / `toward_zero` as declared.
// Allowing truncation widens what the statistics accept by its errors' lean toward zero.
enum class Bf16RoundingClaim { detect, any, nearest, toward_zero };
std::string to_string(Bf16RoundingClaim claim);
Bf16RoundingClaim parse_bf16_rounding(const std::string& text,
                                      const std::string& field = "bf16_rounding");

struct VerifyOptions {
  InputPrecision precision = InputPrecision::fp32;
  // Arithmetic behind the kernel's summaries and selection scores. Kernels that read bf16
  // inputs but accumulate scores in fp32 keep the default; set bf16 for a kernel that rounds
  // summaries or scores to bf16 (the authors' code rounds p; a tensor-core selection may keep
  // k' in bf16), which widens those floors and the margin bound ~65000-fold. The inputs' own
  // rounding is no error source: the oracle rounds its inputs the same way.
  InputPrecision score_precision = InputPrecision::fp32;
  Bf16RoundingClaim bf16_rounding = Bf16RoundingClaim::detect;
  // Query slots the kernel computed (strictly ascending); empty = all T. Must match the rows
  // of every per-query output.
  std::vector<int64_t> queries = {};
  // Print at most this many selection/element problems per tensor in the report.
  int64_t max_messages = 8;
  // Called on the calling thread as each long step of the oracle starts ("the reference in
  // double", "the reference in float", ...), for a progress display (hils verify's); none when
  // empty. Nothing else depends on it.
  std::function<void(const std::string& step)> on_step = {};
};

// A kernel's backward pass, widened to double: the upstream gradients it was given (d_o and
// optionally d_lse, like hils::OutputGradients) and the gradients it returned (like
// hils::InputGradients, reference/SEMANTICS.md §6). Each returned gradient is
// optional (empty = not produced); any of them needs d_o and all T queries. They are compared
// with run_mechanism_backward in double (truth) and float (baseline), the selection held at
// the kernel's forward selection (KernelOutputs::selection; the reference's when absent).
struct KernelGradients {
  std::vector<Matrix<double>> d_o;           // upstream, Hq x [T x dv]
  std::vector<Vector<double>> d_lse;         // upstream, empty (zero) or Hq x [T]
  std::vector<Matrix<double>> dq;            // Hq x [T x d]
  std::vector<Matrix<double>> dk;            // Hkv x [T x d]
  std::vector<Matrix<double>> dv;            // Hkv x [T x dv]
  std::vector<Matrix<double>> dq_retrieval;  // Hq x [T x d], when inputs.q_retrieval is given
  std::vector<Matrix<double>> dprior;        // like inputs.prior (shared / given priors)
  bool any_returned() const {
    return !dq.empty() || !dk.empty() || !dv.empty() || !dq_retrieval.empty() || !dprior.empty();
  }
};

// What a kernel produced, widened to double exactly (every float is a double). Every field is
// optional: an empty vector means "the kernel did not produce this stage" and is skipped.
// Chunk-indexed tensors may carry ceil(T/S) columns (the authors' layout); the extra trailing
// column must then be -inf.
struct KernelOutputs {
  std::vector<Matrix<double>> summary_key;       // Hq x [n_chunks x d] (or Hkv x when per KV head)
  std::vector<Vector<double>> summary_bias;      // Hq x [n_chunks]      (or Hkv x)
  std::vector<Matrix<double>> surrogate_scores;  // Hq x [Tq x n_chunks], -inf outside V(t)
  std::vector<IndexMatrix> selection;            // Hkv x [Tq x K], ascending, -1 padded
  std::vector<Matrix<double>> o_window;          // Hq x [Tq x dv]
  std::vector<Vector<double>> lse_window;        // Hq x [Tq]
  std::vector<Matrix<double>> o;                 // Hq x [Tq x dv]
  std::vector<Vector<double>> lse;               // Hq x [Tq]
  std::vector<Matrix<double>> fusion_weights;    // Hq x [Tq x (K+2)], see HeadOutputs
  KernelGradients gradients;                     // the backward pass, when the kernel has one
};

// Where an output's row stands in the report (the stages the selection scores with, the
// selection, the fused outputs) and the rounding unit its floor uses (tensor_precision).
enum class OutputStage { before_selection, selection, fused };
enum class FloorPrecision { input, score, score_if_hierarchical, fp32 };

template <class Field>
struct OutputTensor {
  const char* name;  // the verify file's /outputs/<name>, hils.verify's outputs["<name>"]
  Field KernelOutputs::*field;
  OutputStage stage;
  FloorPrecision precision;
};
template <class Field>
OutputTensor(const char*, Field KernelOutputs::*, OutputStage, FloorPrecision)
    -> OutputTensor<Field>;

// Every output of a kernel, in pipeline order (data/verify_format.md, "Datasets"): `hils verify`
// reads the verify file's /outputs by it and names any other dataset "not compared", the Python
// package reads hils.verify's outputs by it, and the report's order and tensor_precision come
// from it. How each is compared is its own code in oracle.cpp (compare_*), which a test that
// sweeps this table checks (README "Adding a judged output").
inline constexpr std::tuple kOutputTensors{
    OutputTensor{"summary_key", &KernelOutputs::summary_key, OutputStage::before_selection,
                 FloorPrecision::score},
    OutputTensor{"summary_bias", &KernelOutputs::summary_bias, OutputStage::before_selection,
                 FloorPrecision::score},
    OutputTensor{"surrogate_scores", &KernelOutputs::surrogate_scores,
                 OutputStage::before_selection, FloorPrecision::score},
    OutputTensor{"selection", &KernelOutputs::selection, OutputStage::selection,
                 FloorPrecision::score},
    OutputTensor{"o_window", &KernelOutputs::o_window, OutputStage::before_selection,
                 FloorPrecision::input},
    OutputTensor{"lse_window", &KernelOutputs::lse_window, OutputStage::before_selection,
                 FloorPrecision::fp32},
    OutputTensor{"o", &KernelOutputs::o, OutputStage::fused, FloorPrecision::input},
    OutputTensor{"lse", &KernelOutputs::lse, OutputStage::fused,
                 FloorPrecision::score_if_hierarchical},
    OutputTensor{"fusion_weights", &KernelOutputs::fusion_weights, OutputStage::fused,
                 FloorPrecision::score_if_hierarchical},
};
// A field added to KernelOutputs without its row would be neither read nor listed.
static_assert(sizeof(KernelOutputs) ==
                  sizeof(KernelGradients) + std::tuple_size_v<decltype(kOutputTensors)> *
                                                sizeof(std::vector<Matrix<double>>),
              "every output field of KernelOutputs needs its row in kOutputTensors");

// visit(row, outputs.*row.field) for every row of kOutputTensors, in order.
template <class Outputs, class Visit>
void for_each_output(Outputs& outputs, Visit&& visit) {
  std::apply([&](const auto&... row) { (visit(row, outputs.*(row.field)), ...); },
             kOutputTensors);
}
// The names of kOutputTensors, in order.
const std::vector<std::string>& output_names();
// The report stage of output `name`; nullopt for a name that is no output (a gradient).
std::optional<OutputStage> output_stage(const std::string& name);

// Widen a float (or any scalar) head-list to double for KernelOutputs.
template <class Scalar>
std::vector<Matrix<double>> widen(const std::vector<Matrix<Scalar>>& heads) {
  std::vector<Matrix<double>> out;
  for (const auto& m : heads) out.push_back(m.template cast<double>());
  return out;
}
template <class Scalar>
std::vector<Vector<double>> widen(const std::vector<Vector<Scalar>>& heads) {
  std::vector<Vector<double>> out;
  for (const auto& m : heads) out.push_back(m.template cast<double>());
  return out;
}

// A statistic over all rows of a tensor, value = sum_r a_r e_r with e_r the kernel's error at
// its storage precision (kernel - the reference rounded as the kernel stores), and what a
// correct kernel's rounding can make of it: it passes when value lies in
//   [low() - tolerance, high() + tolerance],
// tolerance = kBaselineFactor x |baseline| + kMeanSigmas x standard_error, standard_error the
// larger of the bf16 rounding model's and the spread of the residuals', and [low(), high()]
// where a correct kernel's roundings can centre it: the exact errors of its roundings (known
// from the reference's values; a truncating kernel's lean toward zero) and of a bf16-stored lse
// against a bf16 top logit (data/verify_format.md, "Statistics over all rows").
struct ShiftTest {
  std::string name;   // "mean" (a_r = 1/N) or "logit scale" (a_r = g_r / sum g^2)
  std::string unit;   // how the value reads: "" (lse units) or " of sigma" (a fraction)
  double value = 0;                   // sum_r a_r e_r
  double baseline = 0;                // the same of the float reference
  double model_standard_error = 0;    // from the rounding model (MeanShiftBound)
  double spread_standard_error = 0;   // sqrt(sum_r a_r^2 residual_r^2)
  // What a correct fp32 kernel's approximate exp and log can shift it by (sum_r |a_r| x
  // Tolerances::fp32_lse_approximation): errors that lean one way in every row, which no
  // standard error covers (data/verify_format.md, "Statistics over all rows").
  double approximation_allowance = 0;
  // Where the exact errors of the kernel's roundings can centre it, each rounding point rounded
  // (to nearest, toward zero: as the conversions are known) or not ...
  double rounding_low = 0, rounding_high = 0;
  // ... plus where a bf16-stored lse's rounding against a bf16 top logit can (0 = scores fp32).
  double store_low = 0, store_high = 0;
  double low() const { return rounding_low + store_low; }
  double high() const { return rounding_high + store_high; }
  double tolerance = 0;
  bool passed = true;
  // |value| over the edge of the accepted interval on its side (fails when > 1).
  double headroom() const {
    const double edge = value >= 0 ? high() + tolerance : tolerance - low();
    return edge > 0 ? std::fabs(value) / edge : 0.0;
  }
};

struct TensorReport {
  std::string name;          // "o", "lse", "surrogate_scores", ...
  bool passed = false;
  InputPrecision precision = InputPrecision::fp32;  // the unit roundoff of the floor
  int64_t count = 0;         // elements compared
  double max_abs = 0;        // max |kernel - double|
  double max_rel = 0;        // max |kernel - double| / max(|double|, rel floor)
  double nmse = 0;           // sum (kernel - double)^2 / sum double^2
  std::string worst_where;   // "h=1 t=37 col=5" (t is the query slot)
  double worst_kernel = 0, worst_truth = 0;
  double baseline_max_abs = 0;  // max |float - double|
  double floor = 0;             // rounding floor of the tolerance
  double magnitude = 0;         // the magnitude the floor scales with
  double tolerance = 0;         // kBaselineFactor * baseline_max_abs + floor
  double headroom = 0;          // max_abs / tolerance (fails when > 1)
  // Statistics over all rows (hierarchical lse under bf16 scores, Tolerances::kMeanSigmas):
  // the mean error and the logit-scale slope, each with its tolerance (ShiftTest); empty where
  // they do not apply.
  std::vector<ShiftTest> shift_tests;
  std::string stored_as;        // the storage the shift tests found: "fp32", "bf16 (to nearest)", ...
  std::string conversions;      // the shift tests' bf16 conversions: "to nearest (read from o)", ...
  bool shift_passed() const;    // every shift test passed (true when there is none)
  std::vector<std::string> problems;  // why it failed: NaN, shape, all-zero, -inf pattern, ...
  std::string diagnosis;              // a guess at the cause, when one is recognised
};

// The comparison of the selections.
struct SelectionReport {
  bool compared = false;    // false when the kernel gave no selection or the spec selects none
  bool passed = true;
  int64_t rows = 0;          // (query, group) rows compared
  int64_t rows_differing = 0;
  int64_t rows_accepted = 0;  // differing rows whose swaps are within the margin bound
  double bound = 0;           // the largest per-swap margin bound used (0 when no row differs)
  double baseline_r_error = 0;  // max |r_float - r_double| over V(t)
  double max_accepted_margin = 0;
  double worst_margin = 0;      // largest margin of any differing row
  std::vector<std::string> problems;  // one line per rejected row (first max_messages)
};

struct Verdict {
  bool passed = false;
  InputPrecision precision = InputPrecision::fp32;
  InputPrecision score_precision = InputPrecision::fp32;
  std::string spec_description;
  SelectionReport selection;
  std::vector<TensorReport> tensors;
  // Data the kernel (or its file) gave that was NOT compared, with the reason, e.g.
  // "/grads/dfoo (a dataset the oracle does not know)": the report names each, so that no one
  // takes a check that never ran for a pass (`hils verify --strict` makes them an error).
  std::vector<std::string> not_compared;
  // A multi-line human report: one line per tensor (max abs, max rel, NMSE, worst element,
  // headroom, PASS/FAIL) followed by the problems and diagnoses.
  std::string report() const;
};

// Compares everything the kernel produced, its gradients included. Throws InvalidArgument for
// an invalid spec, inputs, upstream gradients or options (they are the caller's data); a kernel
// tensor with the wrong number of heads or the wrong shape, NaN, or all zeros is a kernel
// failure and is reported in the verdict.
Verdict verify(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
               const KernelOutputs& kernel, const VerifyOptions& options = {});

// verify() in two steps, for several kernels' outputs on the same spec, inputs and options (the
// variants of one kernel, a parametrised test): the constructor validates, rounds the inputs,
// runs the reference in double and in float and fuses the reference's own selection, once (the
// bulk of verify()'s time); each verify() then does only what depends on that kernel's outputs,
// fusing again only the query blocks where its selection differs. Measured on a 2-core machine
// (T = 4500, Hq = 16, K = 64, bf16): verify() 43 s, Verifier::verify() 6 s after a 32 s
// constructor. Verifier(spec, inputs, options).verify(kernel) is verify(spec, inputs, kernel,
// options), verdict for verdict. Copies share the reference runs.
struct VerifierState;  // oracle.cpp
class Verifier {
 public:
  Verifier(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
           const VerifyOptions& options = {});
  Verdict verify(const KernelOutputs& kernel) const;

 private:
  std::shared_ptr<const VerifierState> state_;
};

// ---- Memory ---------------------------------------------------------------------------------

// The sizes of a problem the oracle judges, known before any array is read (a verify file's
// dataset shapes, or the arrays given to Verifier).
struct ProblemShape {
  int64_t T = 0, Hq = 0, Hkv = 0, d = 0, dv = 0;
  int64_t queries = 0;         // query rows judged (T when all)
  bool q_retrieval = false;    // the inputs hold q~ [Hq x T x d]
  int64_t prior_rows = 0;      // rows of each head's given prior (0: none)
  bool gradients = false;      // the kernel's backward is judged too
};

// The bytes the oracle holds at its peak judging a problem of this shape (Verifier's state and
// one verify call): its copies of the inputs in double and float, the reference's runs in double
// and float, and the larger of a verdict's temporaries and, with gradients, both backward
// passes; a selecting mechanism adds the selection's conditioning and the fusions of the
// reference's own selection. `scores` (when not null) receives the part that grows as rows x
// T / S, the chunk scores every query row keeps. Not the caller's arrays. An estimate, which
// README "The oracle's speed" compares with measured peak RSS.
double oracle_bytes(const MechanismSpec& spec, const ProblemShape& shape, double* scores = nullptr);

// Refuses (InvalidArgument naming `field`) a problem whose oracle_bytes plus `caller_bytes` (what
// the caller holds beside it: a file's arrays read in double) exceed 80% of memory_limit(),
// before anything is computed, saying what needs the memory and that judging fewer query rows
// (`queries_knob`: "/queries", "queries=") shrinks it.
void require_oracle_fits(const MechanismSpec& spec, const ProblemShape& shape, double caller_bytes,
                         const std::string& field, const std::string& queries_knob);

// ---- Building blocks (public so that tests and tools can use them alone) -------------------

// Group scores r(t,g,c) of reference/SEMANTICS.md §4 for one KV group: scores and lse_window are
// the G heads' s_hat [Tq x n_chunks] and lse_swa [Tq]; -inf outside V(t). [Tq x n_chunks].
template <class Scalar>
Matrix<double> group_scores(const std::vector<Matrix<Scalar>>& scores,
                            const std::vector<Vector<Scalar>>& lse_window, GroupRule rule);

// The reference's fusion stage run with a given selection (Hkv x [Tq x K], -1 padded), for the
// listed queries: o, lse and fusion weights per query head, in Scalar. With the reference's own
// selection it reproduces run_mechanism. Throws InvalidArgument for a selection row that names
// a chunk outside V(t) or twice.
template <class Scalar>
std::vector<HeadOutputs<Scalar>> forced_fusion(const MechanismSpec& spec,
                                               const AttentionInputs<Scalar>& inputs,
                                               const std::vector<IndexMatrix>& selection,
                                               const std::vector<int64_t>& queries);

// forced_fusion(spec, inputs, selection, run.queries), the same bits, where `run` is
// run_mechanism(spec, inputs, options)'s outputs with options.keep_window (and, for a
// hierarchical fusion, keep_surrogate_scores): each head's window and the fusion's chunk scores
// are read from `run` instead of computed again (the window only where run_mechanism ran on the
// values as given, scales_values_down; the oracle's fusions of the reference's own selection).
template <class Scalar>
std::vector<HeadOutputs<Scalar>> forced_fusion(const MechanismSpec& spec,
                                               const AttentionInputs<Scalar>& inputs,
                                               const std::vector<IndexMatrix>& selection,
                                               const MechanismOutputs<Scalar>& run);

// How many times forced_fusion has run in this process, on all threads: after the reference
// runs, the oracle's largest cost; tests check with it that verify() fuses only what it uses.
int64_t forced_fusion_runs();

// Compares kernel vs truth (double) given the float baseline, per head lists of equal shapes
// (a kernel shape mismatch is reported, not thrown). Rows are named `row_label`=row_ids[i]
// (e.g. "t" and the query slots, or "c" and chunk indices; row index when row_ids is empty).
// Where truth is -inf (chunks outside V(t)) the kernel must be -inf too. The floor is
// (floor_units x u + subnormal_units) x magnitude (Tolerances::subnormal_probability_units).
TensorReport compare_tensor(const std::string& name, const std::vector<Matrix<double>>& kernel,
                            const std::vector<Matrix<double>>& truth,
                            const std::vector<Matrix<double>>& baseline, double magnitude,
                            InputPrecision precision, const std::string& row_label,
                            const std::vector<int64_t>& row_ids, int64_t max_messages = 8,
                            double subnormal_units = 0.0);

// What a correct kernel's rounding can do to a statistic sum_r a_r e_r of a tensor's errors:
// the standard error of its unbiased roundings (the biased ones give ShiftTest's ranges).
struct MeanShiftBound {
  double standard_error = 0;
};
// Completes `test` (value, baseline, spread_standard_error set) with its tolerance and verdict
// and, when it fails, adds a problem line naming the statistic to `report`.
void check_shift(TensorReport& report, ShiftTest test, const MeanShiftBound& bound);

// How a kernel stored a tensor, read from its values against the truth: nullopt when some finite
// value is not a bf16 number (stored wider); else toward zero when the errors lean toward zero by
// more than a quarter ulp on average (truncation leans by half an ulp, rounding to nearest by
// none, whatever the error before the store), to nearest otherwise.
std::optional<Bf16Rounding> bf16_store_rounding(const std::vector<Matrix<double>>& kernel,
                                                const std::vector<Matrix<double>>& truth);
std::string describe_store(const std::optional<Bf16Rounding>& rounding);  // "fp32", "bf16 (toward zero)", ...

// Guard bytes: the first offset in [data, data+bytes) whose byte differs from `pattern`, or
// nullopt when the whole guard is intact.
std::optional<std::size_t> first_guard_violation(const void* data, std::size_t bytes,
                                                 unsigned char pattern);

}  // namespace hils::oracle
