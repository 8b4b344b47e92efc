// C ABI wrappers: translate hils_gpu_problem into the C++ API and exceptions into codes.
#include "hils/gpu/c_api.h"

#include <exception>
#include <stdexcept>
#include <string>

#include "c_api_guard.hpp"
#include "hils/gpu/attention.hpp"
#include "hils/gpu/decode.hpp"

namespace {

thread_local std::string g_last_error;

struct Translated {
  hils::MechanismSpec spec;
  hils::gpu::Shape shape;
  hils::gpu::DeviceInputs in;
};

Translated translate(const hils_gpu_problem& p) {
  Translated t;
  t.spec.S = p.S, t.spec.W = p.W, t.spec.K = p.K, t.spec.landmarks = p.landmarks != 0;
  t.spec.key_rule = hils::gpu::detail::enum_field<hils::KeyRule>(p.key_rule, "key_rule");
  t.spec.bias_rule = hils::gpu::detail::enum_field<hils::BiasRule>(p.bias_rule, "bias_rule");
  t.spec.prior_rule = hils::gpu::detail::enum_field<hils::PriorRule>(p.prior_rule, "prior_rule");
  t.spec.group_rule = hils::gpu::detail::enum_field<hils::GroupRule>(p.group_rule, "group_rule");
  t.spec.fusion = hils::gpu::detail::enum_field<hils::Fusion>(p.fusion, "fusion");
  t.spec.softmax1 = p.softmax1 != 0;
  t.spec.scale = p.scale;
  t.shape = hils::gpu::Shape{p.T, p.Hq, p.Hkv, p.d, p.dv};
  t.in.dtype = p.bf16 ? hils::gpu::DType::bf16 : hils::gpu::DType::f32;
  t.in.q = p.q, t.in.k = p.k, t.in.v = p.v, t.in.q_retrieval = p.q_retrieval;
  t.in.prior = p.prior, t.in.prior_rows = p.prior_rows;
  return t;
}

// Runs `body` and maps its exceptions to the documented exit codes.
template <class Body>
int guarded(const hils_gpu_problem* p, Body body) {
  return hils::gpu::detail::call_guarded(g_last_error, [&] {
    if (p == nullptr) throw std::invalid_argument("problem: expected a pointer, got null");
    body(translate(*p));
  });
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// A kernel code (a value of SelectKernel, SparseKernel or WindowKernel) that session 17 removed,
// with its name (gpu/NOTES.md "Kernels removed in session 17"). The codes of the kept kernels are
// their enum values, which stay as they were; removed codes stay unused.
struct RemovedKernel {
  int32_t code;
  const char* name;
};
constexpr RemovedKernel kRemovedSelectKernels[] = {
    {2, "two_pass_v6"},   {3, "two_pass_v7"},   {5, "two_pass_v9"},   {6, "two_pass_v10"},
    {7, "two_pass_v11"},  {8, "two_pass_v12"},  {9, "two_pass_v13"},  {10, "two_pass_v14"},
    {12, "two_pass_v16"}, {13, "two_pass_v17"}, {14, "two_pass_v18"}, {15, "two_pass_v19"},
    {16, "two_pass_v20"}};
constexpr RemovedKernel kRemovedSparseKernels[] = {
    {0, "chunked_v4"},   {1, "atomic_v5"},    {2, "chunked_v6"},   {3, "chunked_v7"},
    {4, "chunked_v8"},   {5, "chunked_v9"},   {6, "chunked_v10"},  {7, "chunked_v11"},
    {8, "chunked_v12"},  {9, "chunked_v13"},  {10, "chunked_v14"}, {11, "chunked_v15"},
    {12, "chunked_v16"}, {13, "chunked_v17"}, {14, "chunked_v18"}, {15, "chunked_v19"},
    {16, "chunked_v20"}, {18, "chunked_v22"}, {19, "chunked_v23"}, {20, "chunked_v24"},
    {21, "chunked_v25"}, {22, "chunked_v26"}, {23, "chunked_v27"}, {24, "chunked_v28"},
    {25, "chunked_v29"}, {27, "chunked_v31"}, {28, "chunked_v32"}};
constexpr RemovedKernel kRemovedWindowKernels[] = {
    {0, "mma_v4"},    {2, "mma_v10"},   {3, "wgmma_v11"}, {4, "wgmma_v12"},
    {5, "wgmma_v13"}, {6, "wgmma_v14"}, {7, "wgmma_v15"}, {8, "wgmma_v16"},
    {9, "wgmma_v17"}};

// The kernel enums' C API tables: the kept kernels (their codes are their values) and the removed
// codes, with each kernel's name.
template <class Kernel>
struct KernelCodes;
template <>
struct KernelCodes<hils::gpu::SelectKernel> {
  static constexpr const auto& kept = hils::gpu::kSelectKernels;
  static constexpr const auto& removed = kRemovedSelectKernels;
  static const char* name(hils::gpu::SelectKernel k) { return hils::gpu::select_kernel_name(k); }
};
template <>
struct KernelCodes<hils::gpu::SparseKernel> {
  static constexpr const auto& kept = hils::gpu::kSparseKernels;
  static constexpr const auto& removed = kRemovedSparseKernels;
  static const char* name(hils::gpu::SparseKernel k) { return hils::gpu::sparse_kernel_name(k); }
};
template <>
struct KernelCodes<hils::gpu::WindowKernel> {
  static constexpr const auto& kept = hils::gpu::kWindowKernels;
  static constexpr const auto& removed = kRemovedWindowKernels;
  static const char* name(hils::gpu::WindowKernel k) { return hils::gpu::window_kernel_name(k); }
};
template <>
struct KernelCodes<hils::gpu::DecodeKernel> {  // the table is decode.hpp's
  static constexpr const auto& kept = hils::gpu::kDecodeKernels;
  static constexpr const auto& removed = hils::gpu::kRemovedDecodeKernels;
  static const char* name(hils::gpu::DecodeKernel k) { return hils::gpu::decode_kernel_name(k); }
};

// "name=code" of every kept kernel (or, `removed`, every removed code), space-separated.
template <class Kernel>
std::string kernel_codes(bool removed) {
  using Codes = KernelCodes<Kernel>;
  std::string out;
  if (removed)
    for (const auto& r : Codes::removed)
      out += (out.empty() ? "" : " ") + std::string(r.name) + "=" + std::to_string(r.code);
  else
    for (Kernel k : Codes::kept)
      out += (out.empty() ? "" : " ") + std::string(Codes::name(k)) + "=" +
             std::to_string(static_cast<int32_t>(k));
  return out;
}

// The kernel of code `value`, or invalid_argument naming the field, the code (and, for a removed
// one, its name and that session 17 removed it, gpu/NOTES.md) and every kept code with its name.
template <class Kernel>
Kernel kernel_of_code(const char* field, int32_t value) {
  using Codes = KernelCodes<Kernel>;
  std::string kept;
  for (Kernel k : Codes::kept) {
    if (static_cast<int32_t>(k) == value) return k;
    kept += (kept.empty() ? "" : ", ") + std::to_string(static_cast<int32_t>(k)) + " (" + Codes::name(k) + ")";
  }
  for (const auto& r : Codes::removed)
    if (r.code == value)
      throw std::invalid_argument(std::string(field) + ": " + std::to_string(value) + " (" + r.name +
                                  ") was removed in session 17 (gpu/NOTES.md \"Kernels removed in "
                                  "session 17\"; its code is at commit ad5fb84); expected one of " +
                                  kept);
  throw std::invalid_argument(std::string(field) + ": expected one of " + kept + ", got " +
                              std::to_string(value));
}

// A process-wide kernel choice by its code: 0 and the choice made, or 2 with kernel_of_code's error.
template <class Kernel, class Set>
int set_kernel_by_code(const char* field, int32_t value, Set set) {
  try {
    set(kernel_of_code<Kernel>(field, value));
  } catch (const std::invalid_argument& e) {
    g_last_error = e.what();
    return 2;
  }
  g_last_error.clear();
  return 0;
}

// An int32 row type of the C API (0 f32, 1 f16, 2 bf16), or invalid_argument naming the field.
hils::gpu::RowType row_type(const char* field, int32_t value) {
  if (value < 0 || value > 2)
    throw std::invalid_argument(std::string(field) + ": expected 0 (f32), 1 (f16) or 2 (bf16), got " +
                                std::to_string(value));
  return static_cast<hils::gpu::RowType>(value);
}

}  // namespace

extern "C" {

const char* hils_gpu_last_error(void) { return g_last_error.c_str(); }

const char* hils_gpu_enum_names(const char* field) {
  static const std::string key = hils::enum_options<hils::KeyRule>(" "),
                           bias = hils::enum_options<hils::BiasRule>(" "),
                           prior = hils::enum_options<hils::PriorRule>(" "),
                           group = hils::enum_options<hils::GroupRule>(" "),
                           fusion = hils::enum_options<hils::Fusion>(" ");
  static const std::string select = kernel_codes<hils::gpu::SelectKernel>(false),
                           sparse = kernel_codes<hils::gpu::SparseKernel>(false),
                           window = kernel_codes<hils::gpu::WindowKernel>(false),
                           select_removed = kernel_codes<hils::gpu::SelectKernel>(true),
                           sparse_removed = kernel_codes<hils::gpu::SparseKernel>(true),
                           window_removed = kernel_codes<hils::gpu::WindowKernel>(true),
                           decode = kernel_codes<hils::gpu::DecodeKernel>(false),
                           decode_removed = kernel_codes<hils::gpu::DecodeKernel>(true);
  const std::string name = field == nullptr ? "" : field;
  if (name == "key_rule") return key.c_str();
  if (name == "bias_rule") return bias.c_str();
  if (name == "prior_rule") return prior.c_str();
  if (name == "group_rule") return group.c_str();
  if (name == "fusion") return fusion.c_str();
  if (name == "select_kernel") return select.c_str();
  if (name == "sparse_kernel") return sparse.c_str();
  if (name == "window_kernel") return window.c_str();
  if (name == "select_kernel_removed") return select_removed.c_str();
  if (name == "sparse_kernel_removed") return sparse_removed.c_str();
  if (name == "window_kernel_removed") return window_removed.c_str();
  if (name == "decode_kernel") return decode.c_str();
  if (name == "decode_kernel_removed") return decode_removed.c_str();
  return nullptr;
}

int hils_gpu_workspace_bytes(const hils_gpu_problem* p, size_t* bytes) {
  return guarded(p, [&](const Translated& t) {
    if (bytes == nullptr) throw std::invalid_argument("bytes: expected a pointer, got null");
    *bytes = hils::gpu::workspace_bytes(t.spec, t.shape);
  });
}

int hils_gpu_run(const hils_gpu_problem* p, float* o, float* lse, void* workspace, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::DeviceOutputs out;
    out.o = o, out.lse = lse;
    hils::gpu::run_mechanism(t.spec, t.shape, t.in, out, workspace, as_stream(stream));
  });
}

