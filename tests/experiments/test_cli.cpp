// The `hils` tool driven as a user would: spawned, exit codes and messages checked, files read
// back. Every bad-input case of issue 3 has a test here.
#include <catch2/catch.hpp>

#include <fstream>

#include <H5Cpp.h>

#include "cli/studies/study_table.hpp"
#include "hils/attention.hpp"
#include "io/activation_file.hpp"
#include "io/results_file.hpp"
#include "support.hpp"

using hils::test::quoted;
using hils::test::run_hils;
using hils::test::TempDir;
namespace fs = std::filesystem;

namespace {

fs::path write_small(const TempDir& dir, const std::string& name = "acts.h5") {
  return hils::test::write_small_activation_file(dir, 7, name);
}

// Replaces dataset `name` by one of the given type and dims, filled with `value`.
void replace_dataset(const fs::path& path, const std::string& name, const H5::PredType& type,
                     const std::vector<hsize_t>& dims, double value) {
  H5::H5File file(path.string(), H5F_ACC_RDWR);
  file.unlink(name);
  H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  H5::DataSet dataset = file.createDataSet(name, type, space);
  size_t n = 1;
  for (auto d : dims) n *= d;
  std::vector<double> data(n, value);
  dataset.write(data.data(), H5::PredType::NATIVE_DOUBLE);
}

// Sets one element of a float dataset to `value`.
void poke(const fs::path& path, const std::string& name, double value) {
  H5::H5File file(path.string(), H5F_ACC_RDWR);
  H5::DataSet dataset = file.openDataSet(name);
  H5::DataSpace space = dataset.getSpace();
  std::vector<double> data(space.getSimpleExtentNpoints());
  dataset.read(data.data(), H5::PredType::NATIVE_DOUBLE);
  data[data.size() / 2] = value;
  dataset.write(data.data(), H5::PredType::NATIVE_DOUBLE);
}

void set_int_attribute(const fs::path& path, const std::string& name, int64_t value) {
  H5::H5File file(path.string(), H5F_ACC_RDWR);
  file.removeAttr(name);
  H5::Attribute attribute =
      file.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
  attribute.write(H5::PredType::NATIVE_INT64, &value);
}

// Both `info` and `run` must reject the file with exit 2 and a message naming `needles`, and
// `run` must leave no output and no temporary file behind.
void expect_bad_file(const TempDir& dir, const fs::path& file,
                     const std::vector<std::string>& needles) {
  auto info = run_hils("info " + quoted(file));
  INFO(info.output);
  CHECK(info.exit_code == 2);
  for (const auto& needle : needles) CHECK_THAT(info.output, Catch::Contains(needle));
  auto out = dir / "results.h5";
  auto run = run_hils("run " + quoted(file) + " -o " + quoted(out) + " -p full -S 8 --landmarks true");
  INFO(run.output);
  CHECK(run.exit_code == 2);
  for (const auto& needle : needles) CHECK_THAT(run.output, Catch::Contains(needle));
  CHECK_FALSE(fs::exists(out));
  CHECK(hils::test::count_temp_files(dir.path()) == 0);
}

}  // namespace

TEST_CASE("hils --help lists the subcommands and exits 0", "[cli]") {
  auto r = run_hils("--help");
  CHECK(r.exit_code == 0);
  for (const char* name : {"info", "dump", "run"}) CHECK_THAT(r.output, Catch::Contains(name));
  auto run_help = run_hils("run --help");
  CHECK(run_help.exit_code == 0);
  CHECK_THAT(run_help.output, Catch::Contains("Examples"));
}

TEST_CASE("usage errors exit 2", "[cli]") {
  CHECK(run_hils("").exit_code == 2);
  CHECK(run_hils("info").exit_code == 2);
  CHECK(run_hils("run --no-such-option x.h5 -o y.h5").exit_code == 2);
  CHECK(run_hils("dump synthetic").exit_code == 2);  // -o is required
}

