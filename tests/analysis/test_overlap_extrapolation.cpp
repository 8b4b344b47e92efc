// Overlap of hand-made selections (paper §7.2 formula), the overlap study's layout and resume,
// and the needle test: a strong needle is always found by exact scores without rotation.
#include <catch2/catch.hpp>

#include <cmath>
#include <string_view>

#include "case_inputs.hpp"
#include "study_support.hpp"
#include "hils/analysis/extrapolation.hpp"
#include "hils/analysis/needle.hpp"
#include "hils/analysis/overlap.hpp"

using namespace hils;
using namespace hils::analysis;
using hils::analysis::testing::geometry_of_case;
using hils::cases::case_named;

TEST_CASE("overlap of a sliding selection matches the paper's formula", "[overlap]") {
  // Row t selects {t, t+1, t+2}: blocks of 2 share 2 of 3, blocks of 4 share (12-6)/9.
  IndexMatrix sel(8, 3);
  for (int t = 0; t < 8; ++t) sel.row(t) << t, t + 1, t + 2;
  const auto u = overlap_of_selection(sel, {1, 2, 4, 8}, 4);
  CHECK(u.overlap[0] == 1.0);
  CHECK(u.overlap[1] == Approx(2.0 / 3.0));
  CHECK(u.overlap[2] == Approx((12.0 - 6.0) / 9.0));
  CHECK(u.overlap[3] == Approx((24.0 - 10.0) / 21.0));
  CHECK(u.final_union == 6.0);  // rows 4..7 -> chunks 4..9
  REQUIRE(u.reuse.size() == 1);
  CHECK(u.reuse[0] == Approx(2.0 / 6.0));  // {4..9} ∩ {0..5} = {4, 5}
  IndexMatrix same = IndexMatrix::Constant(6, 2, 7);
  same.col(1).setConstant(9);
  const auto s = overlap_of_selection(same, {2, 3}, 3);
  CHECK(s.overlap == std::vector<double>{1.0, 1.0});
  CHECK(s.reuse == std::vector<double>{1.0});
}

TEST_CASE("overlap study writes units and summaries and resumes", "[overlap]") {
  const auto& c = case_named("longer_blocks");
  OverlapOptions options;
  options.geometry = geometry_of_case(c);
  options.mechanism = study_mechanism("taylor_entropy", PriorRule::landmark_query);
  options.block_sizes = {1, 2, 4, 8};
  options.final_block = 4;
  options.tail_queries = 64;
  StudySource source{c.name, 2, {400, c.T}, [&c](int64_t layer, int64_t T) {
                       auto in = cases::make_inputs<double>(c, layer);
                       for (auto* v : {&in.q, &in.k, &in.v, &in.q_retrieval})
                         for (auto& m : *v) m = Matrix<double>(m.topRows(T));
                       return in;
                     }};
  MemorySink sink;
  const auto report = run_overlap_study(source, options, sink);
  CHECK(report.units_run == 2 * 2 * c.Hkv);
  const auto sel = *sink.read("T799/layer1/group0/selection");
  CHECK(sel.rows() == 64);
  CHECK(sel.cols() == c.K);
  const auto loaded = *sink.read("summary/loaded_fraction");
  CHECK(loaded.rows() == 2);
  CHECK(loaded(1, 1) > 0.0);
  CHECK(loaded(1, 1) <= 1.0);
  const auto cand = *sink.read("summary/final_candidates");
  CHECK(cand(0, 1) < cand(1, 1));  // more visible chunks at the longer length
  const auto m1 = *sink.read("summary/overlap_M1");
  CHECK(m1(0, 1) == 1.0);
  const int64_t writes = sink.writes;
  CHECK(run_overlap_study(source, options, sink).units_run == 0);
  CHECK(sink.writes == writes);
}

