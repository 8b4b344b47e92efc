// Exact chunk log-masses against the reference, exact ties and near-ties in the selection,
// and clear errors on bad input.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "case_inputs.hpp"
#include "device_support.hpp"

namespace {

using hils::AttentionInputs;
using hils::Matrix;
using hils::GroupRule;
using hils::MechanismSpec;
using hils::cases::Case;
using hils::gpu::DType;
namespace oracle = hils::oracle;
namespace gt = hils::gpu::testing;
using hils::cases::case_named;
using gt::tied_inputs;

std::vector<int64_t> all_queries(int64_t T) {
  std::vector<int64_t> q(T);
  for (int64_t t = 0; t < T; ++t) q[t] = t;
  return q;
}

// L(t,c) of every head from the reference in Scalar, widened to double.
template <class Scalar>
std::vector<Matrix<double>> reference_masses(const MechanismSpec& spec,
                                             const AttentionInputs<double>& in) {
  const auto geometry = hils::geometry_of(spec, in.T());
  const Scalar scale = static_cast<Scalar>(hils::logit_scale(spec, in.d()));
  std::vector<Matrix<double>> out;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const int64_t g = h / (in.Hq() / in.Hkv());
    const Matrix<Scalar> q = in.q[h].cast<Scalar>(), k = in.k[g].cast<Scalar>();
    out.push_back(hils::exact_chunk_log_mass<Scalar>(q, k, geometry, scale, all_queries(in.T()))
                      .template cast<double>());
  }
  return out;
}

// Largest finite |x| over the heads: the size of the logits the floor scales with.
double finite_magnitude(const std::vector<Matrix<double>>& heads) {
  double m = 0.0;
  for (const auto& h : heads)
    for (int64_t i = 0; i < h.size(); ++i)
      if (std::isfinite(h.data()[i])) m = std::max(m, std::abs(h.data()[i]));
  return std::max(m, 1.0);
}

// A preset as the selection tests name it ("hils", "lmk", "hils sum_probabilities", "hils
// max_raw": the preset with that group rule) on a case's geometry.
MechanismSpec selection_spec(const std::string& name, const Case& c) {
  MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(name.substr(0, name.find(' '))), c);
  if (name.find("sum_probabilities") != std::string::npos) spec.group_rule = GroupRule::sum_probabilities;
  if (name.find("max_raw") != std::string::npos) spec.group_rule = GroupRule::max_raw;
  return spec;
}

// What a selection kernel reads, staged on the device for one problem: the bf16 inputs, the
// window's lse (and o) and the chunk summaries.
struct SelectionInputs {
  SelectionInputs(const MechanismSpec& spec, const Case& c, const AttentionInputs<double>& inputs)
      : shape{c.T, c.Hq, c.Hkv, c.d, c.dv},
        set(gt::upload_inputs(inputs, DType::bf16)),
        o_swa(c.Hq * c.T * c.dv * 4),
        lse_swa(c.Hq * c.T * 4),
        key(c.Hq * (c.T / c.S) * c.d * 4),
        bias(c.Hq * (c.T / c.S) * 4) {
    hils::gpu::window_attention(spec, shape, set.view, o_swa.as<float>(), lse_swa.as<float>());
    hils::gpu::summarize(spec, shape, set.view, key.as<float>(), bias.as<float>());
  }
  hils::gpu::Shape shape;
  gt::DeviceInputSet set;
  gt::GuardedBuffer o_swa, lse_swa, key, bias;
};

// One selection kernel's selection [Hkv, T, K] and selected scores [Hq, T, K] on the staged
// inputs, run to completion, with their buffers' guards checked.
struct SelectionOutputs {
  gt::GuardedBuffer selection, selected;
};
SelectionOutputs select_with(const MechanismSpec& spec, const Case& c, const SelectionInputs& in,
                             hils::gpu::SelectKernel kernel) {
  SelectionOutputs out{gt::GuardedBuffer(c.Hkv * c.T * c.K * 4), gt::GuardedBuffer(c.Hq * c.T * c.K * 4)};
  hils::gpu::select_chunks(spec, in.shape, in.set.view, in.key.as<float>(), in.bias.as<float>(), nullptr,
                           in.lse_swa.as<float>(), out.selection.as<int32_t>(), out.selected.as<float>(),
                           nullptr, kernel);
  gt::check_cuda(cudaDeviceSynchronize(), "select_chunks");
  CHECK(out.selection.guard_damage("selection").empty());
  CHECK(out.selected.guard_damage("selected_score").empty());
  return out;
}

