// Faults a user meets with the `hils` tool (issue 8): an output naming its input, two writers of
// one file, a full disk, odd output paths, damaged resume state. Each ends in a clear error
// (exit 2) with nothing lost and nothing left behind.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <fstream>
#include <algorithm>
#include <iterator>
#include <sstream>
#include <utility>
#include <vector>

#include <H5Cpp.h>

#include "cli/studies/study_table.hpp"
#include "io/activation_file.hpp"
#include "io/hdf5_util.hpp"
#include "support.hpp"
#include "util/shared_data.hpp"

using hils::test::count_lock_files;
using hils::test::count_temp_files;
using hils::test::file_bytes;
using hils::test::quoted;
using hils::test::run_hils;
using hils::test::run_hils_with_file_limit;
using hils::test::run_shell;
using hils::test::TempDir;
namespace fs = std::filesystem;

namespace {

fs::path write_small(const TempDir& dir, const std::string& name = "acts.h5") {
  return hils::test::write_small_activation_file(dir, 7, name);
}


const std::string kGeometry = " -S 8 -W 16 -K 2 --landmarks true --keep-scores true";
const std::string kFirstArgs = " -p full" + kGeometry;       // a first run
const std::string kRunArgs = " -p full,hils" + kGeometry;    // the same, resumed with one more

}  // namespace

TEST_CASE("hils run refuses an output that is its input, by inode, not by name", "[cli][faults]") {
  TempDir dir("same_file");
  auto acts = write_small(dir);
  const std::string before = file_bytes(acts);
  fs::create_hard_link(acts, dir / "hard_link.h5");
  fs::create_symlink(acts, dir / "sym_link.h5");
  for (const auto& output : {acts, dir / "hard_link.h5", dir / "sym_link.h5",
                             dir / "." / "acts.h5"}) {
    auto r = run_hils("run " + quoted(acts) + " -o " + quoted(output) + kRunArgs);
    INFO(output.string() + "\n" + r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("is the same file as ACTIVATIONS"));
  }
  CHECK(file_bytes(acts) == before);
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("a second writer of one results file is refused and told who holds it",
          "[cli][faults]") {
  TempDir dir("writer_lock");
  auto acts = write_small(dir);
  auto results = dir / "results.h5";
  REQUIRE(run_hils("run " + quoted(acts) + " -o " + quoted(results) + kFirstArgs).exit_code == 0);
  CHECK(count_lock_files(dir.path()) == 0);  // released and removed after a run
  const std::string before = file_bytes(results);
  {
    // This test process is the first writer; hils (another process) must not get in.
    hils::io::OutputLock held(results, "the first writer");
    auto resumed = run_hils("run " + quoted(acts) + " -o " + quoted(results) + kRunArgs + " --resume");
    INFO(resumed.output);
    CHECK(resumed.exit_code == 2);
    CHECK_THAT(resumed.output, Catch::Contains("being written by pid"));
    CHECK_THAT(resumed.output, Catch::Contains("the first writer"));
    auto study = run_hils("fidelity --out " + quoted(results) + " --lengths 1024 -q");
    CHECK(study.exit_code == 2);
    CHECK_THAT(study.output, Catch::Contains("being written by"));
    CHECK(file_bytes(results) == before);
  }
  auto after = run_hils("run " + quoted(acts) + " -o " + quoted(results) + kRunArgs + " --resume");
  INFO(after.output);
  CHECK(after.exit_code == 0);
  CHECK(count_lock_files(dir.path()) == 0);
}

TEST_CASE("a writer killed outright leaves a temporary copy that the next writer removes",
          "[cli][faults]") {
  // SIGKILL (or a killed MPI rank 0) runs no handler: the lock file naming the dead writer and
  // its temporary copy of the results stay. The next writer takes the lock over and removes
  // that pid's temporary files only (another pid's may be a live `hils dump`).
  TempDir dir("orphaned_temps");
  auto acts = write_small(dir);
  auto results = dir / "results.h5";
  std::ofstream(dir / ".results.h5.lock") << "pid 2147483000 (hils run, killed)\n";
  std::ofstream(dir / ".results.h5.tmp-2147483000-0") << "a dead writer's copy";
  std::ofstream(dir / ".results.h5.tmp-2147483001-0") << "someone else's";
  auto r = run_hils("run " + quoted(acts) + " -o " + quoted(results) + kFirstArgs);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(dir / ".results.h5.tmp-2147483000-0"));  // was left forever
  CHECK(fs::exists(dir / ".results.h5.tmp-2147483001-0"));
  CHECK(count_lock_files(dir.path()) == 0);
}

