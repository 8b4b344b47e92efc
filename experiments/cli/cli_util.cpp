// The helpers every `hils` command shares (cli_util.hpp): global options, the command line for
// provenance, and the checks of input files, output folders and sizes.
#include "cli/cli_util.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <iostream>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/studies/study_table.hpp"
#include "hils/memory.hpp"
#include "parallel/session.hpp"

namespace hils::cli {

GlobalOptions& global_options() {
  static GlobalOptions options;
  return options;
}

namespace {
std::string& stored_command_line() {
  static std::string line;
  return line;
}
}  // namespace

namespace {

// A decimal integer (an optional '-', then digits) of type T, rewritten without leading zeros
// so that CLI11's conversion (base 0: "010" is octal) reads it in base 10; "" when it is fine
// or is not a plain decimal (hex, "abc", "1e3": CLI11's own conversion answers those).
template <class T>
std::string check_decimal(std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  const size_t digits = negative ? 1 : 0;
  if (text.size() == digits ||
      text.find_first_not_of("0123456789", digits) != std::string::npos)
    return "";
  if (negative && std::is_unsigned_v<T>)
    return "expected a non-negative integer, got " + text;
  T value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range || end != text.data() + text.size())
    return fmt::format("expected an integer from {} to {}, got {}", std::numeric_limits<T>::min(),
                       std::numeric_limits<T>::max(), text);
  text = std::to_string(value);
  return "";
}

}  // namespace

void check_integer_options(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0)
      option->transform(CLI::Validator(check_decimal<int64_t>, "", "decimal integer"));
    if (type.rfind("UINT", 0) == 0)
      option->transform(CLI::Validator(check_decimal<uint64_t>, "", "decimal integer"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    check_integer_options(*sub);
}

void note(const std::string& text) {
  if (!global_options().quiet) std::cerr << text << "\n";
}

std::string command_line() { return stored_command_line(); }

void set_command_line(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) line += (i ? " " : "") + std::string(argv[i]);
  stored_command_line() = line;
}

void require_input_file(const std::filesystem::path& path, const std::string& option,
                        const std::string& hint) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return;
  std::string found = std::filesystem::exists(path, ec) ? "not a regular file" : "no such file";
  throw BadInput(option + ": expected an existing file, found " + found + ": " + path.string() +
                 (hint.empty() ? "" : " (" + hint + ")"));
}

void make_output_folder(const std::filesystem::path& folder, const std::string& option) {
  std::error_code ec;
  if (folder.empty()) throw BadInput(option + ": expected a folder name, got ''");
  std::filesystem::create_directories(folder, ec);
  const std::string reason = ec ? ": " + ec.message() : "";  // the checks below reuse ec
  if (!ec && std::filesystem::is_directory(folder, ec)) return;
  // Name the first component that is in the way (a regular file where a folder must be).
  std::filesystem::path part;
  for (const auto& piece : folder) {
    part /= piece;
    if (std::filesystem::exists(part, ec) && !std::filesystem::is_directory(part, ec))
      throw BadInput(option + ": cannot create the folder " + folder.string() + ": " +
                     part.string() + " is a file, not a folder");
  }
  throw BadInput(option + ": cannot create the folder " + folder.string() + reason);
}

void require_distinct_files(const std::filesystem::path& input, const std::string& input_option,
                            const std::filesystem::path& output,
                            const std::string& output_option) {
  std::error_code ec;
  if (!std::filesystem::exists(output, ec)) return;
  if (std::filesystem::equivalent(input, output, ec) && !ec)
    throw BadInput(fmt::format("{} {} is the same file as {} {}: writing it would replace the "
                               "input; choose another output file",
                               output_option, output.string(), input_option, input.string()));
}

namespace {

// meta -> "landmark slots at 63, 127, ... (S=64)", "landmark slots at other places" or
// "no landmark slots".
std::string landmark_layout_text(const io::ActivationMeta& meta) {
  if (!meta.has_landmarks()) return "no landmark slots";
  const auto first = std::find(meta.landmarks.begin(), meta.landmarks.end(), 1);
  const int64_t S = static_cast<int64_t>(first - meta.landmarks.begin()) + 1;
  if (!meta.landmarks_match(S)) return "landmark slots at other places";
  if (2 * S > meta.T) return fmt::format("one landmark slot, at {} (S={})", S - 1, S);
  return fmt::format("landmark slots at {}, {}, ... (S={})", S - 1, 2 * S - 1, S);
}

}  // namespace