int hils_gpu_window(const hils_gpu_problem* p, float* o_swa, float* lse_swa, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::window_attention(t.spec, t.shape, t.in, o_swa, lse_swa, as_stream(stream));
  });
}

int hils_gpu_window_rows(const hils_gpu_problem* p, void* o_swa, int32_t o_swa_type, float* lse_swa,
                         void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::window_attention_rows(t.spec, t.shape, t.in, o_swa, row_type("o_swa_type", o_swa_type),
                                     lse_swa, as_stream(stream));
  });
}

int hils_gpu_full(const hils_gpu_problem* p, float* o, float* lse, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::full_attention(t.spec, t.shape, t.in, o, lse, as_stream(stream));
  });
}

int hils_gpu_exact(const hils_gpu_problem* p, float* exact, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::exact_chunk_log_mass(t.spec, t.shape, t.in, exact, as_stream(stream));
  });
}

int hils_gpu_summarize(const hils_gpu_problem* p, float* key, float* bias, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::summarize(t.spec, t.shape, t.in, key, bias, as_stream(stream));
  });
}

int hils_gpu_select(const hils_gpu_problem* p, const float* key, const float* bias,
                    const float* exact, const float* lse_swa, int32_t* selection,
                    float* selected_score, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::select_chunks(t.spec, t.shape, t.in, key, bias, exact, lse_swa, selection,
                             selected_score, as_stream(stream));
  });
}

