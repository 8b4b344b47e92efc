// Host side of the kernels: input validation, stage wrappers and the whole mechanism.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

#include "hils/gpu/attention.hpp"
#include "key_rules.hpp"
#include "launch_params.hpp"

namespace hils::gpu {
namespace {

constexpr int64_t kMaxDim = 256;               // 32 lanes x 8 registers per lane
constexpr size_t kMaxSelectSmem = 48 * 1024;   // the selection kernel's default smem limit
constexpr int kWarpsPerBlock = 4;
// Process-wide switch between the packed tensor-core kernels and the SIMT ones (tests run both).
bool g_packed_kernels = true;
// The packed window kernel named by set_window_kernel; none: default_window_kernel().
std::optional<WindowKernel> g_window_kernel;

// Throws std::invalid_argument("<field>: expected <expected>, got <found>") unless ok.
void require(bool ok, const std::string& field, const std::string& expected,
             const std::string& found) {
  if (!ok) throw std::invalid_argument(field + ": expected " + expected + ", got " + found);
}

// Throws std::invalid_argument("<name>: expected a device pointer, got null") unless p is set:
// a kernel writing through a null output faults, and that fault is a sticky CUDA error that
// poisons the caller's whole context (gpu/NOTES.md "Careless-user audit (session 21)").
void require_pointer(const void* p, const char* name) {
  require(p != nullptr, name, "a device pointer", "null");
}

// The largest buffer, in bytes, that the checks let a shape ask for: 2^59, so that the few
// buffers of workspace_bytes add up without wrapping a size_t (the device has 2^36 or so).
constexpr long double kMaxBufferBytes = 576460752303423488.0L;  // 2^59

// Throws std::invalid_argument naming the product `what` (e.g. "Hq * T * dv") unless the
// buffer of `dims` elements of `element_bytes` stays below kMaxBufferBytes (products in long
// double: int64 products of absurd shapes would wrap before they could be compared).
void require_buffer_fits(const char* what, std::initializer_list<int64_t> dims, size_t element_bytes,
                         const std::string& found) {
  long double bytes = static_cast<long double>(element_bytes);
  for (int64_t n : dims) bytes *= static_cast<long double>(n);
  require(bytes < kMaxBufferBytes, what, "at most 2^59 bytes", found);
}

void check_launch(const char* stage) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("hils::gpu ") + stage + ": " + cudaGetErrorString(err));
}

bool needs_prior(const MechanismSpec& spec) {
  return spec.selects() && spec.key_rule != KeyRule::exact &&
         (spec.key_rule == KeyRule::taylor || spec.bias_rule == BiasRule::entropy);
}

detail::LaunchParams params_of(const MechanismSpec& spec, const Shape& shape,
                               const DeviceInputs& in) {
  detail::LaunchParams p;
  p.T = shape.T, p.Hq = shape.Hq, p.Hkv = shape.Hkv, p.d = shape.d, p.dv = shape.dv;
  p.S = spec.S, p.W = spec.W, p.K = spec.K, p.landmarks = spec.landmarks;
  p.bf16 = in.dtype == DType::bf16;
  p.scale = logit_scale(spec, shape.d);
  p.key_rule = spec.key_rule;
  p.bias_rule = spec.bias_rule;
  p.prior_rule = spec.prior_rule;
  p.group_rule = spec.group_rule;
  p.softmax1 = spec.softmax1;
  p.q = in.q, p.k = in.k, p.v = in.v;
  p.q_retrieval = in.q_retrieval != nullptr ? in.q_retrieval : in.q;
  p.prior = in.prior, p.prior_rows = in.prior_rows;
  return p;
}

