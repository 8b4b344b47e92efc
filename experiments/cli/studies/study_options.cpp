// The options of the study commands (hils fidelity, overlap, extrapolate), and the command
// around a study's row (study_table.hpp): run, print the results file, draw the plots with --plot.
#include <iostream>
#include <memory>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/plot/draw_plots.hpp"
#include "cli/spec_flags.hpp"
#include "cli/studies/study_cli.hpp"
#include "parallel/session.hpp"

namespace hils::cli::studies {

// app, row -> `hils <row.command>` with the study options.
void register_study(CLI::App& app, const StudyRow& row) {
  auto args = std::make_shared<StudyArgs>();
  auto* cmd = app.add_subcommand(std::string(row.command), std::string(row.description));
  add_study_options(cmd, *args, row);
  cmd->callback([args, &row] {
    const auto path = run_study(row, *args);
    if (!parallel::holds_results()) return;
    std::cout << "results: " << path.string() << "\n";
    if (!args->plot) return;
    const auto folder = path.parent_path() / (path.stem().string() + "_plots");
    for (const auto& png : draw_plots(path, folder, "--plot")) std::cout << "plot: " << png.string() << "\n";
  });
}

// cmd, a, row -> the study flags on cmd, each writing into a (which outlives the parse).
// --queries and --mechanisms are hidden for a study whose units sample no queries (overlap): it
// has no use for them and refuses them (study_config.cpp, require_sampling_flags).
void add_study_options(CLI::App* cmd, StudyArgs& a, const StudyRow& row) {
  const std::string others_only = row.samples_queries() ? "Options" : "";
  add_config_option(cmd, &a.config, "study config (TOML, see experiments/configs/)");
  add_output_option(cmd, &a.out, "results file (.h5); an existing one is resumed");
  cmd->add_option("--source", a.source,
                  "synthetic | model | activations (default: the config's [source] kind, else "
                  "synthetic)")
      ->check(CLI::IsMember({"synthetic", "model", "activations"}));
  cmd->add_option("--activations", a.activations, "activation file (source=activations)");
  cmd->add_option("--model-dir", a.model_dir,
                  "folder of stories260K.bin, tok512.bin, tinystories_sample.txt (source=model; "
                  "default $HILS_SHARED_DATA or ../shared/data)");
  cmd->add_option("--lengths", a.lengths,
                  "context lengths in slots, ascending (space- or comma-separated)")
      ->delimiter(',');
  // Optional values, not sentinels: any integer given (-1 too) is checked by
  // require_study_values, naming the flag.
  cmd->add_option_function<int64_t>(
      "--n-layers", [&a](int64_t n) { a.layers = n; },
      "number of layers to study, from layer 0 (default: every layer of an activation file, "
      "5 of the model, 2 synthetic; at most the file's or the model's layers; synthetic: at "
      "most 128 independent draws)");
  // The studies' old name of --n-layers, hidden, kept for old command lines: `hils run
  // --layers` lists layer indices, so the one name had two meanings.
  cmd->add_option_function<int64_t>(
         "--layers", [&a](int64_t n) { a.layers = n, a.layers_old_name = true; }, "")
      ->group("");
  add_spec_flags(cmd, &a.spec, {"S", "W", "K", "landmarks", "prior_rule"});
  cmd->add_option_function<int64_t>(
      "--queries", [&a](int64_t n) { a.queries = n; }, "sampled queries per unit")
      ->group(others_only);
  cmd->add_option("--mechanisms", a.mechanisms,
                  "scores to study: presets, mean, landmark_key, taylor, taylor_entropy, "
                  "max_logit, <key>+<bias> (space- or comma-separated)")
      ->delimiter(',')
      ->group(others_only);
  cmd->add_option("--prior-source", a.prior_source,
                  "inputs | chunk_mean_query | chunk_last_query");
  add_jobs_option(cmd, &a.jobs);
  cmd->add_flag("--plot", a.plot, "draw the plots next to the results file");
}

std::string listed(const std::vector<std::string_view>& names, const char* last) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += std::string(i == 0 ? "" : i + 1 == names.size() ? last : ", ") + std::string(names[i]);
  return list;
}

}  // namespace hils::cli::studies

namespace hils::cli {

// app -> `hils <command>` for every row of kStudies, in its order.
void register_study_commands(CLI::App& app) {
  for (const auto& row : studies::kStudies) studies::register_study(app, row);
}

}  // namespace hils::cli
