// The llama2.c tokenizer (tok512.bin format): byte-fallback BPE driven by piece scores.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

namespace hils::sources {

inline constexpr int32_t kTokenBos = 1;
inline constexpr int32_t kTokenEos = 2;

class Tokenizer {
 public:
  // Reads int32 max_token_length, then per piece: float32 score, int32 length, bytes.
  // Throws io::FileError naming the file and what was found when it is short or malformed.
  static Tokenizer load(const std::filesystem::path& path, int64_t vocab_size);

  // llama2.c encoding: optional BOS, a dummy-prefix " " piece for non-empty text, one piece per
  // UTF-8 character (or its bytes + 3), then repeatedly merge the adjacent pair whose merged
  // piece scores highest (first such pair on ties).
  std::vector<int32_t> encode(const std::string& text, bool bos) const;
  // The text of a piece (raw byte pieces <0xNN> decode to the byte).
  std::string piece(int32_t token) const;
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }

 private:
  int32_t lookup(const std::string& piece) const;  // -1 if absent
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> index_;
};

}  // namespace hils::sources
