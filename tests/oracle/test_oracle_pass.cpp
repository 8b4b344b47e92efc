// A correct kernel passes: the reference's own float run, on every case of the table and every
// preset; the forced fusion reproduces run_mechanism; the tolerance is neither zero nor loose.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include <omp.h>

#include "hils/fuse_rows.hpp"
#include "oracle_support.hpp"

using namespace hils;
using namespace hils::oracle;
using hils::oracle::testing::case_named;
using hils::oracle::testing::float_kernel;
using hils::oracle::testing::specs_for;

TEST_CASE("the float reference passes as the kernel on every case and preset", "[oracle]") {
  for (const auto& c : cases::kCaseTable) {
    const auto inputs = cases::make_inputs<double>(c);
    for (const auto& spec : specs_for(c)) {
      const Verdict verdict = verify(spec, inputs, float_kernel(spec, inputs));
      INFO("case " << c.name << ", spec " << spec.name << "\n" << verdict.report());
      CHECK(verdict.passed);
      for (const auto& t : verdict.tensors) CHECK(t.headroom <= 1.0);
    }
  }
}

TEST_CASE("a bf16 kernel passes under the bf16 policy and fails under fp32", "[oracle]") {
  const auto bf16 = InputPrecision::bf16, fp32 = InputPrecision::fp32;
  for (const char* name : {"gqa_group4", "peaked_attention", "ragged_tail_no_landmarks"}) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    for (const auto& spec : specs_for(c)) {
      INFO("case " << name << ", spec " << spec.name);
      // bf16 inputs, bf16 o, fp32 scores and lse.
      const KernelOutputs kernel = float_kernel(spec, inputs, bf16);
      const Verdict pass = verify(spec, inputs, kernel, {bf16});
      INFO(pass.report());
      CHECK(pass.passed);
      CHECK_FALSE(verify(spec, inputs, kernel, {fp32}).passed);
      // Scores, summaries and (hierarchical) lse stored in bf16 need score_precision bf16.
      const KernelOutputs rounded = float_kernel(spec, inputs, bf16, bf16);
      VerifyOptions options{bf16};
      options.score_precision = bf16;
      const Verdict declared = verify(spec, inputs, rounded, options);
      INFO(declared.report());
      CHECK(declared.passed);
      if (spec.selects()) CHECK_FALSE(verify(spec, inputs, rounded, {bf16}).passed);
    }
  }
}

TEST_CASE("an fp16 kernel passes under the fp16 policy and fails under fp32 and bf16", "[oracle]") {
  // fp16 inputs, fp32 scores and lse, o stored in fp16 (FlashAttention's fp16 path). Declared
  // fp32 its o fails the fp32 floor; declared bf16 the oracle's inputs are other numbers (fp16
  // holds 3 more bits) and lse fails. A kernel that computes from bf16 copies of its fp16 inputs
  // fails under fp16.
  const auto fp16 = InputPrecision::fp16;
  for (const char* name : {"gqa_group4", "peaked_attention", "ragged_tail_no_landmarks"}) {
    const auto& c = case_named(name);
    const auto inputs = round_inputs_to(cases::make_inputs<double>(c), fp16);
    for (const auto& spec : specs_for(c)) {
      INFO("case " << name << ", spec " << spec.name);
      const KernelOutputs kernel = float_kernel(spec, inputs, fp16);
      const Verdict pass = verify(spec, inputs, kernel, {fp16});
      INFO(pass.report());
      CHECK(pass.passed);
      CHECK_FALSE(verify(spec, inputs, kernel, {InputPrecision::fp32}).passed);
      CHECK_FALSE(verify(spec, inputs, kernel, {InputPrecision::bf16}).passed);
      KernelOutputs from_bf16 = float_kernel(spec, round_inputs_to_bf16(inputs), fp16);
      from_bf16.selection = kernel.selection;  // its fusion judged, not a flipped near tie
      CHECK_FALSE(verify(spec, inputs, from_bf16, {fp16}).passed);
    }
  }
}

