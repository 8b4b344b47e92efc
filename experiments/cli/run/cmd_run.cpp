// hils run: mechanisms (presets or specs, from flags and a TOML file) over an activation file's
// layers -> a results file with o, lse, fusion weights per head and selections per KV head.
// This file declares the options; run/run.cpp runs them (run/run_plan.hpp lists the steps).
#include <memory>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/run/run_plan.hpp"
#include "cli/spec_flags.hpp"

namespace hils::cli {

using run_command::RunFlags;

// app -> `hils run` with its options, examples and the run as callback.
void register_run(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  auto* cmd = app.add_subcommand("run", "run attention mechanisms over an activation file");
  cmd->add_option("ACTIVATIONS", flags->input, "activation file (hils dump, hf_dump.py)")
      ->required();
  add_output_option(cmd, &flags->output, "results file to write (HDF5)")->required();
  add_config_option(cmd, &flags->config,
                  "TOML file: [run] settings and [[mechanism]] tables (flags win)");
  cmd->add_option("-p,--preset", flags->presets,
                  "preset(s): " + preset_options(" ") + " (repeat or comma-separate)")
      ->delimiter(',');
  cmd->add_option("--layers", flags->layers, "layer indices to run, e.g. 1,0,2 (default all)")
      ->delimiter(',');
  add_spec_flags(cmd, &flags->spec);
  nlohmann::json* run_settings = &flags->run;
  add_json_option<std::string>(cmd, run_settings, "--positional", "positional",
                               "auto | nope | rope | hope (auto: use the file as it is, "
                               "rotating un-rotated RoPE vectors)");
  add_json_option<std::string>(cmd, run_settings, "--rope-pairing", "rope_pairing",
                               "half | interleaved (default: the file's)");
  add_json_option<double>(cmd, run_settings, "--rope-theta", "rope_theta",
                          "RoPE base (default: the file's)");
  add_json_option<double>(cmd, run_settings, "--hope-train-length", "hope_train_length",
                          "HoPE training length (8192)");
  add_json_option<int64_t>(cmd, run_settings, "--last-queries", "last_queries",
                           "compute only the last N queries (0 = all)");
  add_json_option<bool>(cmd, run_settings, "--keep-scores", "keep_scores",
                        "true/false: also write surrogate and exact chunk scores");
  add_json_option<bool>(cmd, run_settings, "--keep-window", "keep_window",
                        "true/false: also write the window branch");
  add_json_option<int64_t>(cmd, run_settings, "--seed", "seed",
                           "recorded in the results (runs are deterministic)");
  add_jobs_option(cmd, &flags->jobs);
  cmd->add_flag("--resume", flags->resume,
                "continue an existing results file of the same configuration (one stopped by "
                "Ctrl-C or a full disk), skipping its complete units; without it an existing "
                "file is replaced");
  cmd->footer(
      "Spec flags override every mechanism (presets and [[mechanism]] tables).\n"
      "Output: /<mechanism>/layer<l>/head<h>/{o,lse,fusion_weights},\n"
      "        /<mechanism>/layer<l>/kv_head<g>/selection, /<mechanism>/layer<l>/queries.\n"
      "Examples:\n"
      "  hils dump synthetic -o synth.h5 -S 16     # landmark slots every 16 slots\n"
      "  hils run synth.h5 -o res.h5 --preset full,nsa,hils -S 16 -W 32 -K 4 --landmarks true\n"
      "  hils run synth.h5 -o res_cfg.h5 -c experiments/configs/run_example.toml --resume\n"
      "  hils dump llama2c -o llama.h5                # no landmark slots\n"
      "  hils run llama.h5 -o llama_res.h5 --preset full,swa,naive_bsa,nsa -S 16 -W 32 -K 2\n"
      "  hils run llama.h5 -o hils_res.h5 --preset hils --landmarks false --prior-rule shared\n"
      "A file with landmark slots needs --landmarks true and its own chunk size (-S).");
  cmd->callback([flags] { run_command::run(*flags); });
}

}  // namespace hils::cli
