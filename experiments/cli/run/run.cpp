// hils run: the plan checked against the file, the units run (by this process, or shared among
// MPI ranks), the results file written, one line reported.
#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/run/run_plan.hpp"
#include "cli/run/run_results.hpp"
#include "cli/run/run_units.hpp"
#include "io/hdf5_util.hpp"
#include "parallel/session.hpp"
#include "util/progress.hpp"

namespace hils::cli::run_command {

namespace {

// plan, meta, input -> plan.layers (every layer when none given), each checked, and the
// settings that depend on the file (last_queries, each mechanism's layout).
void check_against_file(RunPlan& plan, const io::ActivationMeta& meta, const std::string& input) {
  if (plan.layers.empty())
    for (int64_t l = 0; l < meta.n_layers; ++l) plan.layers.push_back(l);
  for (int64_t l : plan.layers)
    if (l < 0 || l >= meta.n_layers)
      throw BadInput(fmt::format("--layers: expected indices in 0..{} ({} has {} layers), got {}",
                                 meta.n_layers - 1, input, meta.n_layers, l));
  for (size_t i = 0; i < plan.layers.size(); ++i)  // each layer is one unit, written once
    for (size_t j = 0; j < i; ++j)
      if (plan.layers[i] == plan.layers[j])
        throw BadInput(fmt::format("--layers: expected distinct layer indices, got {} twice",
                                   plan.layers[i]));
  require(plan.last_queries <= meta.T, "last_queries", fmt::format("at most T={}", meta.T),
          std::to_string(plan.last_queries));
  for (const auto& spec : plan.mechanisms) check_layout(spec, meta, input);
  require_units_fit(plan, meta, input);
}

// plan, meta -> what the reference keeps and which queries it computes.
RunOptions run_options(const RunPlan& plan, const io::ActivationMeta& meta) {
  RunOptions options;
  options.keep_surrogate_scores = options.keep_exact_scores = plan.keep_scores;
  options.keep_window = plan.keep_window;
  for (int64_t t = meta.T - plan.last_queries; plan.last_queries > 0 && t < meta.T; ++t)
    options.queries.push_back(t);
  return options;
}

// The units run, stopping at a unit boundary on SIGINT/SIGTERM (Interrupted: the file keeps
// every unit complete before it; --resume continues); a failed write says what the last
// checkpoint keeps.
analysis::UnitsDone run_units(analysis::UnitRunner& runner,
                              const std::vector<analysis::StudyUnit>& units, RunResults& results,
                              const RunFlags& flags, const analysis::Progress& progress) {
  return run_stoppable([&] { return runner.run(units, results.sink(), progress); }, flags.output,
                       [&] { return results.units_published(); },
                       flags.resume ? "run the same command again"
                                    : "run the same command with --resume");
}

}  // namespace

// flags -> the results file, or an exception (bad input before any output exists).
void run(const RunFlags& flags) {
  require_input_file(flags.input, "ACTIVATIONS");
  require_distinct_files(flags.input, "ACTIVATIONS", flags.output, "--output");
  io::require_writable_folder(flags.output);
  RunPlan plan = make_plan(flags);
  const io::ActivationMeta meta = io::read_activation_meta(flags.input);
  check_with_jobs(flags.jobs, [&] { check_against_file(plan, meta, flags.input); });
  const RunOptions options = run_options(plan, meta);
  LayerReader layers(flags.input, meta);
  const auto units = list_units(plan, meta, flags.input, options, layers);
  analysis::UnitRunner& runner = parallel::current_runner();
  if (!runner.holds_results()) {  // an MPI worker: computes the units rank 0 hands out
    io::UnitStopScope stop_between_units;
    analysis::RecordingSink unused;
    runner.run(units, unused, {});
    return;
  }

  // Validate every layer before any output exists, so that bad input never leaves a partial
  // results file behind (layers are read again, one at a time, when they are run). Under MPI
  // only rank 0 does this: N ranks reading the whole file up front would cost N full reads.
  for (int64_t l : plan.layers) io::read_activation_layer(flags.input, meta, l);
  RunResults results(flags, plan,
                     {plan_json(plan, flags.input, meta.T), static_cast<uint64_t>(plan.seed),
                      command_line()});
  // Each layer's fingerprint is taken once, by the check (plan.layers, and a layer of the
  // resumed file's complete units that this run does not read).
  check_and_record_fingerprints(
      results.writer(), flags.output, flags.input, "ACTIVATIONS", plan.layers,
      [&](int64_t l) -> std::optional<std::string> {
        if (l < 0 || l >= meta.n_layers) return std::nullopt;
        return io::layer_fingerprint(flags.input, meta, l);
      },
      unit_layer);
  std::unique_ptr<ProgressBar> bar;
  int64_t shown = 0;  // runners report several units at once when they publish them together
  auto progress = [&bar, &shown](int64_t done, int64_t total) {
    if (!bar) bar = std::make_unique<ProgressBar>("hils run", total, "units", global_options().quiet);
    bar->advance(done - shown);
    shown = done;
  };
  const auto done = run_units(runner, units, results, flags, progress);
  results.commit();
  if (bar) bar->finish();
  fmt::print("{} unit(s) computed, {} already complete -> {}\n", done.ran.size(), done.skipped,
             flags.output);
}

}  // namespace hils::cli::run_command