TEST_CASE("fp16: the floors of o and the gradients count subnormal probabilities and fp16 is no "
          "score precision and refuses inputs beyond 65504 naming them", "[oracle]") {
  const auto fp16 = InputPrecision::fp16;
  const auto& c = case_named("gqa_group4");
  const auto inputs = round_inputs_to(cases::make_inputs<double>(c), fp16);
  // The floor of o: 4 units of 2^-11, and 2^-25 for each key of the largest softmax (a kernel
  // that rounds P to fp16 errs absolutely below 2^-14), in units of max |v|.
  for (const auto& spec : specs_for(c)) {
    INFO("spec " << spec.name);
    const Verdict verdict = verify(spec, inputs, float_kernel(spec, inputs, fp16), {fp16});
    const int64_t T = inputs.T();
    const int64_t keys = spec.fusion == Fusion::full
                             ? T
                             : std::min<int64_t>(T, spec.W + spec.S - 1 +
                                                           (spec.selects() ? spec.K * spec.S : 0));
    for (const auto& t : verdict.tensors)
      if (t.name == "o" || t.name == "o_window")
        CHECK(t.floor == Approx((4.0 * 0x1p-11 + static_cast<double>(keys) * 0x1p-25) * t.magnitude)
                             .epsilon(1e-12));
  }
  // fp16 is an input precision only.
  CHECK(parse_input_precision("fp16") == fp16);
  CHECK_THROWS_WITH(parse_score_precision("fp16"), Catch::EndsWith("got \"fp16\""));
  // The gradients' floors (one softmax per query): 4 units of 2^-11 of the gradient's largest
  // entry, plus 2^-25 x (products x factor + 1): dq sums the keys of its softmax (T; for the
  // window W + S - 1 at most) times sigma max |k|, dk and dv the queries of its KV group that
  // read the key (G x T; G x (W + S - 1) for the window) times sigma max |q| and max |do|.
  auto largest = [](const std::vector<Matrix<double>>& heads) {
    double m = 0;
    for (const auto& x : heads) m = std::max(m, x.cwiseAbs().maxCoeff());
    return m;
  };
  const double sigma = 1.0 / std::sqrt(static_cast<double>(inputs.d()));
  const double G = static_cast<double>(inputs.Hq() / inputs.Hkv());
  const MechanismSpec full = preset("full");
  for (const MechanismSpec& spec : {full, cases::with_case_geometry(preset("swa"), c)}) {
    KernelOutputs with_grads = float_kernel(spec, inputs, fp16);
    with_grads.gradients = testing::float_gradients(spec, inputs, with_grads.selection, 7, fp16);
    const Verdict graded = verify(spec, inputs, with_grads, {fp16});
    INFO(spec.name << "\n" << graded.report());
    CHECK(graded.passed);
    const double n = static_cast<double>(
        spec.fusion == Fusion::full ? inputs.T() : std::min<int64_t>(inputs.T(), c.W + c.S - 1));
    const std::map<std::string, double> subnormal = {
        {"dq", (n * sigma * largest(inputs.k) + 1) * 0x1p-25},
        {"dk", (G * n * sigma * largest(inputs.q) + 1) * 0x1p-25},
        {"dv", (G * n * largest(with_grads.gradients.d_o) + 1) * 0x1p-25}};
    int floors = 0;
    for (const auto& t : graded.tensors)
      if (subnormal.count(t.name)) {
        ++floors;
        CHECK(t.floor ==
              Approx(4.0 * 0x1p-11 * t.magnitude + subnormal.at(t.name)).epsilon(1e-12));
      }
    CHECK(floors == 3);
  }
  // An input that fp16 cannot hold is refused, named.
  AttentionInputs<double> big = inputs;
  big.v[1](3, 5) = 70000.0;
  CHECK_THROWS_WITH(verify(full, big, float_kernel(full, inputs, fp16), {fp16}),
                    "v[1](3, 5): expected a value within fp16's range (|x| <= 65504: "
                    "input_precision is fp16), got 7e+04");
}