int hils_gpu_select_with(const hils_gpu_problem* p, int32_t select_kernel, const float* key,
                         const float* bias, const float* exact, const float* lse_swa,
                         int32_t* selection, float* selected_score, void* stream) {
  return guarded(p, [&](const Translated& t) {
    const auto kernel = kernel_of_code<hils::gpu::SelectKernel>("select_kernel", select_kernel);
    hils::gpu::select_chunks(t.spec, t.shape, t.in, key, bias, exact, lse_swa, selection,
                             selected_score, as_stream(stream),
                             kernel);
  });
}

int hils_gpu_set_sparse_kernel(int32_t sparse_kernel) {
  return set_kernel_by_code<hils::gpu::SparseKernel>(
      "sparse_kernel", sparse_kernel, [](hils::gpu::SparseKernel k) { hils::gpu::set_sparse_kernel(k); });
}

int32_t hils_gpu_sparse_kernel(void) {
  return static_cast<int32_t>(hils::gpu::sparse_kernel());
}

int hils_gpu_set_window_kernel(int32_t window_kernel) {
  return set_kernel_by_code<hils::gpu::WindowKernel>(
      "window_kernel", window_kernel, [](hils::gpu::WindowKernel k) { hils::gpu::set_window_kernel(k); });
}

int32_t hils_gpu_window_kernel(void) {
  return static_cast<int32_t>(hils::gpu::window_kernel());
}

