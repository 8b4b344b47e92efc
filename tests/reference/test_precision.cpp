// long double checks double; float is reported; threads never change a bit.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstdio>

#include "support.hpp"

using namespace hils;
using hils::testing::relative_error;

namespace {

template <class To, class From>
AttentionInputs<To> cast_inputs(const AttentionInputs<From>& in) {
  AttentionInputs<To> out;
  auto cast_all = [](const auto& heads, auto& dst) {
    for (const auto& m : heads) dst.push_back(m.template cast<To>());
  };
  cast_all(in.q, out.q);
  cast_all(in.k, out.k);
  cast_all(in.v, out.v);
  cast_all(in.q_retrieval, out.q_retrieval);
  cast_all(in.prior, out.prior);
  return out;
}

RunOptions keep_everything() {
  RunOptions options;
  options.keep_surrogate_scores = options.keep_exact_scores = options.keep_window = true;
  return options;
}

// Largest relative error over every floating output of every head.
template <class A, class B>
double worst_output_error(const MechanismOutputs<A>& a, const MechanismOutputs<B>& b) {
  double worst = 0;
  for (size_t h = 0; h < a.heads.size(); ++h) {
    const auto &x = a.heads[h], &y = b.heads[h];
    for (double err : {relative_error(x.o, y.o), relative_error(x.lse, y.lse),
                       relative_error(x.fusion_weights, y.fusion_weights),
                       relative_error(x.surrogate_scores, y.surrogate_scores),
                       relative_error(x.exact_scores, y.exact_scores),
                       relative_error(x.o_window, y.o_window),
                       relative_error(x.lse_window, y.lse_window)})
      worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace

TEST_CASE("long double agrees with double to 1e-12 on every output of the case table", "[precision]") {
  double worst_float = 0;
  for (const auto& c : cases::kCaseTable) {
    const auto in_d = cases::make_inputs<double>(c);
    const auto in_ld = cast_inputs<long double>(in_d);
    const auto in_f = cast_inputs<float>(in_d);
    for (const auto& base : hils::testing::all_specs()) {
      auto spec = hils::testing::spec_for_case(base, c);
      if (!spec) continue;
      INFO("case " << c.name << ", spec " << spec->name);
      auto out_d = run_mechanism(*spec, in_d, keep_everything());
      auto out_ld = run_mechanism(*spec, in_ld, keep_everything());
      CHECK(worst_output_error(out_ld, out_d) <= 1e-12);
      CHECK(out_ld.selection == out_d.selection);
      auto out_f = run_mechanism(*spec, in_f, keep_everything());
      const double float_error = worst_output_error(out_f, out_d);
      worst_float = std::max(worst_float, float_error);
      std::printf("float vs double  %-28s %-32s worst relative error %.3e\n", c.name,
                  spec->name.c_str(), float_error);
    }
  }
  std::printf("float vs double: worst relative error over the case table %.3e\n", worst_float);
}

TEST_CASE("outputs are bit-identical with 1 and 2 threads", "[precision]") {
  const int saved = omp_get_max_threads();
  for (const auto& c : cases::kCaseTable) {
    const auto inputs = cases::make_inputs<double>(c);
    for (const auto& base : hils::testing::all_specs()) {
      auto spec = hils::testing::spec_for_case(base, c);
      if (!spec) continue;
      INFO("case " << c.name << ", spec " << spec->name);
      omp_set_num_threads(1);
      auto one = run_mechanism(*spec, inputs, keep_everything());
      omp_set_num_threads(2);
      auto two = run_mechanism(*spec, inputs, keep_everything());
      CHECK(one.selection == two.selection);
      for (size_t h = 0; h < one.heads.size(); ++h) {
        CHECK(one.heads[h].o == two.heads[h].o);
        CHECK(one.heads[h].lse == two.heads[h].lse);
        CHECK(one.heads[h].fusion_weights == two.heads[h].fusion_weights);
        CHECK(one.heads[h].surrogate_scores == two.heads[h].surrogate_scores);
      }
    }
  }
  omp_set_num_threads(saved);
}