const char* fusion_name(Fusion f) {
  switch (f) {
    case Fusion::full: return "full";
    case Fusion::window: return "window";
    case Fusion::flat: return "flat";
    case Fusion::hierarchical: return "hierarchical";
  }
  return "unknown";
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

const char* row_type_name(RowType type) {
  switch (type) {
    case RowType::f32: return "f32";
    case RowType::f16: return "f16";
    case RowType::bf16: return "bf16";
  }
  return "unknown";
}

// The pointers a fusion reads and writes: the selection, o and lse, and for the hierarchical
// fusion the selected scores and the window's o_swa and lse_swa (the flat one reads neither).
void require_fusion_pointers(const MechanismSpec& spec, const void* selection, const void* selected_score,
                             const void* o_swa, const void* lse_swa, const void* o, const void* lse) {
  require_pointer(selection, "selection");
  if (spec.fusion == Fusion::hierarchical) {
    require_pointer(selected_score, "selected_score");
    require_pointer(o_swa, "o_swa");
    require_pointer(lse_swa, "lse_swa");
  }
  require_pointer(o, "o");
  require_pointer(lse, "lse");
}

// Carves consecutive aligned pieces out of the workspace.
struct Carver {
  char* next;
  template <class T>
  T* take(size_t count) {
    T* out = reinterpret_cast<T*>(next);
    next += aligned(count * sizeof(T));
    return out;
  }
};

}  // namespace

int64_t n_chunks(const MechanismSpec& spec, int64_t T) { return T / spec.S; }

float logit_scale(const MechanismSpec& spec, int64_t d) {
  return spec.scale != 0.0 ? static_cast<float>(spec.scale)
                           : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
}

void validate_shape(const MechanismSpec& spec, const Shape& shape) {
  auto str = [](int64_t x) { return std::to_string(x); };
  require(shape.T >= 1, "T", ">= 1", str(shape.T));
  require(shape.Hq >= 1, "Hq", ">= 1", str(shape.Hq));
  require(shape.Hkv >= 1, "Hkv", ">= 1", str(shape.Hkv));
  require(shape.Hq % shape.Hkv == 0, "Hq", "a multiple of Hkv = " + str(shape.Hkv), str(shape.Hq));
  require(shape.d >= 1 && shape.d <= kMaxDim, "d", "1..256", str(shape.d));
  require(shape.dv >= 1 && shape.dv <= kMaxDim, "dv", "1..256", str(shape.dv));
  // A key rule of hils/spec.hpp's table that the kernels do not implement would run with
  // garbage summaries (summarize_kernel writes no key for it): refused from the GPU's one list.
  require(detail::gpu_implements(spec.key_rule), "key_rule",
          "one that the GPU implements (" + detail::gpu_key_rule_names() + ")",
          std::string(enum_name(spec.key_rule)) == "?" ? str(static_cast<int64_t>(spec.key_rule))
                                                       : enum_name(spec.key_rule));
  require(spec.S >= (spec.landmarks ? 2 : 1), "S", spec.landmarks ? ">= 2 with landmarks" : ">= 1",
          str(spec.S));
  require(spec.W >= 1, "W", ">= 1", str(spec.W));
  require(spec.K >= 0, "K", ">= 0", str(spec.K));
  // The reference's rule for the scale (reference/include/hils/spec_fields.hpp "scale").
  require(std::isfinite(spec.scale) && spec.scale >= 0.0, "scale",
          "0 (meaning 1/sqrt(d)) or a finite positive logit scale", std::to_string(spec.scale));
  const int64_t G = shape.Hq / shape.Hkv;
  const size_t select_smem = kWarpsPerBlock * (G * shape.d + G + 2 * spec.K) * sizeof(float);
  require(!spec.selects() || select_smem <= kMaxSelectSmem, "K",
          "G*d + G + 2K <= 3072 (selection scratch)", str(spec.K));
  // The buffers workspace_bytes adds up (and the caller's of the same shapes), each below 2^59
  // bytes: sizes of a garbage or overflowed shape are refused instead of wrapping.
  const auto dims = [&](std::initializer_list<std::pair<const char*, int64_t>> named) {
    std::string out;
    for (const auto& [name, value] : named) out += (out.empty() ? "" : ", ") + std::string(name) + " = " + str(value);
    return out;
  };
  const int64_t width = std::max(shape.d, shape.dv), nc = n_chunks(spec, shape.T);
  require_buffer_fits("Hq * T * max(d, dv)", {shape.Hq, shape.T, width}, sizeof(float),
                      dims({{"Hq", shape.Hq}, {"T", shape.T}, {"max(d, dv)", width}}));
  require_buffer_fits("Hq * T * K", {shape.Hq, shape.T, spec.K}, sizeof(float),
                      dims({{"Hq", shape.Hq}, {"T", shape.T}, {"K", spec.K}}));
  if (spec.key_rule == KeyRule::exact)
    require_buffer_fits("Hq * T * T/S", {shape.Hq, shape.T, nc}, sizeof(float),
                        dims({{"Hq", shape.Hq}, {"T", shape.T}, {"T/S", nc}}));
}

