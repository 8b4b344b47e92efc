// Values a user types that the `hils` tool must read as written or refuse by name (the
// battery's third round): integers in base 10 and in range, sizes that overflow, duplicate layers,
// mechanism names that are not one results group, config paths that are not files.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include <H5Cpp.h>

#include "io/activation_file.hpp"
#include "io/hdf5_util.hpp"
#include "support.hpp"

using hils::test::quoted;
using hils::test::run_hils;
using hils::test::TempDir;
namespace fs = std::filesystem;

namespace {

fs::path write_small(const TempDir& dir, const std::string& name = "acts.h5") {
  return hils::test::write_small_activation_file(dir, 3, name);
}

// `hils <args>`: exit 2, the output holds `message`, and dir/out.h5 was not written.
void require_refused(const TempDir& dir, const std::string& args, const std::string& message) {
  hils::test::require_refused(args, message, dir / "out.h5");
}

}  // namespace

TEST_CASE("integer flags are read in base 10 and within range", "[cli][values]") {
  TempDir dir("integer_flags");
  // CLI11 alone read 0100 as octal (T = 64) and clamped an overflow to the largest int64.
  auto dump = run_hils("dump synthetic -T 0100 -S 16 -o " + quoted(dir / "a.h5"));
  INFO(dump.output);
  REQUIRE(dump.exit_code == 0);
  CHECK_THAT(dump.output, Catch::Contains("T 100 "));
  require_refused(dir, "dump synthetic -T 99999999999999999999 -o " + quoted(dir / "out.h5"),
                  "--slots: expected an integer from -9223372036854775808 to 9223372036854775807, "
                  "got 99999999999999999999");
  require_refused(dir, "fidelity --lengths 1024 18446744073709551617 --out " + quoted(dir / "out.h5"),
                  "--lengths: expected an integer from");
  require_refused(dir, "run " + quoted(dir / "a.h5") + " --preset hils -S 99999999999999999999 -o " +
                           quoted(dir / "out.h5"),
                  "--chunk: expected an integer from");
  require_refused(dir, "verify " + quoted(dir / "a.h5") + " --max-messages 0",
                  "--max-messages: Value 0 not in range 1 to 9223372036854775807");
}

TEST_CASE("hils run refuses K near the int64 limit naming K, and duplicate layers",
          "[cli][values]") {
  TempDir dir("run_values");
  const auto acts = write_small(dir);
  const std::string run = "run " + quoted(acts) + " -o " + quoted(dir / "out.h5");
  // K + 2 overflowed: the size check passed and the allocation failed ("out of memory"). The
  // reference's own check (run_mechanism, tests/python/test_bad_input.py) is behind this one.
  require_refused(dir, run + " --preset hils --landmarks true -S 8 -K 9223372036854775807",
                  "(dv=6 + K+3=9223372036854775808) + Hkv=2 x K=9223372036854775807 values); "
                  "not one computed query fits, or -K at most ");
  // A layer twice was found only when its datasets were written the second time.
  require_refused(dir, run + " --preset full --landmarks true -S 8 --layers 1,0,1",
                  "--layers: expected distinct layer indices, got 1 twice");
}

TEST_CASE("a mechanism name must be one results group", "[cli][values]") {
  TempDir dir("mechanism_names");
  const auto acts = write_small(dir);
  const std::string run =
      "run " + quoted(acts) + " -o " + quoted(dir / "out.h5") + " --preset full --landmarks true -S 8";
  // Each was accepted and wrote its layers under nested groups (/a/b/layer0) or at the root.
  for (const std::string name : {"a/b", "..", "x/../y"})
    require_refused(dir, run + " --name '" + name + "'",
                    "mechanism name: expected a results group name (UTF-8, not empty, no '/', "
                    "not . or ..), got '" + name + "'");
  std::ofstream(dir / "empty_name.toml") << "[[mechanism]]\npreset = \"full\"\nname = \"\"\n";
  require_refused(dir, run + " -c " + quoted(dir / "empty_name.toml"), "got ''");
}