void require_landmark_layout(bool landmarks, int64_t S, const io::ActivationMeta& meta,
                             const std::string& input, const std::string& who) {
  if (landmarks && !meta.landmarks_match(S))
    throw BadInput(fmt::format(
        "{} needs the landmark layout (a landmark slot at (c+1)S-1 of every chunk, S={}), but "
        "{} has {}. Real-model dumps have no landmark slots: run a landmark-free spec "
        "(--landmarks false, and --prior-rule shared for taylor/entropy summaries; lmk's "
        "landmark_key rule cannot run), or dump a synthetic source with --landmarks true -S {}",
        who, S, input, landmark_layout_text(meta), S));
  if (!landmarks && meta.has_landmarks())
    throw BadInput(fmt::format(
        "{} has landmarks off, but {} has {} (their keys would be attended as tokens); set "
        "--landmarks true with the file's chunk size",
        who, input, landmark_layout_text(meta)));
}

void add_jobs_option(CLI::App* cmd, std::optional<int64_t>* jobs) {
  cmd->add_option_function<int64_t>(
      "--jobs", [jobs](int64_t n) { *jobs = n; },
      fmt::format("units computed at once in this process (under mpirun: in each worker "
                  "rank), sharing the OpenMP threads (default: one per thread, {} here; under "
                  "mpirun without OMP_NUM_THREADS, a rank's share of its node's cores). The "
                  "results file is the same for any value",
                  parallel::default_jobs()));
}

void check_with_jobs(std::optional<int64_t> jobs, const std::function<void()>& checks) {
  const int chosen = parallel::use_jobs(jobs);
  if (jobs || chosen == 1) return checks();
  try {
    checks();
  } catch (const BadInput& refused) {
    parallel::use_jobs(1);
    checks();  // refused at one unit too: that error, as before --jobs
    note(fmt::format("--jobs: computing one unit at a time, as {} at once do not fit ({})",
                     chosen, refused.what()));
  }
}

void require_fits_in_memory(double bytes, const std::string& what) {
  const MemoryLimit memory = memory_limit();
  if (bytes < 0.8 * memory.bytes) return;
  throw BadInput(fmt::format("{}: expected sizes whose data fit in 80% of {}, got about {}", what,
                             memory.text, bytes_text(bytes)));
}

std::string results_producer(const nlohmann::json& config) {
  const auto study = config.find("study");
  if (study == config.end()) return "hils run";
  const auto* row = study->is_string() ? studies::study_row(study->get<std::string>()) : nullptr;
  return row ? "hils " + std::string(row->command) : "a study " + study->dump();
}

void require_results_of(const std::string& command, const std::filesystem::path& path,
                        const nlohmann::json& stored) {
  const std::string producer = results_producer(stored);
  if (producer != command)
    throw BadInput(fmt::format("{}: expected the results of {} to resume, found those of {}; "
                               "write to another file, or remove this one to start over",
                               path.string(), command, producer));
}

std::optional<int64_t> unit_layer(const std::string& unit) {
  std::optional<int64_t> layer;
  size_t start = 0;
  while (start <= unit.size()) {
    const size_t end = std::min(unit.find('/', start), unit.size());
    const std::string segment = unit.substr(start, end - start);
    if (segment.size() > 5 && segment.compare(0, 5, "layer") == 0 &&
        segment.find_first_not_of("0123456789", 5) == std::string::npos && segment.size() < 15)
      layer = std::stoll(segment.substr(5));
    start = end + 1;
  }
  return layer;
}

