// python_case_reference OUT CASE PRESET: writes the inputs of a case of the table (the float
// draws of cases::make_inputs, widened to double, as oracle_make_verify_file stores them) and
// the double reference's outputs on them to an HDF5 file, for tests/python/test_reference_cases.py,
// which checks that hils.reference returns the same numbers bit for bit.
// Layout: attribute spec (JSON), /inputs/{q,k,v,q_retrieval,prior} float64,
// /reference/{o,lse,fusion_weights,selection,surrogate_scores,o_window,lse_window,summary_key,
// summary_bias} (float64; selection int64), each present where the mechanism has it.
#include <iostream>
#include <string>

#include "case_inputs.hpp"
#include "config/config.hpp"
#include "io/hdf5_util.hpp"

using namespace hils;

namespace {

// Head lists -> one [H x rows x cols] float64 dataset.
void write_heads(H5::Group& root, const std::string& name, const std::vector<Matrix<double>>& heads) {
  std::vector<double> flat;
  for (const auto& m : heads) flat.insert(flat.end(), m.data(), m.data() + m.size());
  io::write_doubles(root, name, flat.data(),
                    {heads.size(), static_cast<hsize_t>(heads.front().rows()),
                     static_cast<hsize_t>(heads.front().cols())}, false);
}

void write_vectors(H5::Group& root, const std::string& name, const std::vector<Vector<double>>& heads) {
  std::vector<double> flat;
  for (const auto& v : heads) flat.insert(flat.end(), v.data(), v.data() + v.size());
  io::write_doubles(root, name, flat.data(),
                    {heads.size(), static_cast<hsize_t>(heads.front().size())}, false);
}

template <class Field>
std::vector<Matrix<double>> heads_of(const MechanismOutputs<double>& run, Field field) {
  std::vector<Matrix<double>> out;
  for (const auto& h : run.heads) out.push_back(h.*field);
  return out;
}

template <class Field>
std::vector<Vector<double>> vectors_of(const MechanismOutputs<double>& run, Field field) {
  std::vector<Vector<double>> out;
  for (const auto& h : run.heads) out.push_back(h.*field);
  return out;
}

int write(const std::string& out, const std::string& case_name, const std::string& preset_name) {
  const auto& c = cases::case_named(case_name);
  MechanismSpec spec = cases::with_case_geometry(preset(preset_name), c);
  if (!c.landmarks && spec.needs_prior()) spec.prior_rule = PriorRule::shared;
  AttentionInputs<double> in;
  const auto f = cases::make_inputs<float>(c);
  for (const auto& x : f.q) in.q.push_back(x.cast<double>());
  for (const auto& x : f.k) in.k.push_back(x.cast<double>());
  for (const auto& x : f.v) in.v.push_back(x.cast<double>());
  for (const auto& x : f.q_retrieval) in.q_retrieval.push_back(x.cast<double>());
  for (const auto& x : f.prior) in.prior.push_back(x.cast<double>());

  RunOptions options;
  options.keep_surrogate_scores = spec.selects();
  options.keep_window = spec.fusion != Fusion::full;
  const auto run = run_mechanism(spec, in, options);

  io::TempFile temp(out);
  {
    H5::H5File file(temp.path().string(), H5F_ACC_TRUNC);
    H5::Group root = file.openGroup("/");
    io::write_attribute(root, "spec", config::spec_to_json(spec).dump());
    write_heads(root, "inputs/q", in.q);
    write_heads(root, "inputs/k", in.k);
    write_heads(root, "inputs/v", in.v);
    write_heads(root, "inputs/q_retrieval", in.q_retrieval);
    write_heads(root, "inputs/prior", in.prior);
    using H = HeadOutputs<double>;
    write_heads(root, "reference/o", heads_of(run, &H::o));
    write_vectors(root, "reference/lse", vectors_of(run, &H::lse));
    write_heads(root, "reference/fusion_weights", heads_of(run, &H::fusion_weights));
    if (spec.selects()) {
      std::vector<int64_t> flat;
      for (const auto& m : run.selection) flat.insert(flat.end(), m.data(), m.data() + m.size());
      io::write_int64s(root, "reference/selection", flat.data(),
                       {run.selection.size(), static_cast<hsize_t>(run.selection.front().rows()),
                        static_cast<hsize_t>(spec.K)});
      write_heads(root, "reference/surrogate_scores", heads_of(run, &H::surrogate_scores));
    }
    if (options.keep_window) {
      write_heads(root, "reference/o_window", heads_of(run, &H::o_window));
      write_vectors(root, "reference/lse_window", vectors_of(run, &H::lse_window));
    }
    if (spec.selects() && spec.key_rule != KeyRule::exact) {
      const Geometry geometry = geometry_of(spec, in.T());
      const double scale = logit_scale(spec, in.d());
      std::vector<Matrix<double>> keys;
      std::vector<Vector<double>> biases;
      for (int64_t h = 0; h < in.Hq(); ++h) {
        const Matrix<double> prior =
            spec.needs_prior() ? resolve_prior(in, h, spec, geometry) : Matrix<double>();
        const int64_t G = in.Hq() / in.Hkv();
        const auto s = summarize(in.k[h / G], prior, spec.key_rule, spec.bias_rule, geometry, scale);
        keys.push_back(s.key);
        biases.push_back(s.bias);
      }
      write_heads(root, "reference/summary_key", keys);
      write_vectors(root, "reference/summary_bias", biases);
    }
  }
  temp.publish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: python_case_reference OUT CASE PRESET\n";
    return 2;
  }
  try {
    return write(argv[1], argv[2], argv[3]);
  } catch (const std::exception& e) {
    std::cerr << "python_case_reference: " << e.what() << "\n";
    return 2;
  }
}
