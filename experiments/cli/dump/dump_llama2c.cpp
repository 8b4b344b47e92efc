// hils dump llama2c: a llama2.c-format model run over a text (the one tracer of
// experiments/sources/model_trace.hpp) -> every layer's activations.
#include <iostream>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/dump/dump.hpp"
#include "cli/spec_flags.hpp"
#include "io/hdf5_util.hpp"
#include "sources/model_trace.hpp"
#include "util/shared_data.hpp"

namespace hils::cli {

namespace {

struct Llama2cOptions {
  std::string model, tokenizer, text, output;
  int64_t tokens = 128;
  std::string precision = "float64";
};

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
  // The output is checked before the model runs (as `hils run` does before its units).
  for (const auto& [input, option] : {std::pair{files.model, "--model"},
                                      {files.tokenizer, "--tokenizer"}, {files.text, "--text"}})
    require_distinct_files(input, option, o.output, "--output");
  io::require_writable_folder(io::output_target(o.output));

  const auto trace = sources::trace_text(files, o.tokens, "--tokens");
  if (trace.truncated && !global_options().quiet)
    std::cerr << fmt::format("hils: note: {} is longer than --tokens {}: kept its first {} "
                             "tokens (BOS included); the file records the truncation\n",
                             files.text.string(), o.tokens, trace.tokens.size());
  io::write_activation_file(o.output, sources::to_activation_file(trace), storage);
  fmt::print("tokens {}  mean next-token NLL {:.5f} nats/token  layers {}  -> {}\n",
             trace.tokens.size(), trace.mean_nll, trace.layers.size(), o.output);
}

}  // namespace

// dump -> `hils dump llama2c` with its options.
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

}  // namespace hils::cli