namespace {

// The fp16 floors' count for a hierarchical fusion's summaries (data/verify_format.md
// "Gradients"), worked out here from the reference's own summaries (k'_c, b'_c = H(p), so that
// sum_j p_j ell_j = LSE(ell) - b'), chunk by chunk, in units of 2^-25: d mu_c's row (prior_row;
// prior_sum, its sum over chunks) and the key rule's dk rows summed over a KV group's heads.
struct ChainCount {
  double prior_row = 0, prior_sum = 0, key_rows = 0;
};

ChainCount chain_count(const MechanismSpec& spec, const AttentionInputs<double>& inputs,
                       const std::vector<IndexMatrix>& selection) {
  const Geometry geo = geometry_of(spec, inputs.T());
  const double sigma = logit_scale(spec, inputs.d());
  const int64_t G = inputs.Hq() / inputs.Hkv(), tokens = geo.tokens_per_chunk();
  double max_k = 0;
  for (const auto& k : inputs.k) max_k = std::max(max_k, k.cwiseAbs().maxCoeff());
  ChainCount out;
  std::vector<double> head_sums(static_cast<size_t>(inputs.Hq()), 0.0);
  for (int64_t g = 0; g < inputs.Hkv(); ++g)
    for (int64_t c = 0; c < geo.n_chunks(); ++c) {
      double key_rows = 0;
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        const Matrix<double>& qr = inputs.retrieval_query(h);
        // The queries of the group that selected c: each d s_hat a rounding.
        double selecting = 0;
        Vector<double> sums = Vector<double>::Zero(inputs.d());
        for (int64_t t = 0; t < inputs.T(); ++t)
          for (int64_t s = 0; s < spec.K; ++s)
            if (selection[static_cast<size_t>(g)](t, s) == c) {
              selecting += 1;
              for (int64_t i = 0; i < inputs.d(); ++i) sums(i) += std::fabs(qr(t, i));
            }
        const double key = sigma * sums.maxCoeff() + 1, bias = selecting + 1;
        key_rows += spec.key_rule == KeyRule::mean ? key / static_cast<double>(tokens) : key;
        if (!spec.needs_prior()) continue;
        const Matrix<double> mu = resolve_prior(inputs, h, spec, geo);
        const auto summary = summarize(inputs.k[static_cast<size_t>(g)], mu, spec.key_rule,
                                       spec.bias_rule, geo, sigma);
        double top = -INFINITY, spread = 0, distance = 0;
        const Matrix<double>& k = inputs.k[static_cast<size_t>(g)];
        std::vector<double> ell;
        for (int64_t j = 0; j < tokens; ++j) {
          ell.push_back(sigma * k.row(c * spec.S + j).dot(mu.row(c)));
          top = std::max(top, ell.back());
        }
        double total = 0;
        for (double e : ell) total += std::exp(e - top);
        const double mean_ell = top + std::log(total) - summary.bias(c);  // LSE - H(p)
        for (int64_t j = 0; j < tokens; ++j) {
          spread = std::max(spread, std::fabs(ell[static_cast<size_t>(j)] - mean_ell));
          double l1 = 0;
          for (int64_t i = 0; i < inputs.d(); ++i)
            l1 += std::fabs(k(c * spec.S + j, i) - summary.key(c, i));
          distance = std::max(distance, l1);
        }
        const double d_ell = (spec.key_rule == KeyRule::taylor ? distance * key : 0.0) +
                             (spec.bias_rule == BiasRule::entropy ? spread * bias : 0.0);
        const double d_mu = sigma * max_k * (static_cast<double>(tokens) + d_ell);
        out.prior_row = std::max(out.prior_row, d_mu);
        head_sums[static_cast<size_t>(h)] += d_mu;
        key_rows += sigma * mu.row(c).cwiseAbs().maxCoeff() * (1 + d_ell);
      }
      out.key_rows = std::max(out.key_rows, key_rows);
    }
  for (double sum : head_sums) out.prior_sum = std::max(out.prior_sum, sum);
  return out;
}

}  // namespace

