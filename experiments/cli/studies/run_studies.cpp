// The studies run from resolved settings: each builds its driver's options
// (analysis/include/hils/analysis/{fidelity,overlap,extrapolation}.hpp), runs the driver into the
// results file and reports the Taylor/KL check where it has one; kStudyRunners gives each row of
// kStudies (study_table.hpp) its runner.
#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/studies/study_cli.hpp"
#include "cli/studies/study_results.hpp"
#include "hils/analysis/extrapolation.hpp"
#include "hils/analysis/overlap.hpp"
#include "parallel/session.hpp"

namespace hils::cli::studies {

namespace {

// r -> one positional encoding per name of [extrapolation] encodings.
std::vector<analysis::NamedEncoding> encodings_of(const Resolved& r) {
  std::vector<analysis::NamedEncoding> out;
  for (const auto& name : r.encodings) {
    PositionalEncoding pe;
    pe.kind = parse_positional_kind(name, "encodings");
    pe.pairing = parse_rope_pairing(r.pairing, "pairing");
    pe.theta = r.theta;
    pe.hope_train_length = static_cast<double>(r.train_length);
    out.push_back({name, pe});
  }
  return out;
}

// a, study -> its settings resolved with a.jobs units at once in force (each unit's share of
// memory counted by resolve's size checks, cli_util.hpp check_with_jobs).
Resolved resolve_with_jobs(const StudyArgs& a, const std::string& study) {
  Resolved r;
  check_with_jobs(a.jobs, [&] { r = resolve(a, study); });
  return r;
}

// args -> the fidelity results file; CheckFailed when the Taylor gap differs from the KL.
std::filesystem::path run_fidelity(const StudyArgs& a) {
  const auto r = resolve_with_jobs(a, "fidelity");
  analysis::FidelityOptions o;
  o.geometry = r.geometry, o.prior = r.prior, o.mechanisms = mechanisms_of(r);
  o.queries_per_unit = r.queries, o.keep_scores = r.keep_scores;
  o.runner = &parallel::current_runner();
  const auto path = out_path(a, "fidelity");
  const auto report = run_into_results(r, path, "fidelity", [&](auto& sink, const auto& progress) {
    return analysis::run_fidelity_study(r.source, o, sink, progress);
  });
  if (report.units_run == 0)  // all resumed: each was checked when it ran (was "0 pairs ... inf")
    note("fidelity: Taylor gap = KL check: no unit ran now (they were checked when they ran)");
  else
    note(fmt::format("fidelity: Taylor gap = KL check over {} pairs: max |gap - KL| = {:.3g}, "
                     "min gap = {:.3g}", report.worst_kl.pairs, report.worst_kl.max_abs_deviation,
                     report.worst_kl.min_gap));
  if (!report.kl_ok)
    throw CheckFailed(fmt::format("Taylor gap differs from KL by {:.3g} (> {:.1g})",
                                  report.worst_kl.max_abs_deviation, o.kl_tolerance));
  return path;
}

// args -> the overlap results file.
std::filesystem::path run_overlap(const StudyArgs& a) {
  const auto r = resolve_with_jobs(a, "overlap");
  analysis::OverlapOptions o;
  o.geometry = r.geometry, o.prior = r.prior;
  o.mechanism = analysis::study_mechanism(r.overlap_mechanism, r.prior.rule);
  o.block_sizes = r.block_sizes, o.final_block = r.final_block, o.tail_queries = r.tail_queries;
  o.runner = &parallel::current_runner();
  const auto path = out_path(a, "overlap");
  run_into_results(r, path, "overlap", [&](auto& sink, const auto& progress) {
    return analysis::run_overlap_study(r.source, o, sink, progress);
  });
  return path;
}

// args -> the extrapolation results file; CheckFailed when the Taylor gap differs from the KL.
std::filesystem::path run_extrapolation(const StudyArgs& a) {
  const auto r = resolve_with_jobs(a, "extrapolation");
  analysis::ExtrapolationOptions o;
  o.fidelity.geometry = r.geometry, o.fidelity.prior = r.prior;
  o.fidelity.mechanisms = mechanisms_of(r), o.fidelity.queries_per_unit = r.queries;
  o.fidelity.keep_scores = false;
  o.fidelity.runner = &parallel::current_runner();
  o.encodings = encodings_of(r);
  o.depths = r.depths, o.needle_logit = r.needle_logit;
  const auto path = out_path(a, "extrapolate");
  const auto report = run_into_results(r, path, "extrapolate", [&](auto& sink, const auto& progress) {
    return analysis::run_extrapolation_study(r.raw_source, o, sink, progress);
  });
  if (!report.kl_ok)
    throw CheckFailed(fmt::format("Taylor gap differs from KL by {:.3g}",
                                  report.worst_kl.max_abs_deviation));
  return path;
}

// The runner of each row of kStudies, in its order.
using StudyRunner = std::filesystem::path (*)(const StudyArgs&);
constexpr std::array<StudyRunner, kStudies.size()> kStudyRunners{run_fidelity, run_overlap,
                                                                 run_extrapolation};
static_assert(std::ranges::none_of(kStudyRunners, [](StudyRunner f) { return f == nullptr; }),
              "every row of kStudies (study_table.hpp) needs its runner in kStudyRunners");

}  // namespace

// row (an element of kStudies), args -> its runner's results file.
std::filesystem::path run_study(const StudyRow& row, const StudyArgs& args) {
  const auto index = static_cast<size_t>(&row - kStudies.data());
  if (index >= kStudies.size()) throw std::logic_error("run_study: a row that is not in kStudies");
  return kStudyRunners[index](args);
}

}  // namespace hils::cli::studies
