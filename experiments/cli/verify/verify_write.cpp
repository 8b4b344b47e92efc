// The inputs half of a verify file (data/verify_format.md), written for a kernel's harness to
// add its /outputs to: `hils cases` writes one per hard case.
#include <memory>
#include <stdexcept>

#include "cli/verify/verify_file.hpp"
#include "config/spec_codec.hpp"
#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"

namespace hils::cli::verify {

namespace {

// Head matrices -> one float32 dataset [heads, rows, columns] (nothing when there are none).
void write_heads(H5::Group& root, const std::string& name, const std::vector<Matrix<double>>& heads) {
  if (heads.empty()) return;
  std::vector<double> flat;
  for (const auto& m : heads) {
    // Row-major, as the format's readers expect (Matrix is row-major: hils/types.hpp).
    flat.insert(flat.end(), m.data(), m.data() + m.size());
  }
  for (double x : flat)
    if (static_cast<double>(static_cast<float>(x)) != x)
      throw std::logic_error("write_verify_inputs: " + name + " holds a value float32 cannot hold");
  // Closed here, inside the write guard (as the activation writer does): a failed close (a full
  // disk flushing a small dataset's buffer) becomes FileError rather than a
  // "DataSet::~DataSet - H5Dclose failed" line printed by the destructor.
  io::write_doubles(root, name, flat.data(),
                    {heads.size(), static_cast<hsize_t>(heads.front().rows()),
                     static_cast<hsize_t>(heads.front().cols())},
                    true)
      .close();
}

void write_contents(H5::H5File& h5, const MechanismSpec& spec, oracle::InputPrecision precision,
                    const AttentionInputs<double>& inputs, const std::vector<int64_t>& queries) {
  H5::Group root = h5.openGroup("/");
  io::write_attribute(root, "format", std::string(kVerifyFormat));
  io::write_attribute(root, "format_version", kVerifyFormatVersion);
  io::write_attribute(root, "spec", io::json_text(config::spec_to_json(spec)));
  io::write_attribute(root, "input_precision", oracle::to_string(precision));
  write_heads(root, "inputs/q", inputs.q);
  write_heads(root, "inputs/k", inputs.k);
  write_heads(root, "inputs/v", inputs.v);
  write_heads(root, "inputs/q_retrieval", inputs.q_retrieval);
  write_heads(root, "inputs/prior", inputs.prior);
  if (!queries.empty())
    io::write_int64s(root, "queries", queries.data(), {static_cast<hsize_t>(queries.size())})
        .close();  // see write_heads
}

}  // namespace

void write_verify_inputs(const std::filesystem::path& file, const MechanismSpec& spec,
                         oracle::InputPrecision precision, const AttentionInputs<double>& inputs,
                         const std::vector<int64_t>& queries) {
  io::TempFile temp(file);
  io::guard_write(file, [&] {
    auto h5 = std::make_unique<H5::H5File>(temp.path().string(), H5F_ACC_TRUNC);
    try {
      write_contents(*h5, spec, precision, inputs, queries);
    } catch (...) {
      try {
        io::close_file(file, h5);  // never leave a failed file for H5File's destructor to close
      } catch (const io::FileError&) {
      }
      throw;
    }
    io::close_file(file, h5);
  });
  temp.publish();
}

}  // namespace hils::cli::verify