// A selection test's problem: its name, geometry and inputs.
struct SelectionProblem {
  std::string name;
  Case geometry;
  AttentionInputs<double> inputs;
};

// Each case's inputs, then longer_blocks with twin chunks (tied_inputs) at each perturbation:
// exact ties (0, named "longer_blocks ties 0") and near ties.
template <std::size_t N>
std::vector<SelectionProblem> cases_and_ties(const Case (&cases)[N]) {
  std::vector<SelectionProblem> problems;
  for (const Case& c : cases) problems.push_back({c.name, c, hils::cases::make_inputs<double>(c)});
  const Case tied = case_named("longer_blocks");
  for (double perturbation : {0.0, 1e-7, 1e-5}) {
    std::ostringstream label;
    label << "longer_blocks ties " << perturbation;
    problems.push_back({label.str(), tied, tied_inputs(tied, perturbation)});
  }
  return problems;
}

// The packed shapes for the selection that may differ from the exact kernels' at near ties (v25);
// the last with queries 100 times the usual, so that scores reach the hundreds.
// clang-format off
constexpr Case kNearTieShapes[] = {
  //   name                        T     S    W   K  Hq Hkv  d  dv  lmk  gain
  Case{"packed_bench_geometry", 2113,   64, 512, 32, 16,  2, 64, 64, true, 1.0},
  Case{"packed_g2_peaked",       777,   64,  64,  3,  4,  2, 64, 64, true, 4.0},
  Case{"packed_multi_tile",     5000,   64, 128, 16,  4,  1, 64, 64, true, 1.0},
  Case{"packed_k20_peaked",     9000,   64, 256, 20,  4,  1, 64, 64, true, 3.0},
  Case{"packed_large_scores",   2113,   64, 512, 32, 16,  2, 64, 64, true, 100.0},
};
// clang-format on

}  // namespace

TEST_CASE("gpu exact chunk log-masses over the case table", "[gpu]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Case& c : hils::cases::kCaseTable) {
      const MechanismSpec spec = hils::cases::with_case_geometry(hils::preset("naive_bsa"), c);
      const int64_t nc = c.T / c.S;
      if (nc == 0) continue;
      auto inputs = hils::cases::make_inputs<double>(c);
      if (dtype == DType::bf16) inputs = oracle::round_inputs_to_bf16(inputs);
      auto set = gt::upload_inputs(inputs, dtype);
      const hils::gpu::Shape shape{c.T, c.Hq, c.Hkv, c.d, c.dv};
      gt::GuardedBuffer exact(c.Hq * c.T * nc * 4);
      hils::gpu::exact_chunk_log_mass(spec, shape, set.view, exact.as<float>());
      gt::check_cuda(cudaDeviceSynchronize(), "exact_chunk_log_mass");
      const auto truth = reference_masses<double>(spec, inputs);
      const auto report = oracle::compare_tensor(
          "exact_log_mass", gt::heads_of(exact, c.Hq, c.T, nc), truth,
          reference_masses<float>(spec, inputs), finite_magnitude(truth),
          gt::precision_of(dtype), "t", all_queries(c.T));
      std::cout << c.name << " [" << gt::name_of(dtype) << "] exact_log_mass max_abs "
                << report.max_abs << " nmse " << report.nmse << " headroom " << report.headroom
                << (report.passed ? " PASS" : " FAIL") << "\n";
      for (const auto& p : report.problems) std::cout << "  " << p << "\n";
      INFO("case " << c.name << " " << gt::name_of(dtype));
      CHECK(report.passed);
      CHECK(exact.guard_damage("exact").empty());
    }
  }
}

namespace {

// tied_inputs' identical chunks (2, 5, 9, 13, 17) have bit-identical kernel scores: a copy may be
// chosen only after every lower-indexed twin was. The rows where that fails in a selection
// [Hkv, T, K]; rows_with_twins counts the rows that choose some but not all of the twins.
int64_t twin_violations(const gt::GuardedBuffer& selection, const Case& c, int64_t& rows_with_twins) {
  int64_t violations = 0;
  for (const auto& sel : gt::index_heads_of(selection, c.Hkv, c.T, c.K)) {
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<bool> chosen(c.T / c.S + 1, false);
      for (int64_t i = 0; i < c.K; ++i)
        if (sel(t, i) >= 0) chosen[sel(t, i)] = true;
      const int64_t twins[] = {2, 5, 9, 13, 17};
      bool gap = false;
      int64_t count = 0;
      for (int64_t tw : twins) {
        if (tw >= static_cast<int64_t>(chosen.size())) break;
        if (chosen[tw] && gap) ++violations;
        if (!chosen[tw]) gap = true;
        count += chosen[tw];
      }
      if (count > 0 && count < 5) ++rows_with_twins;
    }
  }
  return violations;
}

}  // namespace