TEST_CASE("a mistyped command is named with the commands there are", "[cli]") {
  // Was "A subcommand is required", as if none had been typed. The study commands stand in the
  // order of their table (cli/studies/study_table.hpp) after run.
  std::string studies;
  for (const auto& row : hils::cli::studies::kStudies) studies += std::string(row.command) + ", ";
  CHECK(studies.rfind("fidelity, overlap, extrapolate, ", 0) == 0);
  auto r = run_hils("-q fidelty --out x.h5");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("hils: bad input: fidelty: expected a command, one of "
                                       "info, dump, run, " + studies + "plot, studies, verify, cases "
                                       "(hils --help)"));
  r = run_hils("dump synth -o x.h5");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("hils: bad input: dump synth: expected a command, one of "
                                       "llama2c, synthetic (hils dump --help)"));
  // No command at all is still CLI11's line.
  CHECK_THAT(run_hils("").output, Catch::Contains("A subcommand is required"));
  CHECK_THAT(run_hils("dump").output, Catch::Contains("A subcommand is required"));
}

TEST_CASE("bad input: a missing file", "[cli][bad-input]") {
  TempDir dir("missing");
  expect_bad_file(dir, dir / "nothing_here.h5", {"nothing_here.h5", "no such file"});
}

TEST_CASE("bad input: a file that is not HDF5", "[cli][bad-input]") {
  TempDir dir("not_hdf5");
  auto path = dir / "text.h5";
  std::ofstream(path) << "this is not an HDF5 file\n";
  expect_bad_file(dir, path, {"text.h5", "HDF5"});
}

TEST_CASE("bad input: a truncated file", "[cli][bad-input]") {
  TempDir dir("truncated");
  auto path = write_small(dir);
  fs::resize_file(path, fs::file_size(path) / 2);
  expect_bad_file(dir, path, {"acts.h5", "truncated"});
}

TEST_CASE("bad input: a missing dataset", "[cli][bad-input]") {
  TempDir dir("missing_dataset");
  auto path = write_small(dir);
  {
    H5::H5File file(path.string(), H5F_ACC_RDWR);
    file.unlink("layer0/v");
  }
  expect_bad_file(dir, path, {"layer0/v", "nothing at that path"});
}

TEST_CASE("bad input: wrong rank", "[cli][bad-input]") {
  TempDir dir("wrong_rank");
  auto path = write_small(dir);
  replace_dataset(path, "layer0/k", H5::PredType::IEEE_F64LE, {80, 8}, 0.5);
  expect_bad_file(dir, path, {"layer0/k", "rank 3", "found rank 2"});
}

TEST_CASE("bad input: wrong shape", "[cli][bad-input]") {
  TempDir dir("wrong_shape");
  auto path = write_small(dir);
  replace_dataset(path, "layer1/v", H5::PredType::IEEE_F64LE, {2, 40, 7}, 0.5);
  expect_bad_file(dir, path, {"layer1/v", "[2, 40, 6]", "[2, 40, 7]"});
}

TEST_CASE("bad input: Hq not a multiple of Hkv", "[cli][bad-input]") {
  TempDir dir("gqa");
  auto path = write_small(dir);
  set_int_attribute(path, "Hkv", 3);
  expect_bad_file(dir, path, {"Hq", "multiple of Hkv", "Hq=4 Hkv=3"});
}

TEST_CASE("bad input: a wrong dtype", "[cli][bad-input]") {
  TempDir dir("dtype");
  auto path = write_small(dir);
  replace_dataset(path, "layer0/q", H5::PredType::STD_I32LE, {4, 40, 8}, 1.0);
  expect_bad_file(dir, path, {"layer0/q", "float32 or float64", "32-bit integers"});
}

TEST_CASE("bad input: NaN or Inf in the data", "[cli][bad-input]") {
  TempDir dir("nonfinite");
  auto nan_path = write_small(dir, "nan.h5");
  poke(nan_path, "layer1/q", std::nan(""));
  // Named by head, slot and dimension (was only "at flat index 640").
  expect_bad_file(dir, nan_path, {"layer1/q", "finite", "nan at [2, 0, 0] (flat index 640)"});
  auto inf_path = write_small(dir, "inf.h5");
  poke(inf_path, "layer0/k", -INFINITY);
  expect_bad_file(dir, inf_path, {"layer0/k", "finite", "-inf at [1, 0, 0] (flat index 320)"});
}

