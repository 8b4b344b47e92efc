// oracle_make_verify_file OUT CASE BREAK [PRESET] [PRECISION]: writes a `hils verify` file
// (data/verify_format.md) whose "kernel" is the reference's float run on a case of the table,
// optionally broken on purpose. BREAK is one of: none, wrong_chunk, shifted_window,
// missing_softmax1, nan, all_zero (kernel faults, exit 1 expected), bad_spec, bad_version,
// missing_q (file faults, exit 2 expected). Gradients (/inputs/do, dlse and /grads): grads
// (correct), grads_zero_chunk (dk of chunk 2, KV head 1, zeroed), grads_no_softmax1 (softmax1
// in the spec, not in the backward), grads_wrong_sigma (dq x 1/sqrt(2)), grads_unknown (also a
// /grads/dfoo the format does not define), grads_missing_do (file fault).
// CASE may resize a case of the table, NAME:FIELD=N,... (fields T, S, W, K, Hq, Hkv, d, dv and
// landmarks 0 or 1; the draws keep the name's seed), e.g. longer_blocks:T=32768,S=64,W=512,K=16,Hq=16,Hkv=2,d=64,dv=64
// for the oracle's timings at a kernel author's sizes (README "The oracle's speed"); such a
// file holds q_retrieval only where the spec has landmarks, prior only where it reads one, and
// of the outputs o, lse and the selection (what a kernel's dump holds).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/spec_codec.hpp"
#include "io/hdf5_util.hpp"
#include "oracle_support.hpp"

using namespace hils;
using namespace hils::oracle;

namespace {

// Head lists -> one [H x rows x cols] float32 dataset.
void write_heads(H5::Group& root, const std::string& name, const std::vector<Matrix<double>>& heads) {
  if (heads.empty()) return;
  const auto rows = heads.front().rows(), cols = heads.front().cols();
  std::vector<double> flat;
  for (const auto& m : heads) flat.insert(flat.end(), m.data(), m.data() + m.size());
  io::write_doubles(root, name, flat.data(),
                    {heads.size(), static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)}, true);
}

void write_vectors(H5::Group& root, const std::string& name, const std::vector<Vector<double>>& heads) {
  if (heads.empty()) return;
  std::vector<double> flat;
  for (const auto& v : heads) flat.insert(flat.end(), v.data(), v.data() + v.size());
  io::write_doubles(root, name, flat.data(), {heads.size(), static_cast<hsize_t>(heads.front().size())},
                    true);
}

void write_selection(H5::Group& root, const std::string& name,
                     const std::vector<IndexMatrix>& selection) {
  if (selection.empty()) return;
  std::vector<int32_t> flat;
  for (const auto& m : selection) flat.insert(flat.end(), m.data(), m.data() + m.size());
  io::write_int32s(root, name, flat.data(),
                   {selection.size(), static_cast<hsize_t>(selection.front().rows()),
                    static_cast<hsize_t>(selection.front().cols())});
}

// One kernel output (a row of oracle::kOutputTensors) -> its dataset, by the output's type.
void write_output(H5::Group& root, const std::string& name,
                  const std::vector<Matrix<double>>& heads) {
  write_heads(root, name, heads);
}
void write_output(H5::Group& root, const std::string& name,
                  const std::vector<Vector<double>>& heads) {
  write_vectors(root, name, heads);
}
void write_output(H5::Group& root, const std::string& name,
                  const std::vector<IndexMatrix>& selection) {
  write_selection(root, name, selection);
}

// "NAME" -> the table's case; "NAME:T=8192,Hq=16,..." -> that case with those fields set.
cases::Case resized_case(const std::string& text) {
  const auto colon = text.find(':');
  cases::Case c = testing::case_named(text.substr(0, colon));
  if (colon == std::string::npos) return c;
  std::istringstream fields(text.substr(colon + 1));
  for (std::string item; std::getline(fields, item, ',');) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const int64_t value = std::stoll(item.substr(eq == std::string::npos ? item.size() : eq + 1));
    int64_t* field = key == "T" ? &c.T : key == "S" ? &c.S : key == "W" ? &c.W : key == "K" ? &c.K
                   : key == "Hq" ? &c.Hq : key == "Hkv" ? &c.Hkv : key == "d" ? &c.d
                   : key == "dv" ? &c.dv : nullptr;
    if (key == "landmarks") {
      c.landmarks = value != 0;
      continue;
    }
    if (field == nullptr) throw std::invalid_argument("CASE: unknown field '" + key + "'");
    *field = value;
  }
  return c;
}

