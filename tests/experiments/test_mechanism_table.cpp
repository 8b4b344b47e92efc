// Every row of the mechanism tables (kPresets and the enum names of hils/spec.hpp) reaches every
// place a user names a mechanism: the JSON/TOML codec, `hils run --preset`, the studies'
// --mechanisms, the command-line help and the documents that list them (README "Adding a
// mechanism"). A row that one of them misses fails here, naming the row and the place.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "config/spec_codec.hpp"
#include "hils/analysis/study.hpp"
#include "hils/spec.hpp"
#include "io/results_file.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using hils::test::quoted;
using hils::test::run_hils;

namespace {

// A document of the project with its white space folded to single spaces (lists wrap lines).
std::string document(const std::string& relative) {
  std::ifstream in(fs::path(HILS_SOURCE_DIR) / relative);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return std::regex_replace(text.str(), std::regex("\\s+"), " ");
}

// The part of `text` from the heading `from` to the next heading of level 2 ("\n## " folded).
std::string section(const std::string& text, const std::string& from) {
  const size_t start = text.find(from);
  REQUIRE(start != std::string::npos);
  const size_t end = text.find(" ## ", start + from.size());
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

TEST_CASE("mechanism table: every preset through the codec, the studies and hils run",
          "[config][mechanisms]") {
  hils::test::TempDir dir("mechanism_table");
  const auto acts = hils::test::write_small_activation_file(dir, 3);
  std::string all;
  for (const auto& row : hils::kPresets) {
    INFO("preset " << row.name);
    const hils::MechanismSpec spec = hils::preset(row.name);
    CHECK(spec.name == row.name);
    CHECK((spec.fusion == row.fusion && spec.key_rule == row.key_rule &&
           spec.bias_rule == row.bias_rule && spec.landmarks == row.landmarks));
    CHECK_NOTHROW(spec.validate());
    // The JSON codec (hils run's [[mechanism]] tables, hils verify's spec, the Python package).
    const auto decoded = hils::config::spec_from_json({{"preset", row.name}}, "spec");
    CHECK(hils::config::spec_to_json(decoded) == hils::config::spec_to_json(spec));
    // The studies' --mechanisms and [study] mechanisms.
    const auto studied = hils::analysis::study_mechanism(row.name, hils::PriorRule::landmark_query);
    CHECK(studied.name == row.name);
    CHECK(hils::config::spec_to_json(studied.spec) == hils::config::spec_to_json(spec));
    all += (all.empty() ? "" : ",") + std::string(row.name);
  }
  CHECK(hils::preset_names().size() == hils::kPresets.size());
  // hils run --preset: every preset in one run of the small file (landmarks at S = 8).
  const auto out = dir / "presets.h5";
  const auto run = run_hils("-q run " + quoted(acts) + " -o " + quoted(out) + " --preset " + all +
                            " -S 8 -W 16 -K 2 --landmarks true --jobs 1");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const hils::io::ResultsReader results(out);
  for (const auto& row : hils::kPresets) {
    INFO("preset " << row.name);
    CHECK(results.exists(std::string(row.name) + "/layer0"));
  }
  // The help of --preset and the refusal of an unknown preset list every row.
  const auto help = run_hils("run --help");
  const auto refused = run_hils("-q run " + quoted(acts) + " -o " + quoted(dir / "x.h5") +
                                " --preset no_such_preset");
  CHECK(refused.exit_code == 2);
  for (const auto& row : hils::kPresets) {
    INFO("preset " << row.name);
    CHECK_THAT(help.output, Catch::Contains(std::string(" ") + row.name + " "));
    CHECK_THAT(refused.output, Catch::Contains(std::string(" ") + row.name));
  }
}

TEST_CASE("mechanism table: every key rule through the codec and the studies' <key>+<bias>",
          "[config][mechanisms]") {
  for (const auto& rule : hils::kKeyRuleNames) {
    INFO("key rule " << rule.name);
    const auto decoded = hils::config::spec_from_json(
        {{"preset", "hils"}, {"key_rule", rule.name}, {"bias_rule", "none"}}, "spec");
    CHECK(decoded.key_rule == rule.value);
    if (rule.value == hils::KeyRule::exact) continue;  // exact has no summary to study
    const auto studied = hils::analysis::study_mechanism(std::string(rule.name) + "+none",
                                                         hils::PriorRule::landmark_query);
    CHECK(studied.spec.key_rule == rule.value);
    CHECK_NOTHROW(studied.spec.validate());
  }
}

TEST_CASE("mechanism table: the documents list every preset and enum value",
          "[config][mechanisms]") {
  const std::string semantics = document("reference/SEMANTICS.md");
  const std::string presets = section(semantics, "## 7. Presets and ablations");
  const std::string summaries = section(semantics, "## 3. Chunk mass and summaries");
  const std::string verify = document("data/verify_format.md");
  for (const auto& row : hils::kPresets) {
    INFO("preset " << row.name << ": reference/SEMANTICS.md §7 table, data/verify_format.md");
    CHECK_THAT(presets, Catch::Contains(std::string("| `") + row.name + "` |"));
    CHECK_THAT(verify, Catch::Contains(std::string("`") + row.name + "`"));
  }
  for (const auto& rule : hils::kKeyRuleNames) {
    INFO("key rule " << rule.name << ": reference/SEMANTICS.md §3");
    CHECK_THAT(summaries, Catch::Contains(std::string("- `") + rule.name + "`"));
  }
  // data/verify_format.md's spec paragraph: "`key_rule` (`exact|mean|...`)", each enum whole.
  CHECK_THAT(verify, Catch::Contains("`fusion` (`" + hils::enum_options<hils::Fusion>("|") + "`)"));
  CHECK_THAT(verify,
             Catch::Contains("`key_rule` (`" + hils::enum_options<hils::KeyRule>("|") + "`)"));
  CHECK_THAT(verify,
             Catch::Contains("`bias_rule` (`" + hils::enum_options<hils::BiasRule>("|") + "`)"));
  CHECK_THAT(verify,
             Catch::Contains("`prior_rule` (`" + hils::enum_options<hils::PriorRule>("|") + "`)"));
  CHECK_THAT(verify,
             Catch::Contains("`group_rule` (`" + hils::enum_options<hils::GroupRule>("|") + "`)"));
}