TEST_CASE("a config path that is a folder or a FIFO says so", "[cli][values]") {
  TempDir dir("config_paths");
  fs::create_directory(dir / "folder.toml");
  REQUIRE(::mkfifo((dir / "fifo.toml").c_str(), 0600) == 0);
  // Both were "found no such file".
  require_refused(dir, "fidelity -c " + quoted(dir / "folder.toml") + " --out " + quoted(dir / "out.h5"),
                  "folder.toml: expected a TOML configuration file, found a folder");
  require_refused(dir, "dump synthetic -c " + quoted(dir / "fifo.toml") + " -o " + quoted(dir / "out.h5"),
                  "fifo.toml: expected a TOML configuration file, found a FIFO, socket or device");
}

namespace {

// A minimal verify file (data/verify_format.md): `spec` over T = 4, d = dv = 2, one head, the
// kernel's o; `extra` adds to it (root group, /inputs, /outputs).
template <class Extra>
void write_verify_file(const fs::path& path, const std::string& spec, Extra extra) {
  H5::H5File file(path.string(), H5F_ACC_TRUNC);
  H5::Group root = file.openGroup("/");
  hils::io::write_attribute(root, "format", std::string("hils-verify"));
  hils::io::write_attribute(root, "format_version", int64_t{1});
  if (!spec.empty()) hils::io::write_attribute(root, "spec", spec);
  hils::io::write_attribute(root, "input_precision", std::string("fp32"));
  H5::Group inputs = file.createGroup("inputs"), outputs = file.createGroup("outputs");
  const std::vector<double> x = {0.5, -1, 0.25, 2, -0.5, 1, 0, 0.75};
  for (const char* name : {"q", "k", "v"})
    hils::io::write_doubles(inputs, name, x.data(), {1, 4, 2}, false);
  hils::io::write_doubles(outputs, "o", x.data(), {1, 4, 2}, false);
  extra(root, inputs, outputs);
}

}  // namespace

