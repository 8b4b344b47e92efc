// Small helpers shared by every subcommand (cli_util.cpp; not part of the register_ API).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "hils/analysis/units.hpp"
#include "io/activation_file.hpp"
#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"
#include "io/results_file.hpp"

namespace hils::cli {

// Every integer option of `app` and its subcommands reads its value in base 10 and within its
// type's range, or is refused naming the option: CLI11 2.1.2 alone reads "010" as octal 8 and
// clamps 99999999999999999999 to the largest int64 without a word.
void check_integer_options(CLI::App& app);

// Informational line on stderr unless --quiet.
void note(const std::string& text);
// The command line as one string, for provenance.
std::string command_line();
void set_command_line(int argc, char** argv);
// A path that must exist as a regular file, or BadInput naming the option and the path.
void require_input_file(const std::filesystem::path& path, const std::string& option,
                        const std::string& hint = "");

// Creates `folder` (and its parents) for outputs, or BadInput naming the option and why.
void make_output_folder(const std::filesystem::path& folder, const std::string& option);
// BadInput when `output` is the same file as `input` (same device and inode, whatever the
// names), so that an output never replaces the input it is computed from.
void require_distinct_files(const std::filesystem::path& input, const std::string& input_option,
                            const std::filesystem::path& output,
                            const std::string& output_option);
// BadInput unless an activation file's landmark slots (`meta`, read from `input`) are the ones
// that `who` (a mechanism, a study's geometry) assumes: one at (c+1)S-1 of every chunk when
// `landmarks`, none otherwise; the message says what the file holds and the flags that fit it.
void require_landmark_layout(bool landmarks, int64_t S, const io::ActivationMeta& meta,
                             const std::string& input, const std::string& who);

// The command whose results a stored results configuration is: "hils fidelity" (a study's, by
// its "study" key: studies::kStudies), "hils run" (none).
std::string results_producer(const nlohmann::json& config);
// BadInput unless the results file `path` (its stored configuration `stored`), to be resumed by
// `command` ("hils run", "hils overlap": results_producer of its own), holds that command's
// results. Another command's configuration differs in nearly every key: the resume check named
// three ("geometry.W ..., and 4 more"), and hils run read a study's "layers" as its own list.
void require_results_of(const std::string& command, const std::filesystem::path& path,
                        const nlohmann::json& stored);

// The fingerprint (io::layer_fingerprint) of each layer of the activation file whose units a
// results file holds, by layer; the file records them as its root attribute
// `input_fingerprints`, a JSON object {"<layer>": "<16 hex digits>"}.
using LayerFingerprints = std::map<int64_t, std::string>;
inline constexpr const char* kInputFingerprints = "input_fingerprints";

// The layer a unit read: the number of its last path segment "layer<l>" ("T512/layer3/group1",
// "rope/T512/layer3/group1", "hils/layer3" -> 3); nullopt when it has none.
std::optional<int64_t> unit_layer(const std::string& unit);

// The fingerprint of layer l of the run's activation file, nullopt when it has no layer l.
using FingerprintOf = std::function<std::optional<std::string>(int64_t layer)>;

// Before `writer` (the results file `results`, resumed or new) gets any unit of this run:
// BadInput when a layer that one of its complete units read (`layer_of`) was recorded with
// another fingerprint than `fingerprint_of` gives now, i.e. the activation file `input` (given by
// `input_option`) changed since those units ran, so resuming would mix two inputs' units (every
// such layer is checked, also one this run does not read); a note when the file records no
// fingerprints (written before they were: its units are not checked). Then records the
// fingerprints of `run_layers` and of the checked layers, keeping the others recorded. A layer
// no complete unit read may change (a bad layer corrected after a failed run).
void check_and_record_fingerprints(
    io::ResultsWriter& writer, const std::filesystem::path& results,
    const std::filesystem::path& input, const std::string& input_option,
    const std::vector<int64_t>& run_layers, const FingerprintOf& fingerprint_of,
    const std::function<std::optional<int64_t>(const std::string&)>& layer_of);

// "<file> keeps N complete units (...); <to_continue> to continue from them": what a stopped
// run's results file holds for it (no partial unit: a unit is published whole or not at all)
// and the command that continues from it; with none, that nothing was published and the same
// command starts over (a file of that name is another run's, untouched).
std::string units_kept(const std::string& file, size_t complete_units,
                       const std::string& to_continue);
// The line of an interrupted run: the signal, then units_kept().
std::string interrupted_message(int signal, const std::string& file, size_t complete_units,
                                const std::string& to_continue);
// A write of `file` failed (a full disk) during its unit loop: rethrows `error`, with what the
// last checkpoint keeps (`published` units of this run) and how to continue (units_kept:
// "make room and <to_continue>") when it keeps any unit.
[[noreturn]] void rethrow_write_failure(const io::FileError& error, const std::string& file,
                                        size_t published, const std::string& to_continue);
// An input found bad during the unit loop (a study reads each layer as its units start, e.g. a
// NaN in layer 3): rethrows `error`, with what the last checkpoint keeps and how to continue
// once the input is corrected (units_kept: "correct the input and <to_continue>").
[[noreturn]] void rethrow_input_failure(const io::FileError& error, const std::string& file,
                                        size_t published, const std::string& to_continue);

// Runs `unit_loop()` (a UnitRunner's run, or a study driver) into the results file `file` so
// that SIGINT/SIGTERM stop it at a unit boundary (io::UnitStopScope): the stop becomes
// Interrupted, whose line says how many units `units_published()` (its writer's
// io::ResultsWriter::units_published) the file keeps and `to_continue` ("run the same command
// again", ...); a failed write (a full disk, io::WriteError) says the same
// (rethrow_write_failure), and so does an input found bad by a unit (rethrow_input_failure).
// Returns what unit_loop returns.
template <class UnitLoop, class UnitsPublished>
auto run_stoppable(UnitLoop unit_loop, const std::string& file, UnitsPublished units_published,
                   const std::string& to_continue) {
  io::UnitStopScope stop_between_units;
  try {
    return unit_loop();
  } catch (const analysis::Interrupted& e) {
    throw Interrupted(e.signal_number, interrupted_message(e.signal_number, file,
                                                           units_published(), to_continue));
  } catch (const io::WriteError& e) {
    rethrow_write_failure(e, file, units_published(), to_continue);
  } catch (const io::FileError& e) {
    rethrow_input_failure(e, file, units_published(), to_continue);
  }
}

// --jobs N on cmd (the study commands, `hils run`): units computed at once in this process.
void add_jobs_option(CLI::App* cmd, std::optional<int64_t>* jobs);
// Puts --jobs in force (parallel::use_jobs: checked, the runner, each unit's share of memory)
// and runs `checks` (the command's up-front checks, whose size checks then count that many
// units). The default number of units at once falls back to one, with a note, when the checks
// refuse it and pass at one unit (as before --jobs existed); a --jobs given is refused by them,
// their message naming --jobs.
void check_with_jobs(std::optional<int64_t> jobs, const std::function<void()>& checks);

// BadInput when `bytes` (an estimate of what a command will hold at once) exceeds 80% of the
// memory this process may use (hils/memory.hpp: the machine's or cgroup's share, ulimit -v),
// naming `what` (the flags that set the size) and the sizes.
void require_fits_in_memory(double bytes, const std::string& what);

}  // namespace hils::cli
