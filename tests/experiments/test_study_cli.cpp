// The study commands (hils fidelity, overlap, extrapolate) given values they cannot use: each is
// refused before any work with exit 2 and a message naming the flag (or the config key) and the
// value, and no results file is written.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/studies/study_table.hpp"
#include "io/activation_file.hpp"
#include "io/results_file.hpp"
#include "support.hpp"

using hils::test::quoted;
using hils::test::run_hils;
using hils::test::TempDir;
namespace fs = std::filesystem;

namespace {

// Runs `hils -q <command>` into dir/f.h5 and checks exit 2, `message` and that no file exists.
void require_refused(const TempDir& dir, const std::string& command, const std::string& message) {
  hils::test::require_refused("-q " + command + " --out " + quoted(dir / "f.h5"), message, dir / "f.h5");
}

// Writes `toml` into dir/c.toml and checks that `<command> -c <that file>` is refused as
// require_refused does; "<config>" in `message` stands for the file's path.
void require_config_refused(const TempDir& dir, const std::string& command,
                            const std::string& toml, std::string message) {
  const auto config = dir / "c.toml";
  std::ofstream(config) << toml;
  for (size_t at; (at = message.find("<config>")) != std::string::npos;)
    message.replace(at, std::string("<config>").size(), config.string());
  require_refused(dir, command + " -c " + quoted(config), message);
}

}  // namespace

TEST_CASE("study counts given as -1 are checked, not taken for 'not given'", "[cli][study]") {
  TempDir dir("study_minus_one");
  for (const auto& row : hils::cli::studies::kStudies) {
    const std::string study(row.command);
    if (row.samples_queries())  // overlap refuses --queries of any value (its own test below)
      require_refused(dir, study + " --lengths 1024 --queries -1",
                      "--queries: expected an integer >= 1, got -1");
    require_refused(dir, study + " --lengths 1024 --n-layers -1",
                    "--n-layers: expected an integer >= 1, got -1");
  }
}

TEST_CASE("the synthetic source draws at most 128 layers", "[cli][study]") {
  TempDir dir("study_layer_limit");
  require_refused(dir, "fidelity --lengths 1024 --n-layers 1000000",
                  "--n-layers: expected at most 128 layers for the synthetic source");
  require_refused(dir, "fidelity --lengths 1024 --n-layers 129", "got 129");
  require_config_refused(dir, "fidelity --lengths 1024", "[source]\nlayers = 500\n",
                         "--n-layers (or [source] layers in <config>): expected at most 128 "
                         "layers");
}

TEST_CASE("a K whose outputs cannot fit in memory is refused before any unit, with its range",
          "[cli][study]") {
  // 32 queries x 8 heads x 1e9 values of K is 2 TB at any length: was refused by the
  // reference's check ("spec.K: expected outputs ...") only when the first unit ran.
  TempDir dir("study_huge_k");
  for (const std::string study : {"fidelity", "overlap", "extrapolate"})
    require_refused(dir, study + " --lengths 1024 -K 1000000000",
                    "-K,--top-k: expected an integer in [0, ");
  require_refused(dir, "fidelity --lengths 1024 -K 1000000000", "], got 1000000000");
  require_config_refused(dir, "fidelity --lengths 1024", "[geometry]\nK = 1000000000\n",
                         "-K,--top-k (or [geometry] K in <config>): expected an integer in [0, ");
}