TEST_CASE("hils verify: values its reader used to misread are refused or named", "[cli][values]") {
  TempDir dir("verify_values");
  const auto path = dir / "dump.h5";
  auto verify = [&](const std::string& flags = "") { return run_hils("verify " + flags + quoted(path)); };
  // The spec as an array of two strings: the first was used, silently.
  write_verify_file(path, "", [](H5::Group& root, H5::Group&, H5::Group&) {
    const char* specs[2] = {R"({"preset": "full", "S": 2})", R"({"preset": "nsa"})"};
    const hsize_t two = 2;
    root.createAttribute("spec", H5::StrType(H5::PredType::C_S1, H5T_VARIABLE),
                         H5::DataSpace(1, &two))
        .write(H5::StrType(H5::PredType::C_S1, H5T_VARIABLE), specs);
  });
  auto r = verify();
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("attribute spec: expected one string, found an array of 2"));
  // K above int64's range arrived wrapped ("got -1").
  write_verify_file(path, R"({"preset": "nsa", "S": 2, "K": 18446744073709551615})",
                    [](H5::Group&, H5::Group&, H5::Group&) {});
  r = verify();
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("spec.K: expected an integer within int64's range, got "
                                       "number 18446744073709551615"));
  // A selection index beyond int32 was "expected chunk indices >= -1".
  write_verify_file(path, R"({"preset": "nsa", "S": 2, "K": 1})",
                    [](H5::Group&, H5::Group&, H5::Group& outputs) {
                      const std::vector<int64_t> selection = {-1, -1, 0, int64_t{1} << 40};
                      hils::io::write_int64s(outputs, "selection", selection.data(), {1, 4, 1});
                    });
  r = verify();
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("expected chunk indices from -1 (padding) to 2147483647 "
                                       "(int32), found 1099511627776"));
  // A -1 padding written as uint64 (numpy's astype(np.uint64)) was named as 9223372036854775807
  // (HDF5 clips it on conversion), a value not in the file; now the value stored.
  write_verify_file(path, R"({"preset": "nsa", "S": 2, "K": 1})",
                    [](H5::Group&, H5::Group&, H5::Group& outputs) {
                      const std::vector<uint64_t> selection = {~uint64_t{0}, 0, 0, 0};
                      const hsize_t dims[3] = {1, 4, 1};
                      outputs.createDataSet("selection", H5::PredType::STD_U64LE,
                                            H5::DataSpace(3, dims))
                          .write(selection.data(), H5::PredType::NATIVE_UINT64);
                    });
  r = verify();
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("selection: expected integers within int64's range (-1 "
                                       "needs a signed type), found 18446744073709551615 at "
                                       "[0, 0, 0] (flat index 0) in unsigned 64-bit integers"));
  // A prior the spec's rule does not read passed without a word; now named (--strict: exit 2).
  // The kernel's output here is its selection alone: no candidate beyond the window, all -1.
  write_verify_file(path, R"({"preset": "nsa", "S": 2, "K": 1})",
                    [](H5::Group&, H5::Group& inputs, H5::Group& outputs) {
                      const std::vector<double> prior = {1, 2, 3, 4};
                      hils::io::write_doubles(inputs, "prior", prior.data(), {1, 2, 2}, false);
                      outputs.unlink("o");
                      const std::vector<int64_t> none = {-1, -1, -1, -1};
                      hils::io::write_int64s(outputs, "selection", none.data(), {1, 4, 1});
                    });
  r = verify();
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("not compared: inputs/prior (the spec's prior rule"));
  CHECK(verify("--strict ").exit_code == 2);
  // A soft link the format does not define that leads nowhere (a dataset since removed) made
  // the file "corrupt: Group::childObjType: H5Oget_info_by_name failed" (exit 2); now named
  // as not compared, as any object the format does not define.
  write_verify_file(path, R"({"preset": "nsa", "S": 2, "K": 1})",
                    [](H5::Group& root, H5::Group&, H5::Group& outputs) {
                      outputs.unlink("o");
                      const std::vector<int64_t> none = {-1, -1, -1, -1};
                      hils::io::write_int64s(outputs, "selection", none.data(), {1, 4, 1});
                      root.link(H5L_TYPE_SOFT, "/removed", "latest");
                    });
  r = verify();
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("not compared: /latest (a link that cannot be followed)"));
  // Variable-length strings in HDF5's default character set (ASCII: the C API's and h5py's
  // string_dtype("ascii")) were read as UTF-8, which HDF5 does not convert: "expected a
  // complete HDF5 file, found one the HDF5 library cannot read (corrupt: Attribute::read: H5Aread
  // failed)". Now read in their own set: the file is judged (o = the inputs: a FAIL).
  write_verify_file(path, "", [](H5::Group& root, H5::Group&, H5::Group&) {
    const H5::StrType ascii(H5::PredType::C_S1, H5T_VARIABLE);
    for (const auto& [name, value] : {std::pair<const char*, std::string>{"format", "hils-verify"},
                                      {"spec", R"({"preset": "full"})"},
                                      {"input_precision", "fp32"}}) {
      if (root.attrExists(name)) root.removeAttr(name);
      root.createAttribute(name, ascii, H5::DataSpace(H5S_SCALAR)).write(ascii, value);
    }
  });
  r = verify();
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("oracle: full:"));
}

