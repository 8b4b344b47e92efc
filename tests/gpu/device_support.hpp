// Test support for the GPU kernels: guarded device buffers and uploads of reference inputs in
// fp32 or bf16 (the bf16 values are exactly the oracle's round_to_bf16 of the double inputs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hils/analysis/oracle.hpp"
#include "hils/attention.hpp"
#include "case_table.hpp"
#include "hils/gpu/attention.hpp"

namespace hils::gpu::testing {

// Guard bytes before and after every device output: a kernel that writes outside its tensor
// changes them. Outputs start as all-ones bytes (NaN floats, -1 ints) so unwritten elements
// are caught by the oracle's NaN check.
constexpr std::size_t kGuardBytes = 256;
constexpr unsigned char kGuardPattern = 0xA5;
constexpr unsigned char kPoisonPattern = 0xFF;

// One device allocation with guards on both sides. Owns its memory; move-only.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(std::size_t bytes);
  GuardedBuffer(GuardedBuffer&& other) noexcept;
  GuardedBuffer& operator=(GuardedBuffer&&) = delete;
  GuardedBuffer(const GuardedBuffer&) = delete;
  ~GuardedBuffer();

  void* data() const { return base_ + kGuardBytes; }
  template <class T>
  T* as() const { return static_cast<T*>(data()); }
  std::size_t bytes() const { return bytes_; }
  // Copies the payload to the host.
  std::vector<unsigned char> download() const;
  // An empty string when both guards are intact, else where the first damage is.
  std::string guard_damage(const std::string& name) const;

 private:
  unsigned char* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// The sparse stages that the packed and segment tests iterate: every SparseKernel, or those
// named in HILS_GPU_SPARSE_KERNELS (comma-separated, e.g. "chunked_v36,chunked_v21"; one device
// run cannot afford every version in those tests). Throws std::invalid_argument naming the
// variable and the accepted names when a name is unknown.
std::vector<SparseKernel> sparse_kernels_under_test();
// The same for the window kernels that the window tests iterate (HILS_GPU_WINDOW_KERNELS, e.g.
// "mma_v9,wgmma_v18,wgmma_v19").
std::vector<WindowKernel> window_kernels_under_test();

// Throws std::runtime_error with the CUDA message when err != cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

// Concatenates head matrices into one head-major host array of the element type (bf16: the
// oracle's round_to_bf16 of each value).
std::vector<unsigned char> pack_heads(const std::vector<Matrix<double>>& heads, DType dtype);
// A guarded device copy of host bytes.
GuardedBuffer upload(const std::vector<unsigned char>& bytes);

// Inputs on the device: q, k, v, q~, prior, head-major, in the requested element type.
struct DeviceInputSet {
  std::vector<GuardedBuffer> buffers;
  DeviceInputs view;
};
DeviceInputSet upload_inputs(const AttentionInputs<double>& inputs, DType dtype);

// [H, rows, cols] fp32 on the device -> H matrices in double.
std::vector<Matrix<double>> heads_of(const GuardedBuffer& buffer, int64_t H, int64_t rows,
                                     int64_t cols);
// [H, rows] fp32 -> H vectors in double.
std::vector<Vector<double>> head_vectors_of(const GuardedBuffer& buffer, int64_t H, int64_t rows);
// [H, rows, cols] int32 -> H index matrices.
std::vector<IndexMatrix> index_heads_of(const GuardedBuffer& buffer, int64_t H, int64_t rows,
                                        int64_t cols);

// Copies chunk `from` (keys of every KV head scaled by 1 + relative_perturbation, q and q~ at
// its landmark slot for every query head) onto chunk `to`: their summaries and exact masses tie.
void duplicate_chunk(AttentionInputs<double>& in, int64_t S, int64_t from, int64_t to,
                     double relative_perturbation);

// Inputs of `c` with chunk 2 copied onto chunks 5, 9, 13 and 17 (keys scaled by
// 1 + perturbation; q and q~ at the landmark slots copied), so that their summaries and exact
// masses tie exactly (perturbation 0) or nearly.
AttentionInputs<double> tied_inputs(const cases::Case& c, double perturbation);

oracle::InputPrecision precision_of(DType dtype);
// Precision of the kernel's selection scores: bf16 where the packed selection runs (it rounds
// the summaries k' to bf16 for the tensor cores), else fp32.
oracle::InputPrecision score_precision_of(DType dtype, int64_t d, const MechanismSpec& spec);
// The oracle's options for a kernel's outputs on dtype inputs of width d: precision_of and
// score_precision_of.
oracle::VerifyOptions verify_options(DType dtype, int64_t d, const MechanismSpec& spec);
const char* name_of(DType dtype);

}  // namespace hils::gpu::testing
