// hils verify FILE...: reads a kernel's inputs, spec and outputs (data/verify_format.md), runs the
// oracle (reference in double and float) and prints a pass/fail report per tensor.
// Exit 0 all pass, 1 a tensor or the selection fails, 2 the file is missing or malformed (with
// several files, the worst of theirs).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
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

// The line a Ctrl-C (SIGINT) or SIGTERM prints, one per signal, set before each file is judged
// and read by the handler (write(2) only: async-signal-safe).
char g_sigint_line[1024], g_sigterm_line[1024];
volatile sig_atomic_t g_sigint_length = 0, g_sigterm_length = 0;

extern "C" void on_verify_signal(int signal) {
  const char* line = signal == SIGINT ? g_sigint_line : g_sigterm_line;
  const auto length = static_cast<size_t>(signal == SIGINT ? g_sigint_length : g_sigterm_length);
  if (length > 0 && ::write(STDERR_FILENO, line, length) < 0) {
    // nothing more can be said
  }
  std::signal(signal, SIG_DFL);  // then end by it, as before: 130 (143) in the shell
  std::raise(signal);
}

// While one lives, SIGINT and SIGTERM end `hils verify` at once, as they did, but first print
// "hils: interrupted by SIGINT (Ctrl-C) while judging FILE; nothing was written" (with several
// files, which one of how many, the reports above being complete). Nothing is written by a
// verify, so there is nothing to keep or remove. A signal ignored when hils starts (nohup, a
// script's background job) stays ignored.
class InterruptLine {
 public:
  InterruptLine() {
    for (int signal : {SIGINT, SIGTERM}) {
      struct sigaction action {};
      action.sa_handler = on_verify_signal;
      sigemptyset(&action.sa_mask);
      struct sigaction old {};
      sigaction(signal, nullptr, &old);
      if (old.sa_handler == SIG_IGN) continue;
      sigaction(signal, &action, nullptr);
    }
  }
  ~InterruptLine() {
    for (int signal : {SIGINT, SIGTERM}) {
      struct sigaction old {};
      sigaction(signal, nullptr, &old);
      if (old.sa_handler == on_verify_signal) std::signal(signal, SIG_DFL);
    }
  }
  InterruptLine(const InterruptLine&) = delete;
  InterruptLine& operator=(const InterruptLine&) = delete;

  // The file now judged, the i-th (from 1) of n.
  static void judging(const std::string& path, size_t i, size_t n) {
    const std::string where =
        n == 1 ? "" : fmt::format(" (file {} of {}; the reports above are complete)", i, n);
    set(g_sigint_line, g_sigint_length, "SIGINT (Ctrl-C)", path, where);
    set(g_sigterm_line, g_sigterm_length, "SIGTERM", path, where);
  }

 private:
  static void set(char* line, volatile sig_atomic_t& length, const char* signal,
                  const std::string& path, const std::string& where) {
    length = 0;  // the handler prints nothing while the line changes
    // On a terminal the line starts on a line of its own (after ^C and the step line).
    const std::string text =
        fmt::format("{}hils: interrupted by {} while judging {}{}; nothing was written\n",
                    ::isatty(STDERR_FILENO) == 1 ? "\n" : "", signal, path, where);
    const size_t n = std::min(text.size(), size_t{1023});
    std::memcpy(line, text.data(), n);
    length = static_cast<sig_atomic_t>(n);
  }
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
  const InterruptLine interrupt_line;
  if (flags.paths.size() == 1) {
    InterruptLine::judging(flags.paths.front(), 1, 1);
    return run_verify(flags.paths.front(), flags);
  }
  std::vector<std::string> failed, malformed;
  for (size_t i = 0; i < flags.paths.size(); ++i) {
    const std::string& path = flags.paths[i];
    InterruptLine::judging(path, i + 1, flags.paths.size());
    std::cout << std::flush;  // the reports above are complete when the line says so
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