TEST_CASE("gpu selection with exact ties keeps the lower chunk", "[gpu]") {
  const Case c = case_named("longer_blocks");
  const auto inputs = tied_inputs(c, 0.0);
  for (const char* preset : {"hils", "lmk", "nsa", "naive_bsa"}) {
    const MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
    for (DType dtype : {DType::f32, DType::bf16}) {
      auto set = gt::upload_inputs(inputs, dtype);
      const hils::gpu::Shape shape{c.T, c.Hq, c.Hkv, c.d, c.dv};
      gt::GuardedBuffer o(c.Hq * c.T * c.dv * 4), lse(c.Hq * c.T * 4);
      gt::GuardedBuffer selection(c.Hkv * c.T * c.K * 4);
      gt::GuardedBuffer workspace(hils::gpu::workspace_bytes(spec, shape));
      hils::gpu::DeviceOutputs dev;
      dev.o = o.as<float>(), dev.lse = lse.as<float>(), dev.selection = selection.as<int32_t>();
      hils::gpu::run_mechanism(spec, shape, set.view, dev, workspace.data());
      gt::check_cuda(cudaDeviceSynchronize(), "run_mechanism");
      int64_t rows_with_twins = 0;
      const int64_t violations = twin_violations(selection, c, rows_with_twins);
      std::cout << "ties " << preset << " [" << gt::name_of(dtype) << "]: rows cutting through "
                << "the tied chunks " << rows_with_twins << ", violations " << violations << "\n";
      INFO(preset << " " << gt::name_of(dtype));
      CHECK(violations == 0);
    }
  }
}

TEST_CASE("gpu selection with exact and near ties passes the oracle", "[gpu]") {
  const Case c = case_named("longer_blocks");
  for (double perturbation : {0.0, 1e-7, 1e-5}) {
    const auto inputs = tied_inputs(c, perturbation);
    for (const char* preset : {"hils", "nsa", "naive_bsa"}) {
      const MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
      for (DType dtype : {DType::f32, DType::bf16}) {
        const auto shape = hils::gpu::Shape{c.T, c.Hq, c.Hkv, c.d, c.dv};
        auto set = gt::upload_inputs(inputs, dtype);
        gt::GuardedBuffer o(c.Hq * c.T * c.dv * 4), lse(c.Hq * c.T * 4);
        gt::GuardedBuffer selection(c.Hkv * c.T * c.K * 4);
        gt::GuardedBuffer workspace(hils::gpu::workspace_bytes(spec, shape));
        hils::gpu::DeviceOutputs dev;
        dev.o = o.as<float>(), dev.lse = lse.as<float>(), dev.selection = selection.as<int32_t>();
        hils::gpu::run_mechanism(spec, shape, set.view, dev, workspace.data());
        gt::check_cuda(cudaDeviceSynchronize(), "run_mechanism");
        oracle::KernelOutputs out;
        out.o = gt::heads_of(o, c.Hq, c.T, c.dv);
        out.lse = gt::head_vectors_of(lse, c.Hq, c.T);
        out.selection = gt::index_heads_of(selection, c.Hkv, c.T, c.K);
        const auto verdict = oracle::verify(spec, inputs, out, gt::verify_options(dtype, c.d, spec));
        std::cout << "=== near-tie " << perturbation << " [" << gt::name_of(dtype) << "] "
                  << preset << "\n" << verdict.report();
        INFO(preset << " perturbation " << perturbation << " " << gt::name_of(dtype));
        CHECK(verdict.passed);
      }
    }
  }
}