TEST_CASE("the studies' count of layers is --n-layers and its old name --layers still counts",
          "[cli][study]") {
  // `hils run --layers 1,0,2` lists layer indices; the studies' count had the same name.
  TempDir dir("study_n_layers");
  for (const std::string study : {"fidelity", "overlap", "extrapolate"}) {
    const auto help = run_hils(study + " --help");
    INFO(help.output);
    CHECK_THAT(help.output, Catch::Contains("--n-layers"));
    CHECK_THAT(help.output, !Catch::Contains("--layers"));  // the old name is hidden
  }
  // The old name is the same count (129 > the synthetic limit), and a note names the new one.
  const auto old = run_hils("fidelity --lengths 1024 --layers 129 --out " + quoted(dir / "f.h5"));
  INFO(old.output);
  CHECK(old.exit_code == 2);
  CHECK_THAT(old.output, Catch::Contains("--n-layers: expected at most 128 layers") &&
                             Catch::Contains("call it --n-layers now"));
  CHECK_FALSE(std::filesystem::exists(dir / "f.h5"));
  const auto quiet = run_hils("-q fidelity --lengths 1024 --n-layers 129 --out " +
                              quoted(dir / "f.h5"));
  CHECK_THAT(quiet.output, !Catch::Contains("call it --n-layers now"));
}

