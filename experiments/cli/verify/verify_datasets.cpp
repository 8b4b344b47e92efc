// The datasets of a verify file (data/verify_format.md): heads of matrices and vectors, the
// selection, and the /inputs, /outputs and /grads groups built from them.
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/verify/verify_file.hpp"
#include "io/file_error.hpp"
#include "io/hdf5_util.hpp"

namespace hils::cli::verify {

namespace fs = std::filesystem;

namespace {

// `axes` ("(heads, rows, columns)") with a word on a batch axis when the dataset has one axis
// more than `rank`: a file holds one sequence (a kernel's [B, ...] tensors go one b per file).
std::string axes_for(const H5::DataSet& ds, size_t rank, std::string axes) {
  if (io::dataset_dims(ds).size() == rank + 1 && !axes.empty() && axes.back() == ')')
    axes.insert(axes.size() - 1, "; one sequence per file, no batch axis: write x[b]");
  return axes;
}

// A rank-3 float dataset [H x rows x cols] as H row-major matrices; `expected` may hold -1.
// `axes` names the axes in the message of a wrong shape.
std::vector<Matrix<double>> read_heads(const fs::path& file, const H5::Group& root,
                                       const std::string& name, const std::vector<int64_t>& expected,
                                       bool finite_only,
                                       const std::string& axes = "(heads, rows, columns)") {
  const H5::DataSet ds = io::open_dataset(file, root, name);
  io::require_dims(file, name, ds, expected, axes_for(ds, expected.size(), axes));
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
  io::require_dims(file, name, ds, {-1, -1}, axes_for(ds, 2, "(heads, rows)"));
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
  io::require_dims(file, name, ds, {-1, -1, -1}, axes_for(ds, 3, "(KV groups, queries, K)"));
  const auto dims = io::dataset_dims(ds);
  const std::vector<int64_t> data = io::read_int64s(ds);
  std::vector<IndexMatrix> heads;
  const auto rows = static_cast<Eigen::Index>(dims[1]), cols = static_cast<Eigen::Index>(dims[2]);
  for (hsize_t g = 0; g < dims[0]; ++g) {
    IndexMatrix m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) {
      const int64_t value = data[g * rows * cols + i];
      if (value < -1 || value > std::numeric_limits<int32_t>::max())
        io::fail(file, name, "chunk indices from -1 (padding) to 2147483647 (int32)",
                 std::to_string(value));
      m.data()[i] = static_cast<int32_t>(value);
    }
    heads.push_back(std::move(m));
  }
  return heads;
}

// "[4, 512, 32]"
std::string dims_text(const std::vector<hsize_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

}  // namespace

// /inputs: q [Hq,T,d], k [Hkv,T,d], v [Hkv,T,dv], optional q_retrieval [Hq,T,d], prior [Hq,R,d].
// T and d are q's: each other input's message says so and shows q's shape, so that a q written
// in another layout ([T, Hq, d]) is recognised there, not taken for a wrong k.
AttentionInputs<double> read_inputs(const fs::path& file, const H5::H5File& h5) {
  const H5::Group root = h5.openGroup("/");
  AttentionInputs<double> in;
  in.q = read_heads(file, root, "inputs/q", {-1, -1, -1}, true);
  // From the dataset, not in.q: a q of no heads has no matrices to read T and d from.
  const auto q_dims = io::dataset_dims(io::open_dataset(file, root, "inputs/q"));
  const auto Hq = static_cast<int64_t>(q_dims[0]), T = static_cast<int64_t>(q_dims[1]),
             d = static_cast<int64_t>(q_dims[2]);
  if (Hq == 0) io::fail(file, "inputs/q", "at least one query head", "shape " + dims_text(q_dims));
  const std::string q_shape = "from inputs/q, shape " + dims_text(q_dims) + " read as [Hq, T, d]";
  in.k = read_heads(file, root, "inputs/k", {-1, T, d}, true,
                    fmt::format("(KV heads, T, d; T = {} and d = {} {})", T, d, q_shape));
  const auto k_dims = io::dataset_dims(io::open_dataset(file, root, "inputs/k"));
  in.v = read_heads(file, root, "inputs/v", {static_cast<int64_t>(k_dims[0]), T, -1}, true,
                    fmt::format("(KV heads, T, dv; KV heads = {} from inputs/k, T = {} {})",
                                k_dims[0], T, q_shape));
  if (io::has_object(root, "inputs/q_retrieval"))
    in.q_retrieval = read_heads(file, root, "inputs/q_retrieval", {Hq, T, d}, true,
                                "(Hq, T, d " + q_shape + ")");
  if (io::has_object(root, "inputs/prior"))
    in.prior = read_heads(file, root, "inputs/prior", {Hq, -1, d}, true,
                          fmt::format("(Hq, rows, d; Hq = {} and d = {} {})", Hq, d, q_shape));
  return in;
}

// /outputs: every stage is optional (oracle::kOutputTensors, in its order); values may be NaN or
// Inf (the oracle judges them).
oracle::KernelOutputs read_outputs(const fs::path& file, const H5::H5File& h5) {
  const H5::Group root = h5.openGroup("/");
  oracle::KernelOutputs out;
  auto read = [&](const std::string& path, auto& target) {
    using Field = std::decay_t<decltype(target)>;
    if constexpr (std::is_same_v<Field, std::vector<Matrix<double>>>)
      target = read_heads(file, root, path, {-1, -1, -1}, false);
    else if constexpr (std::is_same_v<Field, std::vector<Vector<double>>>)
      target = read_head_vectors(file, root, path);
    else {
      static_assert(std::is_same_v<Field, std::vector<IndexMatrix>>, "a reader for this output");
      target = read_selection(file, root, path);
    }
  };
  oracle::for_each_output(out, [&](const auto& row, auto& target) {
    const std::string path = std::string("outputs/") + row.name;
    if (io::has_object(root, path)) read(path, target);
  });
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

}  // namespace hils::cli::verify
