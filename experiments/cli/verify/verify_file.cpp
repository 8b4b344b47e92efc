// A verify file read: format and version, the spec through the one spec codec, the precisions,
// the queries, the groups (verify_datasets.cpp), and every object the format does not define.
#include <algorithm>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli/verify/verify_file.hpp"
#include "config/spec_codec.hpp"
#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"
#include "hils/memory.hpp"

namespace hils::cli::verify {

namespace fs = std::filesystem;

namespace {

// The spec attribute: {"preset": name?, then any MechanismSpec field by name}, decoded and
// checked by the one spec codec; its errors become the file's ("<file>: spec.K: expected ...").
MechanismSpec parse_spec(const fs::path& file, const std::string& text) {
  config::ParsedJson parsed;
  try {
    parsed = config::parse_json_text(text);
  } catch (const nlohmann::json::exception& e) {
    io::fail(file, "attribute spec", "a JSON object",
             "invalid JSON (" + io::utf8_text(e.what()) + ")");
  }
  const nlohmann::json& j = parsed.value;
  if (!j.is_object()) io::fail(file, "attribute spec", "a JSON object", j.dump());
  if (!parsed.repeated_key.empty())
    io::fail(file, "attribute spec", "a JSON object whose keys differ (which value is meant?)",
             "the key '" + io::utf8_text(parsed.repeated_key) + "' twice");
  try {
    MechanismSpec spec = config::spec_from_json(j, "spec");
    spec.validate();
    return spec;
  } catch (const InvalidArgument& e) {
    throw io::FileError(file.string() + ": " + e.what());
  }
}

// Every dataset of the format (data/verify_format.md): the outputs are oracle::kOutputTensors;
// anything else in a file is named in the report as not compared.
const std::set<std::string> kKnownDatasets = [] {
  std::set<std::string> known = {
      "inputs/q", "inputs/k", "inputs/v", "inputs/q_retrieval", "inputs/prior", "inputs/do",
      "inputs/dlse", "queries", "grads/dq", "grads/dk", "grads/dv", "grads/dq_retrieval",
      "grads/dprior"};
  for (const auto& name : oracle::output_names()) known.insert("outputs/" + name);
  return known;
}();

// Paths (relative, "grads/dfoo") of the objects under `group` the format does not define. A
// link there that leads nowhere (a soft link to a removed dataset) is named as one: the file
// is not corrupt (a link at a defined path is refused by its reader first).
void collect_unknown(const H5::Group& group, const std::string& prefix,
                     std::vector<std::string>& unknown) {
  for (hsize_t i = 0; i < group.getNumObjs(); ++i) {
    const std::string name = group.getObjnameByIdx(i);
    const std::string path = prefix.empty() ? name : prefix + "/" + name;
    const auto type = io::linked_object_type(group, name);
    if (!type) {
      unknown.push_back("/" + path + " (a link that cannot be followed)");
    } else if (*type == H5O_TYPE_GROUP) {
      if (path == "inputs" || path == "outputs" || path == "grads")
        collect_unknown(group.openGroup(name), path, unknown);
      else
        unknown.push_back("/" + path + " (a group the format does not define)");
    } else if (!kKnownDatasets.count(path)) {
      unknown.push_back("/" + path + " (a dataset the format does not define)");
    }
  }
}

// /inputs, /outputs and /grads, where present, must be groups: a dataset of that name (a whole
// output array written as /outputs) would otherwise read as "no outputs", a kernel failure.
void require_groups(const fs::path& file, const H5::Group& root) {
  const std::pair<std::string, std::string> groups[] = {
      {"inputs", "q"}, {"outputs", "o"}, {"grads", "dq"}};  // each with a dataset it holds
  for (const auto& [name, example] : groups)
    if (io::has_object(root, name) && root.childObjType(name) != H5O_TYPE_GROUP)
      io::fail(file, "/" + name, "a group holding datasets such as /" + name + "/" + example,
               "a dataset or other object of that name");
}

// The dims of dataset `name`, or none where it is missing or no readable dataset (its reader
// names that fault later).
std::vector<hsize_t> dims_or_none(const fs::path& file, const H5::Group& root,
                                  const std::string& name) {
  if (!io::has_object(root, name)) return {};
  try {
    return io::dataset_dims(io::open_dataset(file, root, name));
  } catch (const InvalidArgument&) {
    return {};
  } catch (const H5::Exception&) {
    return {};
  }
}

// The oracle's memory for this file, from its datasets' shapes before any is read: a file too
// large for this machine is refused at once naming inputs/q and what to change
// (oracle::require_oracle_fits), where it ran for minutes and then ended in "out of memory"
// naming no field. Shapes the readers refuse (a missing or misshapen input) are left to them.
void require_oracle_fits(const fs::path& file, const H5::Group& root, const MechanismSpec& spec) {
  const auto q = dims_or_none(file, root, "inputs/q"), k = dims_or_none(file, root, "inputs/k"),
             v = dims_or_none(file, root, "inputs/v");
  if (q.size() != 3 || k.size() != 3 || v.size() != 3 || k[0] == 0 || q[0] % k[0] != 0) return;
  oracle::ProblemShape shape;
  shape.Hq = static_cast<int64_t>(q[0]), shape.T = static_cast<int64_t>(q[1]);
  shape.d = static_cast<int64_t>(q[2]), shape.Hkv = static_cast<int64_t>(k[0]);
  shape.dv = static_cast<int64_t>(v[2]);
  const auto queries = dims_or_none(file, root, "queries");
  shape.queries = queries.size() == 1 && queries[0] > 0 ? static_cast<int64_t>(queries[0]) : shape.T;
  shape.q_retrieval = io::has_object(root, "inputs/q_retrieval");
  const auto prior = dims_or_none(file, root, "inputs/prior");
  shape.prior_rows = prior.size() == 3 ? static_cast<int64_t>(prior[1]) : 0;
  shape.gradients = io::has_object(root, "grads");
  // The file's arrays as the readers hold them: each in double, the largest twice while read.
  // A dataset too large alone is left to its reader, whose message names it (io::read_doubles).
  double values = 0, largest = 0;
  for (const auto& name : kKnownDatasets) {
    double n = 1;
    for (hsize_t extent : dims_or_none(file, root, name)) n *= static_cast<double>(extent);
    if (!io::has_object(root, name)) n = 0;
    if (2 * 8 * n >= 0.8 * memory_limit().bytes) return;
    values += n, largest = std::max(largest, n);
  }
  oracle::require_oracle_fits(spec, shape, 8 * (values + largest), file.string() + ": inputs/q",
                              "/queries");
}

// file -> its contents (read_verify_file, below, without the guards against a corrupt file).
VerifyFile read_contents(const fs::path& file) {
  const H5::H5File h5 = io::open_hdf5(file);
  const H5::Group root = h5.openGroup("/");
  const std::string format = io::read_string_attribute(file, root, "/", "format");
  if (format != kVerifyFormat) {
    // The project's other files, given here by mistake, are named as what they are.
    const std::string what = format == "hils-results"       ? " (a results file of hils run or a study)"
                             : format == "hils-activations" ? " (an activation file of hils dump)"
                                                            : "";
    io::fail(file, "/ attribute format",
             std::string("\"") + kVerifyFormat + "\" (a kernel's dump, data/verify_format.md)",
             "\"" + format + "\"" + what);
  }
  const int64_t version = io::read_int_attribute(file, root, "/", "format_version");
  if (version != kVerifyFormatVersion)
    io::fail(file, "/ attribute format_version", std::to_string(kVerifyFormatVersion),
             std::to_string(version));
  require_groups(file, root);
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
    v.options.score_precision = oracle::parse_score_precision(
        io::read_string_attribute(file, root, "/", "score_precision"),
        file.string() + ": / attribute score_precision");
  if (io::has_attribute(root, "kernel"))
    v.kernel_name = io::utf8_text(io::read_string_attribute(file, root, "/", "kernel"));
  require_oracle_fits(file, root, v.spec);
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
  // A file of inputs only is what `hils cases` writes, before the kernel's harness adds outputs.
  if (!io::has_object(root, "outputs") && !io::has_object(root, "grads"))
    io::fail(file, "outputs",
             "the kernel's outputs to judge (a group /outputs holding at least o) or its "
             "gradients (/grads)",
             "no /outputs or /grads group: inputs only, as `hils cases` writes them for the "
             "kernel's harness to add its outputs to");
  if (io::has_object(root, "outputs")) v.outputs = read_outputs(file, h5);
  v.outputs.gradients = read_gradients(file, h5);
  collect_unknown(root, "", v.unknown);
  return v;
}

}  // namespace

// file -> spec, options, inputs, outputs (gradients included) and the objects not compared. A
// file whose metadata the HDF5 library fails on (an H5::Exception past the checks above) or
// crashes on (io::CorruptInputGuard) is bad input naming it, not an internal error or a crash.
VerifyFile read_verify_file(const fs::path& file) {
  const io::CorruptInputGuard guard(file);
  try {
    return read_contents(file);
  } catch (const H5::Exception& e) {
    io::fail(file, "", "a complete HDF5 file",
             "one the HDF5 library cannot read (corrupt: " + e.getFuncName() + ": " +
                 e.getDetailMsg() + ")");
  }
}

}  // namespace hils::cli::verify
