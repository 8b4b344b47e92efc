// `hils cases`: the oracle's hard cases written as verify files without outputs (data/hard_cases.md,
// "From the command line"), read back with `hils verify`'s own reader, completed with outputs as
// a kernel's harness would and judged by `hils verify`; and its refusals of bad input.
#include <catch2/catch.hpp>

#include <algorithm>

#include <fstream>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

#include "cli/verify/verify_file.hpp"
#include "config/spec_codec.hpp"
#include "hils/analysis/hard_cases.hpp"
#include "io/hdf5_util.hpp"
#include "support.hpp"

using hils::test::quoted;
using hils::test::run_hils;
using hils::test::TempDir;
namespace fs = std::filesystem;

namespace {

// A small geometry whose spec reads a prior (shared), so that /inputs/prior is written too;
// --max-T 300 leaves out many_candidates (T = 16 + 300 * 8).
const std::string kFlags =
    "--preset hils --landmarks false --prior-rule shared -S 8 -W 16 -K 3 --Hq 4 --Hkv 2 -d 16 "
    "--dv 8 --precision bf16 --max-T 300";

hils::MechanismSpec flags_spec() {
  hils::MechanismSpec spec = hils::preset("hils");
  spec.landmarks = false;
  spec.prior_rule = hils::PriorRule::shared;
  spec.S = 8, spec.W = 16, spec.K = 3;
  return spec;
}

// What kFlags asks for, built in this process by the same library.
hils::oracle::HardCases expected_cases() {
  return hils::oracle::hard_cases(flags_spec(), {4, 2, 16, 8},
                                  {hils::oracle::InputPrecision::bf16, 1, 300});
}

std::vector<hils::Matrix<double>> heads_of(const std::vector<hils::Matrix<float>>& heads) {
  std::vector<hils::Matrix<double>> out;
  for (const auto& m : heads) out.push_back(m.cast<double>());
  return out;
}

std::vector<hils::Vector<double>> vectors_of(const std::vector<hils::Vector<float>>& heads) {
  std::vector<hils::Vector<double>> out;
  for (const auto& v : heads) out.push_back(v.cast<double>());
  return out;
}

// The reference run in float on a file's inputs (a correct kernel's o and lse), written into its
// /outputs as a kernel's harness would; `o_error` is added to one entry of o. rows: that many
// rows from `first` (a file with /queries holds its queries' rows; -1: all T).
void add_float_outputs(const fs::path& file, double o_error, int64_t first = 0, int64_t rows = -1) {
  const hils::AttentionInputs<double> in =
      hils::cli::verify::read_inputs(file, hils::io::open_hdf5(file));  // closed again
  hils::AttentionInputs<float> f;
  for (const auto& m : in.q) f.q.push_back(m.cast<float>());
  for (const auto& m : in.k) f.k.push_back(m.cast<float>());
  for (const auto& m : in.v) f.v.push_back(m.cast<float>());
  for (const auto& m : in.prior) f.prior.push_back(m.cast<float>());
  const auto run = hils::run_mechanism(flags_spec(), f);
  std::vector<hils::Matrix<float>> o;
  std::vector<hils::Vector<float>> lse;
  for (const auto& head : run.heads) {
    const int64_t n = rows < 0 ? head.o.rows() : rows;
    o.push_back(head.o.middleRows(first, n)), lse.push_back(head.lse.segment(first, n));
  }
  auto o_double = heads_of(o);
  o_double[1](o_double[1].rows() - 1, 2) += o_error;
  H5::H5File out(file.string(), H5F_ACC_RDWR);
  H5::Group root = out.openGroup("/");
  std::vector<double> flat;
  for (const auto& m : o_double) flat.insert(flat.end(), m.data(), m.data() + m.size());
  hils::io::write_doubles(root, "outputs/o", flat.data(),
                          {o_double.size(), static_cast<hsize_t>(o_double[0].rows()),
                           static_cast<hsize_t>(o_double[0].cols())},
                          true);
  flat.clear();
  for (const auto& v : vectors_of(lse)) flat.insert(flat.end(), v.data(), v.data() + v.size());
  hils::io::write_doubles(root, "outputs/lse", flat.data(),
                          {lse.size(), static_cast<hsize_t>(lse[0].size())}, true);
}

}  // namespace

