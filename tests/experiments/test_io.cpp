// Activation and results files through the library: round trips, atomic writes, resuming.
#include <catch2/catch.hpp>

#include "hils/analysis/units.hpp"
#include "io/activation_file.hpp"
#include "io/file_error.hpp"
#include "io/results_file.hpp"
#include "io/results_sink.hpp"
#include "support.hpp"

using hils::test::TempDir;
namespace io = hils::io;

TEST_CASE("activation files round-trip exactly in float64 and to float precision in float32",
          "[io]") {
  TempDir dir("io_roundtrip");
  auto original = hils::test::small_activation_file(3);
  io::write_activation_file(dir / "f64.h5", original, io::StorageType::float64);
  io::write_activation_file(dir / "f32.h5", original, io::StorageType::float32);
  auto f64 = io::read_activation_file(dir / "f64.h5");
  auto f32 = io::read_activation_file(dir / "f32.h5");
  CHECK(f64.meta.position_ids == original.meta.position_ids);
  CHECK(f64.meta.landmarks == original.meta.landmarks);
  CHECK(f64.meta.source == original.meta.source);
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t h = 0; h < 4; ++h) {
      CHECK(f64.layers[l].inputs.q[h] == original.layers[l].inputs.q[h]);
      double err = (f32.layers[l].inputs.q[h] - original.layers[l].inputs.q[h]).cwiseAbs().maxCoeff();
      CHECK(err < 1e-6);
      CHECK(err > 0);  // really stored as float32
    }
    CHECK(f64.layers[l].inputs.v[1] == original.layers[l].inputs.v[1]);
    CHECK(f64.layers[l].hidden == original.layers[l].hidden);
  }
}

TEST_CASE("the activation writer rejects data that disagree with the metadata", "[io]") {
  TempDir dir("io_writer_checks");
  auto file = hils::test::small_activation_file(4);
  auto nan = file;
  nan.layers[1].inputs.k[0](3, 2) = std::nan("");
  CHECK_THROWS_WITH(io::write_activation_file(dir / "x.h5", nan),
                    Catch::Contains("layer1/k") && Catch::Contains("NaN"));
  auto shape = file;
  shape.layers[0].inputs.v.pop_back();
  CHECK_THROWS_WITH(io::write_activation_file(dir / "x.h5", shape),
                    Catch::Contains("layer0/v"));
  CHECK_FALSE(std::filesystem::exists(dir / "x.h5"));
  CHECK(hils::test::count_temp_files(dir.path()) == 0);
}

TEST_CASE("results writer: nothing under the final name before commit", "[io]") {
  TempDir dir("io_atomic");
  auto path = dir / "r.h5";
  {
    auto writer = io::ResultsWriter::create(path, {{{"study", "x"}}, 9, "test"});
    writer.write_vector("a/b", std::vector<double>{1, 2, 3}, "numbers");
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK(hils::test::count_temp_files(dir.path()) == 1);
  }  // destroyed without commit
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(hils::test::count_temp_files(dir.path()) == 0);
}

TEST_CASE("results writer: checkpoint publishes, commit finalizes, datasets are written once",
          "[io]") {
  TempDir dir("io_checkpoint");
  auto path = dir / "r.h5";
  auto writer = io::ResultsWriter::create(path, {{{"study", "x"}}, 9, "test"});
  hils::Matrix<double> m(2, 3);
  m << 1, 2, 3, 4, 5, 6;
  writer.write_matrix("unit0/m", m, "a matrix");
  writer.mark_complete("unit0");
  writer.checkpoint();
  {
    io::ResultsReader reader(path);
    CHECK(reader.matrix("unit0/m") == m);
    CHECK(reader.int_attribute("unit0", "complete") == 1);
  }
  CHECK_THROWS_AS(writer.write_matrix("unit0/m", m, "again"), io::FileError);
  hils::IndexMatrix sel(1, 2);
  sel << 3, -1;
  writer.write_indices("unit1/sel", sel, "selection");
  writer.write_text("unit1/note", "hello", "a note");
  writer.set_attribute("unit1", "alpha", 0.5);
  writer.commit();
  io::ResultsReader reader(path);
  CHECK(reader.index_matrix("unit1/sel") == sel);
  CHECK(reader.text("unit1/note") == "hello");
  CHECK(reader.double_attribute("unit1", "alpha") == 0.5);
  CHECK(reader.string_attribute("unit1/sel", "meaning") == "selection");
  CHECK(reader.config() == nlohmann::json{{"study", "x"}});
  CHECK(reader.string_attribute("", "seed_text") == "9");
  CHECK(hils::test::count_temp_files(dir.path()) == 0);
}