TEST_CASE("fp16: a hierarchical fusion's gradient floors count d s_hat and the summaries' "
          "rounded gradients", "[oracle][gradients]") {
  // 4 units of 2^-11 of each gradient's largest entry plus 2^-25 x (terms + 1): dq the keys of
  // its softmaxes (W + S - 1 + K S) x sigma max |k| (with q~ given, its own tensor); dq~ its K
  // d s_hat x sigma max |k| and, at the landmark slots, d mu's row (landmark_query prior); dk the
  // G T queries x sigma max |q| and the key rule's rows; dv G T x max |do|; a shared prior's
  // dprior the sum over chunks of d mu_c.
  const auto fp16 = InputPrecision::fp16;
  auto largest = [](const std::vector<Matrix<double>>& heads) {
    double m = 0;
    for (const auto& x : heads) m = std::max(m, x.cwiseAbs().maxCoeff());
    return m;
  };
  std::vector<std::pair<const char*, MechanismSpec>> runs;
  for (const char* name : {"lmk", "hils"})
    runs.emplace_back("gqa_group4",
                      cases::with_case_geometry(preset(name), case_named("gqa_group4")));
  for (const auto& spec : table5_ablations()) {  // the other key rules, entropy alone, dprior
    if (spec.name == "hils_mean_pooling" || spec.name == "hils_landmark_key_entropy")
      runs.emplace_back("gqa_group4", cases::with_case_geometry(spec, case_named("gqa_group4")));
    if (spec.name == "hils_no_landmark_shared_prior")
      runs.emplace_back("ragged_tail_no_landmarks",
                        cases::with_case_geometry(spec, case_named("ragged_tail_no_landmarks")));
  }
  for (const auto& [case_name, spec] : runs) {
    const auto& c = case_named(case_name);
    const auto inputs = round_inputs_to(cases::make_inputs<double>(c), fp16);
    KernelOutputs kernel = float_kernel(spec, inputs, fp16);
    kernel.gradients = testing::float_gradients(spec, inputs, kernel.selection, 7, fp16);
    const Verdict verdict = verify(spec, inputs, kernel, {fp16});
    INFO(case_name << " " << spec.name << "\n" << verdict.report());
    CHECK(verdict.passed);
    const double sigma = logit_scale(spec, inputs.d()), kappa = sigma * largest(inputs.k);
    const double G = static_cast<double>(inputs.Hq() / inputs.Hkv());
    const double T = static_cast<double>(inputs.T());
    const ChainCount chain = chain_count(spec, inputs, kernel.selection);
    const bool landmark_prior = spec.needs_prior() && spec.prior_rule == PriorRule::landmark_query;
    const double keys = static_cast<double>(
        std::min<int64_t>(inputs.T(), spec.W + spec.S - 1 + spec.K * spec.S));
    const double dq_retrieval =
        static_cast<double>(spec.K) * kappa + (landmark_prior ? chain.prior_row : 0.0);
    std::map<std::string, double> terms = {
        {"dq", keys * kappa},
        {"dq_retrieval", dq_retrieval},
        {"dk", G * T * sigma * largest(inputs.q) + chain.key_rows},
        {"dv", G * T * largest(kernel.gradients.d_o)}};
    if (spec.needs_prior() && !landmark_prior) terms["dprior"] = chain.prior_sum;
    CHECK(chain.key_rows > 0);
    if (spec.needs_prior()) CHECK(chain.prior_row > 0);
    int floors = 0;
    for (const auto& t : verdict.tensors)
      if (terms.count(t.name)) {
        ++floors;
        INFO(t.name);
        CHECK(t.floor == Approx(4.0 * 0x1p-11 * t.magnitude + (terms.at(t.name) + 1) * 0x1p-25)
                             .epsilon(1e-12));
      }
    CHECK(floors == static_cast<int>(terms.size()));
  }
}

TEST_CASE("verify fuses with the moved logit scale only for a kernel that gives a bf16 lse",
          "[oracle]") {
  // The lse check of a hierarchical kernel with bf16 scores needs the fusion of the reference's
  // selection at a moved logit scale; a kernel without lse never uses it. The kernel here is the
  // double reference on the bf16 inputs: its selection is the reference's, so no query block is
  // fused again and the count is the oracle's own fusions: truth and float baseline (2), plus
  // the moved scale (1) when an lse is compared.
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  MechanismSpec spec = preset("hils");
  spec.S = c.S, spec.W = c.W, spec.K = c.K;
  VerifyOptions options{InputPrecision::bf16};
  options.score_precision = InputPrecision::bf16;
  const auto run = run_mechanism(spec, round_inputs_to_bf16(inputs));
  KernelOutputs with_lse;
  for (const auto& h : run.heads) with_lse.o.push_back(h.o), with_lse.lse.push_back(h.lse);
  with_lse.selection = run.selection;
  KernelOutputs without_lse = with_lse;
  without_lse.lse.clear();
  auto fusions_of = [](const auto& verdict_of) {
    const int64_t before = forced_fusion_runs();
    const Verdict verdict = verdict_of();
    INFO(verdict.report());
    CHECK(verdict.passed);
    return forced_fusion_runs() - before;
  };
  CHECK(fusions_of([&] { return verify(spec, inputs, without_lse, options); }) == 2);
  CHECK(fusions_of([&] { return verify(spec, inputs, with_lse, options); }) == 3);
  // A Verifier fuses the moved scale at the first kernel with an lse, once for all its copies.
  const int64_t before = forced_fusion_runs();
  const Verifier oracle(spec, inputs, options);
  CHECK(forced_fusion_runs() - before == 2);
  CHECK(fusions_of([&] { return oracle.verify(without_lse); }) == 0);
  const Verifier copy = oracle;
  CHECK(fusions_of([&] { return copy.verify(with_lse); }) == 1);
  CHECK(fusions_of([&] { return oracle.verify(with_lse); }) == 0);
}

