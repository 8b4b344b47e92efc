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

// A FileError of writing an output (a full disk, a file-size limit): the run's inputs were fine,
// so the way on is to make room (cli_util.hpp rethrow_write_failure), not to correct an input.
class WriteError : public FileError {
 public:
  using FileError::FileError;
};

// "<file>: <object>: expected <expected>, found <found>" (object may be empty: the whole file).
[[noreturn]] void fail(const std::filesystem::path& file, const std::string& object,
                       const std::string& expected, const std::string& found);
// The same message, thrown as a WriteError.
[[noreturn]] void fail_writing(const std::filesystem::path& file, const std::string& object,
                               const std::string& expected, const std::string& found);

}  // namespace hils::io