TEST_CASE("a full disk (file-size limit) gives a clear error, no crash, no temporary file",
          "[cli][faults]") {
  // RLIMIT_FSIZE stands in for a full disk: writes past it fail with EFBIG as they would with
  // ENOSPC (a tmpfs of a few KiB gives the same message; it needs root to mount).
  TempDir dir("full_disk");
  auto acts = write_small(dir);
  auto results = dir / "results.h5";
  REQUIRE(run_hils("run " + quoted(acts) + " -o " + quoted(results) + kFirstArgs).exit_code == 0);
  const std::string before = file_bytes(results);
  for (int limit_blocks : {4, 24}) {
    auto run = run_hils_with_file_limit(
        "run " + quoted(acts) + " -o " + quoted(results) + kRunArgs + " --resume", limit_blocks);
    INFO(limit_blocks << " blocks\n" << run.output);
    CHECK(run.exit_code == 2);
    CHECK_THAT(run.output, Catch::Contains("room to"));
    CHECK(file_bytes(results) == before);  // the earlier file is untouched
    // One clean message: HDF5's destructors printed "DataSet::~DataSet - H5Dclose failed"
    // lines before it (up to 94 for this study) while datasets were closed by destructors.
    auto study = run_hils_with_file_limit(
        "fidelity -q --lengths 1024 --layers 1 --queries 8 --out " + quoted(dir / "study.h5"),
        limit_blocks);
    INFO(study.output);
    CHECK(study.exit_code == 2);
    CHECK_THAT(study.output, Catch::Contains("room to write"));
    CHECK_THAT(study.output + run.output, !Catch::Contains("H5Dclose failed"));
    auto dump = run_hils_with_file_limit(
        "dump synthetic -T 2048 -S 16 -o " + quoted(dir / "synthetic.h5"), limit_blocks);
    INFO(dump.output);
    CHECK(dump.exit_code == 2);
    CHECK_THAT(dump.output, Catch::Contains("room to write"));
    CHECK_FALSE(fs::exists(dir / "synthetic.h5"));
    CHECK(count_temp_files(dir.path()) == 0);
    CHECK(count_lock_files(dir.path()) == 0);
  }
}

TEST_CASE("odd output paths are bad input, not internal errors", "[cli][faults]") {
  TempDir dir("odd_outputs");
  auto acts = write_small(dir);
  std::ofstream(dir / "plain_file") << "x";
  auto empty = run_hils("run " + quoted(acts) + " -o ''" + kRunArgs);
  INFO(empty.output);
  CHECK(empty.exit_code == 2);
  CHECK_THAT(empty.output, Catch::Contains("a file name for the output"));
  auto below_file = run_hils("fidelity --out " + quoted(dir / "plain_file" / "x.h5") + " -q");
  INFO(below_file.output);
  CHECK(below_file.exit_code == 2);
  CHECK_THAT(below_file.output, Catch::Contains("which is not a folder"));
  auto studies = run_hils("studies --out " + quoted(dir / "plain_file" / "sub") + " --no-model -q");
  INFO(studies.output);
  CHECK(studies.exit_code == 2);
  CHECK_THAT(studies.output, Catch::Contains("plain_file is a file, not a folder"));
}

TEST_CASE("an output path the shell or the parser left as typed is refused and nothing made",
          "[cli][faults]") {
  // Were taken as names: --out=~/x (the shell expands ~ only at a word's start) made a folder
  // named ~; -o --list (a value forgotten) wrote to a folder named --list; -o=x to one named =x.
  TempDir dir("typed_outputs");
  const std::string cases = "cd " + quoted(dir.path()) + " && '" + HILS_EXE +
                            "' -q cases --preset nsa -S 16 -W 32 -K 4 --Hq 4 --Hkv 2 -d 32 "
                            "--max-T 200 ";
  for (const auto& [flags, words] :
       {std::pair<std::string, std::string>{
            "--out=~/cases", "--output: expected a path, got '~/cases': the shell expands ~ only "
                             "at the start of a word"},
        {"-o --list", "--output: expected a path, got '--list', which looks like an option"},
        {"-o=cases", "--output: expected a path, got '=cases': a short option takes its value "
                     "after a space"}}) {
    const auto r = run_shell(cases + flags + " 2>&1");
    INFO(flags + "\n" + r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(words));
  }
  CHECK(fs::is_empty(dir.path()));
  // ./ before it names such a folder, as the message says.
  const auto named = run_shell(cases + "--out ./~/cases 2>&1");
  INFO(named.output);
  CHECK(named.exit_code == 0);
  CHECK(fs::is_directory(dir / "~" / "cases"));
}