TEST_CASE("forced fusion with the reference's selection reproduces run_mechanism", "[oracle]") {
  for (const auto& c : cases::kCaseTable) {
    const auto inputs = cases::make_inputs<double>(c);
    for (auto spec : specs_for(c)) {
      if (!spec.selects()) continue;
      for (bool softmax1 : {false, true}) {
        if (softmax1 && spec.fusion != Fusion::hierarchical) continue;
        spec.softmax1 = softmax1;
        const auto run = run_mechanism(spec, inputs);
        const auto forced = forced_fusion(spec, inputs, run.selection, run.queries);
        INFO("case " << c.name << ", spec " << spec.name << ", softmax1 " << softmax1);
        REQUIRE(forced.size() == run.heads.size());
        for (size_t h = 0; h < forced.size(); ++h) {
          CHECK((forced[h].o - run.heads[h].o).cwiseAbs().maxCoeff() <= 1e-12);
          CHECK((forced[h].lse - run.heads[h].lse).cwiseAbs().maxCoeff() <= 1e-12);
          CHECK((forced[h].fusion_weights - run.heads[h].fusion_weights).cwiseAbs().maxCoeff() <=
                1e-12);
        }
      }
    }
  }
}

// Every head's o, lse and fusion weights equal, bit for bit (the forced-fusion tests below).
template <class Heads>
void require_same_heads(const Heads& expected, const Heads& got) {
  REQUIRE(expected.size() == got.size());
  for (size_t h = 0; h < expected.size(); ++h) {
    CHECK(expected[h].o == got[h].o);
    CHECK(expected[h].lse == got[h].lse);
    CHECK(expected[h].fusion_weights == got[h].fusion_weights);
  }
}

// forced_fusion fuses its rows on OpenMP units (oracle_fusion.cpp); each row must be what `fuse`
// gives it alone, as the serial loop before it computed them: the window and the chunk scores of
// every query from the public stages, then fuse row by row. Bit for bit, on 1 and 3 threads, in
// double and float, on every selecting spec (so the oracle's numbers did not move).
template <class Scalar>
std::vector<HeadOutputs<Scalar>> fused_row_by_row(const MechanismSpec& spec,
                                                  const AttentionInputs<Scalar>& in,
                                                  const std::vector<IndexMatrix>& selection,
                                                  const std::vector<int64_t>& queries) {
  const Geometry geometry = geometry_of(spec, in.T());
  const auto scale = static_cast<Scalar>(logit_scale(spec, in.d()));
  const int64_t G = in.Hq() / in.Hkv(), Tq = static_cast<int64_t>(queries.size());
  std::vector<HeadOutputs<Scalar>> heads;
  for (int64_t h = 0; h < in.Hq(); ++h) {
    const int64_t g = h / G;
    const auto window = window_attention(in.q[h], in.k[g], in.v[g], geometry, scale, queries);
    Matrix<Scalar> scores;
    if (spec.fusion == Fusion::hierarchical && spec.key_rule == KeyRule::exact)
      scores = exact_chunk_log_mass(in.q[h], in.k[g], geometry, scale, queries);
    else if (spec.fusion == Fusion::hierarchical) {
      const Matrix<Scalar> prior =
          spec.needs_prior() ? resolve_prior(in, h, spec, geometry) : Matrix<Scalar>();
      scores = surrogate_scores(in.retrieval_query(h),
                                summarize(in.k[g], prior, spec.key_rule, spec.bias_rule, geometry, scale),
                                geometry, scale, queries);
    }
    HeadOutputs<Scalar> out;
    out.o.resize(Tq, in.dv());
    out.lse.resize(Tq);
    out.fusion_weights.resize(Tq, selection[g].cols() + 2);
    for (int64_t row = 0; row < Tq; ++row) {
      const FusionRow<Scalar> fusion_row{
          in.q[h].row(queries[row]).transpose(), selection[g].row(row).data(), selection[g].cols(),
          spec.fusion == Fusion::hierarchical ? scores.row(row).data() : nullptr,
          window.lse(row), window.o.row(row)};
      fuse<Scalar>(spec, fusion_row, in.k[g], in.v[g], geometry, scale, out.o.row(row),
                   out.lse(row), out.fusion_weights.row(row));
    }
    heads.push_back(std::move(out));
  }
  return heads;
}

TEST_CASE("forced fusion on threads gives every row what fuse gives it alone", "[oracle]") {
  const int saved = omp_get_max_threads();
  for (const char* name : {"gqa_group4", "ragged_tail", "longer_blocks", "k_covers_all"}) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    const auto inputs_float = hils::oracle::testing::to_float(inputs);
    for (const auto& spec : specs_for(c)) {
      if (!spec.selects()) continue;
      const auto run = run_mechanism(spec, inputs);
      INFO("case " << name << ", spec " << spec.name);
      const auto serial = fused_row_by_row(spec, inputs, run.selection, run.queries);
      const auto serial_float = fused_row_by_row(spec, inputs_float, run.selection, run.queries);
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        require_same_heads(serial, forced_fusion(spec, inputs, run.selection, run.queries));
        require_same_heads(serial_float, forced_fusion(spec, inputs_float, run.selection, run.queries));
      }
      omp_set_num_threads(saved);
    }
  }
}