void validate(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in) {
  auto str = [](int64_t x) { return std::to_string(x); };
  validate_shape(spec, shape);
  require_pointer(in.q, "q");
  require_pointer(in.k, "k");
  require_pointer(in.v, "v");
  require(!(spec.key_rule == KeyRule::landmark_key && spec.selects()) || spec.landmarks,
          "landmarks", "true for key_rule landmark_key", "false");
  if (needs_prior(spec)) {
    const int64_t nc = n_chunks(spec, shape.T);
    if (spec.prior_rule == PriorRule::landmark_query)
      require(spec.landmarks, "landmarks", "true for prior_rule landmark_query", "false");
    else
      require(in.prior != nullptr && (in.prior_rows == nc ||
                                       (spec.prior_rule == PriorRule::shared && in.prior_rows == 1)),
              "prior", "[Hq, " + std::string(spec.prior_rule == PriorRule::shared ? "1 or " : "") +
                           str(nc) + ", d] on the device",
              in.prior == nullptr ? "null" : "rows " + str(in.prior_rows));
  }
  // The packed kernels put the KV heads in their grids' second dimension (at most 65535); the
  // SIMT kernels do not (gpu/NOTES.md "Careless-user audit (session 21)").
  const detail::LaunchParams p = params_of(spec, shape, in);
  const bool packed_grid = g_packed_kernels && (detail::packed_path_applies(p) ||
                                                detail::summarize_packed_applies(p) ||
                                                (spec.selects() && detail::packed_select_applies(p)));
  require(!packed_grid || shape.Hkv <= 65535, "Hkv",
          "<= 65535 where the packed kernels run (bf16, d = 64: the KV heads are their grids' "
          "second dimension; hils::gpu::set_packed_kernels(false) runs the SIMT kernels)",
          str(shape.Hkv));
}

void set_packed_kernels(bool enabled) { g_packed_kernels = enabled; }
void set_sparse_segment_queries(int64_t queries) { detail::set_sparse_segment_queries(queries); }
void set_sparse_kernel(std::optional<SparseKernel> kernel) { detail::set_sparse_kernel(kernel); }
SparseKernel sparse_kernel() { return detail::sparse_kernel(); }
const char* sparse_kernel_name(SparseKernel kernel) {
  switch (kernel) {
    case SparseKernel::chunked_v21: return "chunked_v21";
    case SparseKernel::chunked_v30: return "chunked_v30";
    case SparseKernel::chunked_v35: return "chunked_v35";
    case SparseKernel::chunked_v36: return "chunked_v36";
  }
  return "unknown";
}
bool packed_kernels() { return g_packed_kernels; }
void set_window_kernel(std::optional<WindowKernel> kernel) { g_window_kernel = kernel; }
WindowKernel window_kernel() { return g_window_kernel ? *g_window_kernel : default_window_kernel(); }
const char* window_kernel_name(WindowKernel kernel) {
  switch (kernel) {
    case WindowKernel::mma_v9: return "mma_v9";
    case WindowKernel::wgmma_v18: return "wgmma_v18";
    case WindowKernel::wgmma_v19: return "wgmma_v19";
    case WindowKernel::wgmma_v20: return "wgmma_v20";
  }
  return "unknown";
}
const char* select_kernel_name(SelectKernel kernel) {
  switch (kernel) {
    case SelectKernel::two_pass_v4: return "two_pass_v4";
    case SelectKernel::one_pass_v5: return "one_pass_v5";
    case SelectKernel::two_pass_v8: return "two_pass_v8";
    case SelectKernel::two_pass_v15: return "two_pass_v15";
    case SelectKernel::two_pass_v21: return "two_pass_v21";
    case SelectKernel::two_pass_v22: return "two_pass_v22";
    case SelectKernel::two_pass_v26: return "two_pass_v26";
    case SelectKernel::two_pass_v27: return "two_pass_v27";
    case SelectKernel::two_pass_v25: return "two_pass_v25";
  }
  return "unknown";
}
bool wgmma_available() { return detail::wgmma_runs_on_current_device(); }
SelectKernel default_select_kernel() {
  return wgmma_available() ? kDefaultSelectKernel : kSelectKernelWithoutWgmma;
}
SparseKernel default_sparse_kernel() {
  return wgmma_available() ? kDefaultSparseKernel : kSparseKernelWithoutWgmma;
}
WindowKernel default_window_kernel() {
  return wgmma_available() ? kDefaultWindowKernel : kWindowKernelWithoutWgmma;
}

