// The llama2.c model: the known NLL figure, RoPE against the reference, the dump, bad files.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "hils/positional.hpp"
#include "io/activation_file.hpp"
#include "sources/llama2c.hpp"
#include "sources/model_trace.hpp"
#include "sources/study_inputs.hpp"
#include "sources/tokenizer.hpp"
#include "support.hpp"
#include "util/shared_data.hpp"

namespace fs = std::filesystem;
using hils::test::run_hils;
using hils::test::TempDir;

namespace {

// The shared data folder, or empty (the caller skips) when the files are absent.
fs::path shared_or_skip() {
  auto dir = hils::shared_data_dir();
  for (const char* name : {"stories260K.bin", "tok512.bin", "tinystories_sample.txt"})
    if (!fs::exists(dir / name)) {
      WARN("SKIPPED: " << (dir / name).string()
                       << " is absent; set HILS_SHARED_DATA to a folder with stories260K.bin, "
                          "tok512.bin (karpathy/llama2.c) and tinystories_sample.txt");
      return {};
    }
  return dir;
}

std::vector<int32_t> first_tokens(const fs::path& dir, const hils::sources::Tokenizer& tokenizer,
                                  size_t count) {
  std::ifstream in(dir / "tinystories_sample.txt", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  auto tokens = tokenizer.encode(text.str().substr(0, 16 * count), true);
  tokens.resize(count);
  return tokens;
}

}  // namespace

TEST_CASE("stories260K: mean next-token NLL over the first 128 tokens is 1.276 +- 0.005",
          "[model]") {
  auto dir = shared_or_skip();
  if (dir.empty()) return;
  auto model = hils::sources::Llama2cModel::load(dir / "stories260K.bin");
  auto tokenizer = hils::sources::Tokenizer::load(dir / "tok512.bin", model.config().vocab_size);
  auto tokens = first_tokens(dir, tokenizer, 128);
  CHECK(tokens[0] == hils::sources::kTokenBos);
  auto logits = model.forward(tokens);
  double nll = hils::sources::mean_next_token_nll(logits, tokens);
  INFO("NLL " << nll);
  CHECK(std::abs(nll - 1.276) <= 0.005);
  // An untrained model would score ln 512 = 6.24: the figure really depends on the weights.
  CHECK(nll < 2.0);
}

TEST_CASE("stories260K: dumped q/k after RoPE equal the reference's interleaved RoPE of the "
          "un-rotated ones", "[model]") {
  auto dir = shared_or_skip();
  if (dir.empty()) return;
  auto model = hils::sources::Llama2cModel::load(dir / "stories260K.bin");
  auto tokenizer = hils::sources::Tokenizer::load(dir / "tok512.bin", model.config().vocab_size);
  auto tokens = first_tokens(dir, tokenizer, 64);
  std::vector<hils::sources::LayerTrace> trace;
  model.forward(tokens, &trace);
  REQUIRE(trace.size() == 5);
  hils::PositionalEncoding pe;
  pe.kind = hils::PositionalKind::rope;
  pe.pairing = hils::RopePairing::interleaved;
  pe.theta = 10000.0;
  std::vector<int64_t> positions(tokens.size());
  for (size_t t = 0; t < positions.size(); ++t) positions[t] = static_cast<int64_t>(t);
  for (const auto& layer : trace) {
    REQUIRE(layer.q.size() == 8);
    REQUIRE(layer.k.size() == 4);
    for (size_t h = 0; h < layer.q.size(); ++h) {
      auto rotated = layer.q_unrotated[h];
      hils::apply_rotary(rotated, positions, pe);
      CHECK((rotated - layer.q[h]).cwiseAbs().maxCoeff() < 1e-12);
      // Rotation must have changed something beyond position 0.
      CHECK((layer.q[h] - layer.q_unrotated[h]).cwiseAbs().maxCoeff() > 1e-3);
    }
  }
}

TEST_CASE("the model tracer keeps the first tokens, says what it cut, and feeds the studies",
          "[model]") {
  auto dir = shared_or_skip();
  if (dir.empty()) return;
  const auto files = hils::sources::ModelFiles::in_folder(dir);
  auto model = hils::sources::Llama2cModel::load(files.model);
  auto tokenizer = hils::sources::Tokenizer::load(files.tokenizer, model.config().vocab_size);
  const auto trace = hils::sources::trace_text(files, 48, "--tokens");
  CHECK(trace.tokens == first_tokens(dir, tokenizer, 48));
  CHECK(trace.truncated);
  CHECK(trace.layers.size() == 5);
  CHECK(trace.provenance["token_range"] == nlohmann::json::array({0, 48}));
  CHECK(trace.provenance["text_truncated"] == true);
  CHECK(trace.provenance["model_fnv1a64"].get<std::string>().size() == 16);
  CHECK(trace.provenance.contains("hils_version"));
  // The studies cut one trace of the longest length; a shorter length is its prefix.
  auto inputs = hils::sources::model_study_inputs(files, 9, {32, 48}, "--lengths");
  CHECK(inputs.positioned.n_layers == 5);
  CHECK(inputs.positioned.name == "stories260K");
  auto layer = inputs.positioned.load(3, 32);
  CHECK(layer.q[5] == trace.layers[3].q[5].topRows(32));
  CHECK(layer.v[2] == trace.layers[3].v[2].topRows(32));
  CHECK(inputs.raw.load(3, 48).k[1] == trace.layers[3].k_unrotated[1]);
  // Errors name the setting that asked for the tokens.
  CHECK_THROWS_WITH(hils::sources::trace_text(files, 513, "lengths"),
                    Catch::Contains("lengths") && Catch::Contains("512"));
  CHECK_THROWS_WITH(hils::sources::trace_text(files, 1, "--tokens"), Catch::Contains("--tokens"));
  auto missing = files;
  missing.text = dir / "no_such_text.txt";
  CHECK_THROWS_WITH(hils::sources::model_study_inputs(missing, 1, {32}, "--lengths"),
                    Catch::Contains("no_such_text.txt"));
}

TEST_CASE("hils dump llama2c writes every layer and prints the NLL", "[model][cli]") {
  auto dir = shared_or_skip();
  if (dir.empty()) return;
  TempDir tmp("dump_llama2c");
  auto out = tmp / "llama.h5";
  auto r = run_hils("dump llama2c --tokens 128 -o '" + out.string() + "'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("1.27"));
  auto file = hils::io::read_activation_file(out);
  CHECK(file.meta.n_layers == 5);
  CHECK(file.meta.Hq == 8);
  CHECK(file.meta.Hkv == 4);
  CHECK(file.meta.T == 128);
  CHECK(file.meta.rotated);
  CHECK(file.meta.rope_pairing == "interleaved");
  CHECK_FALSE(file.meta.has_landmarks());
  CHECK(file.meta.tokens.front() == 1);
  CHECK(file.meta.position_ids.back() == 127);
  CHECK(file.layers[4].hidden.cols() == 64);
  CHECK(file.layers[2].k_unrotated.size() == 4);
  CHECK(std::abs(file.meta.source["mean_next_token_nll"].get<double>() - 1.276) <= 0.005);
}

TEST_CASE("a truncated or foreign checkpoint is bad input", "[model][cli][bad-input]") {
  auto dir = shared_or_skip();
  if (dir.empty()) return;
  TempDir tmp("bad_checkpoint");
  fs::copy_file(dir / "stories260K.bin", tmp / "short.bin");
  fs::resize_file(tmp / "short.bin", 100000);
  auto r = run_hils("dump llama2c --model '" + (tmp / "short.bin").string() + "' -o '" +
                    (tmp / "x.h5").string() + "'");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("short.bin") && Catch::Contains("1056540 bytes"));
  std::ofstream(tmp / "tiny.bin") << "abc";
  CHECK(run_hils("dump llama2c --model '" + (tmp / "tiny.bin").string() + "' -o '" +
                 (tmp / "x.h5").string() + "'")
            .exit_code == 2);
  CHECK_FALSE(fs::exists(tmp / "x.h5"));
  auto too_long = run_hils("dump llama2c --tokens 513 -o '" + (tmp / "x.h5").string() + "'");
  CHECK(too_long.exit_code == 2);
  CHECK_THAT(too_long.output, Catch::Contains("512"));
}

TEST_CASE("a text that is not UTF-8 (a checkpoint given as --text) is bad input",
          "[model][cli][bad-input]") {
  // `--text stories260K.bin` (the flags swapped) dumped activations of the checkpoint's bytes
  // through the tokenizer's byte fallback, mean NLL 23.1 nats/token, exit 0. The text is read
  // and checked first, so the stand-in model and tokenizer below are never read.
  TempDir tmp("binary_text");
  std::ofstream(tmp / "model.bin") << "abc";
  std::ofstream(tmp / "tok.bin") << "abc";
  {
    std::ofstream out(tmp / "binary.txt", std::ios::binary);
    const char bytes[] = {'\x10', '\0', '\0', '\0', '\xff', '\xfe', 'h', 'i'};
    out.write(bytes, sizeof bytes);
  }
  std::ofstream(tmp / "accents.txt") << "Once upon a time, a café sold crème brûlée ✓.\n";
  const auto dump = [&](const std::string& text) {
    return run_hils("dump llama2c --model '" + (tmp / "model.bin").string() + "' --tokenizer '" +
                    (tmp / "tok.bin").string() + "' --text '" + (tmp / text).string() +
                    "' -o '" + (tmp / "x.h5").string() + "'");
  };
  auto r = dump("binary.txt");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("binary.txt: expected a UTF-8 text, found bytes that are "
                                       "not UTF-8 (a binary file? the model and the tokenizer "
                                       "are --model and --tokenizer)"));
  // UTF-8 beyond ASCII is a text: the error is then the stand-in model's.
  auto accents = dump("accents.txt");
  INFO(accents.output);
  CHECK(accents.exit_code == 2);
  CHECK_THAT(accents.output, Catch::Contains("model.bin") && !Catch::Contains("UTF-8"));
  CHECK_FALSE(fs::exists(tmp / "x.h5"));
}