// The last of a case's specs whose fusion is `fusion` (the refusal tests below need one).
static MechanismSpec last_spec_with_fusion(const cases::Case& c, Fusion fusion) {
  MechanismSpec spec;
  bool found = false;
  for (const auto& s : specs_for(c))
    if (s.fusion == fusion) spec = s, found = true;
  REQUIRE(found);
  return spec;
}

// fuse_rows (the forced fusion's loop, "forced fusion on threads ..." checks its bits against
// fuse row by row) refuses outputs that do not hold one row per fusion row.
TEST_CASE("fuse_rows refuses outputs without one row per fusion row", "[oracle]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = last_spec_with_fusion(c, Fusion::flat);
  RunOptions options;
  options.keep_window = true;
  const auto run = run_mechanism(spec, inputs, options);
  const Geometry geometry = geometry_of(spec, inputs.T());
  const double scale = logit_scale(spec, inputs.d());
  const int64_t last = inputs.T() - 1;
  std::vector<FusionRow<double>> rows;
  for (int64_t t : {last - 1, last})
    rows.push_back(FusionRow<double>{inputs.q[0].row(t).transpose(), run.selection[0].row(t).data(),
                                     spec.K, nullptr, run.heads[0].lse_window(t),
                                     run.heads[0].o_window.row(t)});
  Matrix<double> o(3, inputs.dv()), weights(2, spec.K + 2);
  Vector<double> lse(2);
  CHECK_THROWS_WITH(fuse_rows<double>(spec, rows, inputs.k[0], inputs.v[0], geometry, scale, o, lse, weights),
                    Catch::Contains("o, lse, weights: expected 2 rows each"));
  o.resize(2, inputs.dv());
  fuse_rows<double>(spec, rows, inputs.k[0], inputs.v[0], geometry, scale, o, lse, weights);
  // fuse row by row into the same layout (Eigen's exp writes a -inf logit's weight as 0 or as
  // exp(-709.4) ~ 5.6e-309 by where the element falls in its vector loop, i.e. by the address).
  Matrix<double> o_alone(2, inputs.dv()), weights_alone(2, spec.K + 2);
  Vector<double> lse_alone(2);
  for (int64_t i = 0; i < 2; ++i)
    fuse<double>(spec, rows[static_cast<size_t>(i)], inputs.k[0], inputs.v[0], geometry, scale,
                 o_alone.row(i), lse_alone(i), weights_alone.row(i));
  CHECK(o == o_alone);
  CHECK(lse == lse_alone);
  CHECK(weights == weights_alone);
}

// The oracle's fusions of the reference's own selection read the window and the chunk scores
// from the reference's runs (forced_fusion given the run) instead of computing them again: the
// same bits as forced_fusion from the stages, in double and float, on all queries and on every
// third slot, on 1 and 3 threads, and with values near the top of the range (run_mechanism then
// runs on scaled values, scales_values_down, and the window is computed again).
TEST_CASE("forced fusion given the run's window and scores gives forced fusion's bits", "[oracle]") {
  const int saved = omp_get_max_threads();
  auto check = [&](const MechanismSpec& spec, const auto& inputs, const std::vector<int64_t>& queries) {
    RunOptions options;
    options.keep_window = true;
    options.keep_surrogate_scores = true;
    options.queries = queries;
    const auto run = run_mechanism(spec, inputs, options);
    const auto expected = forced_fusion(spec, inputs, run.selection, run.queries);
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      require_same_heads(expected, forced_fusion(spec, inputs, run.selection, run));
    }
    omp_set_num_threads(saved);
  };
  for (const char* name : {"gqa_group4", "ragged_tail", "longer_blocks", "k_covers_all"}) {
    const auto& c = case_named(name);
    auto inputs = cases::make_inputs<double>(c);
    std::vector<int64_t> sampled;
    for (int64_t t = inputs.T() / 3; t < inputs.T(); t += 3) sampled.push_back(t);
    for (const auto& spec : specs_for(c)) {
      if (!spec.selects()) continue;
      INFO("case " << name << ", spec " << spec.name);
      for (const auto& queries : {std::vector<int64_t>{}, sampled}) {
        check(spec, inputs, queries);
        check(spec, hils::oracle::testing::to_float(inputs), queries);
      }
      auto huge = inputs;
      for (auto& v : huge.v) v *= 1e300;
      REQUIRE(scales_values_down(huge));
      REQUIRE_FALSE(scales_values_down(inputs));
      check(spec, huge, {});
    }
  }
}