TEST_CASE("a damaged complete_units attribute names the file and the attribute",
          "[cli][faults]") {
  TempDir dir("damaged_units");
  auto acts = write_small(dir);
  auto results = dir / "results.h5";
  REQUIRE(run_hils("run " + quoted(acts) + " -o " + quoted(results) + " -p full -S 8 --landmarks true")
              .exit_code == 0);
  for (const std::string damaged : {"[\"full/layer0\", 3", "{\"a\": 1}", "[1, 2]"}) {
    {
      H5::H5File file(results.string(), H5F_ACC_RDWR);
      file.removeAttr("complete_units");
      H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
      file.createAttribute("complete_units", type, H5::DataSpace(H5S_SCALAR))
          .write(type, damaged);
    }
    auto r = run_hils("run " + quoted(acts) + " -o " + quoted(results) + " -p full -S 8 --landmarks true " +
                      "--resume");
    INFO(damaged + "\n" + r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("results.h5: / attribute complete_units"));
  }
}

TEST_CASE("hils --version names the version and the commit", "[cli]") {
  auto r = run_hils("--version");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::StartsWith("hils "));
  CHECK_THAT(r.output, Catch::Contains("commit"));
  // The commit the sources are at (a rebuild after a commit kept the configure-time commit,
  // and every results file recorded it as its provenance). Skipped outside a git checkout.
  auto head = run_shell("git -C '" + std::string(HILS_SOURCE_DIR) +
                        "' rev-parse --short=12 HEAD 2>/dev/null");
  if (head.exit_code == 0 && head.output.size() > 1)
    CHECK_THAT(r.output, Catch::Contains("(commit " + head.output.substr(0, 12) + ")"));
}

TEST_CASE("study flags out of range are refused naming the flag and the expected value",
          "[cli][faults]") {
  TempDir dir("study_flags");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--K -2", "-K,--top-k: expected an integer >= 0, got -2"},
      {"--S 0", "-S,--chunk: expected an integer >= 1, got 0"},
      {"-W 0", "-W,--window: expected an integer >= 1, got 0"},
      {"--queries 0", "--queries: expected an integer >= 1, got 0"},
      {"--n-layers 0", "--n-layers: expected an integer >= 1, got 0"}};
  for (const auto& [flag, message] : cases) {
    auto r = run_hils("fidelity --out " + quoted(dir / "f.h5") + " --lengths 1024 -q " + flag);
    INFO(flag + "\n" + r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(message));
    CHECK_FALSE(fs::exists(dir / "f.h5"));
  }
  // The same values from a config file name the key and the file.
  std::ofstream(dir / "bad.toml") << "[geometry]\nS = 0\n";
  auto from_config = run_hils("fidelity --config " + quoted(dir / "bad.toml") + " --out " +
                              quoted(dir / "f.h5") + " --lengths 1024 -q");
  INFO(from_config.output);
  CHECK(from_config.exit_code == 2);
  CHECK_THAT(from_config.output, Catch::Contains("[geometry] S in"));
}

TEST_CASE("every command spells its output and config options the same way", "[cli][faults]") {
  std::vector<std::string> commands{"run", "dump synthetic", "dump llama2c", "studies", "plot",
                                    "cases"};
  for (const auto& row : hils::cli::studies::kStudies) commands.emplace_back(row.command);
  for (const std::string& command : commands) {
    auto help = run_hils(command + " --help");
    INFO(command + "\n" + help.output);
    CHECK_THAT(help.output, Catch::Contains("-o,--output,--out "));
    if (command != "dump llama2c" && command != "studies" && command != "plot" &&
        command != "cases")
      CHECK_THAT(help.output, Catch::Contains("-c,--config "));
  }
  // The study spelling --out and the run spelling --output reach the same option.
  TempDir dir("output_spelling");
  auto dump = run_hils("-q dump synthetic --out " + quoted(dir / "a.h5") + " -T 128 -S 16");
  INFO(dump.output);
  CHECK(dump.exit_code == 0);
  CHECK(fs::exists(dir / "a.h5"));
}

TEST_CASE("a study config with an unknown key, table or type is refused before any work",
          "[cli][faults]") {
  // One strict reader for every command: a misspelt key is an error, not a silent default.
  TempDir dir("study_config");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[geometry]\nwindw = 64\n", "[geometry]: unknown key 'windw' (expected one of S, W, K"},
      {"[fidelty]\nlengths = [1024]\n", "unknown table or key 'fidelty'"},
      {"[study]\nqueries = \"all\"\n", "[study].queries: expected an integer, got string"}};
  for (const auto& [text, message] : cases) {
    std::ofstream(dir / "c.toml") << text;
    for (const auto& row : hils::cli::studies::kStudies) {
      const std::string study(row.command);
      auto r = run_hils(study + " --config " + quoted(dir / "c.toml") + " --out " + quoted(dir / "f.h5") +
                        " --lengths 1024 -q");
      INFO(study + "\n" + text + r.output);
      CHECK(r.exit_code == 2);
      CHECK_THAT(r.output, Catch::Contains((dir / "c.toml").string() + ": ") &&
                               Catch::Contains(message));
      CHECK_FALSE(fs::exists(dir / "f.h5"));
    }
  }
}