void window_attention(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                      float* o_swa, float* lse_swa, cudaStream_t stream) {
  window_attention_rows(spec, shape, in, o_swa, RowType::f32, lse_swa, stream);
}

void window_attention_rows(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                           void* o_swa_rows, RowType o_swa_type, float* lse_swa,
                           cudaStream_t stream) {
  validate(spec, shape, in);
  require_pointer(o_swa_rows, "o_swa");
  require_pointer(lse_swa, "lse_swa");
  detail::LaunchParams p = params_of(spec, shape, in);
  const WindowKernel kernel = window_kernel();
  require(o_swa_type != RowType::bf16, "o_swa_type", "f32 or f16", row_type_name(o_swa_type));
  if (o_swa_type == RowType::f16) {
    require(g_packed_kernels && detail::packed_path_applies(p), "o_swa_type",
            "f32 outside the packed window kernels' shapes", "f16");
    p.o_swa_rows = RowType::f16;
  }
  auto* o_swa = static_cast<float*>(o_swa_rows);  // __half where p.o_swa_rows is f16
  if (!g_packed_kernels || !detail::packed_path_applies(p)) {
    detail::launch_window(p, o_swa, lse_swa, stream);
  } else if (uses_wgmma(kernel) && !wgmma_available()) {
    detail::refuse_wgmma_kernel("window_kernel", window_kernel_name(kernel),
                                "mma_v9");
  } else if (kernel == WindowKernel::mma_v9) {
    detail::launch_window_v9(p, o_swa, lse_swa, stream);
  } else {
    detail::launch_window_wgmma(p, kernel, o_swa, lse_swa, stream);
  }
  check_launch("window_attention");
}

void full_attention(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                    float* o, float* lse, cudaStream_t stream) {
  validate(spec, shape, in);
  require_pointer(o, "o");
  require_pointer(lse, "lse");
  detail::launch_full(params_of(spec, shape, in), o, lse, stream);
  check_launch("full_attention");
}

void exact_chunk_log_mass(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                          float* exact, cudaStream_t stream) {
  validate(spec, shape, in);
  require_pointer(exact, "exact");
  detail::launch_exact(params_of(spec, shape, in), exact, stream);
  check_launch("exact_chunk_log_mass");
}

void summarize(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in, float* key,
               float* bias, cudaStream_t stream) {
  validate(spec, shape, in);
  require(spec.key_rule != KeyRule::exact, "key_rule", "a summary rule (not exact)", "exact");
  require_pointer(key, "key");
  require_pointer(bias, "bias");
  const auto p = params_of(spec, shape, in);
  if (g_packed_kernels && detail::summarize_packed_applies(p))
    detail::launch_summarize_packed(p, key, bias, stream);
  else
    detail::launch_summarize(p, key, bias, stream);
  check_launch("summarize");
}

