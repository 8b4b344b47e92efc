#include "device_support.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>

#include "case_inputs.hpp"

namespace hils::gpu::testing {
namespace {

// bf16 bits of a double that round_to_bf16 already made exactly representable.
uint16_t bf16_bits(double rounded) {
  const float f = static_cast<float>(rounded);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

// The kernels of `all` named in the environment variable `variable` (comma-separated), or all of
// them when it is unset; an unknown name throws std::invalid_argument naming the variable and
// the accepted names.
template <class Kernel, std::size_t n, class NameOf>
std::vector<Kernel> kernels_named_in(const char* variable, const Kernel (&all)[n], NameOf name_of) {
  const char* list = std::getenv(variable);
  if (list == nullptr) return {std::begin(all), std::end(all)};
  std::vector<Kernel> kernels;
  std::string names = list, known;
  for (auto kernel : all) known += (known.empty() ? "" : ", ") + std::string(name_of(kernel));
  for (std::size_t at = 0; at <= names.size();) {
    const std::size_t comma = std::min(names.find(',', at), names.size());
    const std::string name = names.substr(at, comma - at);
    bool found = false;
    for (auto kernel : all)
      if (name == name_of(kernel)) kernels.push_back(kernel), found = true;
    if (!found)
      throw std::invalid_argument(std::string(variable) + ": expected a comma-separated list of " +
                                  known + ", got '" + names + "'");
    at = comma + 1;
  }
  return kernels;
}

}  // namespace

std::vector<SparseKernel> sparse_kernels_under_test() {
  return kernels_named_in("HILS_GPU_SPARSE_KERNELS", kSparseKernels, sparse_kernel_name);
}

std::vector<WindowKernel> window_kernels_under_test() {
  return kernels_named_in("HILS_GPU_WINDOW_KERNELS", kWindowKernels, window_kernel_name);
}

// Concatenates head matrices into one head-major host array of the element type.
std::vector<unsigned char> pack_heads(const std::vector<Matrix<double>>& heads, DType dtype) {
  std::vector<unsigned char> bytes;
  for (const auto& m : heads)
    for (int64_t i = 0; i < m.rows(); ++i)
      for (int64_t j = 0; j < m.cols(); ++j) {
        if (dtype == DType::f32) {
          const float f = static_cast<float>(m(i, j));
          const auto* p = reinterpret_cast<const unsigned char*>(&f);
          bytes.insert(bytes.end(), p, p + sizeof f);
        } else {
          const uint16_t b = bf16_bits(oracle::round_to_bf16(m(i, j)));
          const auto* p = reinterpret_cast<const unsigned char*>(&b);
          bytes.insert(bytes.end(), p, p + sizeof b);
        }
      }
  return bytes;
}

GuardedBuffer upload(const std::vector<unsigned char>& bytes) {
  GuardedBuffer buffer(bytes.size());
  check_cuda(cudaMemcpy(buffer.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
             "upload");
  return buffer;
}

void duplicate_chunk(AttentionInputs<double>& in, int64_t S, int64_t from, int64_t to,
                     double relative_perturbation) {
  for (auto& k : in.k)
    for (int64_t s = 0; s < S; ++s)
      k.row(to * S + s) = k.row(from * S + s) * (1.0 + relative_perturbation);
  for (auto* heads : {&in.q, &in.q_retrieval})
    for (auto& q : *heads) q.row((to + 1) * S - 1) = q.row((from + 1) * S - 1);
}


AttentionInputs<double> tied_inputs(const cases::Case& c, double perturbation) {
  auto in = cases::make_inputs<double>(c, /*salt=*/0x7135);
  for (int64_t to : {5, 9, 13, 17}) duplicate_chunk(in, c.S, 2, to, perturbation);
  return in;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

GuardedBuffer::GuardedBuffer(std::size_t bytes) : bytes_(bytes) {
  void* raw = nullptr;
  check_cuda(cudaMalloc(&raw, bytes + 2 * kGuardBytes), "cudaMalloc");
  base_ = static_cast<unsigned char*>(raw);
  check_cuda(cudaMemset(base_, kGuardPattern, kGuardBytes), "guard");
  check_cuda(cudaMemset(base_ + kGuardBytes + bytes, kGuardPattern, kGuardBytes), "guard");
  check_cuda(cudaMemset(base_ + kGuardBytes, kPoisonPattern, bytes), "poison");
}

GuardedBuffer::GuardedBuffer(GuardedBuffer&& other) noexcept
    : base_(other.base_), bytes_(other.bytes_) {
  other.base_ = nullptr;
}

GuardedBuffer::~GuardedBuffer() {
  if (base_ != nullptr) cudaFree(base_);
}

std::vector<unsigned char> GuardedBuffer::download() const {
  std::vector<unsigned char> host(bytes_);
  check_cuda(cudaMemcpy(host.data(), data(), bytes_, cudaMemcpyDeviceToHost), "download");
  return host;
}

std::string GuardedBuffer::guard_damage(const std::string& name) const {
  std::vector<unsigned char> host(bytes_ + 2 * kGuardBytes);
  check_cuda(cudaMemcpy(host.data(), base_, host.size(), cudaMemcpyDeviceToHost), "guards");
  if (auto at = oracle::first_guard_violation(host.data(), kGuardBytes, kGuardPattern))
    return name + ": guard before the tensor overwritten at byte " + std::to_string(*at);
  if (auto at = oracle::first_guard_violation(host.data() + kGuardBytes + bytes_, kGuardBytes,
                                              kGuardPattern))
    return name + ": guard after the tensor overwritten at byte " + std::to_string(*at);
  return {};
}

DeviceInputSet upload_inputs(const AttentionInputs<double>& inputs, DType dtype) {
  DeviceInputSet set;
  set.buffers.reserve(5);
  set.view.dtype = dtype;
  set.buffers.push_back(upload(pack_heads(inputs.q, dtype)));
  set.view.q = set.buffers.back().data();
  set.buffers.push_back(upload(pack_heads(inputs.k, dtype)));
  set.view.k = set.buffers.back().data();
  set.buffers.push_back(upload(pack_heads(inputs.v, dtype)));
  set.view.v = set.buffers.back().data();
  if (!inputs.q_retrieval.empty()) {
    set.buffers.push_back(upload(pack_heads(inputs.q_retrieval, dtype)));
    set.view.q_retrieval = set.buffers.back().data();
  }
  if (!inputs.prior.empty()) {
    set.buffers.push_back(upload(pack_heads(inputs.prior, dtype)));
    set.view.prior = set.buffers.back().data();
    set.view.prior_rows = inputs.prior.front().rows();
  }
  return set;
}

std::vector<Matrix<double>> heads_of(const GuardedBuffer& buffer, int64_t H, int64_t rows,
                                     int64_t cols) {
  const auto host = buffer.download();
  const float* f = reinterpret_cast<const float*>(host.data());
  std::vector<Matrix<double>> heads;
  for (int64_t h = 0; h < H; ++h) {
    Matrix<double> m(rows, cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) m(i, j) = f[(h * rows + i) * cols + j];
    heads.push_back(std::move(m));
  }
  return heads;
}

std::vector<Vector<double>> head_vectors_of(const GuardedBuffer& buffer, int64_t H, int64_t rows) {
  std::vector<Vector<double>> out;
  for (const auto& m : heads_of(buffer, H, rows, 1)) out.push_back(m.col(0));
  return out;
}

std::vector<IndexMatrix> index_heads_of(const GuardedBuffer& buffer, int64_t H, int64_t rows,
                                        int64_t cols) {
  const auto host = buffer.download();
  const int32_t* x = reinterpret_cast<const int32_t*>(host.data());
  std::vector<IndexMatrix> heads;
  for (int64_t h = 0; h < H; ++h) {
    IndexMatrix m(rows, cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) m(i, j) = x[(h * rows + i) * cols + j];
    heads.push_back(std::move(m));
  }
  return heads;
}

oracle::InputPrecision precision_of(DType dtype) {
  return dtype == DType::bf16 ? oracle::InputPrecision::bf16 : oracle::InputPrecision::fp32;
}

oracle::InputPrecision score_precision_of(DType dtype, int64_t d, const MechanismSpec& spec) {
  const bool packed_select = dtype == DType::bf16 && d == 64 && packed_kernels() &&
                             spec.key_rule != KeyRule::exact && spec.K >= 1 && spec.K <= 64;
  return packed_select ? oracle::InputPrecision::bf16 : oracle::InputPrecision::fp32;
}

oracle::VerifyOptions verify_options(DType dtype, int64_t d, const MechanismSpec& spec) {
  oracle::VerifyOptions options;
  options.precision = precision_of(dtype);
  options.score_precision = score_precision_of(dtype, d, spec);
  return options;
}

const char* name_of(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp32"; }

}  // namespace hils::gpu::testing