TEST_CASE("hils cases writes one verify file per case: the inputs of hard_cases, spec and "
          "precision", "[cli][cases]") {
  TempDir dir("cases_write");
  const auto out = dir / "cases";
  const auto r = run_hils("cases " + kFlags + " -o " + quoted(out));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto expected = expected_cases();
  REQUIRE(expected.cases.size() >= 10);
  REQUIRE(expected.skipped.size() == 1);
  CHECK_THAT(r.output, Catch::Contains("skipped many_candidates: needs T = 2416 > max_T = 300"));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(out)) files += entry.is_regular_file();
  CHECK(files == expected.cases.size());  // and no temporary file left
  for (const auto& c : expected.cases) {
    const fs::path file = out / (c.name + ".h5");
    INFO(c.name);
    CHECK_THAT(r.output, Catch::Contains(c.name + "  T " + std::to_string(c.inputs.q[0].rows()) +
                                         "  -> " + file.string()));
    const H5::H5File h5 = hils::io::open_hdf5(file);
    const H5::Group root = h5.openGroup("/");
    CHECK(hils::io::read_string_attribute(file, root, "/", "format") == "hils-verify");
    CHECK(hils::io::read_int_attribute(file, root, "/", "format_version") == 1);
    CHECK(hils::io::read_string_attribute(file, root, "/", "input_precision") == "bf16");
    const auto spec = hils::config::spec_from_json(
        nlohmann::json::parse(hils::io::read_string_attribute(file, root, "/", "spec")), "spec");
    CHECK(hils::config::spec_to_json(spec) == hils::config::spec_to_json(flags_spec()));
    const auto in = hils::cli::verify::read_inputs(file, h5);
    REQUIRE(in.q.size() == 4);
    REQUIRE(in.k.size() == 2);
    REQUIRE(in.prior.size() == 4);  // the shared prior rule reads one
    CHECK(in.q_retrieval.empty());
    CHECK(in.v[0].cols() == 8);
    for (size_t h = 0; h < 4; ++h) {
      CHECK(in.q[h] == c.inputs.q[h]);  // bit for bit: float32 holds every bf16 value
      CHECK(in.prior[h] == c.inputs.prior[h]);
    }
    for (size_t g = 0; g < 2; ++g) CHECK((in.k[g] == c.inputs.k[g] && in.v[g] == c.inputs.v[g]));
    CHECK_FALSE(hils::io::has_object(root, "outputs"));
  }
}

TEST_CASE("a hils cases file completed with a kernel's outputs is judged by hils verify",
          "[cli][cases]") {
  TempDir dir("cases_verify");
  const auto out = dir / "cases";
  REQUIRE(run_hils("cases " + kFlags + " -o " + quoted(out)).exit_code == 0);
  const fs::path file = out / "tied_chunks.h5";

  // Before the harness adds outputs: bad input naming what is missing (was "found nothing").
  auto r = run_hils("verify " + quoted(file));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("inputs only, as `hils cases` writes them"));
  // A harness that made /outputs but wrote nothing into it: the oracle's verdict, a failure
  // with nothing compared (oracle.cpp), not a pass.
  fs::copy_file(file, dir / "empty.h5");
  H5::H5File((dir / "empty.h5").string(), H5F_ACC_RDWR).createGroup("outputs");
  r = run_hils("verify " + quoted(dir / "empty.h5"));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("the kernel outputs are empty: nothing to compare"));

  fs::copy_file(file, dir / "wrong.h5");
  add_float_outputs(file, 0.0);
  r = run_hils("verify " + quoted(file));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  add_float_outputs(dir / "wrong.h5", 0.05);  // one entry of o off by 0.05: far past float's error
  r = run_hils("verify " + quoted(dir / "wrong.h5"));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("FAIL"));
}

TEST_CASE("hils cases --last-queries writes each case's last slots as /queries, judged as "
          "decode steps by hils verify", "[cli][cases]") {
  TempDir dir("cases_last");
  const auto out = dir / "cases";
  const auto r = run_hils("cases " + kFlags + " --last-queries 5 -o " + quoted(out));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const auto& c : expected_cases().cases) {
    INFO(c.name);
    const int64_t T = c.inputs.q[0].rows();
    const fs::path file = out / (c.name + ".h5");
    const H5::H5File h5 = hils::io::open_hdf5(file);
    const auto queries = hils::io::read_int64s(hils::io::open_dataset(file, h5.openGroup("/"), "queries"));
    std::vector<int64_t> expected;
    for (int64_t t = std::max<int64_t>(0, T - 5); t < T; ++t) expected.push_back(t);
    CHECK(queries == expected);  // single_slot (T = 1): [0]
    CHECK_THAT(r.output, Catch::Contains(file.string() + "  (queries " + std::to_string(expected.front()) +
                                         ".." + std::to_string(T - 1) + ")"));
  }
  // The harness's rows for slots T-5..T-1 pass; the rows of T-6..T-2 (each step one slot late)
  // and the rows with one entry off by 0.5 fail.
  const fs::path file = out / "large_logits.h5";
  const int64_t T = hils::cli::verify::read_inputs(file, hils::io::open_hdf5(file)).q[0].rows();
  fs::copy_file(file, dir / "late.h5");
  fs::copy_file(file, dir / "off.h5");
  add_float_outputs(file, 0.0, T - 5, 5);
  auto v = run_hils("verify " + quoted(file));
  INFO(v.output);
  CHECK(v.exit_code == 0);
  add_float_outputs(dir / "late.h5", 0.0, T - 6, 5);
  CHECK(run_hils("verify " + quoted(dir / "late.h5")).exit_code == 1);
  add_float_outputs(dir / "off.h5", 0.5, T - 5, 5);  // o's tolerance here is ~0.05
  CHECK(run_hils("verify " + quoted(dir / "off.h5")).exit_code == 1);
}

