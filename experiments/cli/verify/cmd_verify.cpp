// hils verify FILE...: reads a kernel's inputs, spec and outputs (data/verify_format.md), runs the
// oracle (reference in double and float) and prints a pass/fail report per tensor.
// Exit 0 all pass, 1 a tensor or the selection fails, 2 the file is missing or malformed (with
// several files, the worst of theirs).
#include <unistd.h>

#include <chrono>
#include <cstdio>
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

// What `hils verify` is doing: one line on stderr, "hils verify FILE: the reference in float
// (41 s so far)", rewritten as each step of the oracle starts (VerifyOptions::on_step) and
// cleared before the report, so that a verify of minutes says where it is. Only when stderr is
// a terminal and --quiet is not given (as ProgressBar, util/progress.hpp): scripts and logs
// never see it.
class StepLine {
 public:
  explicit StepLine(std::string path)
      : path_(std::move(path)),
        enabled_(!global_options().quiet && ::isatty(STDERR_FILENO) == 1),
        start_(std::chrono::steady_clock::now()) {}
  ~StepLine() {
    if (drawn_) std::fprintf(stderr, "\r\x1b[K"), std::fflush(stderr);
  }
  StepLine(const StepLine&) = delete;
  StepLine& operator=(const StepLine&) = delete;

  void show(const std::string& step) {
    if (!enabled_) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "\rhils verify %s: %s (%.0f s so far)\x1b[K", path_.c_str(), step.c_str(),
                 seconds);
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  std::string path_;
  bool enabled_, drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

// path, flags -> the report on stdout; CheckFailed when the kernel fails, FileError for a bad file.
void run_verify(const std::string& path, const VerifyFlags& flags) {
  oracle::Verdict verdict;
  verify::VerifyFile v;
  {
    StepLine line(path);  // cleared before the report (or an error) is printed
    line.show("reading the file");
    v = verify::read_verify_file(path);
    v.options.max_messages = flags.max_messages;
    v.options.on_step = [&line](const std::string& step) { line.show(step); };
    try {
      verdict = oracle::verify(v.spec, v.inputs, v.outputs, v.options);
    } catch (const InvalidArgument& e) {
      // Invalid inputs, spec or queries: the file is bad, not the kernel.
      throw io::FileError(path + ": " + e.what());
    }
    v.options.on_step = nullptr;
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
