// The one error type of file readers and writers: bad input that names the file, the dataset or
// attribute, what was found and what was expected (the `hils` tool exits 2 on it).
#pragma once

#include <filesystem>
#include <string>

#include "hils/types.hpp"

namespace hils::io {

class FileError : public hils::InvalidArgument {
 public:
  using hils::InvalidArgument::InvalidArgument;
};

// "<file>: <object>: expected <expected>, found <found>" (object may be empty: the whole file).
[[noreturn]] void fail(const std::filesystem::path& file, const std::string& object,
                       const std::string& expected, const std::string& found);

}  // namespace hils::io