TEST_CASE("paths and names that are not UTF-8 are recorded and resumed", "[cli][values]") {
  TempDir dir("not_utf8");
  const auto acts = dir / "a\xff.h5", results = dir / "r\xff.h5";
  REQUIRE(run_hils("-q dump synthetic -T 64 -S 16 -o " + quoted(acts)).exit_code == 0);
  // The config attribute's JSON threw "invalid UTF-8 byte" (exit 3) for the input path.
  const std::string run = "-q run " + quoted(acts) + " -o " + quoted(results) + " --landmarks true -S 16";
  auto first = run_hils(run + " --preset full");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  auto resumed = run_hils(run + " --preset full,swa --resume");
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Catch::Contains("1 unit(s) computed, 1 already complete"));
  CHECK(run_hils("info --json " + quoted(results)).exit_code == 0);
  // A mechanism name names a results group and a unit of complete_units: it must be UTF-8.
  require_refused(dir, "-q run " + quoted(acts) + " -o " + quoted(dir / "out.h5") +
                           " --landmarks true -S 16 --preset full --name 'm\xff'",
                  "mechanism name: expected a results group name (UTF-8");
}

TEST_CASE("a full disk while dumping activations is one message", "[cli][values]") {
  TempDir dir("dump_full_disk");
  // The activation writer's datasets were closed by their destructors, which printed
  // "DataSet::~DataSet - H5Dclose failed" before the message.
  auto r = hils::test::run_hils_with_file_limit(
      "-q dump synthetic -T 512 -S 16 -o " + quoted(dir / "out.h5"), 10);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("expected room to write the output, found File too large"));
  CHECK_THAT(r.output, !Catch::Contains("H5Dclose"));
  CHECK_FALSE(fs::exists(dir / "out.h5"));
}

TEST_CASE("an output path that is a FIFO (or a device) is refused, not replaced", "[cli][values]") {
  TempDir dir("output_device");
  const auto acts = write_small(dir);
  // A FIFO stands in for /dev/null: as root, `-o /dev/null` replaced the device node with a
  // regular file (the writer renames its temporary file over the name). Never a real device
  // here: a regression would destroy it.
  const auto fifo = dir / "fifo.h5";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string expected =
      "expected a regular file or a new name for the output, found a device, FIFO or socket";
  for (const std::string& command :
       {"run " + quoted(acts) + " --preset full --landmarks true -S 8 -o " + quoted(fifo),
        "dump synthetic -T 64 -o " + quoted(fifo),
        "fidelity --lengths 1024 --layers 1 --queries 2 --out " + quoted(fifo)}) {
    auto r = run_hils("-q " + command);
    INFO(command + "\n" + r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(expected));
    CHECK(fs::is_fifo(fifo));
  }
}

TEST_CASE("a study's lists are not empty and its overlap blocks fit the tail", "[cli][values]") {
  TempDir dir("study_lists");
  auto refused = [&](const std::string& study, const std::string& toml,
                     const std::string& message) {
    std::ofstream(dir / "c.toml") << toml;
    const std::string queries = study == "overlap" ? "" : " --queries 2";  // overlap has none
    require_refused(dir, "-q " + study + " --lengths 1024 --layers 1" + queries + " -c " +
                             quoted(dir / "c.toml") + " --out " + quoted(dir / "out.h5"),
                    message);
  };
  // Each ran: a block of 99999999 queries gave NaN overlaps, empty lists ran nothing of that part.
  refused("overlap", "[overlap]\nblock_sizes = [4, 99999999]\n",
          "[overlap].block_sizes: expected block sizes of at most tail_queries = 256, got 99999999");
  refused("overlap", "[overlap]\ntail_queries = 8\nblock_sizes = [1, 2]\nfinal_block = 16\n",
          "[overlap].final_block: expected at most tail_queries = 8, got 16");
  refused("overlap", "[overlap]\nblock_sizes = []\n",
          "[overlap].block_sizes: expected at least one block size, got []");
  refused("extrapolate", "[extrapolation]\nencodings = []\n",
          "[extrapolation].encodings: expected at least one positional encoding, got []");
  refused("fidelity", "[study]\nmechanisms = []\n",
          "[study].mechanisms: expected at least one mechanism, got []");
}