TEST_CASE("bad input: the file is not an activation file", "[cli][bad-input]") {
  TempDir dir("format");
  auto path = dir / "results_not_acts.h5";
  {
    auto writer = hils::io::ResultsWriter::create(path, {});
    writer.commit();
  }
  auto r = run_hils("run " + quoted(path) + " -o " + quoted(dir / "out.h5") + " -p full");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("hils-activations"));
  CHECK_THAT(r.output, Catch::Contains("hils-results"));
}

TEST_CASE("bad input: an unwritable output folder", "[cli][bad-input]") {
  TempDir dir("unwritable");
  auto acts = write_small(dir);
  auto missing_folder = dir / "no_such_folder" / "out.h5";
  auto r = run_hils("dump synthetic -T 64 -S 8 -o " + quoted(missing_folder));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("no_such_folder"));
  auto run = run_hils("run " + quoted(acts) + " -p full -S 8 --landmarks true -o " +
                      quoted(missing_folder));
  CHECK(run.exit_code == 2);
  CHECK_THAT(run.output, Catch::Contains("output folder"));
  // A regular file where the folder should be.
  std::ofstream(dir / "plain_file") << "x";
  auto under_file = run_hils("dump synthetic -T 64 -S 8 -o " + quoted(dir / "plain_file" / "x.h5"));
  CHECK(under_file.exit_code == 2);
  CHECK_THAT(under_file.output, Catch::Contains("plain_file"));
  if (::geteuid() != 0) {  // root writes into read-only folders, so only users can test this
    fs::create_directory(dir / "read_only");
    fs::permissions(dir / "read_only", fs::perms::owner_read | fs::perms::owner_exec);
    auto ro = run_hils("dump synthetic -T 64 -S 8 -o " + quoted(dir / "read_only" / "x.h5"));
    CHECK(ro.exit_code == 2);
    CHECK_THAT(ro.output, Catch::Contains("not writable"));
    fs::permissions(dir / "read_only", fs::perms::owner_all);
  }
}

TEST_CASE("bad config: TOML syntax, unknown keys, wrong types, unknown presets", "[cli][bad-input]") {
  TempDir dir("config");
  auto acts = write_small(dir);
  auto out = quoted(dir / "out.h5");
  auto toml = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return quoted(dir / name);
  };
  auto syntax = run_hils("run " + quoted(acts) + " -o " + out + " -c " +
                         toml("syntax.toml", "[run]\nlayers = [0,\n"));
  CHECK(syntax.exit_code == 2);
  CHECK_THAT(syntax.output, Catch::Contains("syntax.toml") && Catch::Contains("line"));
  auto unknown = run_hils("run " + quoted(acts) + " -o " + out + " -c " +
                          toml("unknown.toml", "[[mechanism]]\npreset = \"full\"\nwindw = 4\n"));
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.output, Catch::Contains("windw"));
  auto type = run_hils("run " + quoted(acts) + " -o " + out + " -c " +
                       toml("type.toml", "[[mechanism]]\npreset = \"full\"\nS = \"eight\"\n"));
  CHECK(type.exit_code == 2);
  CHECK_THAT(type.output, Catch::Contains("S") && Catch::Contains("integer"));
  auto preset = run_hils("run " + quoted(acts) + " -o " + out + " -p hilz");
  CHECK(preset.exit_code == 2);
  CHECK_THAT(preset.output, Catch::Contains("hilz"));
  auto spec = run_hils("run " + quoted(acts) + " -o " + out + " -p hils -S 8 -W 0");
  CHECK(spec.exit_code == 2);
  CHECK_THAT(spec.output, Catch::Contains("W"));
  auto layers = run_hils("run " + quoted(acts) + " -o " + out + " -p full -S 8 --landmarks true "
                         "--layers 5");
  CHECK(layers.exit_code == 2);
  CHECK_THAT(layers.output, Catch::Contains("--layers"));
  CHECK_FALSE(fs::exists(dir / "out.h5"));
}