TEST_CASE("forced fusion given a run refuses one that did not keep the window or the scores",
          "[oracle]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = last_spec_with_fusion(c, Fusion::hierarchical);
  RunOptions options;
  options.keep_window = true;  // no surrogate scores: the hierarchical fusion reads them
  const auto run = run_mechanism(spec, inputs, options);
  CHECK_THROWS_WITH(forced_fusion(spec, inputs, run.selection, run),
                    Catch::Contains("run: expected run_mechanism's outputs"));
  CHECK_THROWS_WITH(forced_fusion(spec, inputs, run.selection, run_mechanism(spec, inputs)),
                    Catch::Contains("keep_window"));
}

// The oracle fuses again only the query blocks where a kernel's selection differs from the
// reference's and takes the reference fusion's other rows (oracle_context.hpp, fusion_from_own):
// sound only if a row's fused outputs depend on its own block's queries alone (hils::query_blocks).
// Every other block, fused alone, must give the full fusion's rows bit for bit, in double and
// float, with a selection moved so that some rows differ from the reference's, on all queries
// and on every third or fifth slot (blocks cut by the span rule).
TEST_CASE("forced fusion of whole query blocks gives the full fusion's rows bit for bit", "[oracle]") {
  // (case, query stride): strides above 1 give blocks cut by the span rule.
  const std::pair<const char*, int64_t> kRuns[] = {{"gqa_group4", 1},       {"ragged_tail", 1},
                                                   {"peaked_attention", 1}, {"peaked_attention", 3},
                                                   {"longer_blocks", 1},    {"longer_blocks", 5}};
  for (const auto& [name, stride] : kRuns) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    const auto inputs_float = hils::oracle::testing::to_float(inputs);
    for (const auto& spec : specs_for(c)) {
      if (!spec.selects()) continue;
      RunOptions options;
      for (int64_t t = 0; t < c.T; t += stride) options.queries.push_back(t);
      const auto run = run_mechanism(spec, inputs, options);
      // Every odd row takes the row before it (valid: V(t') is within V(t) for t' < t).
      std::vector<IndexMatrix> selection = run.selection;
      for (auto& rows : selection)
        for (Eigen::Index r = 1; r < rows.rows(); r += 2) rows.row(r) = rows.row(r - 1);
      const auto blocks = query_blocks(run.queries, geometry_of(spec, c.T));
      REQUIRE(blocks.size() >= 2);
      std::vector<int64_t> some;
      std::vector<Eigen::Index> some_rows;
      for (size_t b = 0; b < blocks.size(); b += 2)
        for (int64_t r = blocks[b].first; r < blocks[b].second; ++r) {
          some.push_back(run.queries[static_cast<size_t>(r)]);
          some_rows.push_back(static_cast<Eigen::Index>(r));
        }
      std::vector<IndexMatrix> some_selection;
      for (const auto& rows : selection) some_selection.push_back(rows(some_rows, Eigen::all));
      INFO("case " << name << ", spec " << spec.name << ", every " << stride << " queries");
      auto same_rows = [&](const auto& full, const auto& part) {
        REQUIRE(full.size() == part.size());
        for (size_t h = 0; h < full.size(); ++h) {
          CHECK(full[h].o(some_rows, Eigen::all) == part[h].o);
          CHECK(full[h].lse(some_rows) == part[h].lse);
          CHECK(full[h].fusion_weights(some_rows, Eigen::all) == part[h].fusion_weights);
        }
      };
      same_rows(forced_fusion(spec, inputs, selection, run.queries),
                forced_fusion(spec, inputs, some_selection, some));
      same_rows(forced_fusion(spec, inputs_float, selection, run.queries),
                forced_fusion(spec, inputs_float, some_selection, some));
    }
  }
}

TEST_CASE("a perturbation inside the tolerance passes, one beyond it fails", "[oracle]") {
  const auto& c = case_named("longer_blocks");
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  const KernelOutputs good = float_kernel(spec, inputs);
  const Verdict base = verify(spec, inputs, good);
  REQUIRE(base.passed);
  for (const auto& t : base.tensors) {
    INFO(t.name << " tolerance " << t.tolerance);
    CHECK(t.tolerance > 0);
  }
  auto tolerance_of = [&](const std::string& name) {
    for (const auto& t : base.tensors)
      if (t.name == name) return t.tolerance;
    FAIL("no tensor " << name);
    return 0.0;
  };
  SECTION("o") {
    const double tol = tolerance_of("o");
    KernelOutputs small = good, large = good;
    small.o[2](300, 7) += 0.25 * tol;
    large.o[2](300, 7) += 4.0 * tol;
    CHECK(verify(spec, inputs, small).passed);
    const Verdict bad = verify(spec, inputs, large);
    INFO(bad.report());
    CHECK_FALSE(bad.passed);
    CHECK_THAT(bad.report(), Catch::Contains("max abs error") && Catch::Contains("h=2 t=300 col=7"));
  }
  SECTION("lse") {
    const double tol = tolerance_of("lse");
    KernelOutputs large = good;
    large.lse[0](798) -= 4.0 * tol;
    CHECK_FALSE(verify(spec, inputs, large).passed);
  }
  SECTION("summary_key") {
    const double tol = tolerance_of("summary_key");
    KernelOutputs large = good;
    large.summary_key[1](3, 0) += 4.0 * tol;
    const Verdict bad = verify(spec, inputs, large);
    INFO(bad.report());
    CHECK_FALSE(bad.passed);
    CHECK_THAT(bad.report(), Catch::Contains("h=1 c=3 col=0"));
  }
}