// The MPI coordinator writes the units that arrived while it was busy and publishes them with
// one checkpoint (experiments/parallel/mpi_runner.hpp): published together, in order, each
// marked complete; nothing of them published before.
TEST_CASE("results sink: mark_complete_all publishes the units together, in order", "[io]") {
  TempDir dir("io_complete_all");
  auto path = dir / "r.h5";
  auto writer = io::ResultsWriter::create(path, {{{"study", "x"}}, 9, "test"});
  io::ResultsWriterSink sink(writer, io::ResultsWriterSink::ReadBack::nothing, nullptr,
                             /*checkpoint_spacing=*/0);  // every completion publishes
  sink.write("u0/x", std::vector<double>{1, 2}, "x");
  sink.mark_complete("u0");
  sink.write("u2/x", std::vector<double>{3}, "x");
  sink.write("u1/x", std::vector<double>{4}, "x");
  {
    io::ResultsReader published(path);  // the checkpoint of u0 only
    CHECK(published.string_attribute("", "complete_units") == R"(["u0"])");
    CHECK_FALSE(published.exists("u1/x"));
  }
  sink.mark_complete_all({"u2", "u1"});
  {
    io::ResultsReader published(path);
    CHECK(published.string_attribute("", "complete_units") == R"(["u0","u2","u1"])");
    CHECK(published.matrix("u2/x") == hils::Matrix<double>::Constant(1, 1, 3));
    CHECK(published.matrix("u1/x") == hils::Matrix<double>::Constant(1, 1, 4));
    CHECK(published.int_attribute("u1", "complete") == 1);
    CHECK(published.int_attribute("u2", "complete") == 1);
  }
  CHECK(writer.complete_units() == std::vector<std::string>{"u0", "u2", "u1"});
  sink.mark_complete_all({});  // nothing to publish: no error, nothing changes
  writer.commit();
  CHECK(io::ResultsReader(path).string_attribute("", "complete_units") ==
        R"(["u0","u2","u1"])");
}

namespace {
std::string published_units(const std::filesystem::path& path) {
  return io::ResultsReader(path).string_attribute("", "complete_units");
}
}  // namespace

TEST_CASE("results sink: checkpoints are spaced, and the units they skipped are published when "
          "a run ends early", "[io]") {
  TempDir dir("io_spaced_checkpoints");
  auto path = dir / "r.h5";
  auto writer = io::ResultsWriter::create(path, {{{"study", "x"}}, 9, "test"});
  // A spacing no test run reaches: after the first checkpoint, none until publish_completed.
  io::ResultsWriterSink sink(writer, io::ResultsWriterSink::ReadBack::nothing, nullptr, 1e12);
  sink.write("u0/x", std::vector<double>{1}, "x");
  sink.mark_complete("u0");  // the first completion publishes at once
  CHECK(published_units(path) == R"(["u0"])");
  sink.write("u1/x", std::vector<double>{2}, "x");
  sink.mark_complete("u1");
  sink.write("u2/x", std::vector<double>{3}, "x");
  sink.mark_complete_all({"u2"});
  CHECK(published_units(path) == R"(["u0"])");  // spaced: not yet
  // Part of an unfinished unit written: publishing now would take it along, so nothing is.
  sink.write("u3/x", std::vector<double>{4}, "x");
  sink.publish_completed();
  CHECK(published_units(path) == R"(["u0"])");
  CHECK_FALSE(io::ResultsReader(path).exists("u3/x"));
  sink.write("u3/y", std::vector<double>{5}, "y");
  sink.mark_complete("u3");
  sink.publish_completed();  // nothing written since u3's completion: u1, u2, u3 published
  CHECK(published_units(path) == R"(["u0","u1","u2","u3"])");
  CHECK(io::ResultsReader(path).matrix("u2/x") == hils::Matrix<double>::Constant(1, 1, 3));
  sink.publish_completed();  // nothing left: no error
  writer.commit();
  CHECK(published_units(path) == R"(["u0","u1","u2","u3"])");
}

