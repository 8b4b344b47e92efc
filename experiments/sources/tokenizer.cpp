#include "sources/tokenizer.hpp"

#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "io/file_error.hpp"

namespace hils::sources {

namespace {

// Reads `count` bytes or fails naming the file and the piece being read.
void read_exact(std::ifstream& in, const std::filesystem::path& path, char* out, size_t count,
                const std::string& what) {
  in.read(out, static_cast<std::streamsize>(count));
  if (static_cast<size_t>(in.gcount()) != count)
    io::fail(path, what, fmt::format("{} more bytes", count), "end of file");
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& path, int64_t vocab_size) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    io::fail(path, "", "a llama2.c tokenizer file", "no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) io::fail(path, "", "a readable file", "a file that cannot be opened");
  Tokenizer tokenizer;
  int32_t max_length = 0;
  read_exact(in, path, reinterpret_cast<char*>(&max_length), 4, "max_token_length");
  if (max_length < 1 || max_length > 1024)
    io::fail(path, "max_token_length", "1..1024", std::to_string(max_length));
  for (int64_t i = 0; i < vocab_size; ++i) {
    std::string where = fmt::format("piece {}", i);
    float score = 0;
    int32_t length = 0;
    read_exact(in, path, reinterpret_cast<char*>(&score), 4, where + " score");
    read_exact(in, path, reinterpret_cast<char*>(&length), 4, where + " length");
    if (length < 0 || length > max_length)
      io::fail(path, where + " length", fmt::format("0..{}", max_length), std::to_string(length));
    std::string piece(static_cast<size_t>(length), '\0');
    if (length > 0) read_exact(in, path, piece.data(), static_cast<size_t>(length), where);
    tokenizer.index_.emplace(piece, static_cast<int32_t>(i));  // first occurrence wins
    tokenizer.pieces_.push_back(std::move(piece));
    tokenizer.scores_.push_back(score);
  }
  return tokenizer;
}

int32_t Tokenizer::lookup(const std::string& piece) const {
  auto it = index_.find(piece);
  return it == index_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool bos) const {
  std::vector<int32_t> tokens;
  if (bos) tokens.push_back(kTokenBos);
  if (!text.empty()) {
    int32_t space = lookup(" ");
    if (space >= 0) tokens.push_back(space);
  }
  // One piece per UTF-8 character: a lead byte and its continuation bytes (at most 4).
  for (size_t i = 0; i < text.size();) {
    size_t length = 1;
    while (i + length < text.size() && length < 4 &&
           (static_cast<unsigned char>(text[i + length]) & 0xC0) == 0x80)
      ++length;
    int32_t id = lookup(text.substr(i, length));
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (size_t b = 0; b < length; ++b)
        tokens.push_back(static_cast<unsigned char>(text[i + b]) + 3);
    }
    i += length;
  }
  // Greedy merges by score, as llama2.c does (strictly greater: the first best pair wins).
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_index = 0;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      int32_t id = lookup(pieces_[tokens[i]] + pieces_[tokens[i + 1]]);
      if (id >= 0 && scores_[id] > best_score) {
        best_score = scores_[id];
        best_id = id;
        best_index = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_index] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_index) + 1);
  }
  return tokens;
}

std::string Tokenizer::piece(int32_t token) const {
  if (token < 0 || token >= vocab_size()) return "";
  const std::string& text = pieces_[token];
  unsigned int byte = 0;
  if (text.size() == 6 && std::sscanf(text.c_str(), "<0x%02X>", &byte) == 1)
    return std::string(1, static_cast<char>(byte));
  return text;
}

}  // namespace hils::sources