TEST_CASE("an explicit source synthetic flag wins over a config that names the model", "[cli][faults]") {
  TempDir dir("source_flag");
  // The results' source kind says which ran (a --model-dir beside --source synthetic is refused:
  // test_study_cli.cpp).
  std::ofstream(dir / "model.toml") << "[source]\nkind = \"model\"\n";
  auto r = run_hils("fidelity --config " + quoted(dir / "model.toml") + " --source synthetic --out " +
                    quoted(dir / "f.h5") + " --lengths 1024 -q");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  auto info = run_hils("info " + quoted(dir / "f.h5") + " --json");
  CHECK_THAT(info.output, Catch::Contains("\"kind\": \"synthetic\""));
}

TEST_CASE("the examples of hils --help, run, dump, info and cases work as written",
          "[cli][faults]") {
  // Run in a fresh folder, in order, with `hils` on PATH and the project's experiments/ folder
  // beside them (the examples name experiments/configs/*.toml from the project root).
  TempDir dir("help_examples");
  fs::create_directory_symlink(fs::path(HILS_SOURCE_DIR) / "experiments", dir / "experiments");
  const std::string prefix = "cd " + quoted(dir.path()) + " && PATH=" +
                             quoted(fs::path(HILS_EXE).parent_path()) + ":\"$PATH\" && ";
  std::vector<std::string> examples;
  for (const std::string help : {"--help", "run --help", "dump llama2c --help",
                                 "dump synthetic --help", "info --help", "cases --help"}) {
    std::istringstream lines(run_hils(help).output);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("  hils ", 0) != 0) continue;
      line = line.substr(2, line.find('#') == std::string::npos ? std::string::npos
                                                                : line.find('#') - 2);
      if (std::find(examples.begin(), examples.end(), line) == examples.end())
        examples.push_back(line);
    }
  }
  REQUIRE(examples.size() >= 10);
  const bool have_model = fs::exists(hils::shared_data_dir() / "stories260K.bin");
  if (!have_model) WARN("SKIPPED the llama2c examples: no " << hils::shared_data_dir().string());
  for (const auto& example : examples) {
    if (!have_model && example.find("llama") != std::string::npos) continue;
    auto r = run_shell(prefix + example + " -q 2>&1");
    INFO(example + "\n" + r.output);
    CHECK(r.exit_code == 0);
  }
}

TEST_CASE("hils dump llama2c says and records a truncated text, and hashes its inputs",
          "[cli][faults]") {
  const auto data = hils::shared_data_dir();
  if (!fs::exists(data / "stories260K.bin") || !fs::exists(data / "tok512.bin")) {
    WARN("SKIPPED: no " << (data / "stories260K.bin").string());
    return;
  }
  TempDir dir("dump_truncation");
  auto cut = run_hils("dump llama2c --tokens 16 -o " + quoted(dir / "cut.h5"));
  INFO(cut.output);
  REQUIRE(cut.exit_code == 0);
  CHECK_THAT(cut.output, Catch::Contains("kept its first 16 tokens"));
  auto info = run_hils("info " + quoted(dir / "cut.h5") + " --json");
  CHECK_THAT(info.output, Catch::Contains("\"text_truncated\": true"));
  CHECK_THAT(info.output, Catch::Contains("\"model_fnv1a64\""));
  CHECK_THAT(info.output, Catch::Contains("\"tokenizer_fnv1a64\""));
  CHECK_THAT(info.output, Catch::Contains("\"hils_version\""));
  // A text shorter than --tokens is kept whole and said to be so.
  std::ofstream(dir / "short.txt") << "Once upon a time there was a cat.";
  auto whole = run_hils("dump llama2c --tokens 128 --text " + quoted(dir / "short.txt") + " -o " +
                        quoted(dir / "whole.h5"));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  CHECK_THAT(whole.output, !Catch::Contains("kept its first"));
  CHECK_THAT(run_hils("info " + quoted(dir / "whole.h5") + " --json").output,
             Catch::Contains("\"text_truncated\": false"));
}

