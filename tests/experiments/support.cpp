#include "support.hpp"

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>

namespace hils::test {

TempDir::TempDir(const std::string& name) {
  path_ = std::filesystem::temp_directory_path() /
          ("hils_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CommandResult run_shell(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

CommandResult run_hils(const std::string& args) {
  return run_shell(std::string("'") + HILS_EXE + "' " + args + " 2>&1");
}

CommandResult run_hils_with_file_limit(const std::string& args, int limit_blocks) {
  return run_shell("(ulimit -f " + std::to_string(limit_blocks) + " && '" + HILS_EXE + "' " + args +
                   ") 2>&1");
}

io::ActivationFile small_activation_file(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto draw = [&](int64_t rows, int64_t cols) {
    Matrix<double> m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
    return m;
  };
  io::ActivationFile file;
  auto& meta = file.meta;
  meta.n_layers = 2;
  meta.Hq = 4;
  meta.Hkv = 2;
  meta.T = 40;
  meta.d = 8;
  meta.dv = 6;
  meta.d_model = 12;
  Geometry geometry(meta.T, 8, 8, true);
  meta.position_ids = geometry.position_ids();
  for (int64_t t = 0; t < meta.T; ++t) meta.landmarks.push_back(geometry.is_landmark(t));
  meta.source = {{"kind", "test"}, {"seed", seed}};
  for (int64_t l = 0; l < meta.n_layers; ++l) {
    io::LayerActivations layer;
    for (int64_t h = 0; h < meta.Hq; ++h) layer.inputs.q.push_back(draw(meta.T, meta.d));
    for (int64_t g = 0; g < meta.Hkv; ++g) layer.inputs.k.push_back(draw(meta.T, meta.d));
    for (int64_t g = 0; g < meta.Hkv; ++g) layer.inputs.v.push_back(draw(meta.T, meta.dv));
    layer.hidden = draw(meta.T, meta.d_model);
    file.layers.push_back(std::move(layer));
  }
  return file;
}

std::filesystem::path write_small_activation_file(const TempDir& dir, uint64_t seed,
                                                  const std::string& name) {
  const auto path = dir / name;
  io::write_activation_file(path, small_activation_file(seed), io::StorageType::float64);
  return path;
}

std::string quoted(const std::filesystem::path& path) { return "'" + path.string() + "'"; }

int count_temp_files(const std::filesystem::path& folder) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) ++count;
  return count;
}

int count_lock_files(const std::filesystem::path& folder) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.path().extension() == ".lock") ++count;
  return count;
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void require_refused(const std::string& args, const std::string& message,
                     const std::filesystem::path& not_written) {
  const auto r = run_hils(args);
  INFO(args + "\n" + r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(message));
  CHECK_FALSE(std::filesystem::exists(not_written));
}

void require_same_results(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto r = run_shell("/usr/bin/python3 '" HILS_SOURCE_DIR
                           "/tests/experiments/compare_results.py' " + quoted(a) + " " +
                           quoted(b) + " 2>&1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

}  // namespace hils::test
