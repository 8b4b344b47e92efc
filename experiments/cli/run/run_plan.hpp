// hils run's settings: the flags as given (RunFlags) and the plan resolved from them and the TOML
// config (RunPlan, run_plan.cpp); the steps of a run, one file each: the mechanisms' inputs
// (run_inputs.cpp), the units (run_units.cpp), the results file (run_results.cpp), the run
// itself (run.cpp). Internal to the run command (cmd_run.cpp declares its options).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hils/hils.hpp"
#include "io/activation_file.hpp"

namespace hils::cli::run_command {

// The command line as given: the input, outputs, presets and layers, and the spec fields and
// [run] settings given as flags (decoded with the TOML's by make_plan).
struct RunFlags {
  std::string input, output, config;
  std::vector<std::string> presets;
  std::vector<int64_t> layers;
  nlohmann::json spec = nlohmann::json::object();  // spec fields given as flags
  nlohmann::json run = nlohmann::json::object();   // [run] settings given as flags
  bool resume = false;
  // --jobs: units computed at once (parallel::use_jobs); not a [run] setting: it changes no
  // result, so a file may be resumed with another.
  std::optional<int64_t> jobs;
};

// Everything a run needs, resolved from TOML and flags (flags win).
struct RunPlan {
  std::vector<MechanismSpec> mechanisms;
  std::vector<int64_t> layers;
  std::string positional = "auto";  // auto | nope | rope | hope
  std::optional<std::string> rope_pairing;
  std::optional<double> rope_theta;
  double hope_train_length = 8192.0, hope_m = 2.0;
  int64_t last_queries = 0;
  bool keep_scores = false, keep_window = false;
  int64_t seed = 0;
};

// Reads the config (run_schema), applies the [run] settings and then the flags, and builds the
// mechanisms: [[mechanism]] tables first, then presets, the spec flags over each. Throws BadInput
// (or InvalidArgument naming the file) for a setting it cannot use or two mechanisms of one name.
RunPlan make_plan(const RunFlags& flags);
// The results file's config: the plan as run on `input` of T slots.
nlohmann::json plan_json(const RunPlan& plan, const std::string& input, int64_t T);

// BadInput unless the file's slot layout (landmark slots) is the one the spec assumes.
void check_layout(const MechanismSpec& spec, const io::ActivationMeta& meta,
                  const std::string& input);
// The mechanism's inputs: stored vectors as they are, or un-rotated ones with the plan's
// encoding applied at the file's position ids.
AttentionInputs<double> inputs_for(const MechanismSpec& spec, const RunPlan& plan,
                                   const io::ActivationMeta& meta,
                                   const io::LayerActivations& layer, const std::string& input);

// BadInput when a mechanism's unit (one layer, the queries computed, the outputs kept) would
// not fit in memory, naming the sizes and what would fit (run_memory.cpp).
void require_units_fit(const RunPlan& plan, const io::ActivationMeta& meta,
                       const std::string& input);

// Runs the plan: layers checked, units listed and run (under MPI too), results written.
void run(const RunFlags& flags);

}  // namespace hils::cli::run_command