TEST_CASE("context lengths without a retrieval candidate are refused naming --lengths",
          "[cli][study]") {
  TempDir dir("study_short_lengths");
  for (const std::string study : {"fidelity", "overlap", "extrapolate"})
    require_refused(dir, study + " --lengths 1",
                    "--lengths: expected lengths with a retrieval candidate (T > W + S = 576 at "
                    "S=64, W=512), got 1");
  // The boundary: T = W + S has no candidate, T = W + S + 1 has one.
  require_refused(dir, "overlap -S 16 -W 64 --lengths 80", "T > W + S = 80 at S=16, W=64), got 80");
  auto r = run_hils("-q overlap -S 16 -W 64 -K 2 --lengths 81 --layers 1 --out " +
                    quoted(dir / "ok.h5"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // Set in a config, the error names the file and the key.
  require_config_refused(dir, "fidelity", "[fidelity]\nlengths = [100]\n",
                         "<config>: [fidelity].lengths: expected lengths with a retrieval "
                         "candidate");
}

TEST_CASE("lengths whose synthetic layers cannot fit in memory are refused naming --lengths",
          "[cli][study]") {
  TempDir dir("study_huge_lengths");
  require_refused(dir, "fidelity --lengths 100000000000",
                  "--lengths: expected sizes whose data fit in 80% of this machine's");
  require_refused(dir, "overlap --lengths 1024 100000000000", "--lengths: expected sizes");
  require_config_refused(dir, "extrapolate", "[extrapolation]\nlengths = [100000000000]\n",
                         "<config>: [extrapolation].lengths: expected sizes");
}

TEST_CASE("lengths out of order or not positive are refused showing the lengths given",
          "[cli][study]") {
  TempDir dir("study_lengths_order");
  require_refused(dir, "fidelity --lengths 2048 1024",
                  "--lengths: expected positive, strictly ascending lengths, got [2048,1024]");
  require_refused(dir, "fidelity --lengths 0",
                  "--lengths: expected positive, strictly ascending lengths, got [0]");
  // Comma-separated as `hils run --preset a,b` takes them (was "Could not convert").
  require_refused(dir, "extrapolate --lengths 4096,2048",
                  "--lengths: expected positive, strictly ascending lengths, got [4096,2048]");
  require_refused(dir, "fidelity --lengths 2048 --mechanisms hils,bogus",
                  "--mechanisms: mechanism: a preset, mean, landmark_key, taylor, "
                  "taylor_entropy, max_logit or <key>+<bias>, got 'bogus'");
}

TEST_CASE("a study config's unknown key or table is refused", "[cli][study]") {
  TempDir dir("study_unknown_keys");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[study]\nbanana = 3\n", "[study]: unknown key 'banana'"},
      {"[bananas]\nx = 3\n", "unknown table or key 'bananas'"}};
  for (const auto& [text, message] : cases)
    require_config_refused(dir, "fidelity --lengths 1024", text, "<config>: " + message);
}

TEST_CASE("lengths beyond an activation file's T are refused up front naming --lengths or the key",
          "[cli][study]") {
  TempDir dir("study_activation_lengths");
  const auto acts = dir / "acts.h5";
  REQUIRE(run_hils("-q dump synthetic -T 640 -S 64 -o " + quoted(acts)).exit_code == 0);
  // Was refused only when a unit loaded the layer, naming "lengths".
  require_refused(dir, "fidelity --source activations --activations " + quoted(acts) +
                           " --lengths 600 1024",
                  "--lengths: expected lengths within the activation file's T = 640 slots");
  require_config_refused(dir, "overlap --activations " + quoted(acts),
                         "[source]\nkind = \"activations\"\n[overlap]\nlengths = [600, 4096]\n",
                         "[overlap].lengths: expected lengths within the activation file's "
                         "T = 640");
}

TEST_CASE("an empty list of lengths is refused, not a crash", "[cli][study]") {
  TempDir dir("study_no_lengths");
  require_config_refused(dir, "fidelity", "[fidelity]\nlengths = []\n",
                         "[fidelity].lengths: expected at least one length, got []");
  // Extrapolation's default lengths start at train_length: none within the source's context.
  require_config_refused(dir, "extrapolate", "[extrapolation]\ntrain_length = 2000000\n",
                         "[extrapolation].train_length: expected a train length whose default "
                         "lengths");
}

TEST_CASE("a study on an activation file needs the file's landmark layout", "[cli][study]") {
  TempDir dir("study_activation_layout");
  const auto with = dir / "with.h5", without = dir / "without.h5";
  REQUIRE(run_hils("-q dump synthetic -T 640 -S 16 -o " + quoted(with)).exit_code == 0);
  REQUIRE(run_hils("-q dump synthetic -T 640 -S 16 --landmarks false -o " + quoted(without))
              .exit_code == 0);
  const std::string fidelity = "fidelity --source activations --lengths 640 --layers 1 --queries 2 ";
  // Both ran, the landmark keys attended as tokens or real tokens taken for landmarks.
  require_refused(dir, fidelity + "--landmarks false --activations " + quoted(with),
                  "the study's geometry (-S 16, --landmarks false) has landmarks off, but " +
                      with.string() + " has landmark slots at 15, 31, ... (S=16)");
  require_refused(dir, fidelity + "--landmarks true --activations " + quoted(without),
                  "the study's geometry (-S 16, --landmarks true) needs the landmark layout");
  require_refused(dir, fidelity + "--landmarks true -S 32 --activations " + quoted(with),
                  "has landmark slots at 15, 31, ... (S=16). Real-model dumps");
  // The matching layout runs.
  auto r = run_hils("-q " + fidelity + "--landmarks true --activations " + quoted(with) + " --out " +
                    quoted(dir / "f.h5"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // By default a file with landmark slots is studied with its own layout (S = 16, landmarks on;
  // until session 28 the model's S = 16 without landmarks, refused above, unless both flags were
  // given), and one without them with the model's geometry.
  for (const auto& [file, S, landmarks] :
       {std::tuple{with, 16, true}, std::tuple{without, 16, false}}) {
    const fs::path out = dir / ("default_" + file.stem().string() + ".h5");
    auto d = run_hils("-q " + fidelity + "--activations " + quoted(file) + " --out " + quoted(out));
    INFO(d.output);
    REQUIRE(d.exit_code == 0);
    const nlohmann::json geometry = hils::io::ResultsReader(out).config()["geometry"];
    CHECK(geometry["S"] == S);
    CHECK(geometry["landmarks"] == landmarks);
  }
  const fs::path with32 = dir / "with32.h5";
  REQUIRE(run_hils("-q dump synthetic -T 640 -S 32 -o " + quoted(with32)).exit_code == 0);
  auto d = run_hils("-q " + fidelity + "--activations " + quoted(with32) + " --out " +
                    quoted(dir / "default_with32.h5"));
  INFO(d.output);
  REQUIRE(d.exit_code == 0);
  CHECK(hils::io::ResultsReader(dir / "default_with32.h5").config()["geometry"]["S"] == 32);
}

TEST_CASE("a study rotates an activation file's un-rotated RoPE vectors as hils run does",
          "[cli][study]") {
  // A file with rotated = 0 and rope_pairing half (q and k dumped before the model's RoPE) was
  // studied as if the model had no positional encoding (fidelity and overlap: the exact masses
  // of un-rotated q and k, off by up to ~4 nats here), and extrapolate refused it for lacking
  // q_unrotated, which its q and k are. The same vectors stored rotated (with their un-rotated
  // copies) must give the same results.
  TempDir dir("study_unrotated_rope");
  const auto rotated = dir / "rotated.h5", unrotated = dir / "unrotated.h5";
  REQUIRE(run_hils("-q dump synthetic --generator topics -T 300 -S 16 --landmarks false "
                   "--positional rope --rope-pairing half --rope-theta 5000 --seed 3 -o " +
                   quoted(rotated))
              .exit_code == 0);
  hils::io::ActivationFile file = hils::io::read_activation_file(rotated);
  REQUIRE(file.meta.rotated);
  file.meta.rotated = false;
  for (auto& layer : file.layers) {
    layer.inputs.q = std::move(layer.q_unrotated);
    layer.inputs.k = std::move(layer.k_unrotated);
    layer.q_unrotated.clear(), layer.k_unrotated.clear();
  }
  hils::io::write_activation_file(unrotated, file, hils::io::StorageType::float64);

  for (const auto& [study, dataset] :
       std::vector<std::pair<std::string, std::string>>{
           {"fidelity", "T256/layer0/group0/head0/exact"},
           {"overlap", "T256/layer0/group0/selection"},
           {"extrapolate", "rope/T256/layer0/group0/head0/mean/gap_mean"}}) {
    std::vector<hils::Matrix<double>> values;
    for (const auto& input : {rotated, unrotated}) {
      const auto out = dir / (study + "_" + input.stem().string() + ".h5");
      const std::string extra = study == "overlap" ? "" : " --queries 4 --mechanisms mean";
      auto r = run_hils("-q " + study + " --lengths 256 --n-layers 1 -S 16 -W 32 -K 4" + extra +
                        " --activations " + quoted(input) + " --out " + quoted(out));
      INFO(study << " on " << input << ": " << r.output);
      REQUIRE(r.exit_code == 0);
      hils::io::ResultsReader results(out);
      values.push_back(dataset.find("selection") != std::string::npos
                          ? results.index_matrix(dataset).cast<double>()
                          : results.matrix(dataset));
    }
    INFO(study);
    const auto finite = [](const hils::Matrix<double>& m) {
      return m.unaryExpr([](double x) { return std::isfinite(x) ? x : 0.0; });
    };
    CHECK((finite(values[0]) - finite(values[1])).cwiseAbs().maxCoeff() < 1e-12);
  }

  // Positions the file does not share with the study's layout are refused up front, naming them.
  for (auto& id : file.meta.position_ids) id += 7;
  const auto shifted = dir / "shifted.h5";
  hils::io::write_activation_file(shifted, file, hils::io::StorageType::float64);
  require_refused(dir, "fidelity --lengths 256 --n-layers 1 -S 16 -W 32 -K 4 --activations " +
                           quoted(shifted),
                  shifted.string() + ": position_ids: expected the study's position ids (S=16, "
                  "landmarks=false: 0 at slot 0) to rotate the un-rotated q and k (rotated = 0, "
                  "rope_pairing half) at, found 7");
}

TEST_CASE("an activation file is studied whole by default and extrapolated with its own RoPE",
          "[cli][study]") {
  // A file got the defaults of the model stories260K: lengths [512] (a 300-slot file was refused,
  // "(defaults): [fidelity].lengths: expected lengths within the activation file's T = 300
  // slots, got 512"; a longer one was studied at 512 slots alone), layers 0..4 of its 6, and an
  // extrapolation whose rope encoding was RoPE interleaved with theta 10000 where the file's
  // model has half with theta 5000.
  TempDir dir("study_activation_defaults");
  REQUIRE(run_hils("-q dump synthetic -T 300 -S 16 --landmarks false --positional rope "
                   "--rope-pairing half --rope-theta 5000 --Hq 2 --Hkv 1 -d 16 --seed 4 -o " +
                   quoted(dir / "one.h5"))
              .exit_code == 0);
  hils::io::ActivationFile file = hils::io::read_activation_file(dir / "one.h5");
  file.meta.n_layers = 6;
  file.layers.resize(6, file.layers.front());
  const auto six = dir / "six.h5";
  hils::io::write_activation_file(six, file, hils::io::StorageType::float64);
  const auto config = [](const fs::path& results) {
    return nlohmann::json::parse(
        hils::io::ResultsReader(results).string_attribute("/", "config"));
  };
  const std::string flags = " -W 32 -K 4 --queries 2 --mechanisms mean --activations " +
                            quoted(six) + " --out ";
  auto fidelity = run_hils("-q fidelity" + flags + quoted(dir / "f.h5"));
  INFO(fidelity.output);
  REQUIRE(fidelity.exit_code == 0);
  CHECK(config(dir / "f.h5")["lengths"] == nlohmann::json::array({300}));
  CHECK(config(dir / "f.h5")["layers"] == 6);
  auto extrapolation = run_hils("-q extrapolate --n-layers 1" + flags + quoted(dir / "e.h5"));
  INFO(extrapolation.output);
  REQUIRE(extrapolation.exit_code == 0);
  const nlohmann::json e = config(dir / "e.h5");
  CHECK(e["lengths"] == nlohmann::json::array({128, 256}));
  CHECK(e["extrapolation"]["pairing"] == "half");
  CHECK(e["extrapolation"]["theta"] == 5000.0);
}

TEST_CASE("a layer count beyond an activation file's layers is refused and not capped",
          "[cli][study]") {
  // --n-layers 3 (or [source] layers = 3) on a one-layer file studied its one layer without a
  // word (exit 0; the results' config said layers 1). The default, every layer, still runs.
  TempDir dir("study_layers_beyond");
  const auto file = dir / "one.h5";
  REQUIRE(run_hils("-q dump synthetic -T 300 -S 16 --landmarks false --Hq 2 --Hkv 1 -d 16 "
                   "--seed 4 -o " + quoted(file))
              .exit_code == 0);
  const std::string flags =
      " -W 32 -K 4 --queries 2 --mechanisms mean --activations " + quoted(file) + " --out ";
  auto flagged = run_hils("-q fidelity --n-layers 3" + flags + quoted(dir / "a.h5"));
  CHECK(flagged.exit_code == 2);
  CHECK_THAT(flagged.output, Catch::Contains("--n-layers: expected at most 1 (the layers of the "
                                             "activation file " + file.string() + "), got 3"));
  CHECK_FALSE(fs::exists(dir / "a.h5"));
  {
    std::ofstream(dir / "layers.toml") << "[source]\nlayers = 3\n";
  }
  auto configured = run_hils("-q fidelity --config " + quoted(dir / "layers.toml") + flags +
                             quoted(dir / "b.h5"));
  CHECK(configured.exit_code == 2);
  CHECK_THAT(configured.output, Catch::Contains("[source].layers: expected at most 1 (the layers "
                                                "of the activation file"));
  CHECK(run_hils("-q fidelity" + flags + quoted(dir / "c.h5")).exit_code == 0);
}

TEST_CASE("a study reads an activation file's q_retrieval as hils run does", "[cli][study]") {
  // The studies dropped q_retrieval (q~, the retrieval queries the surrogates score with) of an
  // activation file without a word: a file with q_retrieval = q + noise gave the results of the
  // same file without it, while hils run and the synthetic source used q~.
  TempDir dir("study_q_retrieval");
  const auto with = dir / "with.h5", without = dir / "without.h5";
  REQUIRE(run_hils("-q dump synthetic --generator topics -T 300 -S 16 --landmarks false "
                   "--retrieval-noise 0.5 --seed 6 -o " + quoted(with))
              .exit_code == 0);
  hils::io::ActivationFile file = hils::io::read_activation_file(with);
  REQUIRE_FALSE(file.layers.front().inputs.q_retrieval.empty());
  file.layers.front().inputs.q_retrieval.clear();
  hils::io::write_activation_file(without, file, hils::io::StorageType::float64);
  const std::string head = "T300/layer0/group0/head0/";
  std::vector<hils::Matrix<double>> exact, surrogate;
  for (const auto& input : {with, without}) {
    const auto out = dir / ("f_" + input.stem().string() + ".h5");
    auto r = run_hils("-q fidelity --lengths 300 -W 32 -K 4 --queries 4 --mechanisms mean "
                      "--activations " + quoted(input) + " --out " + quoted(out));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    hils::io::ResultsReader results(out);
    exact.push_back(results.matrix(head + "exact"));
    surrogate.push_back(results.matrix(head + "mean/surrogate"));
  }
  CHECK(exact[0] == exact[1]);  // L reads q
  const auto finite = [](const hils::Matrix<double>& m) {
    return m.unaryExpr([](double x) { return std::isfinite(x) ? x : 0.0; });
  };
  CHECK((finite(surrogate[0]) - finite(surrogate[1])).cwiseAbs().maxCoeff() > 0.01);

  // Extrapolation applies each encoding to un-rotated vectors: a q_retrieval stored rotated
  // without an un-rotated copy is refused by name, as hils run --positional refuses it.
  const auto rotated = dir / "rotated.h5";
  REQUIRE(run_hils("-q dump synthetic -T 300 -S 16 --landmarks false --positional rope "
                   "--retrieval-noise 0.5 -o " + quoted(rotated))
              .exit_code == 0);
  require_refused(dir, "extrapolate --lengths 300 -W 32 -K 4 --queries 2 --mechanisms mean "
                       "--activations " + quoted(rotated),
                  "activations: expected an un-rotated q_retrieval (extrapolation applies each "
                  "encoding to un-rotated vectors");
}

TEST_CASE("landmark_key named without the landmark layout is refused and not left out",
          "[cli][study]") {
  // It was left out without a word: `--mechanisms landmark_key` wrote a results file with no
  // mechanism (exit 0), whose hils plot failed (exit 3, a ZeroDivisionError), while lmk and
  // landmark_key+entropy were refused ("key_rule: expected landmarks on ...").
  TempDir dir("study_landmark_key");
  require_refused(dir, "fidelity --lengths 1024 --landmarks false --mechanisms mean,landmark_key",
                  "--mechanisms: expected mechanisms that run without landmark slots (the "
                  "study's --landmarks false), got 'landmark_key'");
  require_config_refused(dir, "extrapolate --lengths 1024 --landmarks false",
                         "[study]\nmechanisms = [\"landmark_key\"]\n",
                         "[study].mechanisms: expected mechanisms that run without landmark "
                         "slots");
}

TEST_CASE("a name or value given twice in a study's lists is refused before any unit",
          "[cli][study]") {
  // Each name is a results group or a grid column: the second one's datasets collided with the
  // first's when written, after minutes of work ("expected a dataset written once"), with the
  // advice to make room and run the same command again, which failed the same way.
  TempDir dir("study_twice");
  require_refused(dir, "fidelity --lengths 1024 --mechanisms mean,taylor,mean",
                  "--mechanisms: expected distinct names, got 'mean' twice");
  require_config_refused(dir, "fidelity --lengths 1024",
                         "[study]\nmechanisms = [\"mean\", \"mean\"]\n"
                         "[extrapolation]\nencodings = [\"rope\", \"rope\"]\n"
                         "depths = [0.5, 0.5]\n[overlap]\nblock_sizes = [2, 4, 2]\n",
                         "[study].mechanisms: expected distinct names, got 'mean' twice");
  require_config_refused(dir, "extrapolate --lengths 1024",
                         "[extrapolation]\nencodings = [\"rope\", \"nope\", \"rope\"]\n",
                         "[extrapolation].encodings: expected distinct names, got 'rope' twice");
  require_config_refused(dir, "extrapolate --lengths 1024",
                         "[extrapolation]\ndepths = [0.5, 0.5]\n",
                         "[extrapolation].depths: expected distinct needle depths, got 0.5 twice");
  require_config_refused(dir, "overlap --lengths 1024", "[overlap]\nblock_sizes = [2, 4, 2]\n",
                         "[overlap].block_sizes: expected distinct block sizes, got 2 twice");
}

TEST_CASE("a source's file flag is not ignored: it picks its source, or another is refused",
          "[cli][study]") {
  // --activations without --source activations ran the synthetic source without a word.
  TempDir dir("study_source_flags");
  const auto acts = dir / "acts.h5";
  REQUIRE(run_hils("-q dump synthetic -T 640 -S 16 -o " + quoted(acts)).exit_code == 0);
  require_refused(dir, "fidelity --lengths 640 --source synthetic --activations " + quoted(acts),
                  "--activations: expected --source activations (or no --source), got --source "
                  "synthetic, which does not read it");
  require_refused(dir, "fidelity --lengths 640 --source synthetic --model-dir " + quoted(dir.path()),
                  "--model-dir: expected --source model (or no --source), got --source synthetic");
  require_config_refused(dir, "fidelity --lengths 640 --activations " + quoted(acts),
                         "[source]\nkind = \"model\"\n",
                         "--activations: expected --source activations (or no --source), got "
                         "[source] kind = model");
  // Alone, the flag picks its source: the file's landmark layout is checked, so it is read.
  require_refused(dir, "fidelity --lengths 640 --landmarks false --activations " + quoted(acts),
                  "the study's geometry (-S 16, --landmarks false) has landmarks off, but " +
                      acts.string());
  auto r = run_hils("-q fidelity --lengths 640 --n-layers 1 --queries 2 --landmarks true "
                    "--activations " + quoted(acts) + " --out " + quoted(dir / "f.h5"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(run_hils("info --json " + quoted(dir / "f.h5")).output.find("\"kind\": \"activations\"") !=
        std::string::npos);
}

TEST_CASE("hils overlap refuses the flags it has no use for", "[cli][study]") {
  // It studies one mechanism ([overlap] mechanism) over the last [overlap] tail_queries queries:
  // --mechanisms and --queries were accepted and ignored.
  TempDir dir("study_overlap_flags");
  require_refused(dir, "overlap --lengths 1024 --mechanisms nsa",
                  "--mechanisms: hils overlap studies one mechanism, [overlap] mechanism in a "
                  "--config (default taylor_entropy); --mechanisms is for hils fidelity and "
                  "extrapolate");
  require_refused(dir, "overlap --lengths 1024 --queries 8",
                  "--queries: hils overlap studies the last [overlap] tail_queries queries of "
                  "each length (default 256); --queries is for hils fidelity and extrapolate");
  const auto help = run_hils("overlap --help").output;
  CHECK(help.find("--mechanisms") == std::string::npos);
  CHECK(help.find("--queries") == std::string::npos);
}

TEST_CASE("resuming a study file of another configuration names what differs and what to do",
          "[cli][study]") {
  // Was the whole stored configuration as JSON (~600 characters) after "expected the
  // configuration of this run": neither the value that differs nor a way on.
  TempDir dir("study_resume_other");
  const std::string base = "-q fidelity --lengths 1024 --n-layers 1 --mechanisms mean "
                           "--out " + quoted(dir / "f.h5");
  REQUIRE(run_hils(base + " --queries 2").exit_code == 0);
  const auto before = hils::test::file_bytes(dir / "f.h5");
  auto r = run_hils(base + " -K 4 --queries 3");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(
                           "/ attribute config: expected the configuration of this run (resuming "
                           "must not mix experiments: write to another file, or remove this one "
                           "to start over), found one that differs in geometry.K (32 in the "
                           "file, 4 in this run), queries (2 in the file, 3 in this run)"));
  CHECK_THAT(r.output, !Catch::Contains("{\""));
  CHECK(hils::test::file_bytes(dir / "f.h5") == before);
}

TEST_CASE("a study resumed on a changed activation file is refused naming the layer",
          "[cli][study]") {
  // Was: an activation file re-dumped at the same path resumed the study without a word (the
  // config records the path and the file's provenance, not its data), mixing units computed
  // from two inputs. Every layer's fingerprint is recorded; a layer a complete unit read must
  // hold the same data.
  TempDir dir("study_changed_input");
  const fs::path acts = hils::test::write_small_activation_file(dir, 12);
  const fs::path out = dir / "f.h5";
  const std::string study = "fidelity --activations " + quoted(acts) +
                            " -S 8 --landmarks true -W 8 -K 2 --queries 2 --mechanisms mean "
                            "--out " + quoted(out);
  const auto first = run_hils(study);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const std::string before = hils::test::file_bytes(out);
  hils::io::ActivationFile file = hils::test::small_activation_file(12);
  file.layers[1].inputs.q[3](30, 4) *= 1.0 + 1e-12;
  hils::io::write_activation_file(acts, file, hils::io::StorageType::float64);
  auto r = run_hils(study);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--activations (" + acts.string() + ") layer 1: expected "
                                       "the data that " + out.string() + "'s complete units "
                                       "were computed from (fingerprint "));
  CHECK_THAT(r.output, Catch::Contains("the file changed since unit T40/layer1/group0 ran"));
  CHECK(hils::test::file_bytes(out) == before);
  // The same values again, stored as they were: resumed (nothing left to run).
  hils::test::write_small_activation_file(dir, 12);
  auto again = run_hils(study);
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.output, Catch::Contains("0 units run, 4 resumed"));
}

TEST_CASE("a results file of another command given to resume is named as such", "[cli][study]") {
  // Another study's file (or hils run's) differs in nearly every key: the message named the
  // first three ("geometry.W (512 in the file, 256 in this run), layers ..., lengths ... and 4
  // more"), never that the file is a fidelity study's; hils run --resume on a study's file
  // ended in "internal error: [json.exception.type_error.302] type must be array, but is
  // number" (exit 3: the study's "layers" count read as hils run's list).
  TempDir dir("resume_other_command");
  const auto fidelity = dir / "f.h5", run = dir / "r.h5", acts = dir / "a.h5";
  REQUIRE(run_hils("-q fidelity --lengths 1024 --n-layers 1 --queries 2 --mechanisms mean --out " +
                   quoted(fidelity)).exit_code == 0);
  REQUIRE(run_hils("-q dump synthetic -T 64 -S 16 -o " + quoted(acts)).exit_code == 0);
  REQUIRE(run_hils("-q run " + quoted(acts) + " -o " + quoted(run) +
                   " -p full -S 16 --landmarks true").exit_code == 0);
  const auto before = hils::test::file_bytes(fidelity);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-q overlap --lengths 2048 --n-layers 1 -W 256 --out " + quoted(fidelity),
       ": expected the results of hils overlap to resume, found those of hils fidelity; write "
       "to another file, or remove this one to start over"},
      {"-q fidelity --lengths 1024 --n-layers 1 --out " + quoted(run),
       ": expected the results of hils fidelity to resume, found those of hils run"},
      {"-q run " + quoted(acts) + " -o " + quoted(fidelity) +
           " -p full -S 16 --landmarks true --resume",
       ": expected the results of hils run to resume, found those of hils fidelity"}};
  for (const auto& [command, words] : cases) {
    const auto r = run_hils(command);
    INFO(command + "\n" + r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(words));
  }
  CHECK(hils::test::file_bytes(fidelity) == before);
}