namespace {

// The fingerprints a results file recorded (none when it predates them), or FileError naming
// the attribute when it is not the JSON object check_and_record_fingerprints writes.
std::optional<LayerFingerprints> recorded_fingerprints(const std::filesystem::path& results) {
  io::ResultsReader reader(results);
  if (!reader.has_attribute("", kInputFingerprints)) return std::nullopt;
  const std::string text = reader.string_attribute("", kInputFingerprints);
  LayerFingerprints recorded;
  try {
    const nlohmann::json stored = nlohmann::json::parse(text);
    if (!stored.is_object()) throw std::invalid_argument("not an object");
    for (const auto& item : stored.items())
      recorded[std::stoll(item.key())] = item.value().get<std::string>();
  } catch (const std::exception&) {
    throw io::FileError(results.string() + ": / attribute " + kInputFingerprints +
                        ": expected a JSON object of layer fingerprints, got \"" +
                        text.substr(0, 60) + "\"");
  }
  return recorded;
}

}  // namespace

void check_and_record_fingerprints(
    io::ResultsWriter& writer, const std::filesystem::path& results,
    const std::filesystem::path& input, const std::string& input_option,
    const std::vector<int64_t>& run_layers, const FingerprintOf& fingerprint_of,
    const std::function<std::optional<int64_t>(const std::string&)>& layer_of) {
  LayerFingerprints kept;
  std::map<int64_t, std::optional<std::string>> now;  // each layer read once
  auto current = [&](int64_t layer) -> const std::optional<std::string>& {
    auto found = now.find(layer);
    if (found == now.end()) found = now.emplace(layer, fingerprint_of(layer)).first;
    return found->second;
  };
  const std::vector<std::string> complete = writer.complete_units();
  if (!complete.empty()) {
    const std::optional<LayerFingerprints> recorded = recorded_fingerprints(results);
    if (!recorded)
      note(fmt::format("{}: records no fingerprints of its input (written before they were "
                       "recorded), so its complete units ({}) are not checked against {}",
                       results.string(), complete.size(), input.string()));
    for (const auto& unit : complete) {
      const std::optional<int64_t> layer = layer_of(unit);
      if (!recorded || !layer) continue;
      const auto was = recorded->find(*layer);
      if (was == recorded->end()) continue;
      const std::optional<std::string>& digest = current(*layer);
      if (digest == was->second) continue;
      throw BadInput(fmt::format(
          "{} ({}) layer {}: expected the data that {}'s complete units were computed from "
          "(fingerprint {}), found {}: the file changed since unit {} ran, and resuming would "
          "mix two inputs' results; write to another results file, or remove {} to start over",
          input_option, input.string(), *layer, results.string(), was->second,
          digest ? "other data (fingerprint " + *digest + ")" : std::string("no such layer"),
          unit, results.string()));
    }
    if (recorded) kept = *recorded;
  }
  for (int64_t layer : run_layers) current(layer);
  for (const auto& [layer, digest] : now)
    if (digest) kept[layer] = *digest;
  nlohmann::json stored = nlohmann::json::object();
  for (const auto& [layer, digest] : kept) stored[std::to_string(layer)] = digest;
  writer.set_attribute("", kInputFingerprints, io::json_text(stored));
}

std::string units_kept(const std::string& file, size_t complete_units,
                       const std::string& to_continue) {
  if (complete_units == 0)
    return fmt::format("no unit was complete, so nothing was published to {} (a file of that "
                       "name is as it was); run the same command again to start over", file);
  return fmt::format("{} keeps {} complete unit{} (work on unfinished units is dropped); {} to "
                     "continue from them",
                     file, complete_units, complete_units == 1 ? "" : "s", to_continue);
}

std::string interrupted_message(int signal, const std::string& file, size_t complete_units,
                                const std::string& to_continue) {
  const char* name = signal == SIGINT ? "SIGINT (Ctrl-C)" : signal == SIGTERM ? "SIGTERM" : "a signal";
  return fmt::format("interrupted by {}: {}", name,
                     units_kept(file, complete_units, to_continue));
}

[[noreturn]] void rethrow_write_failure(const io::FileError& error, const std::string& file,
                                        size_t published, const std::string& to_continue) {
  if (published == 0) throw error;
  throw BadInput(std::string(error.what()) + "; " +
                 units_kept(file, published, "make room and " + to_continue));
}

[[noreturn]] void rethrow_input_failure(const io::FileError& error, const std::string& file,
                                        size_t published, const std::string& to_continue) {
  if (published == 0) throw error;
  throw BadInput(std::string(error.what()) + "; " +
                 units_kept(file, published, "correct the input and " + to_continue));
}

}  // namespace hils::cli