TEST_CASE("mechanisms that need landmarks fail clearly on a file without them", "[cli][bad-input]") {
  TempDir dir("no_landmarks");
  auto acts = dir / "flat.h5";
  auto dump = run_hils("dump synthetic -T 64 -S 8 --landmarks false -o " + quoted(acts));
  REQUIRE(dump.exit_code == 0);
  auto r = run_hils("run " + quoted(acts) + " -o " + quoted(dir / "out.h5") + " -p hils -S 8");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("landmark") && Catch::Contains("prior-rule shared"));
  auto ok = run_hils("run " + quoted(acts) + " -o " + quoted(dir / "out.h5") +
                     " -p hils -S 8 -W 8 -K 2 --landmarks false --prior-rule shared");
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("dump synthetic -> run -> results match the reference on the same inputs", "[cli]") {
  TempDir dir("roundtrip");
  auto acts = dir / "acts.h5";
  auto out = dir / "results.h5";
  auto dump = run_hils("dump synthetic --generator topics -T 150 -S 16 --Hq 4 --Hkv 2 -d 16 "
                       "--dv 8 --seed 11 -o " + quoted(acts));
  INFO(dump.output);
  REQUIRE(dump.exit_code == 0);
  auto run = run_hils("-q run " + quoted(acts) + " -o " + quoted(out) +
                      " -p full,hils -S 16 -W 32 -K 3 --landmarks true --seed 5");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);

  auto file = hils::io::read_activation_file(acts);
  hils::io::ResultsReader results(out);
  for (const char* name : {"full", "hils"}) {
    auto spec = hils::preset(name);
    spec.S = 16;
    spec.W = 32;
    spec.K = 3;
    spec.landmarks = true;
    auto expected = hils::run_mechanism(spec, file.layers[0].inputs);
    for (int64_t h = 0; h < 4; ++h) {
      auto prefix = std::string(name) + "/layer0/head" + std::to_string(h) + "/";
      CHECK(results.matrix(prefix + "o").isApprox(expected.heads[h].o, 1e-14));
      CHECK(results.matrix(prefix + "lse").isApprox(expected.heads[h].lse, 1e-14));
      CHECK_FALSE(results.string_attribute(prefix + "o", "meaning").empty());
    }
    if (std::string(name) == "hils")
      for (int64_t g = 0; g < 2; ++g)
        CHECK(results.index_matrix("hils/layer0/kv_head" + std::to_string(g) + "/selection") ==
              expected.selection[g]);
  }
  // Provenance attributes of every results file.
  auto config = results.config();
  CHECK(config["mechanisms"].size() == 2);
  CHECK(config["mechanisms"][1]["K"] == 3);
  CHECK(results.string_attribute("", "hils_version") == hils::io::project_version());
  CHECK(results.string_attribute("", "git_commit") == hils::io::git_commit());
  CHECK(results.int_attribute("", "seed") == 5);
  CHECK(results.string_attribute("", "created").size() == 20);
  CHECK(hils::test::count_temp_files(dir.path()) == 0);
}