TEST_CASE("hils plot of an interrupted study says the run is incomplete", "[cli][faults]") {
  TempDir dir("plot_interrupted");
  auto results = dir / "f.h5";
  REQUIRE(run_hils("fidelity --out " + quoted(results) + " --lengths 1024 --layers 1 -q").exit_code ==
          0);
  auto finished = run_hils("plot " + quoted(results) + " --out " + quoted(dir / "done"));
  INFO(finished.output);
  CHECK(finished.exit_code == 0);
  CHECK_THAT(finished.output, !Catch::Contains("the run is incomplete"));
  // --out naming a file, or empty (an unset shell variable): errors named "plots: ..." (no such
  // option), and "" drew into the default <results>_plots without a word.
  std::ofstream(dir / "a_file") << "x";
  auto onto_file = run_hils("plot " + quoted(results) + " --out " + quoted(dir / "a_file"));
  INFO(onto_file.output);
  CHECK(onto_file.exit_code == 2);
  CHECK_THAT(onto_file.output, Catch::Contains("--out: cannot create the folder"));
  auto empty = run_hils("plot " + quoted(results) + " --out ''");
  INFO(empty.output);
  CHECK(empty.exit_code == 2);
  CHECK_THAT(empty.output, Catch::Contains("--out: expected a folder name, got ''"));
  CHECK_FALSE(fs::exists(dir / "f_plots"));
  // /usr/bin/python3 without matplotlib (here one that fails to import, first on PYTHONPATH):
  // was a traceback and "internal error: plotting failed (exit 1)", exit 3, for a setup step.
  fs::create_directories(dir / "no_modules" / "matplotlib");
  std::ofstream(dir / "no_modules" / "matplotlib" / "__init__.py")
      << "raise ImportError(\"No module named 'matplotlib'\")\n";
  auto no_modules = run_shell("PYTHONPATH=" + quoted(dir / "no_modules") + " '" + HILS_EXE +
                              "' plot " + quoted(results) + " --out " + quoted(dir / "p") + " 2>&1");
  INFO(no_modules.output);
  CHECK(no_modules.exit_code == 2);
  CHECK_THAT(no_modules.output, Catch::Contains(
                                    "expected the modules h5py, matplotlib and numpy for the "
                                    "plots (apt-get install python3-h5py python3-matplotlib "
                                    "python3-numpy), found No module named 'matplotlib'"));
  CHECK_THAT(no_modules.output, !Catch::Contains("Traceback"));
  {
    // What an interrupted run leaves: units complete, the closing summary not yet.
    H5::H5File file(results.string(), H5F_ACC_RDWR);
    file.removeAttr("complete_units");
    H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
    file.createAttribute("complete_units", type, H5::DataSpace(H5S_SCALAR))
        .write(type, std::string("[\"T1024/layer0/group0\"]"));
  }
  auto partial = run_hils("plot " + quoted(results) + " --out " + quoted(dir / "partial"));
  INFO(partial.output);
  CHECK(partial.exit_code == 0);
  CHECK_THAT(partial.output, Catch::Contains("the run is incomplete"));
}