int hils_gpu_set_packed_kernels(int32_t enabled) {
  if (enabled != 0 && enabled != 1) {
    g_last_error = "enabled: expected 0 or 1, got " + std::to_string(enabled);
    return 2;
  }
  hils::gpu::set_packed_kernels(enabled == 1);
  g_last_error.clear();
  return 0;
}

int hils_gpu_set_sparse_segment_queries(int64_t queries) {
  if (queries < 0) {
    g_last_error = "queries: expected >= 0, got " + std::to_string(queries);
    return 2;
  }
  hils::gpu::set_sparse_segment_queries(queries);
  g_last_error.clear();
  return 0;
}

int hils_gpu_fuse(const hils_gpu_problem* p, const int32_t* selection,
                  const float* selected_score, const float* o_swa, const float* lse_swa,
                  float* o, float* lse, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::fuse(t.spec, t.shape, t.in, selection, selected_score, o_swa, lse_swa, o, lse,
                    as_stream(stream));
  });
}

int hils_gpu_fuse_rows(const hils_gpu_problem* p, const int32_t* selection,
                       const float* selected_score, const void* o_swa, int32_t o_swa_type,
                       const float* lse_swa, void* o, int32_t o_type, float* lse, void* stream) {
  return guarded(p, [&](const Translated& t) {
    hils::gpu::fuse_rows(t.spec, t.shape, t.in, selection, selected_score, o_swa,
                         row_type("o_swa_type", o_swa_type), lse_swa, o, row_type("o_type", o_type),
                         lse, as_stream(stream));
  });
}

}  // extern "C"