TEST_CASE("flags win over the TOML file", "[cli]") {
  TempDir dir("flags_win");
  auto acts = write_small(dir);
  std::ofstream(dir / "run.toml") << "[run]\nlayers = [1]\n\n[[mechanism]]\npreset = \"nsa\"\n"
                                     "S = 8\nW = 8\nK = 3\nlandmarks = true\n";
  auto out = dir / "out.h5";
  auto r = run_hils("run " + quoted(acts) + " -o " + quoted(out) + " -c " + quoted(dir / "run.toml") + " -K 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find('\r') == std::string::npos);  // no progress bar when not on a terminal
  hils::io::ResultsReader results(out);
  CHECK(results.config()["mechanisms"][0]["K"] == 2);
  CHECK(results.config()["layers"] == nlohmann::json::array({1}));
  CHECK(results.index_matrix("nsa/layer1/kv_head0/selection").cols() == 2);
  CHECK_FALSE(results.exists("nsa/layer0"));
}

TEST_CASE("run --resume adds units and keeps finished ones", "[cli]") {
  TempDir dir("resume");
  auto acts = write_small(dir);
  auto out = dir / "out.h5";
  std::string base = "run " + quoted(acts) + " -o " + quoted(out) + " -S 8 -W 8 -K 2 --landmarks true ";
  REQUIRE(run_hils(base + "-p full --layers 0").exit_code == 0);
  auto first = hils::io::ResultsReader(out).matrix("full/layer0/head1/o");
  auto again = run_hils(base + "-p full,hils --layers 0,1 --resume");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK_THAT(again.output, Catch::Contains("3 unit(s) computed, 1 already complete"));
  hils::io::ResultsReader results(out);
  CHECK(results.matrix("full/layer0/head1/o") == first);
  CHECK(results.exists("hils/layer1/head3/o"));
  CHECK(results.config()["layers"] == nlohmann::json::array({0, 1}));
  // The same mechanism name with another spec would mix experiments.
  auto clash = run_hils("run " + quoted(acts) + " -o " + quoted(out) +
                        " -S 8 -W 16 -K 2 --landmarks true -p full --layers 1 --resume");
  CHECK(clash.exit_code == 2);
  // Was both specs as JSON, side by side, the one value that differs left to find.
  CHECK_THAT(clash.output, Catch::Contains("mechanism 'full' was run with another spec: W (8 in "
                                           "the file, 16 in this run); give it another name"));
}

// The two resume tests' start: a small activation file and `hils run` of full on layer 0 into
// out.h5, complete; `base` is that command less its --layers.
struct ResumableRun {
  fs::path acts, out;
  std::string base;
};
static ResumableRun run_full_on_layer0(const TempDir& dir) {
  ResumableRun r{write_small(dir), dir / "out.h5", ""};
  r.base = "run " + quoted(r.acts) + " -o " + quoted(r.out) +
           " -S 8 -W 8 -K 2 --landmarks true -p full ";
  REQUIRE(run_hils(r.base + "--layers 0").exit_code == 0);
  return r;
}

TEST_CASE("run --resume refuses an activation file changed under its complete units", "[cli]") {
  // Was: a file re-dumped or edited at the same path resumed without a word, its new units
  // beside the old ones, computed from other data. Each layer's fingerprint is recorded now.
  TempDir dir("resume_changed_input");
  const ResumableRun first = run_full_on_layer0(dir);
  const fs::path &acts = first.acts, &out = first.out;
  const std::string& base = first.base;
  hils::io::ActivationFile file = hils::test::small_activation_file(7);
  // Layer 1, which no complete unit read, may change (a bad layer corrected).
  file.layers[1].inputs.v[0](3, 2) += 0.5;
  hils::io::write_activation_file(acts, file, hils::io::StorageType::float64);
  auto corrected = run_hils(base + "--layers 0,1 --resume");
  INFO(corrected.output);
  REQUIRE(corrected.exit_code == 0);
  CHECK_THAT(corrected.output, Catch::Contains("1 unit(s) computed, 1 already complete"));
  // One value of layer 0 changed under its complete unit: refused, whichever layers this run
  // reads, and the results file is left as it was.
  file.layers[0].inputs.k[1](5, 1) += 1e-9;
  hils::io::write_activation_file(acts, file, hils::io::StorageType::float64);
  const std::string before = hils::test::file_bytes(out);
  for (const std::string layers : {"0,1", "1"}) {
    auto r = run_hils(base + "--layers " + layers + " --resume");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("ACTIVATIONS (" + acts.string() + ") layer 0: expected "
                                         "the data that " + out.string() + "'s complete units "
                                         "were computed from (fingerprint "));
    CHECK_THAT(r.output, Catch::Contains("found other data (fingerprint "));
    CHECK_THAT(r.output, Catch::Contains("the file changed since unit full/layer0 ran"));
    CHECK(hils::test::file_bytes(out) == before);
  }
  // Back to the data layer 0 was computed from: resumed again.
  file.layers[0] = hils::test::small_activation_file(7).layers[0];
  hils::io::write_activation_file(acts, file, hils::io::StorageType::float64);
  CHECK(run_hils(base + "--layers 0,1 --resume").exit_code == 0);
}