TEST_CASE("needle: exact scores find a strong needle at every depth without rotation",
          "[extrapolation]") {
  const auto& c = case_named("longer_blocks");
  ExtrapolationOptions options;
  options.fidelity.geometry = geometry_of_case(c);
  options.fidelity.prior = {PriorRule::landmark_query, PriorSource::inputs};
  options.fidelity.mechanisms = {study_mechanism("naive_bsa", PriorRule::landmark_query),
                                 study_mechanism("max_logit", PriorRule::landmark_query),
                                 study_mechanism("mean", PriorRule::landmark_query)};
  options.needle_logit = 25.0;
  const auto raw = cases::make_inputs<double>(c);
  MemorySink sink;
  run_needle_unit(raw, {"nope", {}}, options, sink);
  const auto chunks = *sink.read("needle/nope/T799/needle_chunk");
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const int64_t nv = geometry.candidate_count(geometry.real_slots().back());
  CHECK(chunks(0, 0) == 0);
  CHECK(chunks(4, 0) == nv - 1);
  const auto exact = *sink.read("needle/nope/T799/naive_bsa/success");
  const auto max_logit = *sink.read("needle/nope/T799/max_logit/success");
  for (int64_t i = 0; i < exact.rows(); ++i) {
    CHECK(exact(i, 0) == 1.0);
    CHECK(max_logit(i, 0) == 1.0);
  }
  // Without a needle (logit 0 aims a zero key), exact scores find "it" only by chance.
  options.needle_logit = 0.0;
  MemorySink none;
  run_needle_unit(raw, {"nope", {}}, options, none);
  CHECK(none.read("needle/nope/T799/naive_bsa/success")->mean() < 1.0);
}

TEST_CASE("plant_needle: the planted key gives the aim exactly its logit, a zero aim is refused",
          "[extrapolation][needle]") {
  std::vector<Matrix<double>> k(2, Matrix<double>::Constant(6, 3, 0.25));
  RowVector<double> aim(3);
  aim << 0.5, -1.0, 2.0;
  plant_needle(k, 1, 4, aim, 0.125, 7.0, "needle_query");
  CHECK(0.125 * aim.dot(k[1].row(4)) == Approx(7.0).epsilon(1e-14));
  CHECK(k[0] == Matrix<double>::Constant(6, 3, 0.25));  // other heads and rows untouched
  CHECK(k[1].row(3) == RowVector<double>::Constant(3, 0.25));
  CHECK_THROWS_WITH(plant_needle(k, 0, 1, RowVector<double>::Zero(3), 0.125, 7.0, "needle_query"),
                    Catch::Contains("needle_query") && Catch::Contains("zero vector"));
}

TEST_CASE("NeedleContext: every slot's inputs are those of positioning the needled context",
          "[extrapolation][needle]") {
  // The needle unit positions its context once and moves the needle rows from depth to depth;
  // each depth must see exactly (bit for bit) what planting the needle in the raw keys and
  // positioning all of it gives, whatever slots came before. Landmarks make position ids differ
  // from slots; the slots go far, near, the same again, back: a needle row left behind, or one
  // rotated at another slot's position, differs.
  const auto& c = case_named("longer_blocks");
  const Geometry geometry(c.T, c.S, c.W, c.landmarks);
  const auto raw = cases::make_inputs<double>(c);
  const int64_t aim = geometry.real_slots().back();
  const double scale = 0.125, logit = 6.0;
  struct Setting {
    PositionalEncoding pe;
    PriorRule rule;
    PriorSource source;
  };
  PositionalEncoding rope, hope;
  rope.kind = PositionalKind::rope;
  hope.kind = PositionalKind::hope;
  hope.pairing = RopePairing::interleaved;
  hope.hope_train_length = 256.0;
  for (const auto& s : {Setting{rope, PriorRule::shared, PriorSource::inputs},
                        Setting{hope, PriorRule::given, PriorSource::chunk_mean_query}}) {
    NeedleContext context(raw, geometry, s.pe, s.rule, s.source, aim, scale, logit);
    for (int64_t slot : {700, 17, 17, 333, 700}) {
      CAPTURE(to_string(s.pe.kind), slot);
      AttentionInputs<double> needled = raw;
      const int64_t G = raw.Hq() / raw.Hkv();
      for (int64_t g = 0; g < raw.Hkv(); ++g) {
        Vector<double> mean_q = Vector<double>::Zero(raw.d());
        for (int64_t h = g * G; h < (g + 1) * G; ++h) mean_q += raw.q[h].row(aim).transpose();
        mean_q /= static_cast<double>(G);
        plant_needle(needled.k, g, slot, mean_q.transpose(), scale, logit, "aim");
      }
      auto expected = apply_positional_encoding<double>(needled, geometry, s.pe, s.rule);
      fill_prior(expected, geometry, s.source);
      const auto& got = context.at(slot);
      for (auto field : {&AttentionInputs<double>::q, &AttentionInputs<double>::k,
                         &AttentionInputs<double>::v, &AttentionInputs<double>::q_retrieval,
                         &AttentionInputs<double>::prior}) {
        REQUIRE((got.*field).size() == (expected.*field).size());
        for (size_t h = 0; h < (got.*field).size(); ++h) CHECK((got.*field)[h] == (expected.*field)[h]);
      }
    }
  }
}
