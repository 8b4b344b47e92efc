// hils dump llama2c | synthetic: real-model or synthetic activations -> activation file.
#include <cstdint>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/spec_flags.hpp"
#include "config/config.hpp"
#include "io/activation_file.hpp"
#include "io/results_file.hpp"
#include "sources/model_trace.hpp"
#include "sources/synthetic.hpp"
#include "util/shared_data.hpp"

namespace hils::cli {

namespace {

struct Llama2cOptions {
  std::string model, tokenizer, text, output;
  int64_t tokens = 128;
  std::string precision = "float64";
};

io::StorageType storage_of(const std::string& precision) {
  if (precision == "float32") return io::StorageType::float32;
  if (precision == "float64") return io::StorageType::float64;
  throw BadInput("--precision: expected float32 or float64, got '" + precision + "'");
}

// Tokens -> forward pass -> NLL on stdout, every layer's activations to the output file.
void dump_llama2c(const Llama2cOptions& o) {
  auto data = shared_data_dir();
  std::string hint = fmt::format(
      "the shared data folder is {} (set HILS_SHARED_DATA); stories260K.bin and tok512.bin "
      "come with karpathy/llama2.c",
      data.string());
  sources::ModelFiles files = sources::ModelFiles::in_folder(data);
  if (!o.model.empty()) files.model = o.model;
  if (!o.tokenizer.empty()) files.tokenizer = o.tokenizer;
  if (!o.text.empty()) files.text = o.text;
  require_input_file(files.model, "--model", hint);
  require_input_file(files.tokenizer, "--tokenizer", hint);
  require_input_file(files.text, "--text", hint);
  auto storage = storage_of(o.precision);

  const auto trace = sources::trace_text(files, o.tokens, "--tokens");
  if (trace.truncated && !global_options().quiet)
    std::cerr << fmt::format("hils: note: {} is longer than --tokens {}: kept its first {} "
                             "tokens (BOS included); the file records the truncation\n",
                             files.text.string(), o.tokens, trace.tokens.size());
  io::write_activation_file(o.output, sources::to_activation_file(trace), storage);
  fmt::print("tokens {}  mean next-token NLL {:.5f} nats/token  layers {}  -> {}\n",
             trace.tokens.size(), trace.mean_nll, trace.layers.size(), o.output);
}

// Flags given on the command line, as a JSON object of synthetic keys (flags win over TOML).
struct SyntheticFlags {
  std::string config, output, precision = "float64";
  nlohmann::json given = nlohmann::json::object();
};

// Bytes that generating and writing `p` holds at once, roughly: the rotated and unrotated
// inputs, the activation file's copy and the writer's buffer, all in double.
double synthetic_bytes(const sources::SyntheticParams& p) {
  const double per_slot = static_cast<double>(p.Hq) * static_cast<double>(p.d) * 2 +
                          static_cast<double>(p.Hkv) * static_cast<double>(p.d + p.dv);
  return 4.0 * sizeof(double) * static_cast<double>(p.T) * per_slot;
}

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
  require_fits_in_memory(synthetic_bytes(params), "-T, --Hq, --Hkv, -d, --dv");
  auto sample = sources::generate(params);
  io::write_activation_file(f.output, sources::to_activation_file(sample), storage);
  fmt::print("synthetic {}  T {}  Hq {}  Hkv {}  d {}  dv {}  seed {}", params.generator,
             params.T, params.Hq, params.Hkv, params.d, params.value_dim(), params.seed);
  for (const auto& n : sample.needles)
    fmt::print("  needle(kv {}: slot {} chunk {} query {})", n.kv_head, n.slot, n.chunk,
               n.query_slot);
  fmt::print("  -> {}\n", f.output);
}

void register_llama2c(CLI::App& dump) {
  auto options = std::make_shared<Llama2cOptions>();
  auto* cmd = dump.add_subcommand(
      "llama2c", "run a llama2.c-format model over a text and dump every layer's activations");
  add_output_option(cmd, &options->output, "activation file to write (HDF5)")
      ->required();
  cmd->add_option("--model", options->model,
                  "llama2.c checkpoint (default: $HILS_SHARED_DATA/stories260K.bin)");
  cmd->add_option("--tokenizer", options->tokenizer,
                  "llama2.c tokenizer (default: $HILS_SHARED_DATA/tok512.bin)");
  cmd->add_option("--text", options->text,
                  "UTF-8 text (default: $HILS_SHARED_DATA/tinystories_sample.txt)");
  cmd->add_option("--tokens", options->tokens, "tokens to run, BOS included (default 128)");
  cmd->add_option("--precision", options->precision,
                  "storage of the floats: float32 or float64 (default float64)");
  cmd->footer(
      "Prints the mean next-token NLL (about 1.276 nats/token for stories260K over the first\n"
      "128 tokens of tinystories_sample.txt). q and k are stored after RoPE, q_unrotated and\n"
      "k_unrotated before it; the model has no landmark slots, so landmarks are all 0.\n"
      "Example:\n  hils dump llama2c -o llama.h5 --tokens 512");
  cmd->callback([options] { dump_llama2c(*options); });
}

// Adds an option whose value, when given, lands in flags->given[key].
template <class T>
void add_synthetic_option(CLI::App* cmd, std::shared_ptr<SyntheticFlags> flags,
                          const std::string& names, const std::string& key,
                          const std::string& help) {
  cmd->add_option_function<T>(names, [flags, key](const T& v) { flags->given[key] = v; }, help);
}

void register_synthetic(CLI::App& dump) {
  auto flags = std::make_shared<SyntheticFlags>();
  auto* cmd = dump.add_subcommand("synthetic", "generate seeded synthetic activations");
  add_output_option(cmd, &flags->output, "activation file to write (HDF5)")->required();
  add_config_option(cmd, &flags->config,
                  "TOML file with a [synthetic] table (flags win over it)");
  cmd->add_option("--precision", flags->precision, "float32 or float64 (default float64)");
  add_synthetic_option<std::string>(cmd, flags, "--generator", "generator",
                                    "gaussian | topics | needle | drift (default gaussian)");
  add_synthetic_option<int64_t>(cmd, flags, "-T,--slots", "T", "slots (default 1024)");
  add_synthetic_option<int64_t>(cmd, flags, "-S,--chunk", "S", "chunk size (default 64)");
  add_synthetic_option<bool>(cmd, flags, "--landmarks", "landmarks",
                             "true/false: landmark slot ending each chunk (default true)");
  add_synthetic_option<int64_t>(cmd, flags, "--Hq", "Hq", "query heads (default 4)");
  add_synthetic_option<int64_t>(cmd, flags, "--Hkv", "Hkv", "key/value heads (default 2)");
  add_synthetic_option<int64_t>(cmd, flags, "-d,--head-dim", "d", "q/k head dim (default 64)");
  add_synthetic_option<int64_t>(cmd, flags, "--dv", "dv", "value head dim (default: d)");
  add_synthetic_option<double>(cmd, flags, "--logit-std", "logit_std",
                               "std of the logits: ~0 flat, large peaked (default 1)");
  add_synthetic_option<double>(cmd, flags, "--topic-share", "topic_share",
                               "topics: share of a key's variance from its topic (0.7)");
  add_synthetic_option<double>(cmd, flags, "--query-topic-share", "query_topic_share",
                               "topics: the same for queries (0.5)");
  add_synthetic_option<double>(cmd, flags, "--depth", "depth",
                               "needle: position in [0,1] of the needle (0.5)");
  add_synthetic_option<int64_t>(cmd, flags, "--needle-query", "needle_query",
                                "needle: query slot it aligns with (-1 = last real token)");
  add_synthetic_option<double>(cmd, flags, "--needle-logit", "needle_logit",
                               "needle: its logit for that query (8)");
  add_synthetic_option<int64_t>(cmd, flags, "--segment", "segment",
                                "drift: mean topic segment length in slots (192)");
  add_synthetic_option<double>(cmd, flags, "--key-noise", "key_noise",
                               "drift: key noise std around the topic (0.6)");
  add_synthetic_option<double>(cmd, flags, "--query-rho", "query_rho",
                               "drift: adjacent-slot correlation of the queries (0.98)");
  add_synthetic_option<double>(cmd, flags, "--retrieval-noise", "retrieval_noise",
                               "> 0 stores q_retrieval = q + noise (0)");
  add_synthetic_option<std::string>(cmd, flags, "--positional", "positional",
                                    "nope | rope | hope (default nope)");
  add_synthetic_option<std::string>(cmd, flags, "--rope-pairing", "rope_pairing",
                                    "half | interleaved (default half)");
  add_synthetic_option<double>(cmd, flags, "--rope-theta", "rope_theta", "RoPE base (1e4)");
  add_synthetic_option<int64_t>(cmd, flags, "--seed", "seed", "random seed (default 0)");
  cmd->footer(
      "Statistical models: experiments/sources/synthetic.hpp.\nExamples:\n"
      "  hils dump synthetic -o flat.h5 --generator topics --logit-std 0.1 --seed 7\n"
      "  hils dump synthetic -o needle.h5 --generator needle -T 4096 --depth 0.25\n"
      "  hils dump synthetic -o drift.h5 --generator drift --seed 24301   # the studies' synthetic layer 0\n"
      "  hils dump synthetic -o rope.h5 --positional rope --rope-pairing half -c experiments/configs/synthetic_example.toml");
  cmd->callback([flags] { dump_synthetic(*flags); });
}

}  // namespace

void register_dump(CLI::App& app) {
  auto* dump = app.add_subcommand("dump", "write an activation file from a real model or a "
                                          "synthetic source");
  dump->require_subcommand(1);
  dump->fallthrough();
  register_llama2c(*dump);
  register_synthetic(*dump);
}

}  // namespace hils::cli
