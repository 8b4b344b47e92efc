// C ABI of the decode step: translates hils_gpu_decode into the C++ API, exceptions into codes.
#include "hils/gpu/decode_c_api.h"

#include <exception>
#include <stdexcept>
#include <string>

#include "c_api_guard.hpp"
#include "hils/gpu/decode.hpp"

namespace {

thread_local std::string g_last_error;

struct DecodeCall {
  hils::MechanismSpec spec;
  hils::gpu::DecodeCache cache;
  hils::gpu::DecodeQuery query;
  hils::gpu::DecodeKernel kernel = hils::gpu::DecodeKernel::fused;
};

DecodeCall translate(const hils_gpu_decode& p) {
  DecodeCall t;
  t.spec.S = p.S, t.spec.W = p.W, t.spec.K = p.K, t.spec.landmarks = p.landmarks != 0;
  // Out-of-range values are refused naming the field (before session 21 they were cast: group_rule
  // 7 ran as max_raw, key_rule 99 as a summary rule; gpu/NOTES.md "Careless-user audit
  // (session 21)").
  using hils::gpu::detail::enum_field;
  t.spec.key_rule = enum_field<hils::KeyRule>(p.key_rule, "key_rule");
  t.spec.bias_rule = enum_field<hils::BiasRule>(p.bias_rule, "bias_rule");
  t.spec.group_rule = enum_field<hils::GroupRule>(p.group_rule, "group_rule");
  t.spec.fusion = enum_field<hils::Fusion>(p.fusion, "fusion");
  t.spec.softmax1 = p.softmax1 != 0;
  t.spec.scale = p.scale;
  t.cache.B = p.B, t.cache.T = p.T, t.cache.Hq = p.Hq, t.cache.Hkv = p.Hkv;
  t.cache.d = p.d, t.cache.dv = p.dv;
  t.cache.slot_capacity = p.slot_capacity, t.cache.chunk_capacity = p.chunk_capacity;
  t.cache.k = p.k, t.cache.v = p.v, t.cache.summary_key = p.summary_key;
  t.cache.summary_bias = p.summary_bias;
  t.query.q = p.q, t.query.q_retrieval = p.q_retrieval;
  t.cache.summary_type = static_cast<hils::gpu::SummaryType>(p.summary_type);
  t.cache.summary_scale = p.summary_scale;
  t.cache.summary_key_fp32 = p.summary_key_fp32;
  t.cache.summary_scale_bias = p.summary_scale_bias;
  t.kernel = static_cast<hils::gpu::DecodeKernel>(p.kernel);
  return t;
}

// Runs `body` and maps its exceptions to the documented codes.
template <class Body>
int guarded(const hils_gpu_decode* p, Body body) {
  return hils::gpu::detail::call_guarded(g_last_error, [&] {
    if (p == nullptr) throw std::invalid_argument("decode: expected a pointer, got null");
    body(translate(*p));
  });
}

}  // namespace

extern "C" {

const char* hils_gpu_decode_last_error(void) { return g_last_error.c_str(); }

int hils_gpu_decode_workspace_bytes(const hils_gpu_decode* p, size_t* bytes) {
  return guarded(p, [&](const DecodeCall& t) {
    if (bytes == nullptr) throw std::invalid_argument("bytes: expected a pointer, got null");
    hils::gpu::validate_decode(t.spec, t.cache, t.query);
    *bytes = hils::gpu::decode_workspace_bytes(t.spec, t.cache);
  });
}

int hils_gpu_decode_step(const hils_gpu_decode* p, const hils_gpu_decode_outputs* out,
                         void* workspace, void* stream) {
  return guarded(p, [&](const DecodeCall& t) {
    if (out == nullptr) throw std::invalid_argument("outputs: expected a pointer, got null");
    hils::gpu::DecodeOutputs o;
    o.o = out->o, o.lse = out->lse, o.selection = out->selection;
    o.o_window = out->o_window, o.lse_window = out->lse_window;
    o.surrogate = out->surrogate, o.fusion_weights = out->fusion_weights;
    hils::gpu::decode_step(t.spec, t.cache, t.query, o, workspace,
                           static_cast<cudaStream_t>(stream), t.kernel);
  });
}

int hils_gpu_decode_scan_probe(const hils_gpu_decode* p, int32_t probe, void* workspace,
                               void* stream) {
  return guarded(p, [&](const DecodeCall& t) {
    hils::gpu::decode_scan_probe(t.spec, t.cache, t.query, workspace,
                                 static_cast<hils::gpu::ScanProbe>(probe),
                                 static_cast<cudaStream_t>(stream));
  });
}

int hils_gpu_quantize_summaries_fp8(const float* key, int64_t rows, int64_t d, void* key_fp8,
                                    float* scale, void* stream) {
  const hils_gpu_decode unused{};
  return guarded(&unused, [&](const DecodeCall&) {
    hils::gpu::quantize_summaries_fp8(key, rows, d, key_fp8, scale,
                                      static_cast<cudaStream_t>(stream));
  });
}

int hils_gpu_quantize_summaries_int4(const float* key, int64_t rows, int64_t d, void* key_int4,
                                     float* scale, void* stream) {
  const hils_gpu_decode unused{};
  return guarded(&unused, [&](const DecodeCall&) {
    hils::gpu::quantize_summaries_int4(key, rows, d, key_int4, scale,
                                       static_cast<cudaStream_t>(stream));
  });
}

int hils_gpu_quantize_summaries_int4h(const float* key, const float* bias, int64_t rows, int64_t d,
                                      void* key_int4, void* scale_bias, void* stream) {
  const hils_gpu_decode unused{};
  return guarded(&unused, [&](const DecodeCall&) {
    hils::gpu::quantize_summaries_int4h(key, bias, rows, d, key_int4, scale_bias,
                                        static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
