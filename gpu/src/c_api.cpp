// C ABI wrappers: translate hils_gpu_problem into the C++ API and exceptions into codes.
#include "hils/gpu/c_api.h"

#include <exception>
#include <iterator>
#include <stdexcept>
#include <string>

#include "c_api_guard.hpp"
#include "hils/gpu/attention.hpp"

namespace {

thread_local std::string g_last_error;

struct Translated {
  hils::MechanismSpec spec;
  hils::gpu::Shape shape;
  hils::gpu::DeviceInputs in;
};

// An enum field of hils_gpu_problem -> the spec's value, or invalid_argument naming the field
// and the accepted integers (the names tables of hils/spec.hpp, in integer order).
template <class Enum>
Enum enum_field(int32_t value, const char* field) {
  if (auto e = hils::enum_from_int<Enum>(value)) return *e;
  std::string accepted;
  for (const auto& entry : hils::enum_names(Enum{})) {
    const int i = static_cast<int>(entry.value);  // the tables are in integer order
    accepted += (i == 0 ? "" : ", ") + std::to_string(i) + " (" + entry.name + ")";
  }
  throw std::invalid_argument(std::string(field) + ": expected one of " + accepted + ", got " +
                              std::to_string(value));
}

Translated translate(const hils_gpu_problem& p) {
  Translated t;
  t.spec.S = p.S, t.spec.W = p.W, t.spec.K = p.K, t.spec.landmarks = p.landmarks != 0;
  t.spec.key_rule = enum_field<hils::KeyRule>(p.key_rule, "key_rule");
  t.spec.bias_rule = enum_field<hils::BiasRule>(p.bias_rule, "bias_rule");
  t.spec.prior_rule = enum_field<hils::PriorRule>(p.prior_rule, "prior_rule");
  t.spec.group_rule = enum_field<hils::GroupRule>(p.group_rule, "group_rule");
  t.spec.fusion = enum_field<hils::Fusion>(p.fusion, "fusion");
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

// Every value of `kernels` (the values are their indices) with its name: "0 (a), 1 (b)", the
// last one joined by `last_joiner`.
template <class Kernel, size_t N, class NameOf>
std::string kernel_values(const Kernel (&kernels)[N], NameOf name_of, const char* last_joiner) {
  std::string names;
  for (size_t i = 0; i < N; ++i)
    names += (i == 0 ? "" : i + 1 == N ? last_joiner : ", ") + std::to_string(i) + " (" +
             name_of(kernels[i]) + ")";
  return names;
}

// A process-wide kernel choice by its enum value (the values are the indices of `kernels`): 0 and
// the choice made, or 2 with an error naming the field and every accepted value with its name.
template <class Kernel, size_t N, class NameOf, class Set>
int set_kernel_by_value(const char* field, int32_t value, const Kernel (&kernels)[N], NameOf name_of,
                        Set set) {
  if (value < 0 || value >= static_cast<int32_t>(N)) {
    g_last_error = std::string(field) + ": expected one of " + kernel_values(kernels, name_of, ", ") +
                   ", got " + std::to_string(value);
    return 2;
  }
  set(static_cast<Kernel>(value));
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
  const std::string name = field == nullptr ? "" : field;
  if (name == "key_rule") return key.c_str();
  if (name == "bias_rule") return bias.c_str();
  if (name == "prior_rule") return prior.c_str();
  if (name == "group_rule") return group.c_str();
  if (name == "fusion") return fusion.c_str();
  return nullptr;
}

int hils_gpu_workspace_bytes(const hils_gpu_problem* p, size_t* bytes) {
  return guarded(p, [&](const Translated& t) {
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
    if (select_kernel < 0 || select_kernel >= static_cast<int32_t>(std::size(hils::gpu::kSelectKernels)))
      throw std::invalid_argument(
          "select_kernel: expected " +
          kernel_values(hils::gpu::kSelectKernels, hils::gpu::select_kernel_name, " or ") +
          ", got " + std::to_string(select_kernel));
    hils::gpu::select_chunks(t.spec, t.shape, t.in, key, bias, exact, lse_swa, selection,
                             selected_score, as_stream(stream),
                             static_cast<hils::gpu::SelectKernel>(select_kernel));
  });
}

int hils_gpu_set_sparse_kernel(int32_t sparse_kernel) {
  return set_kernel_by_value(
      "sparse_kernel", sparse_kernel, hils::gpu::kSparseKernels,
      [](hils::gpu::SparseKernel k) { return hils::gpu::sparse_kernel_name(k); },
      [](hils::gpu::SparseKernel k) { hils::gpu::set_sparse_kernel(k); });
}

int32_t hils_gpu_sparse_kernel(void) {
  return static_cast<int32_t>(hils::gpu::sparse_kernel());
}

int hils_gpu_set_window_kernel(int32_t window_kernel) {
  return set_kernel_by_value(
      "window_kernel", window_kernel, hils::gpu::kWindowKernels,
      [](hils::gpu::WindowKernel k) { return hils::gpu::window_kernel_name(k); },
      [](hils::gpu::WindowKernel k) { hils::gpu::set_window_kernel(k); });
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