int make(const std::string& out, const std::string& case_name, const std::string& kind,
         const std::string& preset_name, const std::string& precision_text) {
  const cases::Case c = resized_case(case_name);
  const bool resized = case_name.find(':') != std::string::npos;
  const InputPrecision precision = parse_input_precision(precision_text);
  MechanismSpec spec = cases::with_case_geometry(preset(preset_name), c);
  if (!c.landmarks && spec.needs_prior()) spec.prior_rule = PriorRule::shared;
  if (kind == "missing_softmax1" || kind == "grads_no_softmax1") spec.softmax1 = true;
  // The kernel's inputs are float32 (or bf16) numbers: store exactly what it computed from.
  AttentionInputs<double> inputs;
  {
    const auto f = cases::make_inputs<float>(c);
    for (const auto& x : f.q) inputs.q.push_back(x.cast<double>());
    for (const auto& x : f.k) inputs.k.push_back(x.cast<double>());
    for (const auto& x : f.v) inputs.v.push_back(x.cast<double>());
    for (const auto& x : f.q_retrieval) inputs.q_retrieval.push_back(x.cast<double>());
    for (const auto& x : f.prior) inputs.prior.push_back(x.cast<double>());
    if (resized && !spec.landmarks) inputs.q_retrieval.clear();
    if (resized && !(spec.needs_prior() && (spec.prior_rule == PriorRule::shared ||
                                            spec.prior_rule == PriorRule::given)))
      inputs.prior.clear();
    if (precision == InputPrecision::bf16) inputs = round_inputs_to_bf16(inputs);
  }
  MechanismSpec kernel_spec = spec;
  if (kind == "missing_softmax1") kernel_spec.softmax1 = false;
  if (kind == "shifted_window") kernel_spec.W = spec.W + spec.S;
  KernelOutputs kernel = testing::float_kernel(kernel_spec, inputs, precision);
  if (kind == "wrong_chunk")
    std::cerr << "wrong_chunk: " << testing::plant_wrong_chunk(spec, inputs, testing::to_float(inputs), kernel) << "\n";
  if (kind == "nan") kernel.o[1](5, 2) = std::numeric_limits<double>::quiet_NaN();
  if (kind == "all_zero")
    for (auto& o : kernel.o) o.setZero();
  const bool gradients = kind.rfind("grads", 0) == 0;
  if (gradients) {
    MechanismSpec backward_spec = spec;
    if (kind == "grads_no_softmax1") backward_spec.softmax1 = false;
    kernel.gradients = testing::float_gradients(backward_spec, inputs, kernel.selection,
                                                cases::seed_of(c.name) ^ 0x9d, precision);
    if (kind == "grads_zero_chunk") kernel.gradients.dk.at(1).middleRows(2 * spec.S, spec.S).setZero();
    if (kind == "grads_wrong_sigma")
      for (auto& dq : kernel.gradients.dq) dq *= 1 / std::sqrt(2.0);
  }

  io::TempFile temp(out);
  {
    H5::H5File file(temp.path().string(), H5F_ACC_TRUNC);
    H5::Group root = file.openGroup("/");
    io::write_attribute(root, "format", std::string("hils-verify"));
    io::write_attribute(root, "format_version", int64_t{kind == "bad_version" ? 99 : 1});
    nlohmann::json sj = config::spec_to_json(spec);
    if (kind == "bad_spec") sj["K"] = "four";
    io::write_attribute(root, "spec", sj.dump());
    io::write_attribute(root, "input_precision", to_string(precision));
    io::write_attribute(root, "kernel", "reference float run (break: " + kind + ")");
    if (kind != "missing_q") write_heads(root, "inputs/q", inputs.q);
    write_heads(root, "inputs/k", inputs.k);
    write_heads(root, "inputs/v", inputs.v);
    write_heads(root, "inputs/q_retrieval", inputs.q_retrieval);
    write_heads(root, "inputs/prior", inputs.prior);
    oracle::for_each_output(kernel, [&](const auto& row, const auto& field) {
      const std::string name = row.name;
      if (!resized || name == "o" || name == "lse" || name == "selection")
        write_output(root, "outputs/" + name, field);
    });
    if (gradients) {
      const auto& g = kernel.gradients;
      if (kind != "grads_missing_do") write_heads(root, "inputs/do", g.d_o);
      write_vectors(root, "inputs/dlse", g.d_lse);
      write_heads(root, "grads/dq", g.dq);
      write_heads(root, "grads/dk", g.dk);
      write_heads(root, "grads/dv", g.dv);
      write_heads(root, "grads/dq_retrieval", g.dq_retrieval);
      write_heads(root, "grads/dprior", g.dprior);
      if (kind == "grads_unknown") write_heads(root, "grads/dfoo", g.dq);
    }
  }
  temp.publish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::cerr << "usage: oracle_make_verify_file OUT CASE BREAK [PRESET=hils] [PRECISION=fp32]\n";
    return 2;
  }
  try {
    return make(argv[1], argv[2], argv[3], argc > 4 ? argv[4] : "hils", argc > 5 ? argv[5] : "fp32");
  } catch (const std::exception& e) {
    std::cerr << "oracle_make_verify_file: " << e.what() << "\n";
    return 2;
  }
}