TEST_CASE("gpu host API rejects bad input naming the field", "[gpu]") {
  int dummy = 0;
  hils::gpu::DeviceInputs in;
  in.q = in.k = in.v = &dummy;
  const hils::gpu::Shape good{64, 4, 2, 16, 16};
  MechanismSpec spec = hils::preset("hils");
  spec.S = 8, spec.W = 16, spec.K = 2;
  auto message = [&](MechanismSpec s, hils::gpu::Shape shape, hils::gpu::DeviceInputs i) {
    try {
      hils::gpu::validate(s, shape, i);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message(spec, good, in) == "accepted");
  CHECK(message(spec, {64, 3, 2, 16, 16}, in).rfind("Hq:", 0) == 0);
  CHECK(message(spec, {0, 4, 2, 16, 16}, in).rfind("T:", 0) == 0);
  CHECK(message(spec, {64, 4, 2, 300, 16}, in).rfind("d:", 0) == 0);
  MechanismSpec bad_w = spec;
  bad_w.W = 0;
  CHECK(message(bad_w, good, in).rfind("W:", 0) == 0);
  MechanismSpec shared = spec;
  shared.prior_rule = hils::PriorRule::shared;
  CHECK(message(shared, good, in).rfind("prior:", 0) == 0);
  MechanismSpec no_landmarks = spec;
  no_landmarks.landmarks = false;
  CHECK(message(no_landmarks, good, in).rfind("landmarks:", 0) == 0);
  hils::gpu::DeviceInputs missing = in;
  missing.v = nullptr;
  CHECK(message(spec, good, missing).rfind("v:", 0) == 0);
}

// A stage whose scratch cannot be allocated throws before it launches anything, naming the stage
// and the bytes, and leaves no CUDA error behind (a size above the device's whole memory is refused
// without asking the driver, so memcheck sees no failed call). The shapes are far beyond any device's memory
// (the selection's bf16 keys of T = 2^34 alone are 512 GiB; the sparse stage's fp16 sums of
// 128 heads at T = 2^24, 256 GiB), so nothing is read from the dummy pointers.
TEST_CASE("gpu stage scratch that cannot be allocated names the stage and the bytes", "[gpu]") {
  int dummy = 0;
  hils::gpu::DeviceInputs in;
  in.dtype = hils::gpu::DType::bf16;
  in.q = in.k = in.v = &dummy;
  MechanismSpec spec = hils::preset("hils");
  spec.S = 64, spec.W = 512, spec.K = 32;
  float* f = reinterpret_cast<float*>(&dummy);
  int32_t* selection = &dummy;
  const hils::gpu::Shape select_shape{int64_t{1} << 34, 16, 2, 64, 64};
  // The bf16 copy of k' [Hq, T / S, 64] and the scaled bias [Hq, T / S] (select_packed.cu).
  const int64_t rows = select_shape.Hq * (select_shape.T / spec.S);
  const std::string select_bytes = std::to_string(rows * 64 * 2 + rows * 4);
  CHECK_THROWS_WITH(hils::gpu::select_chunks(spec, select_shape, in, f, f, nullptr, f, selection, f),
                    Catch::StartsWith("hils::gpu selection scratch: cannot allocate " + select_bytes +
                                      " bytes ("));
  CHECK(cudaGetLastError() == cudaSuccess);
  spec.K = 15;
  const hils::gpu::Shape sparse_shape{int64_t{1} << 24, 128, 8, 64, 64};
  CHECK_THROWS_WITH(hils::gpu::fuse(spec, sparse_shape, in, selection, f, f, f, f, f),
                    Catch::StartsWith("hils::gpu sparse stage scratch: cannot allocate ") &&
                        Catch::Contains(" bytes ("));
  CHECK(cudaGetLastError() == cudaSuccess);
}

// The one-pass selection (v5: the exact one-pass claim, gpu/NOTES.md v5), the buffered
// two-pass selection (v8) and v15 (v8 scored by wgmma, whose sums equal mma.sync's bit for bit, 128
// queries per block, two tiles per pass-1 step with odd counts ending on a phantom tile, the
// writer's loads one unit ahead; also the path of v21, v22 and v25 for Hq T 64 >= 2^32) against
// the two-pass kernel v4: the same s2 and log2 Z_hat arithmetic and selected-score writers with
// the same sum order, v8's bound (64 slots) drops only candidates that cannot be selected, and v8
// keeps the K best under the same (value, chunk) order in another way (its buffer cuts run on
// every tile without a bound: max_raw, and the few-tile shapes), so the selections and selected
// scores must agree bit for bit, on packed shapes (one wave of blocks on a 132-SM GPU, whose
// second blocks block_t0 (select_packed/common.cuh) maps lightest first: packed_one_wave_g8 and, for
// the 64-query kernels, packed_k32_five_tiles; one and several scoring tiles, G = 1..16, K up to
// 64: K > 32 runs v8 and v15 as v4) and on exact and near ties, for the group rules each kernel
// takes. The oracle judges the default kernel over the case table through run_mechanism.
TEST_CASE("gpu one-pass selection equals the two-pass kernel", "[gpu]") {
  // clang-format off
  static constexpr Case kCases[] = {
    //   name                        T     S    W   K  Hq Hkv  d  dv  lmk  gain
    Case{"packed_bench_geometry", 2113,   64, 512, 32, 16,  2, 64, 64, true, 1.0},
    Case{"packed_g8_small_window",1500,   64, 128,  4,  8,  1, 64, 64, true, 1.0},
    Case{"packed_g2_peaked",       777,   64,  64,  3,  4,  2, 64, 64, true, 4.0},
    Case{"packed_g1_no_landmarks", 700,   64, 100,  5,  2,  2, 64, 64, false, 1.0},
    Case{"packed_multi_tile",     5000,   64, 128, 16,  4,  1, 64, 64, true, 1.0},
    Case{"packed_g16_k64",        4500,   64,  64, 64, 16,  1, 64, 64, true, 2.0},
    Case{"packed_g4_k40_peaked",  6000,   64,  64, 40,  8,  2, 64, 64, true, 5.0},
    Case{"packed_k32_three_tiles",12000,  64, 512, 32,  8,  1, 64, 64, true, 1.0},
    Case{"packed_k20_peaked",     9000,   64, 256, 20,  4,  1, 64, 64, true, 3.0},
    Case{"packed_k32_five_tiles", 17000,  64, 512, 32,  8,  1, 64, 64, true, 1.0},
    Case{"packed_one_wave_g8",    12000,  64, 512, 32, 16,  2, 64, 64, true, 1.0},
  };
  // clang-format on
  std::vector<SelectionProblem> problems = cases_and_ties(kCases);
  // Every head of the group equal: each chunk's group score is attained by all G heads.
  {
    const Case& c = kCases[std::size(kCases) - 1];
    auto equal = hils::cases::make_inputs<double>(c);
    for (int64_t h = 0; h < c.Hq; ++h) equal.q[h] = equal.q[h / (c.Hq / c.Hkv) * (c.Hq / c.Hkv)];
    problems.push_back({std::string(c.name) + " equal heads", c, std::move(equal)});
  }
  for (const SelectionProblem& problem : problems) {
    const Case& c = problem.geometry;
    const auto& inputs = problem.inputs;
    for (const char* preset : {"hils", "lmk", "hils sum_probabilities", "hils max_raw"}) {
      const MechanismSpec spec = selection_spec(preset, c);
      if (!c.landmarks) continue;  // both presets read the landmark slots
      const SelectionInputs staged(spec, c, inputs);
      std::vector<std::vector<unsigned char>> selections, scores;
      const auto kernels = {hils::gpu::SelectKernel::two_pass_v4, hils::gpu::SelectKernel::one_pass_v5,
                            hils::gpu::SelectKernel::two_pass_v8, hils::gpu::SelectKernel::two_pass_v15};
      for (auto kernel : kernels) {
        const SelectionOutputs run = select_with(spec, c, staged, kernel);
        selections.push_back(run.selection.download());
        scores.push_back(run.selected.download());
      }
      const auto* base = reinterpret_cast<const int32_t*>(selections[0].data());
      // Every row was written: a block-to-rows mapping that skipped a block would leave the
      // buffer's poison (0xFF bytes, i.e. -1 entries) in every kernel alike, so a row with at
      // least K candidate chunks (t >= W + (K + 2) S) must hold K chunks in [0, T / S).
      int64_t unwritten = 0;
      for (int64_t row = 0; row < c.Hkv * c.T; ++row)
        if (row % c.T >= c.W + (c.K + 2) * c.S)
          for (int64_t i = 0; i < c.K; ++i) unwritten += base[row * c.K + i] < 0 || base[row * c.K + i] >= c.T / c.S;
      INFO(problem.name << " " << preset << " v4 entries of full rows outside [0, T / S)");
      CHECK(unwritten == 0);
      for (std::size_t k = 1; k < selections.size(); ++k) {
        int64_t differing_rows = 0;
        const auto* other = reinterpret_cast<const int32_t*>(selections[k].data());
        for (int64_t row = 0; row < c.Hkv * c.T; ++row)
          for (int64_t i = 0; i < c.K; ++i)
            if (other[row * c.K + i] != base[row * c.K + i]) {
              ++differing_rows;
              break;
            }
        const char* labels[] = {"two-pass v4", "one-pass v5", "two-pass v8", "two-pass v15"};
        const char* label = labels[k];
        std::cout << label << " vs two-pass v4 " << problem.name << " " << preset << ": rows "
                  << c.Hkv * c.T << ", differing " << differing_rows << "\n";
        INFO(problem.name << " " << preset << " " << label);
        CHECK(differing_rows == 0);
        CHECK(scores[k] == scores[0]);
      }
    }
  }
}

// v25 adds the bias and -log2 Z_hat / scale2 to pass 2's products by a fifth wgmma k-step (three
// bf16 pieces each) and ranks r' = scale2 max_h acc_h, with pass 1's bound lowered by a margin
// (select_packed/inputs.cuh kFoldMargin), so a row may differ from v22's at a near tie: the oracle judges
// its selections as sets on the packed shapes, queries 100 times the usual (log2 Z_hat in the
// hundreds, the pieces' largest terms), exact and near ties and the four group rules; with exact
// ties the lower twin must be chosen first (identical chunks have identical products). For the
// group rules other than max_normalized v25 runs v22's pass 2: its selections and scores must be
// v22's bytes; for max_normalized its scores are v22's kernel's on its own selection, so every row
// it selects as v22 does must have v22's scores in each of the group's heads.
TEST_CASE("gpu selection v25 with the bias and log Z_hat in its products passes the oracle", "[gpu]") {
  for (const SelectionProblem& problem : cases_and_ties(kNearTieShapes)) {
    const Case& c = problem.geometry;
    const auto& inputs = problem.inputs;
    const bool exact_ties = problem.name == "longer_blocks ties 0";
    for (const char* preset : {"hils", "lmk", "hils sum_probabilities", "hils max_raw"}) {
      const MechanismSpec spec = selection_spec(preset, c);
      const SelectionInputs staged(spec, c, inputs);
      const oracle::Verifier verifier(spec, inputs, gt::verify_options(DType::bf16, c.d, spec));
      const SelectionOutputs v22 = select_with(spec, c, staged, hils::gpu::SelectKernel::two_pass_v22);
      const SelectionOutputs v25 = select_with(spec, c, staged, hils::gpu::SelectKernel::two_pass_v25);
      oracle::KernelOutputs out;
      out.selection = gt::index_heads_of(v25.selection, c.Hkv, c.T, c.K);
      const oracle::Verdict verdict = verifier.verify(out);
      const auto bytes22 = v22.selection.download(), bytes25 = v25.selection.download();
      const auto scores22 = v22.selected.download(), scores25 = v25.selected.download();
      const int64_t G = c.Hq / c.Hkv;
      const auto row_bytes = static_cast<std::size_t>(c.K) * 4;
      int64_t differing_rows = 0, scores_off = 0;
      for (int64_t g = 0; g < c.Hkv; ++g)
        for (int64_t t = 0; t < c.T; ++t) {
          if (std::memcmp(bytes25.data() + (g * c.T + t) * row_bytes, bytes22.data() + (g * c.T + t) * row_bytes,
                          row_bytes) != 0) {
            ++differing_rows;
            continue;
          }
          for (int64_t h = g * G; h < (g + 1) * G; ++h)
            scores_off += std::memcmp(scores25.data() + (h * c.T + t) * row_bytes,
                                      scores22.data() + (h * c.T + t) * row_bytes, row_bytes) != 0;
        }
      int64_t rows_with_twins = 0;
      const int64_t violations = exact_ties ? twin_violations(v25.selection, c, rows_with_twins) : 0;
      std::cout << "=== two_pass_v25 " << problem.name << " " << preset << ": rows " << c.Hkv * c.T
                << ", differing from v22 " << differing_rows << ", score rows off " << scores_off
                << ", twin violations " << violations << " (rows cutting through the twins "
                << rows_with_twins << ")\n"
                << verdict.report();
      INFO(problem.name << " " << preset);
      CHECK(verdict.passed);
      CHECK(scores_off == 0);
      CHECK(violations == 0);
      if (spec.group_rule != GroupRule::max_normalized) {
        CHECK(bytes25 == bytes22);
        CHECK(scores25 == scores22);
      }
    }
  }
}

// v21 runs v15's selection (v16: its pass-2 copies from 32-bit state) and sums its selected scores
// from the bf16 copy of k' that the ranking scored (v20: half the writer's bytes) in a kernel of
// their own (selected_scores_lean_kernel: its partial sums reduced by one reduce-scatter per head),
// so its selections must be v8's bytes and each selected score must be the surrogate score of the
// same (head, query, chunk) computed by the generic kernel from k' rounded to bf16 on the host, up
// to fp32 summation order; v8's scores must be the same surrogate from the fp32 k'. The two differ
// by k''s rounding (up to ~4e-3 on scores of ~5 on the benchmark inputs), which the tolerance
// (1e-5 per unit of score) does not cover, so a writer that read the fp32 rows, another head's row
// or another chunk's row fails. (lmk's k' are bf16 keys, which the rounding leaves as they are:
// there v21's scores are v8's bytes.) v22's selections and scores must be v21's bytes (v21's kernel
// with the slots past a row's entries summed from chunk 0's row).
// v26 runs v22's scores kernel on the fp32 k': its scores must be the fp32-k' surrogate's (v8's);
// v27 (the default) on an fp16 copy: the fp16-k' surrogate's. The fourth case puts k' beyond fp16's
// range (keys x 2^17, queries x 2^-17: the same logits): v27 must read those parts from fp32 k'
// (finite scores within fp16 rounding of the fp32 surrogate).
TEST_CASE("gpu selection v21 and v22 score their choices from the bf16 k' they ranked with, v26 from fp32 k', "
          "v27 from fp16 k'",
          "[gpu]") {
  // clang-format off
  static constexpr Case kCases[] = {
    //   name                        T     S    W   K  Hq Hkv  d  dv  lmk  gain
    Case{"packed_bench_geometry", 2113,   64, 512, 32, 16,  2, 64, 64, true, 1.0},
    Case{"packed_g2_peaked",       777,   64,  64,  3,  4,  2, 64, 64, true, 4.0},
    Case{"packed_multi_tile",     5000,   64, 128, 16,  4,  1, 64, 64, true, 1.0},
    Case{"packed_fp16_overflow",   777,   64,  64,  3,  4,  2, 64, 64, true, 1.0},
  };
  // clang-format on
  for (const Case& c : kCases) {
    auto inputs = hils::cases::make_inputs<double>(c);
    const bool overflow = std::string(c.name) == "packed_fp16_overflow";
    if (overflow) {
      for (auto& k : inputs.k) k *= 131072.0;
      for (auto& q : inputs.q) q /= 131072.0;
      inputs.q_retrieval.clear();
    }
    for (const char* preset : {"hils", "lmk"}) {
      const MechanismSpec spec = selection_spec(preset, c);
      const int64_t nc = c.T / c.S;
      const SelectionInputs staged(spec, c, inputs);
      // k' rounded on the host (to nearest even) to bf16, as the selection's copy, and to fp16,
      // as v27's.
      const std::vector<unsigned char> key_bytes = staged.key.download();
      auto rounded_key = [&](auto round) {
        std::vector<float> values(key_bytes.size() / 4);
        std::memcpy(values.data(), key_bytes.data(), key_bytes.size());
        for (float& x : values) x = static_cast<float>(round(x));
        std::vector<unsigned char> bytes(key_bytes.size());
        std::memcpy(bytes.data(), values.data(), bytes.size());
        return gt::upload(bytes);
      };
      const gt::GuardedBuffer key_bf16 = rounded_key([](float x) { return oracle::round_to_bf16(x); });
      const gt::GuardedBuffer key_fp16 = rounded_key([](float x) { return oracle::round_to_fp16(x); });
      gt::GuardedBuffer surrogate(c.Hq * c.T * nc * 4), surrogate_bf16(c.Hq * c.T * nc * 4),
          surrogate_fp16(c.Hq * c.T * nc * 4);
      hils::gpu::surrogate_scores(spec, staged.shape, staged.set.view, staged.key.as<float>(),
                                  staged.bias.as<float>(), surrogate.as<float>());
      hils::gpu::surrogate_scores(spec, staged.shape, staged.set.view, key_bf16.as<float>(),
                                  staged.bias.as<float>(), surrogate_bf16.as<float>());
      hils::gpu::surrogate_scores(spec, staged.shape, staged.set.view, key_fp16.as<float>(),
                                  staged.bias.as<float>(), surrogate_fp16.as<float>());
      struct Run {
        std::vector<int32_t> selection;
        std::vector<float> scores;
      };
      auto run = [&](hils::gpu::SelectKernel kernel) {
        const SelectionOutputs out = select_with(spec, c, staged, kernel);
        Run r{std::vector<int32_t>(c.Hkv * c.T * c.K), std::vector<float>(c.Hq * c.T * c.K)};
        const auto sel_bytes = out.selection.download();
        const auto score_bytes = out.selected.download();
        std::memcpy(r.selection.data(), sel_bytes.data(), sel_bytes.size());
        std::memcpy(r.scores.data(), score_bytes.data(), score_bytes.size());
        return r;
      };
      const Run v8 = run(hils::gpu::SelectKernel::two_pass_v8);
      const Run v21 = run(hils::gpu::SelectKernel::two_pass_v21);
      const Run v22 = run(hils::gpu::SelectKernel::two_pass_v22);
      const Run v26 = run(hils::gpu::SelectKernel::two_pass_v26);
      const Run v27 = run(hils::gpu::SelectKernel::two_pass_v27);
      auto floats = [](const gt::GuardedBuffer& b) {
        const auto bytes = b.download();
        std::vector<float> f(bytes.size() / 4);
        std::memcpy(f.data(), bytes.data(), bytes.size());
        return f;
      };
      const std::vector<float> s32 = floats(surrogate), s16 = floats(surrogate_bf16), sh = floats(surrogate_fp16);
      INFO("case " << c.name << " preset " << preset);
      CHECK(v21.selection == v8.selection);
      CHECK(v22.selection == v21.selection);
      CHECK(v22.scores == v21.scores);
      CHECK(v26.selection == v8.selection);
      CHECK(v27.selection == v8.selection);
      const int64_t G = c.Hq / c.Hkv;
      int64_t checked = 0, off_v8 = 0, off_v21 = 0, off_v26 = 0, v26_bits_not_v8 = 0, rounding_visible = 0;
      int64_t off_v27 = 0, v27_not_finite = 0;
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t t = 0; t < c.T; ++t)
          for (int64_t j = 0; j < c.K; ++j) {
            const int32_t chunk = v8.selection[((h / G) * c.T + t) * c.K + j];
            const float a8 = v8.scores[(h * c.T + t) * c.K + j], a21 = v21.scores[(h * c.T + t) * c.K + j];
            const float a26 = v26.scores[(h * c.T + t) * c.K + j], a27 = v27.scores[(h * c.T + t) * c.K + j];
            if (chunk < 0) continue;
            const float e32 = s32[(h * c.T + t) * nc + chunk], e16 = s16[(h * c.T + t) * nc + chunk];
            ++checked;
            off_v8 += std::fabs(a8 - e32) > 1e-5f * (1.0f + std::fabs(e32));
            off_v21 += std::fabs(a21 - e16) > 1e-5f * (1.0f + std::fabs(e16));
            off_v26 += std::fabs(a26 - e32) > 1e-5f * (1.0f + std::fabs(e32));
            v26_bits_not_v8 += a26 != a8;
            const float eh = sh[(h * c.T + t) * nc + chunk];
            v27_not_finite += !std::isfinite(a27);
            // Where k' overflowed fp16 the expected value mixes fp16 and fp32 parts: within fp16's
            // rounding of the fp32 surrogate (the scores are O(1) there).
            off_v27 += overflow ? std::fabs(a27 - e32) > 2e-3f * (1.0f + std::fabs(e32))
                                : std::fabs(a27 - eh) > 1e-5f * (1.0f + std::fabs(eh));
            rounding_visible += std::fabs(e16 - e32) > 1e-5f * (1.0f + std::fabs(e32));
          }
      std::cout << "v21 " << c.name << " " << preset << ": " << checked << " selected scores, off the fp32 "
                << "surrogate (v8) " << off_v8 << ", off the bf16-k' surrogate (v21) " << off_v21
                << ", where k''s rounding shows " << rounding_visible << "; v26 off the fp32 surrogate "
                << off_v26 << ", not v8's bits " << v26_bits_not_v8 << "; v27 off its surrogate " << off_v27
                << ", not finite " << v27_not_finite << "\n";
      CHECK(checked > 0);
      CHECK(off_v8 == 0);
      CHECK(off_v21 == 0);
      CHECK(off_v26 == 0);
      CHECK(off_v27 == 0);
      CHECK(v27_not_finite == 0);
      if (spec.key_rule == hils::KeyRule::landmark_key)
        // lmk's k' are landmark tokens' keys, bf16 inputs: bf16 holds them exactly, so v21's
        // scores are v8's sums of the same values.
        CHECK(v21.scores == v8.scores);
      else
        CHECK(rounding_visible > 0);  // the test tells the two writers apart
    }
  }
}
