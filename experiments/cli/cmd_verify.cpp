// hils verify FILE: reads a kernel's inputs, spec and outputs (data/verify_format.md), runs the
// oracle (reference in double and float) and prints a pass/fail report per tensor.
// Exit 0 all pass, 1 a tensor or the selection fails, 2 the file is missing or malformed.
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "config/spec_codec.hpp"
#include "hils/analysis/oracle.hpp"
#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"

namespace hils::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kVerifyFormat = "hils-verify";
constexpr int64_t kVerifyFormatVersion = 1;

// ---- spec ----------------------------------------------------------------------------------

// The spec attribute: {"preset": name?, then any MechanismSpec field by name}, decoded and
// checked by the one spec codec; its errors become the file's ("<file>: spec.K: expected ...").
MechanismSpec parse_spec(const fs::path& file, const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    io::fail(file, "attribute spec", "a JSON object", std::string("invalid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) io::fail(file, "attribute spec", "a JSON object", j.dump());
  try {
    MechanismSpec spec = config::spec_from_json(j, "spec");
    spec.validate();
    return spec;
  } catch (const InvalidArgument& e) {
    throw io::FileError(file.string() + ": " + e.what());
  }
}

// ---- datasets ------------------------------------------------------------------------------

// A rank-3 float dataset [H x rows x cols] as H row-major matrices; `expected` may hold -1.
std::vector<Matrix<double>> read_heads(const fs::path& file, const H5::Group& root,
                                       const std::string& name, const std::vector<int64_t>& expected,
                                       bool finite_only) {
  const H5::DataSet ds = io::open_dataset(file, root, name);
  io::require_dims(file, name, ds, expected, "(heads, rows, columns)");
  const auto dims = io::dataset_dims(ds);
  const std::vector<double> data = io::read_doubles(file, name, ds, finite_only);
  std::vector<Matrix<double>> heads;
  const auto rows = static_cast<Eigen::Index>(dims[1]), cols = static_cast<Eigen::Index>(dims[2]);
  for (hsize_t h = 0; h < dims[0]; ++h)
    heads.push_back(Eigen::Map<const Matrix<double>>(data.data() + h * rows * cols, rows, cols));
  return heads;
}

// A rank-2 float dataset [H x n] as H vectors.
std::vector<Vector<double>> read_head_vectors(const fs::path& file, const H5::Group& root,
                                              const std::string& name) {
  const H5::DataSet ds = io::open_dataset(file, root, name);
  io::require_dims(file, name, ds, {-1, -1}, "(heads, rows)");
  const auto dims = io::dataset_dims(ds);
  const std::vector<double> data = io::read_doubles(file, name, ds, false);
  std::vector<Vector<double>> heads;
  const auto n = static_cast<Eigen::Index>(dims[1]);
  for (hsize_t h = 0; h < dims[0]; ++h)
    heads.push_back(Eigen::Map<const Vector<double>>(data.data() + h * n, n));
  return heads;
}

// The selection [Hkv x Tq x K] (any integer type) as Hkv index matrices.
std::vector<IndexMatrix> read_selection(const fs::path& file, const H5::Group& root,
                                        const std::string& name) {
  const H5::DataSet ds = io::open_dataset(file, root, name);
  io::require_integer(file, name, ds);
  io::require_dims(file, name, ds, {-1, -1, -1}, "(KV groups, queries, K)");
  const auto dims = io::dataset_dims(ds);
  const std::vector<int64_t> data = io::read_int64s(ds);
  std::vector<IndexMatrix> heads;
  const auto rows = static_cast<Eigen::Index>(dims[1]), cols = static_cast<Eigen::Index>(dims[2]);
  for (hsize_t g = 0; g < dims[0]; ++g) {
    IndexMatrix m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) {
      const int64_t value = data[g * rows * cols + i];
      if (value < -1 || value > std::numeric_limits<int32_t>::max())
        io::fail(file, name, "chunk indices >= -1", std::to_string(value));
      m.data()[i] = static_cast<int32_t>(value);
    }
    heads.push_back(std::move(m));
  }
  return heads;
}

// /inputs: q [Hq,T,d], k [Hkv,T,d], v [Hkv,T,dv], optional q_retrieval [Hq,T,d], prior [Hq,R,d].
AttentionInputs<double> read_inputs(const fs::path& file, const H5::H5File& h5) {
  const H5::Group root = h5.openGroup("/");
  AttentionInputs<double> in;
  in.q = read_heads(file, root, "inputs/q", {-1, -1, -1}, true);
  const int64_t Hq = in.Hq(), T = in.T(), d = in.d();
  in.k = read_heads(file, root, "inputs/k", {-1, T, d}, true);
  in.v = read_heads(file, root, "inputs/v", {in.Hkv(), T, -1}, true);
  if (io::has_object(root, "inputs/q_retrieval"))
    in.q_retrieval = read_heads(file, root, "inputs/q_retrieval", {Hq, T, d}, true);
  if (io::has_object(root, "inputs/prior"))
    in.prior = read_heads(file, root, "inputs/prior", {Hq, -1, d}, true);
  return in;
}

// /outputs: every stage is optional; values may be NaN or Inf (the oracle judges them).
oracle::KernelOutputs read_outputs(const fs::path& file, const H5::H5File& h5) {
  const H5::Group root = h5.openGroup("/");
  oracle::KernelOutputs out;
  auto heads = [&](const char* name, std::vector<Matrix<double>>& target) {
    const std::string path = std::string("outputs/") + name;
    if (io::has_object(root, path)) target = read_heads(file, root, path, {-1, -1, -1}, false);
  };
  auto vectors = [&](const char* name, std::vector<Vector<double>>& target) {
    const std::string path = std::string("outputs/") + name;
    if (io::has_object(root, path)) target = read_head_vectors(file, root, path);
  };
  heads("summary_key", out.summary_key);
  vectors("summary_bias", out.summary_bias);
  heads("surrogate_scores", out.surrogate_scores);
  if (io::has_object(root, "outputs/selection"))
    out.selection = read_selection(file, root, "outputs/selection");
  heads("o_window", out.o_window);
  vectors("lse_window", out.lse_window);
  heads("o", out.o);
  vectors("lse", out.lse);
  heads("fusion_weights", out.fusion_weights);
  return out;
}

// /inputs/do, /inputs/dlse (the upstream gradients) and /grads: the kernel's backward pass.
oracle::KernelGradients read_gradients(const fs::path& file, const H5::H5File& h5) {
  const H5::Group root = h5.openGroup("/");
  oracle::KernelGradients grads;
  if (io::has_object(root, "inputs/do"))
    grads.d_o = read_heads(file, root, "inputs/do", {-1, -1, -1}, true);
  if (io::has_object(root, "inputs/dlse")) {
    grads.d_lse = read_head_vectors(file, root, "inputs/dlse");
    for (const auto& x : grads.d_lse)
      if (!x.allFinite()) io::fail(file, "inputs/dlse", "finite values", "NaN or Inf");
  }
  auto heads = [&](const char* name, std::vector<Matrix<double>>& target) {
    const std::string path = std::string("grads/") + name;
    if (io::has_object(root, path)) target = read_heads(file, root, path, {-1, -1, -1}, false);
  };
  heads("dq", grads.dq);
  heads("dk", grads.dk);
  heads("dv", grads.dv);
  heads("dq_retrieval", grads.dq_retrieval);
  heads("dprior", grads.dprior);
  if (grads.any_returned() && grads.d_o.empty())
    io::fail(file, "inputs/do", "the upstream gradient the kernel's backward was given (the file "
             "holds /grads)", "no such dataset");
  return grads;
}

// Every dataset of the format (data/verify_format.md); anything else in a file is named in the
// report as not compared.
const std::set<std::string> kKnownDatasets = {
    "inputs/q", "inputs/k", "inputs/v", "inputs/q_retrieval", "inputs/prior", "inputs/do",
    "inputs/dlse", "queries", "outputs/o", "outputs/lse", "outputs/selection",
    "outputs/surrogate_scores", "outputs/summary_key", "outputs/summary_bias", "outputs/o_window",
    "outputs/lse_window", "outputs/fusion_weights", "grads/dq", "grads/dk", "grads/dv",
    "grads/dq_retrieval", "grads/dprior"};

// Paths (relative, "grads/dfoo") of the objects under `group` the format does not define.
void collect_unknown(const H5::Group& group, const std::string& prefix,
                     std::vector<std::string>& unknown) {
  for (hsize_t i = 0; i < group.getNumObjs(); ++i) {
    const std::string name = group.getObjnameByIdx(i);
    const std::string path = prefix.empty() ? name : prefix + "/" + name;
    if (group.childObjType(name) == H5O_TYPE_GROUP) {
      if (path == "inputs" || path == "outputs" || path == "grads")
        collect_unknown(group.openGroup(name), path, unknown);
      else
        unknown.push_back("/" + path + " (a group the format does not define)");
    } else if (!kKnownDatasets.count(path)) {
      unknown.push_back("/" + path + " (a dataset the format does not define)");
    }
  }
}

struct VerifyFile {
  MechanismSpec spec;
  oracle::VerifyOptions options;
  AttentionInputs<double> inputs;
  oracle::KernelOutputs outputs;
  std::string kernel_name;
  std::vector<std::string> unknown;  // datasets and groups the oracle does not read
};

VerifyFile read_verify_file(const fs::path& file) {
  const H5::H5File h5 = io::open_hdf5(file);
  const H5::Group root = h5.openGroup("/");
  const std::string format = io::read_string_attribute(file, root, "/", "format");
  if (format != kVerifyFormat)
    io::fail(file, "/ attribute format", std::string("\"") + kVerifyFormat + "\"", "\"" + format + "\"");
  const int64_t version = io::read_int_attribute(file, root, "/", "format_version");
  if (version != kVerifyFormatVersion)
    io::fail(file, "/ attribute format_version", std::to_string(kVerifyFormatVersion),
             std::to_string(version));
  VerifyFile v;
  v.spec = parse_spec(file, io::read_string_attribute(file, root, "/", "spec"));
  v.options.precision = oracle::parse_input_precision(
      io::read_string_attribute(file, root, "/", "input_precision"),
      file.string() + ": / attribute input_precision");
  if (io::has_attribute(root, "bf16_rounding"))
    v.options.bf16_rounding = oracle::parse_bf16_rounding(
        io::read_string_attribute(file, root, "/", "bf16_rounding"),
        file.string() + ": / attribute bf16_rounding");
  if (io::has_attribute(root, "score_precision"))
    v.options.score_precision = oracle::parse_input_precision(
        io::read_string_attribute(file, root, "/", "score_precision"),
        file.string() + ": / attribute score_precision");
  if (io::has_attribute(root, "kernel"))
    v.kernel_name = io::read_string_attribute(file, root, "/", "kernel");
  v.inputs = read_inputs(file, h5);
  if (io::has_object(root, "queries")) {
    const H5::DataSet ds = io::open_dataset(file, root, "queries");
    io::require_integer(file, "queries", ds);
    io::require_dims(file, "queries", ds, {-1}, "(queries)");
    v.options.queries = io::read_int64s(ds);
    // An empty list would read as "every query" (the oracle's default): say what is meant.
    if (v.options.queries.empty())
      io::fail(file, "queries", "at least one query slot (omit /queries to compare all T)",
               "an empty dataset");
  }
  if (!io::has_object(root, "outputs") && !io::has_object(root, "grads"))
    io::fail(file, "outputs", "a group of kernel outputs (at least o) or of gradients (grads)",
             "nothing");
  if (io::has_object(root, "outputs")) v.outputs = read_outputs(file, h5);
  v.outputs.gradients = read_gradients(file, h5);
  collect_unknown(root, "", v.unknown);
  return v;
}

void run_verify(const std::string& path, int64_t max_messages, bool strict) {
  VerifyFile v = read_verify_file(path);
  v.options.max_messages = max_messages;
  oracle::Verdict verdict;
  try {
    verdict = oracle::verify(v.spec, v.inputs, v.outputs, v.options);
  } catch (const InvalidArgument& e) {
    // Invalid inputs, spec or queries: the file is bad, not the kernel.
    throw io::FileError(path + ": " + e.what());
  }
  for (const auto& what : v.unknown) verdict.not_compared.push_back(what);
  std::cout << path << (v.kernel_name.empty() ? "" : " (kernel " + v.kernel_name + ")") << "\n"
            << verdict.report();
  if (!verdict.passed) throw CheckFailed(path + ": the kernel's outputs fail the oracle");
  if (strict && !verdict.not_compared.empty())
    throw io::FileError(path + ": --strict: " + std::to_string(verdict.not_compared.size()) +
                        " item(s) not compared, first " + verdict.not_compared.front());
}

}  // namespace

