// hils cases: the oracle's hard cases (hils::oracle::hard_cases, data/hard_cases.md) for a spec
// and a kernel's head shape, each written as a verify file holding its inputs and spec only
// (data/verify_format.md), for a kernel's harness to read /inputs, add its /outputs and run
// `hils verify DIR/*.h5`. --list says what would be written and writes nothing; --last-queries N
// writes /queries = each case's last N slots, the steps a decode kernel's harness runs.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/spec_flags.hpp"
#include "cli/verify/verify_file.hpp"
#include "config/spec_codec.hpp"
#include "hils/analysis/hard_cases.hpp"

namespace hils::cli {

namespace {

struct CasesFlags {
  std::string preset, output, precision = "fp32";
  nlohmann::json spec = nlohmann::json::object();
  int64_t Hq = 0, Hkv = 0, d = 0;
  std::optional<int64_t> dv;  // absent: d
  int64_t length_multiple = 1, max_T = 0;
  int64_t last_queries = 0;  // 0: every slot (no /queries)
  bool list = false;
};

// The spec: --preset, the spec flags over it (as `hils run` applies them), checked.
MechanismSpec spec_of(const CasesFlags& f) {
  if (f.preset.empty() && f.spec.empty())
    throw BadInput("no mechanism: give --preset NAME (one of " + preset_options(", ") +
                   ") or spec flags (-S, -W, -K, --fusion, ...)");
  MechanismSpec spec = f.preset.empty() ? MechanismSpec{} : preset(f.preset);
  config::apply_spec_overrides(spec, f.spec, "flags");
  spec.validate();
  return spec;
}

// The option that sets each field hard_cases names in its errors (hard_cases.hpp).
constexpr std::pair<const char*, const char*> kFieldOptions[] = {
    {"Hq", "--Hq"},           {"Hkv", "--Hkv"},
    {"d", "-d/--head-dim"},   {"dv", "--dv"},
    {"precision", "--precision"}, {"length_multiple", "--length-multiple"},
    {"max_T", "--max-T"}};

// hard_cases with its "field: expected ..." errors worded with the option's name instead.
oracle::HardCases build_cases(const MechanismSpec& spec, oracle::InputPrecision precision,
                              const CasesFlags& f) {
  const oracle::HeadShape shape{f.Hq, f.Hkv, f.d, f.dv.value_or(f.d)};
  const oracle::HardCaseOptions options{precision, f.length_multiple, f.max_T};
  try {
    return oracle::hard_cases(spec, shape, options);
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    for (const auto& [field, option] : kFieldOptions)
      if (message.rfind(std::string(field) + ": ", 0) == 0)
        throw BadInput(option + message.substr(std::string(field).size()));
    throw;
  }
}

void print_skipped(const oracle::HardCases& cases) {
  for (const auto& s : cases.skipped) fmt::print("skipped {}: {}\n", s.name, s.reason);
}

// --out given and, if it exists, a folder (make_output_folder creates it after the checks).
void check_output_folder(const std::string& output) {
  if (output.empty())
    throw BadInput("--out: expected the folder to write the cases into (or --list)");
  std::error_code ec;
  if (std::filesystem::exists(output, ec) && !std::filesystem::is_directory(output, ec))
    throw BadInput("--out: expected a folder, got " + output + ", which is not a folder");
}

// The last min(n, T) slots of a case of T slots, ascending; empty for n = 0 (every slot).
std::vector<int64_t> last_slots(int64_t n, int64_t T) {
  std::vector<int64_t> slots;
  for (int64_t t = std::max<int64_t>(0, T - n); n > 0 && t < T; ++t) slots.push_back(t);
  return slots;
}

// flags -> one verify file per case in --out (or, with --list, the cases described).
void run_cases(const CasesFlags& f) {
  const MechanismSpec spec = spec_of(f);
  const oracle::InputPrecision precision = oracle::parse_input_precision(f.precision, "--precision");
  if (f.last_queries < 0)
    throw BadInput(fmt::format("--last-queries: expected 0 (every slot) or a count >= 1, got {}",
                               f.last_queries));
  if (!f.list) check_output_folder(f.output);
  const oracle::HardCases cases = build_cases(spec, precision, f);
  if (!f.list) make_output_folder(f.output, "--out");  // after the checks: none on bad input
  for (const auto& c : cases.cases) {
    const int64_t T = c.inputs.q.front().rows();
    if (f.list) {
      fmt::print("{}  T {}  {}\n", c.name, T, c.catches);
      continue;
    }
    const auto path = std::filesystem::path(f.output) / (c.name + ".h5");
    const std::vector<int64_t> queries = last_slots(f.last_queries, T);
    verify::write_verify_inputs(path, spec, precision, c.inputs, queries);
    fmt::print("{}  T {}  -> {}{}\n", c.name, T, path.string(),
               queries.empty() ? "" : fmt::format("  (queries {}..{})", queries.front(), queries.back()));
  }
  print_skipped(cases);
}

}  // namespace

// app -> `hils cases` with its options and examples.
void register_cases(CLI::App& app) {
  auto flags = std::make_shared<CasesFlags>();
  auto* cmd = app.add_subcommand(
      "cases", "write the oracle's hard cases as verify files for a kernel's harness "
               "(inputs and spec; data/hard_cases.md)");
  add_output_option(cmd, &flags->output,
                    "folder to write one file per case into, <case>.h5 (created if missing)");
  cmd->add_option("-p,--preset", flags->preset, "preset: " + preset_options(" "));
  add_spec_flags(cmd, &flags->spec);
  cmd->add_option("--Hq", flags->Hq, "the kernel's query heads")->required();
  cmd->add_option("--Hkv", flags->Hkv, "the kernel's key/value heads (Hq a multiple of it)")
      ->required();
  cmd->add_option("-d,--head-dim", flags->d, "q/k head dim")->required();
  cmd->add_option_function<int64_t>(
      "--dv", [dv = &flags->dv](int64_t n) { *dv = n; }, "value head dim (default: d)");
  cmd->add_option("--precision", flags->precision,
                  "the kernel's input precision, fp32, bf16 or fp16 (every value exact in it; "
                  "default fp32)");
  cmd->add_option("--length-multiple", flags->length_multiple,
                  "every case's T a multiple of this, for a kernel that takes only such "
                  "lengths (default 1)");
  cmd->add_option("--max-T", flags->max_T, "skip cases longer than this (default 0: no limit)");
  cmd->add_option("--last-queries", flags->last_queries,
                  "write /queries = each case's last N slots (all when T <= N): the decode steps "
                  "to run, slot t's query against slots 0..t (default 0: every slot, no /queries)");
  cmd->add_flag("--list", flags->list,
                "print each case (name, T, what it catches) and the skipped ones; write nothing");
  cmd->footer(
      "Each file holds /inputs (q, k, v, and prior when the spec reads one; float32, every\n"
      "value exact in --precision) and the root attributes format, format_version, spec and\n"
      "input_precision (data/verify_format.md). Your harness reads /inputs, runs the kernel\n"
      "and writes its outputs (at least /outputs/o, [Hq, T, dv]) into the same file; then\n"
      "`hils verify cases/*.h5` judges them all. Cases these flags leave out are printed with\n"
      "the reason (data/hard_cases.md). With --last-queries N each file also holds /queries,\n"
      "the last N slots, and the outputs hold those rows only ([Hq, N, dv]): a decode kernel's\n"
      "harness runs one step per slot t (its query against a cache of slots 0..t) and writes\n"
      "row i for slot queries[i]. Exit 0 written, 2 bad input (the option named).\n"
      "Examples:\n"
      "  hils cases --preset nsa -S 16 -W 32 -K 4 --Hq 4 --Hkv 2 -d 32 --precision bf16 --list\n"
      "  hils cases --preset nsa -S 16 -W 32 -K 4 --Hq 4 --Hkv 2 -d 32 --precision bf16 -o cases\n"
      "  hils cases --preset hils -S 16 -W 32 -K 4 --Hq 4 --Hkv 2 -d 32 --last-queries 64 -o steps");
  cmd->callback([flags] { run_cases(*flags); });
}

}  // namespace hils::cli
