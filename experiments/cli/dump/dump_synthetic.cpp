// hils dump synthetic: the seeded generators of experiments/sources/synthetic.hpp, from a
// [synthetic] TOML table and flags (flags win) -> a one-layer activation file.
#include <memory>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/dump/dump.hpp"
#include "cli/spec_flags.hpp"
#include "config/config.hpp"
#include "io/hdf5_util.hpp"
#include "sources/synthetic.hpp"

namespace hils::cli {

namespace {

// Flags given on the command line, as a JSON object of synthetic keys (flags win over TOML).
struct SyntheticFlags {
  std::string config, output, precision = "float64";
  nlohmann::json given = nlohmann::json::object();
};

// flags -> the activation file; one line on stdout (the needles' places too).
void dump_synthetic(const SyntheticFlags& f) {
  sources::SyntheticParams params;
  nlohmann::json toml = nlohmann::json::object();
  if (!f.config.empty()) {
    toml = config::load_toml(f.config, config::synthetic_schema());
    if (toml.contains("synthetic"))
      config::apply_synthetic_json(params, toml["synthetic"], f.config + ": [synthetic]");
  }
  config::apply_synthetic_json(params, f.given, "flags");
  config::check_naming_file([&] { params.validate(); }, toml.value("synthetic", nlohmann::json()),
                            f.given, f.config + ": [synthetic]");
  auto storage = storage_of(f.precision);
  require_fits_in_memory(params.working_bytes(), "-T, --Hq, --Hkv, -d, --dv");
  io::require_writable_folder(io::output_target(f.output));  // before the generator runs
  auto sample = sources::generate(params);
  io::write_activation_file(f.output, sources::to_activation_file(sample), storage);
  fmt::print("synthetic {}  T {}  Hq {}  Hkv {}  d {}  dv {}  seed {}", params.generator,
             params.T, params.Hq, params.Hkv, params.d, params.value_dim(), params.seed);
  for (const auto& n : sample.needles)
    fmt::print("  needle(kv {}: slot {} chunk {} query {})", n.kv_head, n.slot, n.chunk,
               n.query_slot);
  fmt::print("  -> {}\n", f.output);
}

}  // namespace

// dump -> `hils dump synthetic` with its options (one per [synthetic] key).
void register_synthetic(CLI::App& dump) {
  auto flags = std::make_shared<SyntheticFlags>();
  auto* cmd = dump.add_subcommand("synthetic", "generate seeded synthetic activations");
  add_output_option(cmd, &flags->output, "activation file to write (HDF5)")->required();
  add_config_option(cmd, &flags->config,
                  "TOML file with a [synthetic] table (flags win over it)");
  cmd->add_option("--precision", flags->precision, "float32 or float64 (default float64)");
  add_json_option<std::string>(cmd, &flags->given, "--generator", "generator",
                                    "gaussian | topics | needle | drift (default gaussian)");
  add_json_option<int64_t>(cmd, &flags->given, "-T,--slots", "T", "slots (default 1024)");
  add_json_option<int64_t>(cmd, &flags->given, "-S,--chunk", "S", "chunk size (default 64)");
  add_json_option<bool>(cmd, &flags->given, "--landmarks", "landmarks",
                             "true/false: landmark slot ending each chunk (default true)");
  add_json_option<int64_t>(cmd, &flags->given, "--Hq", "Hq", "query heads (default 4)");
  add_json_option<int64_t>(cmd, &flags->given, "--Hkv", "Hkv", "key/value heads (default 2)");
  add_json_option<int64_t>(cmd, &flags->given, "-d,--head-dim", "d", "q/k head dim (default 64)");
  add_json_option<int64_t>(cmd, &flags->given, "--dv", "dv", "value head dim (default: d)");
  add_json_option<double>(cmd, &flags->given, "--logit-std", "logit_std",
                               "std of the logits: ~0 flat, large peaked (default 1)");
  add_json_option<double>(cmd, &flags->given, "--topic-share", "topic_share",
                               "topics: share of a key's variance from its topic (0.7)");
  add_json_option<double>(cmd, &flags->given, "--query-topic-share", "query_topic_share",
                               "topics: the same for queries (0.5)");
  add_json_option<double>(cmd, &flags->given, "--depth", "depth",
                               "needle: position in [0,1] of the needle (0.5)");
  add_json_option<int64_t>(cmd, &flags->given, "--needle-query", "needle_query",
                                "needle: query slot it aligns with (-1 = last real token)");
  add_json_option<double>(cmd, &flags->given, "--needle-logit", "needle_logit",
                               "needle: its logit for that query (8)");
  add_json_option<int64_t>(cmd, &flags->given, "--segment", "segment",
                                "drift: mean topic segment length in slots (192)");
  add_json_option<double>(cmd, &flags->given, "--key-noise", "key_noise",
                               "drift: key noise std around the topic (0.6)");
  add_json_option<double>(cmd, &flags->given, "--query-rho", "query_rho",
                               "drift: adjacent-slot correlation of the queries (0.98)");
  add_json_option<double>(cmd, &flags->given, "--retrieval-noise", "retrieval_noise",
                               "> 0 stores q_retrieval = q + noise (0)");
  add_json_option<std::string>(cmd, &flags->given, "--positional", "positional",
                                    "nope | rope | hope (default nope)");
  add_json_option<std::string>(cmd, &flags->given, "--rope-pairing", "rope_pairing",
                                    "half | interleaved (default half)");
  add_json_option<double>(cmd, &flags->given, "--rope-theta", "rope_theta", "RoPE base (1e4)");
  add_json_option<int64_t>(cmd, &flags->given, "--seed", "seed", "random seed (default 0)");
  cmd->footer(
      "Statistical models: experiments/sources/synthetic.hpp.\nExamples:\n"
      "  hils dump synthetic -o flat.h5 --generator topics --logit-std 0.1 --seed 7\n"
      "  hils dump synthetic -o needle.h5 --generator needle -T 4096 --depth 0.25\n"
      "  hils dump synthetic -o drift.h5 --generator drift --seed 24301   # the studies' synthetic layer 0\n"
      "  hils dump synthetic -o rope.h5 --positional rope --rope-pairing half -c experiments/configs/synthetic_example.toml");
  cmd->callback([flags] { dump_synthetic(*flags); });
}

}  // namespace hils::cli
