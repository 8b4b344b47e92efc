// hils verify FILE: reads a kernel's inputs, spec and outputs (data/verify_format.md), runs the
// oracle (reference in double and float) and prints a pass/fail report per tensor.
// Exit 0 all pass, 1 a tensor or the selection fails, 2 the file is missing or malformed.
#include <iostream>
#include <limits>
#include <memory>
#include <string>

#include "cli/commands.hpp"
#include "cli/verify/verify_file.hpp"
#include "io/file_error.hpp"

namespace hils::cli {

namespace {

struct VerifyFlags {
  std::string path;
  int64_t max_messages = 8;
  bool strict = false;
};

// flags -> the report on stdout; CheckFailed when the kernel fails, FileError for a bad file.
void run_verify(const VerifyFlags& flags) {
  const std::string& path = flags.path;
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

}  // namespace

// app -> `hils verify` with its options.
void register_verify(CLI::App& app) {
  auto flags = std::make_shared<VerifyFlags>();
  auto* cmd = app.add_subcommand(
      "verify", "Check a kernel's outputs against the reference (oracle, data/verify_format.md)");
  cmd->add_option("file", flags->path, "HDF5 file with inputs, spec and the kernel's outputs")
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
      "Exit 0 pass, 1 fail, 2 bad file (or, with --strict, something not compared).\n"
      "Example (kernel_dump.h5: your kernel's dump, written as data/verify_format.md says;\n"
      "`scripts/verify_demo.sh build` writes good and broken ones into out/verify_demo/):\n"
      "  hils verify out/verify_demo/good_hils_fp32.h5");
  cmd->callback([flags] { run_verify(*flags); });
}

}  // namespace hils::cli
