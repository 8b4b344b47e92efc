// The study commands' shared entry points: the options of `hils fidelity`, `hils overlap` and
// `hils extrapolate` (study_options.cpp), one command per row of kStudies (study_table.hpp), and
// run_study, which runs a row's study into a results file (run_studies.cpp) for its command and
// for `hils studies`.
//
// The flow of a study run, one file per step (all in this folder):
//   options (study_options.cpp) -> settings from defaults, TOML and flags (study_config.cpp,
//   study_tables.cpp), checked (study_checks.cpp) -> inputs from a source (study_sources.cpp,
//   experiments/sources/) -> the study driver (analysis/, run_studies.cpp) into a results file
//   (study_results.cpp) -> plots (cli/plot/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/studies/study_table.hpp"

namespace hils::cli::studies {

// Options common to the three study commands; a TOML config (experiments/configs/*.toml)
// sets them first, then explicit flags override.
struct StudyArgs {
  std::string config;            // TOML file, optional
  std::string out;               // results file (.h5)
  std::string source;            // synthetic | model | activations; empty: the config's or synthetic
  std::string activations;       // activation file for source = activations
  std::string model_dir;         // folder with stories260K.bin, tok512.bin, text (source=model)
  std::vector<int64_t> lengths;  // context lengths in slots (synthetic), or prefixes (files)
  std::optional<int64_t> layers;   // --n-layers; absent: the config's or the source's
  bool layers_old_name = false;    // given as --layers, the old name (a note says the new one)
  // Spec flags given (S, W, K, landmarks, prior_rule; experiments/cli/spec_flags.hpp), applied
  // over the config by the spec decoder.
  nlohmann::json spec = nlohmann::json::object();
  std::optional<int64_t> queries;  // sampled queries per unit (fidelity, extrapolation)
  std::vector<std::string> mechanisms;
  std::string prior_source;
  bool plot = false;             // draw plots after the run
  std::optional<int64_t> jobs;   // --jobs: units computed at once (parallel::use_jobs)
};

// Adds the common flags to the subcommand of `row` (--queries and --mechanisms hidden where they
// do not apply).
void add_study_options(CLI::App* cmd, StudyArgs& args, const StudyRow& row);

// Adds `hils <row.command>`: the study options, then run_study, printing the results file and,
// with --plot, the plots drawn from it.
void register_study(CLI::App& app, const StudyRow& row);

// Runs `row`'s study into args.out (resuming it when it exists) and returns the file.
std::filesystem::path run_study(const StudyRow& row, const StudyArgs& args);

// "a", "a and b", "a, b and c" (`last` for " and ", e.g. " or ").
std::string listed(const std::vector<std::string_view>& names, const char* last = " and ");

}  // namespace hils::cli::studies