TEST_CASE("bf16 rounding is round-to-nearest-even on 8 significant bits", "[oracle]") {
  CHECK(round_to_bf16(1.0) == 1.0);
  CHECK(round_to_bf16(1.0 + 0x1p-8) == 1.0);               // tie -> even
  CHECK(round_to_bf16(1.0 + 3 * 0x1p-8) == 1.0 + 0x1p-6);  // tie -> even (up)
  CHECK(round_to_bf16(1.0 + 0x1p-8 + 0x1p-20) == 1.0 + 0x1p-7);
  CHECK(round_to_bf16(-3.0) == -3.0);
  CHECK(std::isnan(round_to_bf16(std::nan(""))));
  CHECK(round_to_bf16(0x1p-140) == 0.0);
}

TEST_CASE("verify rejects bad options with a clear error", "[oracle]") {
  const auto& c = case_named("gqa_group4");
  const auto inputs = cases::make_inputs<double>(c);
  const MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
  VerifyOptions options;
  options.queries = {5, 3};
  CHECK_THROWS_WITH(verify(spec, inputs, float_kernel(spec, inputs), options),
                    Catch::Contains("queries[1]"));
}

TEST_CASE("the float reference passes on Table 5 ablations, group rules and softmax1",
          "[oracle]") {
  for (const char* name : {"gqa_group4", "peaked_attention"}) {
    const auto& c = case_named(name);
    const auto inputs = cases::make_inputs<double>(c);
    std::vector<MechanismSpec> specs;
    for (const auto& spec : table5_ablations()) specs.push_back(cases::with_case_geometry(spec, c));
    for (GroupRule rule : {GroupRule::sum_probabilities, GroupRule::max_raw}) {
      MechanismSpec spec = cases::with_case_geometry(preset("hils"), c);
      spec.group_rule = rule;
      spec.name = "hils/" + to_string(rule);
      specs.push_back(spec);
    }
    MechanismSpec softmax1 = cases::with_case_geometry(preset("hils"), c);
    softmax1.softmax1 = true;
    specs.push_back(softmax1);
    for (const auto& spec : specs) {
      const Verdict verdict = verify(spec, inputs, float_kernel(spec, inputs));
      INFO("case " << name << ", spec " << describe(spec) << "\n" << verdict.report());
      CHECK(verdict.passed);
    }
  }
}

// Hidden (run with `test_oracle "[.report]"`): the largest headroom of the float reference as
// the kernel, per case and preset, in fp32 and bf16 — how close a correct kernel comes to the
// tolerance.
TEST_CASE("headroom table of the float reference", "[.report]") {
  std::printf("%-26s %-10s %-6s %9s  %-16s %s\n", "case", "preset", "prec", "headroom", "tensor",
              "selection rows differing/accepted");
  for (const auto& c : cases::kCaseTable) {
    const auto inputs = cases::make_inputs<double>(c);
    for (const auto& spec : specs_for(c))
      for (InputPrecision p : {InputPrecision::fp32, InputPrecision::bf16}) {
        VerifyOptions options{p};
        options.score_precision = p;
        const Verdict v = verify(spec, inputs, float_kernel(spec, inputs, p, p), options);
        double worst = 0;
        std::string where;
        for (const auto& t : v.tensors)
          if (t.headroom >= worst) {
            worst = t.headroom;
            where = t.name;
          }
        std::printf("%-26s %-10s %-6s %9.3g  %-16s %lld/%lld %s\n", c.name, spec.name.c_str(),
                    to_string(p).c_str(), worst, where.c_str(),
                    static_cast<long long>(v.selection.rows_differing),
                    static_cast<long long>(v.selection.rows_accepted), v.passed ? "" : "FAIL");
        CHECK(v.passed);
      }
  }
}
