#include "sources/model_trace.hpp"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"
#include "sources/tokenizer.hpp"
#include "util/shared_data.hpp"

namespace hils::sources {

namespace {

// Encode only a prefix of the text long enough for the tokens: BPE merging is quadratic in the
// text's length (TinyStories averages ~2 bytes per token; 16 leaves a wide margin).
constexpr int64_t kBytesPerTokenBound = 16;

// path -> its bytes (FileError naming the path when it is not a readable regular file).
std::string read_file_bytes(const std::filesystem::path& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) io::fail(path, "", what, "no such file");
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in) io::fail(path, "", what, "a file that cannot be read");
  return bytes.str();
}

// path -> the text the model reads, or FileError: an empty file, or bytes that are not UTF-8.
// A binary file given as the text (the checkpoint or the tokenizer, the flags swapped) went
// through the tokenizer's byte fallback into activations of noise (a mean next-token NLL of
// ~23 nats against ~1.3) without a word.
std::string read_text(const std::filesystem::path& path) {
  const std::string text = read_file_bytes(path, "a UTF-8 text");
  if (text.empty()) io::fail(path, "", "a UTF-8 text", "an empty file");
  if (io::utf8_text(text) != text)  // utf8_text replaces what is not UTF-8
    io::fail(path, "", "a UTF-8 text",
             "bytes that are not UTF-8 (a binary file? the model and the tokenizer are --model "
             "and --tokenizer)");
  return text;
}

// bytes -> 16 hex digits: FNV-1a (64-bit) of a file's content, to tell which model, tokenizer
// and text a trace came from (an identity check, not a cryptographic one).
std::string fnv1a64_of(const std::string& bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", hash);
}

}  // namespace

ModelFiles ModelFiles::in_folder(const std::filesystem::path& folder) {
  const std::filesystem::path dir = folder.empty() ? shared_data_dir() : folder;
  return {dir / "stories260K.bin", dir / "tok512.bin", dir / "tinystories_sample.txt"};
}

TextTrace trace_text(const ModelFiles& files, int64_t tokens, const std::string& field) {
  require(tokens >= 2, field, ">= 2 tokens (BOS included)", std::to_string(tokens));
  const std::string text = read_text(files.text);  // first: it costs less than the model
  const auto model = Llama2cModel::load(files.model);
  require(tokens <= model.config().seq_len, field,
          fmt::format("at most the model's context {}", model.config().seq_len),
          std::to_string(tokens));
  const auto tokenizer = Tokenizer::load(files.tokenizer, model.config().vocab_size);

  TextTrace trace;
  trace.config = model.config();
  const size_t prefix_bytes = static_cast<size_t>(kBytesPerTokenBound * tokens);
  trace.tokens = tokenizer.encode(text.substr(0, prefix_bytes), true);
  // Cut when the text holds more tokens than asked for: the encoded prefix was longer, or the
  // text went on past the prefix that was encoded.
  trace.truncated =
      static_cast<int64_t>(trace.tokens.size()) > tokens || text.size() > prefix_bytes;
  if (static_cast<int64_t>(trace.tokens.size()) > tokens) trace.tokens.resize(tokens);

  const Matrix<double> logits = model.forward(trace.tokens, &trace.layers);
  trace.mean_nll = mean_next_token_nll(logits, trace.tokens);
  const size_t kept = trace.tokens.size();
  trace.provenance = {{"kind", "llama2c"},
                      {"model", files.model.filename().string()},
                      {"tokenizer", files.tokenizer.filename().string()},
                      {"text", files.text.filename().string()},
                      {"tokens", kept},
                      {"token_range", {0, kept}},
                      {"tokens_requested", tokens},
                      {"text_truncated", trace.truncated},
                      {"text_bytes", text.size()},
                      {"model_fnv1a64", fnv1a64_of(read_file_bytes(files.model, "a checkpoint"))},
                      {"tokenizer_fnv1a64",
                       fnv1a64_of(read_file_bytes(files.tokenizer, "a tokenizer"))},
                      {"text_fnv1a64", fnv1a64_of(text)},
                      {"hils_version", io::project_version()},
                      {"git_commit", io::git_commit()},
                      {"bos", true},
                      {"mean_next_token_nll", trace.mean_nll},
                      {"computation", "float64"}};
  return trace;
}

io::ActivationFile to_activation_file(const TextTrace& trace) {
  return activations_from_trace(trace.config, trace.layers, trace.tokens, trace.provenance);
}

}  // namespace hils::sources