TEST_CASE("run --resume of a results file without input fingerprints says its units go "
          "unchecked", "[cli]") {
  // Files written before the fingerprints were recorded resume as before, with a note.
  TempDir dir("resume_no_fingerprints");
  const ResumableRun first = run_full_on_layer0(dir);
  const fs::path &acts = first.acts, &out = first.out;
  const std::string& base = first.base;
  {
    H5::H5File h5(out.string(), H5F_ACC_RDWR);
    REQUIRE(h5.attrExists("input_fingerprints"));
    h5.removeAttr("input_fingerprints");
  }
  auto r = run_hils(base + "--layers 0,1 --resume");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains(out.string() + ": records no fingerprints of its input "
                                       "(written before they were recorded), so its complete units "
                                       "(1) are not checked against " + acts.string()));
  CHECK(hils::io::ResultsReader(out).has_attribute("", "input_fingerprints"));
}

TEST_CASE("a failed run leaves an existing results file untouched", "[cli]") {
  TempDir dir("untouched");
  auto acts = write_small(dir);
  auto out = dir / "out.h5";
  REQUIRE(run_hils("run " + quoted(acts) + " -o " + quoted(out) + " -p full -S 8 --landmarks true")
              .exit_code == 0);
  auto before = fs::file_size(out);
  auto stamp = fs::last_write_time(out);
  poke(acts, "layer1/v", std::nan(""));
  auto r = run_hils("run " + quoted(acts) + " -o " + quoted(out) + " -p full,swa -S 8 --landmarks true");
  CHECK(r.exit_code == 2);
  CHECK(fs::file_size(out) == before);
  CHECK(fs::last_write_time(out) == stamp);
  CHECK(hils::test::count_temp_files(dir.path()) == 0);
}

TEST_CASE("info describes activation and results files", "[cli]") {
  TempDir dir("info");
  auto acts = write_small(dir);
  auto r = run_hils("info " + quoted(acts));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("Hq=4 Hkv=2 T=40 d=8 dv=6"));
  CHECK_THAT(r.output, Catch::Contains("/layer1/v"));
  auto json = run_hils("info --json " + quoted(acts));
  REQUIRE(json.exit_code == 0);
  auto doc = nlohmann::json::parse(json.output);
  CHECK(doc["landmark_slots"] == 5);
  CHECK(doc["n_layers"] == 2);
  // A soft link to a removed dataset made the whole file "corrupt: Group::childObjType:
  // H5Oget_info_by_name failed" (exit 2), while hils run reads it; now a row of the listing.
  {
    H5::H5File file(acts.string(), H5F_ACC_RDWR);
    file.openGroup("/layer1").link(H5L_TYPE_SOFT, "/removed", "old_q");
  }
  auto linked = run_hils("info " + quoted(acts));
  INFO(linked.output);
  CHECK(linked.exit_code == 0);
  CHECK_THAT(linked.output, Catch::Contains("/layer1/old_q") &&
                                Catch::Contains("link  a link that cannot be followed"));
}

TEST_CASE("the example configurations in experiments/configs run", "[cli]") {
  TempDir dir("examples");
  const fs::path configs = fs::path(HILS_SOURCE_DIR) / "experiments" / "configs";
  auto acts = dir / "acts.h5";
  auto dump = run_hils("-q dump synthetic -c " + quoted(configs / "synthetic_example.toml") +
                       " -T 300 -o " + quoted(acts));
  INFO(dump.output);
  REQUIRE(dump.exit_code == 0);
  auto run = run_hils("-q run " + quoted(acts) + " -c " + quoted(configs / "run_example.toml") + " -o " +
                      quoted(dir / "out.h5"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  hils::io::ResultsReader results(dir / "out.h5");
  CHECK(results.members("") ==
        std::vector<std::string>{"full", "hils", "hils_mean_pooling", "nsa"});
  auto meta = hils::io::read_activation_meta(acts);
  CHECK(meta.T == 300);  // the flag won over the file's T = 1024
  CHECK(meta.rotated);
}