void register_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "verify", "Check a kernel's outputs against the reference (oracle, data/verify_format.md)");
  static std::string path;
  static int64_t max_messages = 8;
  cmd->add_option("file", path, "HDF5 file with inputs, spec and the kernel's outputs")
      ->required();
  static bool strict = false;
  cmd->add_option("--max-messages", max_messages, "problems listed per tensor")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--strict", strict,
                "fail (exit 2) when the file holds anything the oracle did not compare");
  cmd->footer(
      "Recomputes every stage the file holds with the reference in double (truth) and float\n"
      "(baseline); a tensor passes when its max abs error <= 2 x float's + a rounding floor;\n"
      "selections are compared as sets with a margin bound; gradients (/grads, with\n"
      "/inputs/do) against the fp64 backward with the kernel's selection held fixed.\n"
      "Anything not compared is named in the report (an error with --strict).\n"
      "Exit 0 pass, 1 fail, 2 bad file (or, with --strict, something not compared).\n"
      "Example (kernel_dump.h5: your kernel's dump, written as data/verify_format.md says;\n"
      "`scripts/verify_demo.sh build` writes good and broken ones into out/verify_demo/):\n"
      "  hils verify out/verify_demo/good_hils_fp32.h5");
  cmd->callback([] { run_verify(path, max_messages, strict); });
}

}  // namespace hils::cli