TEST_CASE("dump sizes beyond this machine's memory and values float32 cannot hold are refused "
          "before anything is written", "[cli][faults]") {
  TempDir dir("dump_limits");
  auto huge = run_hils("dump synthetic -o " + quoted(dir / "huge.h5") + " -T 1000000000000");
  INFO(huge.output);
  CHECK(huge.exit_code == 2);  // was exit 3, "internal error: std::bad_alloc"
  CHECK_THAT(huge.output, Catch::Contains("-T, --Hq, --Hkv, -d, --dv: expected sizes whose data "
                                          "fit in 80% of this machine's"));
  auto overflow = run_hils("dump synthetic -o " + quoted(dir / "f32.h5") +
                           " -T 64 -S 16 --logit-std 1e300 --precision float32");
  INFO(overflow.output);
  CHECK(overflow.exit_code == 2);  // was exit 0 with -inf stored in layer0/q
  CHECK_THAT(overflow.output, Catch::Contains("layer0/q: expected values within float32's range"));
  // The same values stored as float64 are finite and written.
  CHECK(run_hils("dump synthetic -o " + quoted(dir / "f64.h5") + " -T 64 -S 16 --logit-std 1e300")
            .exit_code == 0);
  CHECK_FALSE(fs::exists(dir / "huge.h5"));
  CHECK_FALSE(fs::exists(dir / "f32.h5"));
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("a FIFO given as an input file is refused, not read (no hang)", "[cli][faults]") {
  TempDir dir("fifo_input");
  const auto fifo = dir / "acts.h5";
  REQUIRE(run_shell("mkfifo " + quoted(fifo)).exit_code == 0);
  // timeout: before the fix HDF5's signature read blocked on the FIFO for ever (exit 124 here).
  auto r = run_shell("timeout 20 '" + std::string(HILS_EXE) + "' info " + quoted(fifo) + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("expected a regular file, found a FIFO"));
}

TEST_CASE("hils verify refuses an empty /queries instead of passing it vacuously",
          "[cli][faults]") {
  TempDir dir("verify_empty_queries");
  const auto path = dir / "dump.h5";
  {
    // A minimal verify file (data/verify_format.md): full attention over T=4, d=dv=2.
    H5::H5File file(path.string(), H5F_ACC_TRUNC);
    H5::Group root = file.openGroup("/");
    hils::io::write_attribute(root, "format", std::string("hils-verify"));
    hils::io::write_attribute(root, "format_version", int64_t{1});
    hils::io::write_attribute(root, "spec", std::string(R"({"preset": "full", "S": 2})"));
    hils::io::write_attribute(root, "input_precision", std::string("fp32"));
    H5::Group inputs = file.createGroup("inputs"), outputs = file.createGroup("outputs");
    const std::vector<double> x = {0.5, -1, 0.25, 2, -0.5, 1, 0, 0.75};
    for (const char* name : {"q", "k", "v"})
      hils::io::write_doubles(inputs, name, x.data(), {1, 4, 2}, false);
    hils::io::write_doubles(outputs, "o", x.data(), {1, 4, 2}, false);
    hils::io::write_int64s(root, "queries", nullptr, {0});
  }
  auto r = run_hils("verify " + quoted(path));
  INFO(r.output);
  CHECK(r.exit_code == 2);  // was exit 0: an empty list read as "every query"
  CHECK_THAT(r.output, Catch::Contains("queries: expected at least one query slot"));
}

TEST_CASE("a report cut short on the standard output (full disk) is exit 2, not 0",
          "[cli][faults]") {
  TempDir dir("stdout_full");
  auto acts = write_small(dir);
  const auto report = dir / "info.json";
  auto whole = run_shell("'" + std::string(HILS_EXE) + "' info " + quoted(acts) + " --json > " +
                         quoted(report));
  REQUIRE(whole.exit_code == 0);
  REQUIRE(fs::file_size(report) > 1024);  // longer than the limit below
  auto cut = run_shell("(ulimit -f 1 && '" + std::string(HILS_EXE) + "' info " + quoted(acts) +
                       " --json > " + quoted(report) + ") 2>&1");
  INFO(cut.output);
  CHECK(cut.exit_code == 2);  // was 0 with the JSON cut at 1024 bytes
  CHECK_THAT(cut.output, Catch::Contains("expected room to write the standard output"));
}

TEST_CASE("an output path that is a symlink is written through, the link kept", "[cli][faults]") {
  // Was: the link replaced by a regular file holding the new results, its target left stale.
  TempDir dir("output_symlink");
  auto acts = write_small(dir);
  fs::create_directory(dir / "store");
  const auto target = dir / "store" / "results.h5";
  REQUIRE(run_hils("run " + quoted(acts) + " -o " + quoted(target) + kFirstArgs).exit_code == 0);
  const std::string first = file_bytes(target);
  fs::create_symlink(fs::path("store") / "results.h5", dir / "link.h5");
  auto r = run_hils("run " + quoted(acts) + " -o " + quoted(dir / "link.h5") + kRunArgs + " --resume");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(fs::is_symlink(dir / "link.h5"));
  CHECK(file_bytes(target) != first);  // the resumed run's second mechanism is in the target
  CHECK(count_temp_files(dir.path()) + count_temp_files(dir / "store") == 0);
  CHECK(count_lock_files(dir.path()) + count_lock_files(dir / "store") == 0);
}

// Runs `hils <args>` in `folder` with `ignored` (0: none) set to SIG_IGN, as nohup does; once
// its temporary file appears (its signal handlers are installed by then) sends it `signal`.
// Returns the wait status, or -1 when no temporary file was seen before hils ended.
int signal_during_write(const fs::path& folder, const std::vector<std::string>& args,
                        int ignored, int signal) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(folder.c_str()) != 0) ::_exit(127);
    if (ignored != 0) std::signal(ignored, SIG_IGN);
    std::vector<char*> argv{const_cast<char*>(HILS_EXE)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(HILS_EXE, argv.data());
    ::_exit(127);
  }
  bool seen = false;
  int status = 0;
  while (!seen && ::waitpid(pid, &status, WNOHANG) == 0) {
    for (const auto& entry : fs::directory_iterator(folder))
      if (entry.path().filename().string().find(".tmp-") != std::string::npos) seen = true;
    if (seen) ::kill(pid, signal);
    else ::usleep(500);
  }
  if (!seen) return -1;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST_CASE("a hangup that nohup ignores stays ignored, and SIGQUIT removes the temporary file",
          "[cli][faults]") {
  // hils installs handlers that remove its temporary files; it replaced nohup's SIG_IGN, so
  // `nohup hils ...` died when the terminal closed. SIGQUIT (Ctrl-\) left the temporary file.
  TempDir dir("signals");
  REQUIRE(run_hils("-q dump synthetic -T 2048 -S 16 -d 16 --dv 16 -o " + quoted(dir / "acts.h5"))
              .exit_code == 0);
  const std::vector<std::string> run{"-q", "run", "acts.h5", "-o", "out.h5", "-p", "full,hils",
                                     "-S", "16", "--landmarks", "true"};
  const int hup = signal_during_write(dir.path(), run, SIGHUP, SIGHUP);
  REQUIRE(hup != -1);
  CHECK(WIFEXITED(hup));  // was killed by SIGHUP
  CHECK(fs::exists(dir / "out.h5"));
  fs::remove(dir / "out.h5");
  const int quit = signal_during_write(dir.path(), run, 0, SIGQUIT);
  REQUIRE(quit != -1);
  CHECK((WIFSIGNALED(quit) && WTERMSIG(quit) == SIGQUIT));
  CHECK(count_temp_files(dir.path()) == 0);  // was left behind
}

