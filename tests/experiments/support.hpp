// Helpers for the experiments tests: a temporary folder per test, spawning `hils`, small files.
#pragma once

#include <filesystem>
#include <string>

#include "io/activation_file.hpp"

namespace hils::test {

// A fresh folder under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs the hils executable with `args` (a shell-quoted string) and returns its exit code and
// output.
CommandResult run_hils(const std::string& args);
// `hils <args>` is refused as bad input: exit 2, the output holds `message`, and the output
// file `not_written` does not exist (Catch2 checks; the command and output are reported).
void require_refused(const std::string& args, const std::string& message,
                     const std::filesystem::path& not_written);
// Two results files hold the same objects, attributes and bit-identical datasets, provenance
// aside (tests/experiments/compare_results.py; a Catch2 REQUIRE).
void require_same_results(const std::filesystem::path& a, const std::filesystem::path& b);
// Runs a shell command line as given (sh -c), output and exit code as run_hils.
CommandResult run_shell(const std::string& command);

// run_hils under a file-size limit of `limit_blocks` (sh's `ulimit -f`, RLIMIT_FSIZE; dash,
// Debian's sh, counts 512-byte blocks, bash KiB): a write past it fails as on a full disk.
CommandResult run_hils_with_file_limit(const std::string& args, int limit_blocks);

// A small valid activation file: 2 layers, Hq=4, Hkv=2, T=40, d=8, dv=6, landmarks at S=8,
// deterministic values from `seed`.
io::ActivationFile small_activation_file(uint64_t seed);

// small_activation_file(seed) written as float64 to dir/name; returns its path.
std::filesystem::path write_small_activation_file(const TempDir& dir, uint64_t seed,
                                                  const std::string& name = "acts.h5");

// `path` in single quotes, for the shell command lines given to run_hils and run_shell.
std::string quoted(const std::filesystem::path& path);

// Files in `folder` whose name contains ".tmp-" (left-over temporary files).
int count_temp_files(const std::filesystem::path& folder);

// Files in `folder` whose name ends in ".lock" (left-over output locks).
int count_lock_files(const std::filesystem::path& folder);

// The whole file at `path`, byte for byte ("" when it cannot be opened).
std::string file_bytes(const std::filesystem::path& path);

}  // namespace hils::test