TEST_CASE("a run that ends early publishes every unit it finished, whatever the spacing",
          "[io]") {
  TempDir dir("io_runner_early_end");
  for (int jobs : {0, 2}) {  // 0: the serial runner
    INFO("jobs " << jobs);
    auto path = dir / ("r" + std::to_string(jobs) + ".h5");
    auto writer = io::ResultsWriter::create(path, {{{"study", "x"}}, 9, "test"});
    io::ResultsWriterSink sink(writer, io::ResultsWriterSink::ReadBack::nothing, nullptr, 1e12);
    std::vector<hils::analysis::StudyUnit> units;
    for (int u = 0; u < 5; ++u)
      units.push_back({"u" + std::to_string(u), 5.0 - u, [u](hils::analysis::ResultSink& s) {
                         s.write("u" + std::to_string(u) + "/a", std::vector<double>{1.0 * u}, "a");
                         if (u == 3) throw hils::InvalidArgument("unit 3 fails");
                         s.write("u" + std::to_string(u) + "/b", std::vector<double>{2.0 * u}, "b");
                       }});
    hils::analysis::ThreadedUnitRunner threaded(std::max(jobs, 1), 2);
    hils::analysis::UnitRunner& runner =
        jobs == 0 ? static_cast<hils::analysis::UnitRunner&>(hils::analysis::serial_runner())
                  : threaded;
    CHECK_THROWS_WITH(runner.run(units, sink, {}), Catch::Contains("unit 3 fails"));
    // u0 was published at once; u1 and u2 only by the early end; u3 wrote "a" before failing.
    CHECK(published_units(path) == R"(["u0","u1","u2"])");
    io::ResultsReader published(path);
    CHECK(published.exists("u2/b"));
    CHECK_FALSE(published.exists("u3/a"));
  }
}

TEST_CASE("results writer: resume keeps units and refuses another configuration", "[io]") {
  TempDir dir("io_resume");
  auto path = dir / "r.h5";
  io::Provenance provenance{{{"study", "x"}, {"n", 1}}, 1, "test"};
  {
    auto writer = io::ResultsWriter::create(path, provenance);
    writer.write_vector("u0/x", std::vector<double>{1}, "x");
    writer.mark_complete("u0");
    writer.commit();
  }
  {
    auto writer = io::ResultsWriter::resume(path, provenance);
    CHECK(writer.is_complete("u0"));
    CHECK_FALSE(writer.is_complete("u1"));
    writer.write_vector("u1/x", std::vector<double>{2}, "x");
    writer.mark_complete("u1");
    writer.commit();
  }
  auto other = provenance;
  other.config["n"] = 2;
  CHECK_THROWS_WITH(io::ResultsWriter::resume(path, other),
                    Catch::Contains("found one that differs in n (1 in the file, 2 in this run)"));
  CHECK_NOTHROW(io::ResultsWriter::resume(path, other, {"n"}));
  io::ResultsReader reader(path);
  CHECK(reader.members("") == std::vector<std::string>{"u0", "u1"});
}