void surrogate_scores(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                      const float* key, const float* bias, float* scores, cudaStream_t stream) {
  validate(spec, shape, in);
  require_pointer(key, "key");
  require_pointer(bias, "bias");
  require_pointer(scores, "scores");
  detail::launch_surrogate(params_of(spec, shape, in), key, bias, scores, stream);
  check_launch("surrogate_scores");
}

void select_chunks(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                   const float* key, const float* bias, const float* exact,
                   const float* lse_swa, int32_t* selection, float* selected_score,
                   cudaStream_t stream, std::optional<SelectKernel> kernel) {
  validate(spec, shape, in);
  require(spec.key_rule != KeyRule::exact || exact != nullptr, "exact",
          "L(t,c) scores for key_rule exact", "null");
  if (spec.key_rule != KeyRule::exact) {
    require_pointer(key, "key");
    require_pointer(bias, "bias");
  }
  require_pointer(lse_swa, "lse_swa");
  require_pointer(selection, "selection");
  require_pointer(selected_score, "selected_score");
  const detail::LaunchParams p = params_of(spec, shape, in);
  if (g_packed_kernels && spec.key_rule != KeyRule::exact && detail::packed_select_applies(p))
    detail::launch_select_packed(p, key, bias, lse_swa, selection, selected_score,
                                 kernel.value_or(default_select_kernel()), stream);
  else
    detail::launch_select(p, key, bias, spec.key_rule == KeyRule::exact ? exact : nullptr,
                          lse_swa, selection, selected_score, stream);
  check_launch("select_chunks");
}

void fuse_rows(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
               const int32_t* selection, const float* selected_score, const void* o_swa,
               RowType o_swa_type, const float* lse_swa, void* o, RowType o_type, float* lse,
               cudaStream_t stream) {
  if (o_swa_type == RowType::f32 && o_type == RowType::f32)
    return fuse(spec, shape, in, selection, selected_score, static_cast<const float*>(o_swa),
                lse_swa, static_cast<float*>(o), lse, stream);
  validate(spec, shape, in);
  require_fusion_pointers(spec, selection, selected_score, o_swa, lse_swa, o, lse);
  require(o_swa_type != RowType::bf16, "o_swa_type", "f32 or f16", row_type_name(o_swa_type));
  require(o_type != RowType::f16, "o_type", "f32 or bf16", row_type_name(o_type));
  require(spec.fusion == Fusion::hierarchical, "fusion", "hierarchical for rows other than f32",
          fusion_name(spec.fusion));
  const detail::LaunchParams p = params_of(spec, shape, in);
  require(g_packed_kernels && detail::packed_path_applies(p) && detail::chunked_fuse_applies(p),
          "shape", "the chunk-major sparse stage's packed shapes for rows other than f32",
          "another shape or the SIMT kernels");
  require(detail::fusion_rows_apply(detail::sparse_kernel()), "sparse_kernel",
          "chunked_v30, chunked_v35 or chunked_v36 for rows other than f32",
          sparse_kernel_name(detail::sparse_kernel()));
  detail::launch_fuse_chunked(p, selection, selected_score,
                              detail::FusionRows{o_swa, o_swa_type, o, o_type}, lse_swa, lse, stream);
  check_launch("fuse_rows");
}

void fuse(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
          const int32_t* selection, const float* selected_score, const float* o_swa,
          const float* lse_swa, float* o, float* lse, cudaStream_t stream) {
  validate(spec, shape, in);
  require_fusion_pointers(spec, selection, selected_score, o_swa, lse_swa, o, lse);
  const detail::LaunchParams p = params_of(spec, shape, in);
  if (spec.fusion == Fusion::flat) {
    detail::launch_fuse_flat(p, selection, o, lse, stream);
  } else {
    require(spec.fusion == Fusion::hierarchical, "fusion", "flat or hierarchical",
            fusion_name(spec.fusion));
    if (g_packed_kernels && detail::packed_path_applies(p) && detail::chunked_fuse_applies(p))
      detail::launch_fuse_chunked(p, selection, selected_score,
                                  detail::FusionRows{o_swa, RowType::f32, o, RowType::f32}, lse_swa,
                                  lse, stream);
    else if (g_packed_kernels && detail::packed_path_applies(p))
      detail::launch_fuse_packed(p, selection, selected_score, o_swa, lse_swa, o, lse, stream);
    else
      detail::launch_fuse_hierarchical(p, selection, selected_score, o_swa, lse_swa, o, lse,
                                       stream);
  }
  check_launch("fuse");
}