TEST_CASE("an OMP_NUM_THREADS beyond what the machine can run is not a crash", "[cli][faults]") {
  // Was SIGSEGV inside libgomp (GOMP_parallel) creating a team of 100000 threads.
  TempDir dir("huge_team");
  auto acts = write_small(dir);
  auto r = run_shell("OMP_NUM_THREADS=100000 '" + std::string(HILS_EXE) + "' run " + quoted(acts) +
                     " -o " + quoted(dir / "r.h5") + kFirstArgs + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(fs::exists(dir / "r.h5"));
}

TEST_CASE("a file another program is writing, and a name too long for its temporary file, say so",
          "[cli][faults]") {
  TempDir dir("locked_and_long");
  auto acts = write_small(dir);
  {
    // This process opens it for writing: HDF5 holds its exclusive file lock until closed.
    H5::H5File writing(acts.string(), H5F_ACC_RDWR);
    auto info = run_hils("info " + quoted(acts));
    INFO(info.output);
    CHECK(info.exit_code == 2);  // was "found one the HDF5 library cannot open (truncated ...)"
    CHECK_THAT(info.output, Catch::Contains("expected a file no other program is writing"));
  }
  CHECK(run_hils("info " + quoted(acts)).exit_code == 0);
  // 252 + ".h5" is a valid name, but ".<name>.tmp-<pid>-<n>" is not.
  auto long_name = dir / (std::string(252, 'a') + ".h5");
  auto dump = run_hils("dump synthetic -T 64 -S 16 -o " + quoted(long_name));
  INFO(dump.output);
  CHECK(dump.exit_code == 2);
  CHECK_THAT(dump.output, Catch::Contains("File name too long"));  // was no reason at all
}

TEST_CASE("an unreadable input and an uncreatable output folder say why (permission denied)",
          "[cli][faults]") {
  // Root reads everything: run hils as nobody then (setpriv, util-linux).
  std::string as_user;
  if (::geteuid() == 0) {
    if (run_shell("command -v setpriv >/dev/null").exit_code != 0) {
      WARN("running as root without setpriv: permissions cannot be exercised");
      return;  // Catch2 v2 has no SKIP
    }
    as_user = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  }
  TempDir dir("permissions");
  fs::permissions(dir.path(), fs::perms::all);  // traversable by the other user
  auto acts = write_small(dir);
  fs::permissions(acts, fs::perms::owner_read | fs::perms::owner_write);
  fs::create_directory(dir / "locked");
  fs::permissions(dir / "locked", fs::perms::owner_all);
  const std::string hils = as_user + "'" + std::string(HILS_EXE) + "' ";
  if (::geteuid() != 0) fs::permissions(acts, fs::perms::none);
  auto unreadable = run_shell(hils + "info " + quoted(acts) + " 2>&1");
  INFO(unreadable.output);
  CHECK(unreadable.exit_code == 2);  // was "found a file without the HDF5 signature"
  CHECK_THAT(unreadable.output, Catch::Contains("expected a file this user can read, found "
                                                "Permission denied"));
  if (::geteuid() != 0) fs::permissions(dir / "locked", fs::perms::owner_read);
  auto folder = run_shell(hils + "studies --out " + quoted(dir / "locked" / "sub") + " --no-model -q 2>&1");
  INFO(folder.output);
  CHECK(folder.exit_code == 2);  // the reason was lost
  CHECK_THAT(folder.output, Catch::Contains("cannot create the folder " + (dir / "locked" / "sub").string() +
                                            ": Permission denied"));
  fs::permissions(dir / "locked", fs::perms::owner_all);
  fs::permissions(acts, fs::perms::owner_all);
}

TEST_CASE("hils dump checks its output before running the model, and never replaces an input",
          "[cli][faults]") {
  const auto data = hils::shared_data_dir();
  if (!fs::exists(data / "stories260K.bin") || !fs::exists(data / "tok512.bin")) {
    WARN("SKIPPED: no " << (data / "stories260K.bin").string());
    return;
  }
  TempDir dir("dump_output_first");
  // The model ran (and said so: the truncation note) before the folder was refused.
  auto no_folder = run_hils("dump llama2c -o " + quoted(dir / "missing" / "x.h5"));
  INFO(no_folder.output);
  CHECK(no_folder.exit_code == 2);
  CHECK_THAT(no_folder.output, Catch::Contains("an output folder that exists"));
  CHECK_THAT(no_folder.output, !Catch::Contains("kept its first"));
  // -o naming the model file replaced the model with the dump. Copies only: a regression must
  // not destroy the shared data (an old binary did, once, while this test was written).
  fs::copy_file(data / "stories260K.bin", dir / "model.bin");
  std::ofstream(dir / "text.txt") << "Once upon a time there was a cat.";
  for (const std::string option : {"--model", "--text"}) {
    const auto input = option == "--model" ? dir / "model.bin" : dir / "text.txt";
    const std::string before = file_bytes(input);
    auto same = run_hils("dump llama2c " + option + " " + quoted(input) + " -o " + quoted(input));
    INFO(same.output);
    CHECK(same.exit_code == 2);
    CHECK_THAT(same.output, Catch::Contains("is the same file as " + option));
    CHECK(file_bytes(input) == before);
  }
}

TEST_CASE("an activation file declaring more slots than memory holds is refused naming the "
          "dataset, not ended by bad_alloc or an out-of-memory kill", "[cli][faults]") {
  TempDir dir("huge_file");
  const auto path = write_small(dir);
  {  // T = 2^40 slots declared: unwritten HDF5 chunks take no room, so the file stays small
    const int64_t T = int64_t{1} << 40;
    H5::H5File file(path.string(), H5F_ACC_RDWR);
    file.removeAttr("T");
    file.createAttribute("T", H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR))
        .write(H5::PredType::NATIVE_INT64, &T);
    file.unlink("position_ids");
    const hsize_t dims[1] = {static_cast<hsize_t>(T)}, chunk[1] = {1 << 16};
    H5::DSetCreatPropList chunked;
    chunked.setChunk(1, chunk);
    file.createDataSet("position_ids", H5::PredType::STD_I64LE, H5::DataSpace(1, dims), chunked);
  }
  REQUIRE(fs::file_size(path) < (1 << 20));
  for (const std::string command : {"info " + quoted(path),
                                    "run " + quoted(path) + " -o " + quoted(dir / "r.h5") + " -p full"}) {
    auto r = run_hils(command);
    INFO(command << "\n" << r.output);
    CHECK(r.exit_code == 2);  // was "out of memory" (bad_alloc of 8 TiB), or a kill below that
    CHECK_THAT(r.output, Catch::Contains("/position_ids: expected a dataset whose values fit in "
                                         "80% of") &&
                             Catch::Contains("found shape [1099511627776], about 16 TiB"));
  }
  CHECK_FALSE(fs::exists(dir / "r.h5"));
}