TEST_CASE("hils cases --list describes the cases and writes nothing", "[cli][cases]") {
  TempDir dir("cases_list");
  const auto out = dir / "cases";
  const auto r = run_hils("cases " + kFlags + " --list -o " + quoted(out));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  for (const auto& c : expected_cases().cases)
    CHECK_THAT(r.output, Catch::Contains(c.name + "  T " + std::to_string(c.inputs.q[0].rows()) +
                                         "  " + c.catches));
  CHECK_THAT(r.output, Catch::Contains("skipped many_candidates: needs T = 2416 > max_T = 300"));
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("hils cases refuses bad input naming the option, writing nothing", "[cli][cases]") {
  TempDir dir("cases_bad");
  const auto out = dir / "cases";
  const std::string spec = "--preset nsa -S 8 -W 16 -K 3 ";
  const std::string shape = "--Hq 4 --Hkv 2 -d 16 ";
  using hils::test::require_refused;
  require_refused("cases " + spec + shape + "--precision fp16 -o " + quoted(out),
                  "--precision: expected \"fp32\" or \"bf16\", got \"fp16\"", out);
  require_refused("cases " + spec + "--Hq 3 --Hkv 2 -d 16 -o " + quoted(out),
                  "--Hq: expected a multiple of Hkv = 2, got 3", out);
  require_refused("cases " + spec + "--Hq 4 --Hkv 0 -d 16 -o " + quoted(out),
                  "--Hkv: expected an integer >= 1, got 0", out);
  require_refused("cases " + spec + shape + "--dv 0 -o " + quoted(out),
                  "--dv: expected an integer >= 1, got 0", out);
  require_refused("cases " + spec + shape + "--length-multiple 0 -o " + quoted(out),
                  "--length-multiple: expected an integer >= 1, got 0", out);
  require_refused("cases " + spec + shape + "--max-T -1 -o " + quoted(out),
                  "--max-T: expected 0 (no limit) or a length >= 1, got -1", out);
  require_refused("cases " + spec + shape + "--last-queries -2 -o " + quoted(out),
                  "--last-queries: expected 0 (every slot) or a count >= 1, got -2", out);
  require_refused("cases --preset nsa -S 8 -W 16 -K -1 " + shape + "-o " + quoted(out),
                  "K: expected a chunk count of at least 0, got -1", out);
  require_refused("cases --preset nsb " + shape + "-o " + quoted(out), "preset: expected one of",
                  out);
  require_refused("cases " + shape + "-o " + quoted(out), "no mechanism: give --preset", out);
  require_refused("cases " + spec + shape, "--out: expected the folder", out);
  require_refused("cases " + spec + "--Hkv 2 -d 16 -o " + quoted(out), "--Hq is required", out);
  // An existing file as --out is refused and left as it was.
  const auto file = dir / "a_file";
  { std::ofstream(file) << "keep"; }
  const auto r = run_hils("cases " + spec + shape + "-o " + quoted(file));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--out: expected a folder"));
  CHECK(hils::test::file_bytes(file) == "keep");
  // A full disk (a 150 KiB file-size limit: gaussian.h5's k and v, under HDF5's 64 KiB sieve
  // buffer, are flushed when their dataset closes) was two "DataSet::~DataSet - H5Dclose
  // failed" lines from the destructors before the message; now the message alone.
  const auto full = hils::test::run_shell(
      "prlimit --fsize=153600 '" + std::string(HILS_EXE) + "' -q cases --preset nsa -S 16 -W 32 "
      "-K 4 --Hq 4 --Hkv 2 -d 32 -o " + quoted(dir / "full") + " 2>&1");
  INFO(full.output);
  CHECK(full.exit_code == 2);
  CHECK_THAT(full.output, Catch::StartsWith("hils: bad input: ") &&
                              Catch::Contains("expected room to write the output, found File "
                                              "too large"));
  CHECK(std::count(full.output.begin(), full.output.end(), '\n') == 1);
}