size_t workspace_bytes(const MechanismSpec& spec, const Shape& shape) {
  validate_shape(spec, shape);
  const size_t T = shape.T, Hq = shape.Hq, Hkv = shape.Hkv, nc = n_chunks(spec, shape.T);
  const size_t K = spec.K;
  size_t bytes = aligned(Hq * T * shape.dv * sizeof(float)) + aligned(Hq * T * sizeof(float));
  bytes += aligned(Hq * nc * shape.d * sizeof(float)) + aligned(Hq * nc * sizeof(float));
  if (spec.key_rule == KeyRule::exact) bytes += aligned(Hq * T * nc * sizeof(float));
  bytes += aligned(Hkv * T * K * sizeof(int32_t)) + aligned(Hq * T * K * sizeof(float));
  return bytes;
}

void run_mechanism(const MechanismSpec& spec, const Shape& shape, const DeviceInputs& in,
                   const DeviceOutputs& out, void* workspace, cudaStream_t stream) {
  validate(spec, shape, in);
  require(out.o != nullptr && out.lse != nullptr, "outputs", "o and lse device pointers", "null");
  if (spec.fusion == Fusion::full) return full_attention(spec, shape, in, out.o, out.lse, stream);
  require(workspace != nullptr, "workspace", "workspace_bytes(spec, shape) device bytes", "null");
  Carver carve{static_cast<char*>(workspace)};
  const int64_t nc = n_chunks(spec, shape.T);
  float* o_swa = carve.take<float>(shape.Hq * shape.T * shape.dv);
  float* lse_swa = carve.take<float>(shape.Hq * shape.T);
  float* key = carve.take<float>(shape.Hq * nc * shape.d);
  float* bias = carve.take<float>(shape.Hq * nc);
  float* exact = spec.key_rule == KeyRule::exact ? carve.take<float>(shape.Hq * shape.T * nc)
                                                 : nullptr;
  int32_t* selection = carve.take<int32_t>(shape.Hkv * shape.T * spec.K);
  float* selected_score = carve.take<float>(shape.Hq * shape.T * spec.K);
  if (out.o_window) o_swa = out.o_window;
  if (out.lse_window) lse_swa = out.lse_window;
  if (out.summary_key) key = out.summary_key;
  if (out.summary_bias) bias = out.summary_bias;
  if (out.selection) selection = out.selection;
  if (out.exact) exact = out.exact;
  window_attention(spec, shape, in, o_swa, lse_swa, stream);
  if (spec.fusion == Fusion::window) {
    cudaMemcpyAsync(out.o, o_swa, shape.Hq * shape.T * shape.dv * sizeof(float),
                    cudaMemcpyDeviceToDevice, stream);
    cudaMemcpyAsync(out.lse, lse_swa, shape.Hq * shape.T * sizeof(float),
                    cudaMemcpyDeviceToDevice, stream);
    return check_launch("run_mechanism window copy");
  }
  if (exact != nullptr) exact_chunk_log_mass(spec, shape, in, exact, stream);
  if (spec.key_rule != KeyRule::exact) {
    summarize(spec, shape, in, key, bias, stream);
    if (out.surrogate) surrogate_scores(spec, shape, in, key, bias, out.surrogate, stream);
  }
  select_chunks(spec, shape, in, key, bias, exact, lse_swa, selection, selected_score, stream);
  fuse(spec, shape, in, selection, selected_score, o_swa, lse_swa, out.o, out.lse, stream);
}

}  // namespace hils::gpu