TEST_CASE("hils run refuses a unit beyond the memory limit before any work, saying what fits",
          "[cli][faults]") {
  TempDir dir("huge_unit");
  const auto acts = write_small(dir);  // T = 40, Hq = 4, Hkv = 2, dv = 6
  const auto results = dir / "r.h5";
  // Under ulimit -v 2 GB (the limit is read: on a cluster it is the job's cgroup) K = 10^7
  // asks ~38 GB of fusion weights and selections; the reference alone would allocate them.
  auto r = run_shell("(ulimit -v 2000000 && '" + std::string(HILS_EXE) + "' run " + quoted(acts) +
                     " -o " + quoted(results) + " -p hils -S 8 --landmarks true -K 10000000) 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output,
             Catch::Contains("mechanism hils over") &&
                 Catch::Contains("whose data fit in 80% of the address-space limit (ulimit -v) "
                                 "of 1.91 GiB") &&
                 Catch::Contains("Hq=4 x (dv=6 + K+3=10000003) + Hkv=2 x K=10000000 values") &&
                 Catch::Contains("at most 1 computed queries fit (--last-queries 1), or -K at "
                                 "most ") &&
                 Catch::Contains(" with 40 queries"));
  CHECK_FALSE(fs::exists(results));
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("a report longer than stdio's buffer meeting a full disk is bad input, not an "
          "internal error", "[cli][faults]") {
  TempDir dir("report_full_disk");
  const auto acts = write_small(dir);
  const auto results = dir / "r.h5";
  REQUIRE(run_hils("-q run " + quoted(acts) + " -o " + quoted(results) + " -p full,hils -S 8 "
                   "--landmarks true").exit_code == 0);
  // The report is over 4 KiB, so the write fails inside fmt::print (which throws), not only at
  // the flush at exit; ulimit -f 1 (one block) fails it with EFBIG as a full disk does with ENOSPC.
  auto r = run_shell("(ulimit -f 1 && '" + std::string(HILS_EXE) + "' info " + quoted(results) +
                     " > " + quoted(dir / "report.txt")  + ") 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);  // was 3, "internal error: cannot write to file: File too large"
  CHECK_THAT(r.output, Catch::Contains("hils: bad input: expected room to write the standard "
                                       "output, found File too large; the output is incomplete"));
}
