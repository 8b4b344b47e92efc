// The configuration module: the MechanismSpec field table (hils/spec_fields.hpp) and what it
// drives (the JSON codec, the command-line flags, describe, validate), the enum name tables
// (hils/spec.hpp), and the TOML reader.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>

#include <CLI/CLI.hpp>

#include "cli/spec_flags.hpp"
#include "config/config.hpp"
#include "hils/spec_fields.hpp"
#include "support.hpp"

namespace {

using hils::MechanismSpec;
using nlohmann::json;
using hils::test::TempDir;

// The message of the InvalidArgument that `body` throws ("" when it throws none).
template <class Body>
std::string message_of(Body body) {
  try {
    body();
  } catch (const hils::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// Every spec of the presets and Table 5 ablations, plus one with every field off its default.
std::vector<MechanismSpec> sample_specs() {
  std::vector<MechanismSpec> specs;
  for (const auto& name : hils::preset_names()) specs.push_back(hils::preset(name));
  for (const auto& spec : hils::table5_ablations()) specs.push_back(spec);
  MechanismSpec odd;
  odd.name = "odd", odd.fusion = hils::Fusion::flat, odd.key_rule = hils::KeyRule::mean;
  odd.bias_rule = hils::BiasRule::none, odd.prior_rule = hils::PriorRule::given;
  odd.group_rule = hils::GroupRule::max_raw, odd.softmax1 = true, odd.S = 7, odd.W = 9;
  odd.K = 3, odd.landmarks = false, odd.scale = 0.375;
  specs.push_back(odd);
  return specs;
}

// spec_to_json of argv parsed by a command with the spec flags, applied over a default spec.
MechanismSpec spec_from_flags(std::vector<std::string> args,
                              const std::vector<std::string>& keys = {}) {
  CLI::App app("test");
  json overrides = json::object();
  hils::cli::add_spec_flags(&app, &overrides, keys);
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  app.parse(args);
  MechanismSpec spec;
  hils::config::apply_spec_overrides(spec, overrides, "flags");
  return spec;
}

}  // namespace

TEST_CASE("enum name tables: names round-trip, integers follow the table order", "[config]") {
  auto check = [](auto sample) {
    using Enum = decltype(sample);
    const auto& names = hils::enum_names(Enum{});
    for (size_t i = 0; i < names.size(); ++i) {
      const Enum value = names[i].value;
      CHECK(hils::parse_enum<Enum>(hils::enum_name(value), "field") == value);
      CHECK(hils::enum_from_int<Enum>(static_cast<long long>(i)) == value);
    }
    CHECK_FALSE(hils::enum_from_int<Enum>(-1).has_value());
    CHECK_FALSE(hils::enum_from_int<Enum>(static_cast<long long>(names.size())).has_value());
    CHECK_THAT(message_of([] { hils::parse_enum<Enum>("nope", "spec.x"); }),
               Catch::StartsWith("spec.x: expected one of " + hils::enum_options<Enum>()));
  };
  check(hils::KeyRule{}), check(hils::BiasRule{}), check(hils::PriorRule{});
  check(hils::GroupRule{}), check(hils::Fusion{});
  // The format, on the rows every version has (a new key rule adds its row at the end).
  CHECK_THAT(hils::enum_options<hils::KeyRule>(),
             Catch::StartsWith("exact | mean | landmark_key | taylor"));
}

TEST_CASE("spec codec: every field round-trips through JSON, keys are the table's", "[config]") {
  std::vector<std::string> table_keys;
  hils::for_each_spec_field([&](const auto& field) { table_keys.emplace_back(field.key); });
  REQUIRE(table_keys.size() == 12);
  std::vector<std::string> expected_keys{"preset"};
  expected_keys.insert(expected_keys.end(), table_keys.begin(), table_keys.end());
  CHECK(hils::config::spec_keys() == expected_keys);
  for (const auto& spec : sample_specs()) {
    INFO(hils::describe(spec));
    const json j = hils::config::spec_to_json(spec);
    std::vector<std::string> written;
    for (const auto& item : j.items()) written.push_back(item.key());
    CHECK(std::set<std::string>(written.begin(), written.end()) ==
          std::set<std::string>(table_keys.begin(), table_keys.end()));
    const MechanismSpec back = hils::config::spec_from_json(j, "spec");
    CHECK(hils::config::spec_to_json(back) == j);
    CHECK(hils::describe(back) == hils::describe(spec));
  }
  // A preset key starts from the preset; other keys override it.
  const auto lmk = hils::config::spec_from_json(json{{"preset", "lmk"}, {"K", 5}}, "spec");
  CHECK(lmk.key_rule == hils::KeyRule::landmark_key);
  CHECK(lmk.K == 5);
}

TEST_CASE("spec codec: unknown keys, wrong types and bad names are named", "[config]") {
  using hils::config::spec_from_json;
  CHECK_THAT(message_of([] { spec_from_json(json{{"k", 4}}, "f.toml: [[mechanism]] #1"); }),
             Catch::StartsWith("f.toml: [[mechanism]] #1: unknown key 'k' (expected one of "
                               "preset, name, fusion"));
  CHECK(message_of([] { spec_from_json(json{{"K", "four"}}, "spec"); }) ==
        "spec.K: expected an integer, got string \"four\"");
  CHECK(message_of([] { spec_from_json(json{{"landmarks", 1}}, "spec"); }) ==
        "spec.landmarks: expected true or false, got number 1");
  CHECK_THAT(message_of([] { spec_from_json(json{{"key_rule", "max"}}, "spec"); }),
             Catch::StartsWith("spec.key_rule: expected one of exact | mean"));
  CHECK_THAT(message_of([] { spec_from_json(json{{"preset", "bsa"}}, "spec"); }),
             Catch::StartsWith("spec.preset: expected one of full"));
  // Were "spec.spec.preset: expected a string, got null null" (hils.verify({"preset": None}, ...)).
  CHECK(message_of([] { spec_from_json(json{{"preset", nullptr}}, "spec"); }) ==
        "spec.preset: expected a string, got null");
  CHECK(message_of([] { spec_from_json(json{{"preset", 3}}, "spec"); }) ==
        "spec.preset: expected a string, got number 3");
  CHECK(message_of([] { spec_from_json(json{{"S", nullptr}}, "spec"); }) ==
        "spec.S: expected an integer, got null");
}

TEST_CASE("spec flags: one flag per table field, the same names in every command", "[config]") {
  const MechanismSpec spec = spec_from_flags(
      {"--name", "x", "--fusion", "flat", "--key-rule", "mean", "--bias-rule", "none",
       "--prior-rule", "shared", "--group-rule", "sum_probabilities", "--softmax1", "false",
       "-S", "16", "--window", "32", "--top-k", "4", "--landmarks", "false", "--scale", "0.25"});
  CHECK(spec.name == "x");
  CHECK(spec.fusion == hils::Fusion::flat);
  CHECK(spec.key_rule == hils::KeyRule::mean);
  CHECK(spec.bias_rule == hils::BiasRule::none);
  CHECK(spec.prior_rule == hils::PriorRule::shared);
  CHECK(spec.group_rule == hils::GroupRule::sum_probabilities);
  CHECK(spec.S == 16);
  CHECK(spec.W == 32);
  CHECK(spec.K == 4);
  CHECK_FALSE(spec.landmarks);
  CHECK(spec.scale == 0.25);
  // Every field of the table has a flag (a row added to the table gets one).
  CLI::App app("test");
  json overrides = json::object();
  hils::cli::add_spec_flags(&app, &overrides);
  hils::for_each_spec_field([&](const auto& field) {
    INFO(field.key);
    CHECK(app.get_option_no_throw(std::string(field.flags).substr(
              std::string(field.flags).rfind(',') + 1)) != nullptr);
  });
  // The studies' older spellings still work; a subset registers only its fields.
  CHECK(spec_from_flags({"--S", "8", "--W", "24", "--K", "2"}, {"S", "W", "K"}).W == 24);
  CHECK_THROWS_AS(spec_from_flags({"--fusion", "flat"}, {"S", "W", "K"}), CLI::ParseError);
  // Values are checked by the spec decoder, as JSON and TOML values are.
  CHECK_THAT(message_of([] { spec_from_flags({"--key-rule", "max"}); }),
             Catch::StartsWith("flags.key_rule: expected one of exact | mean"));
}

TEST_CASE("describe and validate read the field table", "[config]") {
  CHECK(hils::describe(hils::preset("hils")) ==
        "hils: fusion=hierarchical key_rule=taylor bias_rule=entropy prior_rule=landmark_query "
        "group_rule=max_normalized S=64 W=512 K=32 landmarks=true");
  // A window mechanism selects nothing: no key, bias, prior, group or K.
  CHECK(hils::describe(hils::preset("swa")) == "swa: fusion=window S=64 W=512 landmarks=false");
  MechanismSpec sink = hils::preset("lmk");
  sink.softmax1 = true, sink.scale = 0.5;
  CHECK(hils::describe(sink) ==
        "lmk: fusion=hierarchical key_rule=landmark_key bias_rule=none "
        "group_rule=max_normalized softmax1 S=64 W=512 K=32 landmarks=true scale=0.5");
  MechanismSpec bad = hils::preset("nsa");
  bad.K = -2;
  CHECK(message_of([&] { bad.validate(); }) == "K: expected a chunk count of at least 0, got -2");
  bad.K = 1, bad.scale = std::numeric_limits<double>::infinity();
  CHECK_THAT(message_of([&] { bad.validate(); }), Catch::StartsWith("scale: expected 0 (meaning"));
  bad.scale = 0.0, bad.W = 0;
  CHECK_THAT(message_of([&] { hils::validate_fields(bad); }), Catch::StartsWith("W: expected"));
}

namespace {

// A TOML file `name` with `text` in `dir`, its path as a string.
std::string toml_file(const TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir / name) << text;
  return (dir / name).string();
}

}  // namespace

TEST_CASE("TOML reader: unknown tables and keys are refused, naming file, table and key",
          "[config]") {
  using hils::config::load_toml;
  using hils::config::study_schema;
  TempDir dir("config_strict");
  // A misspelt key in a known table (a lenient reader would run with W's default).
  const auto key = toml_file(dir, "key.toml", "[geometry]\nS = 16\nwindw = 64\n");
  CHECK(message_of([&] { load_toml(key, study_schema()); }) ==
        key + ": [geometry]: unknown key 'windw' (expected one of S, W, K, landmarks)");
  // A misspelt table.
  const auto table = toml_file(dir, "table.toml", "[geometri]\nS = 16\n");
  CHECK_THAT(message_of([&] { load_toml(table, study_schema()); }),
             Catch::StartsWith(table + ": unknown table or key 'geometri' (expected the tables "
                               "[source], [geometry], [study], [fidelity], [overlap]"));
  // A key outside any table, and a table written as a plain value.
  const auto bare = toml_file(dir, "bare.toml", "S = 16\n");
  CHECK_THAT(message_of([&] { load_toml(bare, study_schema()); }),
             Catch::Contains("unknown table or key 'S'"));
  const auto value = toml_file(dir, "value.toml", "geometry = 3\n");
  CHECK(message_of([&] { load_toml(value, study_schema()); }) ==
        value + ": geometry: expected a table [geometry], got number 3");
  // Each element of an array of tables is checked, and named by its position.
  const auto run = toml_file(dir, "run.toml",
                             "[[mechanism]]\npreset = \"full\"\n[[mechanism]]\npreset = \"nsa\"\n"
                             "windw = 4\n");
  CHECK_THAT(message_of([&] { load_toml(run, hils::config::run_schema()); }),
             Catch::StartsWith(run + ": [[mechanism]] #2: unknown key 'windw' (expected one of "
                               "preset, name,"));
  const auto single = toml_file(dir, "single.toml", "[mechanism]\npreset = \"full\"\n");
  CHECK_THAT(message_of([&] { load_toml(single, hils::config::run_schema()); }),
             Catch::Contains("expected an array of tables [[mechanism]]"));
  // The [synthetic] table of `hils dump synthetic` refuses what only a study config holds.
  const auto synthetic = toml_file(dir, "synthetic.toml", "[synthetic]\nkind = \"model\"\n");
  CHECK_THAT(message_of([&] { load_toml(synthetic, hils::config::synthetic_schema()); }),
             Catch::StartsWith(synthetic + ": [synthetic]: unknown key 'kind'"));
  // Keys a table refuses with a hint: an old name says what to write instead.
  const auto renamed = toml_file(dir, "renamed.toml", "[source]\nquery_gain = 2.5\n");
  CHECK(message_of([&] { load_toml(renamed, study_schema()); }) ==
        renamed + ": [source] query_gain: renamed logit_std (the same number: the queries' "
                  "gain); write logit_std = 2.5");
}

TEST_CASE("TOML reader: typed values name the key and the expected type", "[config]") {
  using hils::config::ConfigValues;
  TempDir dir("config_types");
  const auto file = toml_file(dir, "types.toml",
                              "[source]\nHq = \"four\"\nquery_rho = true\nkind = 3\nlayers = 0\n"
                              "[study]\nmechanisms = [\"hils\", 2]\nkeep_scores = 1\n"
                              "[overlap]\nblock_sizes = [64, 1.5]\n"
                              "[extrapolation]\ndepths = 0.5\n");
  const ConfigValues c(hils::config::load_toml(file, hils::config::study_schema()), file);
  CHECK(message_of([&] { c.integer("source", "Hq", 4); }) ==
        file + ": [source].Hq: expected an integer, got string \"four\"");
  CHECK_THAT(message_of([&] { c.number("source", "query_rho", 0.0); }),
             Catch::StartsWith(file + ": [source].query_rho: expected a number"));
  CHECK_THAT(message_of([&] { c.text("source", "kind", "synthetic"); }),
             Catch::StartsWith(file + ": [source].kind: expected a string"));
  CHECK(message_of([&] { c.integer("source", "layers", 2, 1); }) ==
        file + ": [source].layers: expected an integer >= 1, got 0");
  CHECK(message_of([&] { c.texts("study", "mechanisms", {}); }) ==
        file + ": [study].mechanisms: expected an array of strings, got number 2");
  CHECK(message_of([&] { c.boolean("study", "keep_scores", true); }) ==
        file + ": [study].keep_scores: expected true or false, got number 1");
  CHECK(message_of([&] { c.integers("overlap", "block_sizes", {}, 1); }) ==
        file + ": [overlap].block_sizes: expected an array of integers >= 1, got number 1.5");
  CHECK(message_of([&] { c.numbers("extrapolation", "depths", {}); }) ==
        file + ": [extrapolation].depths: expected an array of numbers, got number 0.5");
  // Absent keys and tables take the default; no file at all is "(defaults)".
  CHECK(c.integer("geometry", "S", 64) == 64);
  CHECK(ConfigValues().integers("fidelity", "lengths", {4096}) == std::vector<int64_t>{4096});
  CHECK(ConfigValues().file() == "(defaults)");
}

TEST_CASE("TOML reader: inf and nan are refused naming the key and the line", "[config]") {
  // TOML has inf and nan; no setting takes one. They were passed on as the JSON strings
  // "Infinity" and "NaN": `expected a number, got string "Infinity"` for `rope_theta = inf`.
  using hils::config::load_toml;
  TempDir dir("config_non_finite");
  const auto theta = toml_file(dir, "theta.toml", "[run]\nrope_theta = inf\n");
  CHECK(message_of([&] { load_toml(theta, hils::config::run_schema()); }) ==
        theta + ": [run].rope_theta (line 2): expected a finite number, found inf");
  const auto scale = toml_file(dir, "scale.toml",
                               "[[mechanism]]\npreset = \"full\"\n"
                               "[[mechanism]]\npreset = \"hils\"\nscale = -inf\n");
  CHECK(message_of([&] { load_toml(scale, hils::config::run_schema()); }) ==
        scale + ": [[mechanism]] #2.scale (line 5): expected a finite number, found -inf");
  const auto depths = toml_file(dir, "depths.toml", "[extrapolation]\ndepths = [0.0, nan]\n");
  CHECK(message_of([&] { load_toml(depths, hils::config::study_schema()); }) ==
        depths + ": [extrapolation].depths[1] (line 2): expected a finite number, found nan");
  // Finite numbers, large ones included, pass.
  const auto large = toml_file(dir, "large.toml", "[run]\nrope_theta = 1e300\n");
  CHECK(message_of([&] { load_toml(large, hils::config::run_schema()); }).empty());
}

TEST_CASE("TOML reader: every shipped config loads under one command's schema", "[config]") {
  const std::vector<const hils::config::TomlSchema*> schemas = {
      &hils::config::run_schema(), &hils::config::synthetic_schema(),
      &hils::config::study_schema()};
  int files = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(HILS_SOURCE_DIR) /
                                           "experiments" / "configs")) {
    if (entry.path().extension() != ".toml") continue;
    ++files;
    std::vector<std::string> refusals;
    for (const auto* schema : schemas) {
      const std::string message =
          message_of([&] { hils::config::load_toml(entry.path(), *schema); });
      if (!message.empty()) refusals.push_back(message);
    }
    INFO(entry.path().string());
    CHECK(refusals.size() == schemas.size() - 1);  // exactly one command reads it
  }
  CHECK(files >= 3);
}
