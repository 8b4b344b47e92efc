// hils verify FILE...: reads a kernel's inputs, spec and outputs (data/verify_format.md), runs the
// oracle (reference in double and float) and prints a pass/fail report per tensor.
// Exit 0 all pass, 1 a tensor or the selection fails, 2 the file is missing or malformed (with
// several files, the worst of theirs).
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/verify/verify_file.hpp"
#include "io/file_error.hpp"

namespace hils::cli {

namespace {

struct VerifyFlags {
  std::vector<std::string> paths;
  int64_t max_messages = 8;
  bool strict = false;
};

// path, flags -> the report on stdout; CheckFailed when the kernel fails, FileError for a bad file.
void run_verify(const std::string& path, const VerifyFlags& flags) {
  verify::VerifyFile v = verify::read_verify_file(path);
  v.options.max_messages = flags.max_messages;
  oracle::Verdict verdict;
  try {
    verdict = oracle::verify(v.spec, v.inputs, v.outputs, v.options);
  } catch (const InvalidArgument& e) {
    // Invalid inputs, spec or queries: the file is bad, not the kernel.
    throw io::FileError(path + ": " + e.what());
  }
  for (const auto& what : v.unknown) verdict.not_compared.push_back(what);
  std::cout << path << (v.kernel_name.empty() ? "" : " (kernel " + v.kernel_name + ")") << "\n"
            << verdict.report();
  if (!verdict.passed) throw CheckFailed(path + ": the kernel's outputs fail the oracle");
  if (flags.strict && !verdict.not_compared.empty())
    throw io::FileError(path + ": --strict: " + std::to_string(verdict.not_compared.size()) +
                        " item(s) not compared, first " + verdict.not_compared.front());
}

// "a.h5, b.h5"
std::string joined(const std::vector<std::string>& paths) {
  std::string text;
  for (const auto& path : paths) text += (text.empty() ? "" : ", ") + path;
  return text;
}

// Several files (`hils verify dumps/*.h5`): each judged and reported in turn, a file's error on
// stderr as it comes, then the next; the exit status is the worst one, 2 when a file could not
// be judged, else 1 when one fails. One file: run_verify, as ever.
void run_verify_files(const VerifyFlags& flags) {
  if (flags.paths.size() == 1) return run_verify(flags.paths.front(), flags);
  std::vector<std::string> failed, malformed;
  for (const auto& path : flags.paths) {
    try {
      run_verify(path, flags);
    } catch (const CheckFailed& e) {
      failed.push_back(path);
      std::cout << std::flush;
      std::cerr << "hils: check failed: " << e.what() << std::endl;
    } catch (const InvalidArgument& e) {
      malformed.push_back(path);
      std::cout << std::flush;
      std::cerr << "hils: bad input: " << e.what() << std::endl;
    }
  }
  const size_t n = flags.paths.size();
  const std::string fails = failed.empty() ? "" : fmt::format("; {} of {} files fail the oracle: {}",
                                                               failed.size(), n, joined(failed));
  if (!malformed.empty())
    throw BadInput(fmt::format("{} of {} files could not be judged (their errors above): {}{}",
                               malformed.size(), n, joined(malformed), fails));
  if (!failed.empty()) throw CheckFailed(fails.substr(2));
  std::cout << "all " << n << " files PASS\n";
}

}  // namespace

// app -> `hils verify` with its options.
void register_verify(CLI::App& app) {
  auto flags = std::make_shared<VerifyFlags>();
  auto* cmd = app.add_subcommand(
      "verify", "Check a kernel's outputs against the reference (oracle, data/verify_format.md)");
  cmd->add_option("files", flags->paths,
                 "HDF5 file(s) with inputs, spec and the kernel's outputs (several: each judged "
                 "in turn)")
      ->required();
  cmd->add_option("--max-messages", flags->max_messages, "problems listed per tensor")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));  // PositiveNumber says "0 to 1.8e308"
  cmd->add_flag("--strict", flags->strict,
                "fail (exit 2) when the file holds anything the oracle did not compare");
  cmd->footer(
      "Recomputes every stage the file holds with the reference in double (truth) and float\n"
      "(baseline); a tensor passes when its max abs error <= 2 x float's + a rounding floor;\n"
      "selections are compared as sets with a margin bound; gradients (/grads, with\n"
      "/inputs/do) against the fp64 backward with the kernel's selection held fixed.\n"
      "Anything not compared is named in the report (an error with --strict).\n"
      "Exit 0 pass, 1 fail, 2 bad file (or, with --strict, something not compared); with\n"
      "several files the worst of theirs, after every file's report.\n"
      "Examples (your kernel's dump is a file written as data/verify_format.md says;\n"
      "`scripts/verify_demo.sh build` writes good and broken ones into out/verify_demo/):\n"
      "  hils verify out/verify_demo/good_hils_fp32.h5\n"
      "  hils verify out/verify_demo/*.h5   (all of them: the broken ones named, exit 2)");
  cmd->callback([flags] { run_verify_files(*flags); });
}

}  // namespace hils::cli
