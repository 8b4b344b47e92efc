// --jobs N (units computed at once in one process, analysis::ThreadedUnitRunner): every study and
// `hils run` write the file of one unit at a time, bit for bit (tests/experiments/compare_results.py);
// values it cannot use are refused naming --jobs; the size checks count N units.
#include <catch2/catch.hpp>

#include <string>

#include <fmt/format.h>

#include "support.hpp"

using hils::test::quoted;
using hils::test::require_refused;
using hils::test::require_same_results;
using hils::test::run_hils;
using hils::test::TempDir;

namespace {

// `hils -q <command> --out <dir/name> <args> --jobs <jobs>` -> the file (REQUIREs success).
std::filesystem::path study_file(const TempDir& dir, const std::string& command,
                                 const std::string& args, int jobs) {
  const auto out = dir / fmt::format("{}_{}.h5", command, jobs);
  const auto r = run_hils(fmt::format("-q {} --out {} {} --jobs {}", command, quoted(out), args,
                                      jobs));
  INFO(command << " --jobs " << jobs << "\n" << r.output);
  REQUIRE(r.exit_code == 0);
  return out;
}

}  // namespace

TEST_CASE("jobs: each study writes the file of one unit at a time", "[cli][jobs]") {
  TempDir dir("jobs_studies");
  // 2 lengths x 3 layers x 2 KV groups = 12 fidelity units, 8 overlap units (W = 128: T = 256
  // has queries with retrieval candidates); extrapolation runs several unit lists in turn.
  const std::string fidelity =
      "--lengths 256 512 --n-layers 3 --queries 8 --mechanisms mean taylor_entropy --W 128";
  const auto f1 = study_file(dir, "fidelity", fidelity, 1);
  require_same_results(f1, study_file(dir, "fidelity", fidelity, 2));
  require_same_results(f1, study_file(dir, "fidelity", fidelity, 3));
  const std::string overlap = "--lengths 256 512 --n-layers 2 --W 128";
  const auto o1 = study_file(dir, "overlap", overlap, 1);
  require_same_results(o1, study_file(dir, "overlap", overlap, 3));
  const std::string extrapolate = "--lengths 256 512 --n-layers 1 --queries 4 --S 32 --W 128";
  const auto e1 = study_file(dir, "extrapolate", extrapolate, 1);
  require_same_results(e1, study_file(dir, "extrapolate", extrapolate, 2));
  // More units at once than units (2 needle units per encoding): the same.
  require_same_results(e1, study_file(dir, "extrapolate", extrapolate, 8));
}

TEST_CASE("jobs: hils run writes the file of one unit at a time", "[cli][jobs]") {
  TempDir dir("jobs_run");
  const auto acts = hils::test::write_small_activation_file(dir, 11);
  // 2 layers x 3 mechanisms = 6 units.
  auto run = [&](int jobs) {
    const auto out = dir / fmt::format("run_{}.h5", jobs);
    const auto r = run_hils(fmt::format("-q run {} -o {} -p swa,full,nsa -S 8 -W 16 -K 2 "
                                        "--landmarks true --jobs {}",
                                        quoted(acts), quoted(out), jobs));
    INFO("--jobs " << jobs << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return out;
  };
  const auto one = run(1);
  require_same_results(one, run(3));
  require_same_results(one, run(8));  // more than the units
}

TEST_CASE("jobs: zero, negative or absurd counts are refused naming --jobs", "[cli][jobs]") {
  TempDir dir("jobs_refused");
  const auto out = dir / "f.h5";
  for (const std::string jobs : {"0", "-2", "100000"}) {
    require_refused(fmt::format("fidelity --out {} --lengths 256 --W 128 --jobs {}", quoted(out),
                                jobs),
                    "--jobs: expected an integer from 1 to", out);
    require_refused(fmt::format("studies --out {} --no-model --jobs {}", quoted(dir / "s"), jobs),
                    "--jobs: expected an integer from 1 to", dir / "s" / "fidelity_synthetic.h5");
  }
  const auto acts = hils::test::write_small_activation_file(dir, 3);
  require_refused(fmt::format("run {} -o {} -p swa -S 8 -W 16 --landmarks true --jobs 0",
                              quoted(acts), quoted(out)),
                  "--jobs: expected an integer from 1 to", out);
}

TEST_CASE("jobs: the size checks count every unit computed at once", "[cli][jobs]") {
  TempDir dir("jobs_memory");
  const auto out = dir / "f.h5";
  // A K no machine holds: refused, the message naming each unit's share under --jobs 2.
  require_refused(fmt::format("fidelity --out {} --lengths 4096 --W 128 --K 4000000000000 "
                              "--jobs 2",
                              quoted(out)),
                  "shared by 2 units computed at once (--jobs 2;", out);
}
