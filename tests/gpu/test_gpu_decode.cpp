// The decode step (gpu/include/hils/gpu/decode.hpp) judged by the oracle: B = 2 sequences per
// call, the query at slot T-1 of each (VerifyOptions::queries = {T-1}, what `hils verify`
// does with /queries holding the last slot), over the case table, every group rule, and exact
// and near ties. The cache holds bf16 K/V and the prefill's summaries rounded to bf16 (the
// oracle's score_precision bf16) or quantised to fp8 e4m3 with per-row scales by
// quantize_summaries_fp8 (score_precision fp8_e4m3) or to int4 codes by quantize_summaries_int4
// (score_precision int4, and each candidate's score checked against its stored row, the case
// table, ties, three tiles and 16 heads); the fused kernel (d39 since session 18) and d5 (six
// launches, each stage's first form: the independent GPU path) run everywhere, d29 on the ties,
// the several-tile cases, every case with d = 64 and 16 heads per group, d36 with int4 summaries
// (d39 without the tensor-core dots) on the ties and every case with d = 64; d34 (two score
// tiles per launch-1 block) equals d29 bit for bit, d35 (the select's sorts skipped, four-warp
// chunk tiles; int4 with d34's launch 1) d34, d36 (no select launch: the chunk tiles select)
// d35, d39 with fp8 or bf16 summaries d36; d39 with int4 summaries (its dots on the tensor
// cores: exact products, the tensor core's sums, not d36's bits) is judged by the oracle (as
// fused on the case table and the ties, by name on the cross-tile ties over four and eleven
// tiles), every candidate's score checked against its stored row (a code paired with the wrong
// q~ dimension fails that); d40 with int4_h summaries (d39 reading each row's scale and b' as one
// fp16 pair, codes against the fp16 scale) likewise under score_precision int4_h (by name: the
// case table's d = 64 cases, the ties, three tiles, 16 heads, the cross-tile ties), its
// quantizer's pairs checked bit for bit (a b' in bf16 or e4m3 fails that), and with fp8 or int4
// d39's bits. The versions
// removed in session 17 are refused by code, naming them (gpu/NOTES.md "Kernels removed in
// session 17"). A non-finite summary row is stored marked by the fp8 and int4 quantizers and
// gives its KV group NaN o and lse, every other group its bits (gpu/NOTES.md "Non-finite
// summary rows (session 22)").
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "case_inputs.hpp"
#include "device_support.hpp"
#include "hils/gpu/decode.hpp"
#include "hils/gpu/decode_c_api.h"

namespace {

using hils::AttentionInputs;
using hils::Matrix;
using hils::MechanismSpec;
using hils::cases::Case;
using hils::gpu::DType;
namespace oracle = hils::oracle;
namespace gt = hils::gpu::testing;

constexpr uint64_t kSecondSequenceSalt = 0x5eed;

// Which decode kernel runs, on which summaries.
struct Variant {
  hils::gpu::DecodeKernel kernel;
  hils::gpu::SummaryType summary;
  const char* name;
};
constexpr Variant kFusedBf16{hils::gpu::DecodeKernel::fused, hils::gpu::SummaryType::bf16, "fused bf16"};
constexpr Variant kFusedFp8{hils::gpu::DecodeKernel::fused, hils::gpu::SummaryType::fp8_e4m3, "fused fp8"};
constexpr Variant kD5Bf16{hils::gpu::DecodeKernel::d5, hils::gpu::SummaryType::bf16, "d5 bf16"};
constexpr Variant kD29Fp8{hils::gpu::DecodeKernel::d29, hils::gpu::SummaryType::fp8_e4m3, "d29 fp8"};
constexpr Variant kD29Bf16{hils::gpu::DecodeKernel::d29, hils::gpu::SummaryType::bf16, "d29 bf16"};
constexpr Variant kFusedInt4{hils::gpu::DecodeKernel::fused, hils::gpu::SummaryType::int4, "fused int4"};
constexpr Variant kD29Int4{hils::gpu::DecodeKernel::d29, hils::gpu::SummaryType::int4, "d29 int4"};
constexpr Variant kD34Fp8{hils::gpu::DecodeKernel::d34, hils::gpu::SummaryType::fp8_e4m3, "d34 fp8"};
constexpr Variant kD34Bf16{hils::gpu::DecodeKernel::d34, hils::gpu::SummaryType::bf16, "d34 bf16"};
constexpr Variant kD34Int4{hils::gpu::DecodeKernel::d34, hils::gpu::SummaryType::int4, "d34 int4"};
constexpr Variant kD35Fp8{hils::gpu::DecodeKernel::d35, hils::gpu::SummaryType::fp8_e4m3, "d35 fp8"};
constexpr Variant kD35Bf16{hils::gpu::DecodeKernel::d35, hils::gpu::SummaryType::bf16, "d35 bf16"};
constexpr Variant kD35Int4{hils::gpu::DecodeKernel::d35, hils::gpu::SummaryType::int4, "d35 int4"};
constexpr Variant kD36Fp8{hils::gpu::DecodeKernel::d36, hils::gpu::SummaryType::fp8_e4m3, "d36 fp8"};
constexpr Variant kD36Bf16{hils::gpu::DecodeKernel::d36, hils::gpu::SummaryType::bf16, "d36 bf16"};
constexpr Variant kD36Int4{hils::gpu::DecodeKernel::d36, hils::gpu::SummaryType::int4, "d36 int4"};
constexpr Variant kD5Int4{hils::gpu::DecodeKernel::d5, hils::gpu::SummaryType::int4, "d5 int4"};
constexpr Variant kD39Int4{hils::gpu::DecodeKernel::d39, hils::gpu::SummaryType::int4, "d39 int4"};
constexpr Variant kD39Fp8{hils::gpu::DecodeKernel::d39, hils::gpu::SummaryType::fp8_e4m3, "d39 fp8"};
constexpr Variant kD39Bf16{hils::gpu::DecodeKernel::d39, hils::gpu::SummaryType::bf16, "d39 bf16"};
constexpr Variant kD40Int4h{hils::gpu::DecodeKernel::d40, hils::gpu::SummaryType::int4_h, "d40 int4_h"};
constexpr Variant kD40Fp8{hils::gpu::DecodeKernel::d40, hils::gpu::SummaryType::fp8_e4m3, "d40 fp8"};
constexpr Variant kD40Int4{hils::gpu::DecodeKernel::d40, hils::gpu::SummaryType::int4, "d40 int4"};
// Every variant, for the tie and several-tile cases (fused int4 is d39 where d = 64; d36 int4
// keeps the scalar int4 dots in the set).
const std::vector<Variant> kAllVariants{kFusedBf16, kFusedFp8, kFusedInt4, kD5Bf16, kD29Fp8,
                                        kD36Int4, kD40Int4h};

// An e4m3 byte as a double (sign, 4 exponent bits with bias 7, 3 mantissa bits; no NaN expected).
double decode_e4m3(unsigned char byte) {
  const int exponent = (byte >> 3) & 0xf, mantissa = byte & 0x7;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -9)
                                         : std::ldexp(8 + mantissa, exponent - 10);
  return byte & 0x80 ? -magnitude : magnitude;
}

// Quantises the summaries `key` (fp32 values) on the device with quantize_summaries_fp8;
// appends the e4m3 and scale buffers to `cache`, replaces `key` by what the step scores with (e4m3 x
// scale) and counts in *mismatches the values that differ from the oracle's
// round_to_fp8_e4m3(k' / s) x s with s = fp8_row_scale(max |k'|).
void quantize_fp8(std::vector<Matrix<double>>& key, std::vector<gt::GuardedBuffer>& cache,
                  int64_t* mismatches) {
  const int64_t rows = key.empty() ? 0 : key.size() * key.front().rows();
  const int64_t d = key.empty() ? 1 : key.front().cols();
  auto fp32 = gt::upload(gt::pack_heads(key, DType::f32));
  gt::GuardedBuffer bytes(std::max<int64_t>(1, rows * d)), scale(std::max<int64_t>(1, rows) * 4);
  hils::gpu::quantize_summaries_fp8(fp32.as<float>(), rows, d, bytes.data(), scale.as<float>());
  gt::check_cuda(cudaDeviceSynchronize(), "quantize_summaries_fp8");
  const auto host_bytes = bytes.download();
  const auto host_scale = scale.download();
  int64_t row = 0;
  for (auto& m : key)
    for (int64_t c = 0; c < m.rows(); ++c, ++row) {
      float s = 0;
      std::memcpy(&s, host_scale.data() + 4 * row, 4);
      const double expected_scale =
          oracle::fp8_row_scale(m.row(c).cwiseAbs().maxCoeff());
      *mismatches += s != expected_scale;
      for (int64_t i = 0; i < d; ++i) {
        const double stored = decode_e4m3(host_bytes[row * d + i]) * s;
        *mismatches += stored != oracle::round_to_fp8_e4m3(m(c, i) / expected_scale) * expected_scale;
        m(c, i) = stored;
      }
    }
  cache.push_back(std::move(bytes));
  cache.push_back(std::move(scale));
}

// Quantises the summaries `key` (fp32 values) on the device with quantize_summaries_int4;
// appends the code and scale buffers to `cache`, replaces `key` by what the step scores with
// (code x scale) and counts in *mismatches the values that differ from the oracle's
// int4_code(k', s) x s with s = int4_row_scale(max |k'|).
void quantize_int4(std::vector<Matrix<double>>& key, std::vector<gt::GuardedBuffer>& cache,
                   int64_t* mismatches) {
  const int64_t rows = key.empty() ? 0 : key.size() * key.front().rows();
  const int64_t d = key.empty() ? 2 : key.front().cols();
  auto fp32 = gt::upload(gt::pack_heads(key, DType::f32));
  gt::GuardedBuffer bytes(std::max<int64_t>(1, rows * d / 2)), scale(std::max<int64_t>(1, rows) * 4);
  hils::gpu::quantize_summaries_int4(fp32.as<float>(), rows, d, bytes.data(), scale.as<float>());
  gt::check_cuda(cudaDeviceSynchronize(), "quantize_summaries_int4");
  const auto host_bytes = bytes.download();
  const auto host_scale = scale.download();
  int64_t row = 0;
  for (auto& m : key)
    for (int64_t c = 0; c < m.rows(); ++c, ++row) {
      float s = 0;
      std::memcpy(&s, host_scale.data() + 4 * row, 4);
      const float expected_scale = oracle::int4_row_scale(m.row(c).cwiseAbs().maxCoeff());
      *mismatches += s != expected_scale;
      for (int64_t i = 0; i < d; ++i) {
        const int code = (host_bytes[row * d / 2 + i / 2] >> (4 * (i % 2)) & 0xf) - 8;
        *mismatches += code != oracle::int4_code(m(c, i), expected_scale);
        m(c, i) = code * static_cast<double>(s);
      }
    }
  cache.push_back(std::move(bytes));
  cache.push_back(std::move(scale));
}

// Quantises the summaries `key` and biases `bias` (fp32 values) on the device with
// quantize_summaries_int4h; appends the code and (s16, b'16) pair buffers to `cache`, replaces
// `key` by what the step scores with (code x s16) and `bias` by b'16, and counts in *mismatches
// the values that differ from the oracle's int4_code(k', s16) x s16 with s16 =
// int4h_row_scale(max |k'|) and round_to_fp16(b') (a b' stored in bf16 or e4m3 fails this).
void quantize_int4h(std::vector<Matrix<double>>& key, std::vector<hils::Vector<double>>& bias,
                    std::vector<gt::GuardedBuffer>& cache, int64_t* mismatches) {
  const int64_t rows = key.empty() ? 0 : key.size() * key.front().rows();
  const int64_t d = key.empty() ? 2 : key.front().cols();
  std::vector<Matrix<double>> bias_rows;
  for (const auto& b : bias) bias_rows.push_back(b.transpose());
  auto fp32 = gt::upload(gt::pack_heads(key, DType::f32));
  auto bias32 = gt::upload(gt::pack_heads(bias_rows, DType::f32));
  gt::GuardedBuffer bytes(std::max<int64_t>(1, rows * d / 2)), pairs(std::max<int64_t>(1, rows) * 4);
  hils::gpu::quantize_summaries_int4h(fp32.as<float>(), bias32.as<float>(), rows, d, bytes.data(),
                                      pairs.data());
  gt::check_cuda(cudaDeviceSynchronize(), "quantize_summaries_int4h");
  const auto host_bytes = bytes.download();
  const auto host_pairs = pairs.download();
  auto half_at = [&](int64_t byte) {  // an fp16 number as a double
    uint16_t h = 0;
    std::memcpy(&h, host_pairs.data() + byte, 2);
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24)
                                           : std::ldexp(1024 + mantissa, exponent - 25);
    return h & 0x8000 ? -magnitude : magnitude;
  };
  int64_t row = 0;
  for (size_t head = 0; head < key.size(); ++head) {
    Matrix<double>& m = key[head];
    for (int64_t c = 0; c < m.rows(); ++c, ++row) {
      const double s16 = half_at(4 * row), b16 = half_at(4 * row + 2);
      const float expected_scale = oracle::int4h_row_scale(m.row(c).cwiseAbs().maxCoeff());
      *mismatches += s16 != expected_scale;
      *mismatches += b16 != oracle::round_to_fp16(bias[head](c));
      for (int64_t i = 0; i < d; ++i) {
        const int code = (host_bytes[row * d / 2 + i / 2] >> (4 * (i % 2)) & 0xf) - 8;
        *mismatches += code != oracle::int4_code(m(c, i), expected_scale);
        m(c, i) = code * s16;
      }
      bias[head](c) = b16;
    }
  }
  cache.push_back(std::move(bytes));
  cache.push_back(std::move(pairs));
}

// int4's margin bound leaves the oracle little power over the selection (gpu/NOTES.md "decode",
// session 15), so the int4 runs also check the scores against the stored rows: s_hat(c) =
// sigma q~ . (code x scale) + b' in double for every candidate c of the query at T-1, within
// 2^-17 of sigma sum |q~_i k_i| + |b'| (fp32 dot products of 64 terms and three roundings);
// counts the chunks outside that in *mismatches.
void check_scores_against_rows(const MechanismSpec& spec, const std::vector<Matrix<double>>& qr,
                               const std::vector<Matrix<double>>& key,
                               const std::vector<hils::Vector<double>>& bias,
                               const std::vector<Matrix<double>>& surrogate, int64_t T,
                               int64_t* mismatches) {
  const int64_t candidates = hils::geometry_of(spec, T).candidate_count(T - 1);
  const double sigma = spec.scale != 0.0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(key.front().cols()));
  for (size_t h = 0; h < key.size(); ++h) {
    const Eigen::RowVectorXd q = qr[h].row(0).unaryExpr([](double x) { return oracle::round_to_bf16(x); });
    for (int64_t c = 0; c < candidates && c < key[h].rows(); ++c) {
      const double expected = sigma * q.dot(key[h].row(c)) + bias[h](c);
      const double size = sigma * q.cwiseAbs().dot(key[h].row(c).cwiseAbs()) + std::fabs(bias[h](c));
      *mismatches += !(std::fabs(surrogate[h](0, c) - expected) <= 0x1p-17 * size);
    }
  }
}

// Row `t` of every head as a 1-row matrix.
std::vector<Matrix<double>> rows_at(const std::vector<Matrix<double>>& heads, int64_t t) {
  std::vector<Matrix<double>> out;
  for (const auto& m : heads) out.push_back(m.row(t));
  return out;
}

// Head `h` of sequence `b` from a [B * H] list.
template <class M>
std::vector<M> sequence_heads(const std::vector<M>& all, int64_t b, int64_t H) {
  return std::vector<M>(all.begin() + b * H, all.begin() + (b + 1) * H);
}

// The prefill's summaries of one sequence (GPU summarize stage, bf16 inputs), fp32.
void prefill_summaries(const MechanismSpec& spec, const AttentionInputs<double>& in,
                       std::vector<Matrix<double>>& key, std::vector<hils::Vector<double>>& bias) {
  const int64_t nc = in.T() / spec.S;
  auto set = gt::upload_inputs(in, DType::bf16);
  gt::GuardedBuffer k(std::max<int64_t>(1, in.Hq() * nc * in.d()) * 4);
  gt::GuardedBuffer b(std::max<int64_t>(1, in.Hq() * nc) * 4);
  if (nc > 0) {
    hils::gpu::summarize(spec, {in.T(), in.Hq(), in.Hkv(), in.d(), in.dv()}, set.view,
                         k.as<float>(), b.as<float>());
    gt::check_cuda(cudaDeviceSynchronize(), "summarize");
  }
  for (auto& m : gt::heads_of(k, in.Hq(), nc, in.d())) key.push_back(m);
  for (auto& v : gt::head_vectors_of(b, in.Hq(), nc)) bias.push_back(v);
}

// Changes the prefill's fp32 summaries [B * Hq] before they are stored (a non-finite row).
using SummaryTamper = std::function<void(std::vector<Matrix<double>>& key)>;

// One decode call over `seqs` (same shapes); returns the oracle's verdict per sequence. `bytes`
// (when given) receives the bytes of every output (o, lse, o_window, lse_window, selection,
// surrogate, fusion_weights), for kernels that must agree bit for bit. `tamper` (when given)
// changes the summaries before they are stored; nothing is then judged (no verdicts), only the
// buffers' guards checked.
std::vector<oracle::Verdict> decode_and_verify(const MechanismSpec& spec,
                                               const std::vector<AttentionInputs<double>>& seqs,
                                               std::vector<hils::IndexMatrix>* selections,
                                               const Variant& variant = kFusedBf16,
                                               std::vector<unsigned char>* bytes = nullptr,
                                               const SummaryTamper& tamper = nullptr) {
  const auto& first = seqs.front();
  const int64_t B = seqs.size(), T = first.T(), Hq = first.Hq(), Hkv = first.Hkv();
  const int64_t d = first.d(), dv = first.dv(), nc = T / spec.S, K = spec.K;
  std::vector<Matrix<double>> k, v, q, qr, key;
  std::vector<hils::Vector<double>> bias;
  for (const auto& s : seqs) {
    for (const auto& m : s.k) k.push_back(m);
    for (const auto& m : s.v) v.push_back(m);
    for (const auto& m : rows_at(s.q, T - 1)) q.push_back(m);
    for (const auto& m : rows_at(s.q_retrieval.empty() ? s.q : s.q_retrieval, T - 1))
      qr.push_back(m);
    prefill_summaries(spec, s, key, bias);
  }
  if (tamper) tamper(key);
  // The cache's summaries are bf16 or fp8 e4m3 x row scale (what the oracle sees too); biases
  // stay fp32. The summary fp32 values are floats already (the prefill's output).
  const bool fp8 = variant.summary == hils::gpu::SummaryType::fp8_e4m3;
  const bool int4h = variant.summary == hils::gpu::SummaryType::int4_h;
  const bool int4 = variant.summary == hils::gpu::SummaryType::int4 || int4h;
  std::vector<Matrix<double>> bias_rows;
  int64_t quantize_mismatches = 0;
  std::vector<gt::GuardedBuffer> fp8_cache;  // e4m3 or int4 rows, row scales or pairs
  const std::vector<hils::Vector<double>> bias32 = bias;  // the prefill's fp32 b' 
  // The fp32 rows (hierarchical fusion's logits, every store) before key is rounded or quantized.
  auto fp32_rows = gt::upload(gt::pack_heads(key, DType::f32));
  if (fp8 || int4) {
    if (fp8) quantize_fp8(key, fp8_cache, &quantize_mismatches);
    else if (int4h) quantize_int4h(key, bias, fp8_cache, &quantize_mismatches);  // bias: b'16
    else quantize_int4(key, fp8_cache, &quantize_mismatches);
  } else {
    for (auto& m : key)
      for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = oracle::round_to_bf16(m.data()[i]);
  }
  // The cache's fp32 b' (the fusion logits read it): int4_h's bias is b'16 from here on (what its
  // scan scores with), so the fp32 copy is made from the prefill's values first.
  for (const auto& b : bias32) bias_rows.push_back(b.transpose());
  auto k_dev = gt::upload(gt::pack_heads(k, DType::bf16));
  auto v_dev = gt::upload(gt::pack_heads(v, DType::bf16));
  auto q_dev = gt::upload(gt::pack_heads(q, DType::bf16));
  auto qr_dev = gt::upload(gt::pack_heads(qr, DType::bf16));
  auto key_dev = gt::upload(gt::pack_heads(key, DType::bf16));
  auto bias_dev = gt::upload(gt::pack_heads(bias_rows, DType::f32));

  hils::gpu::DecodeCache cache;
  cache.B = B, cache.T = T, cache.Hq = Hq, cache.Hkv = Hkv, cache.d = d, cache.dv = dv;
  cache.k = k_dev.data(), cache.v = v_dev.data();
  cache.summary_key = key_dev.data(), cache.summary_bias = bias_dev.as<float>();
  cache.summary_key_fp32 = fp32_rows.as<float>();
  if (fp8 || int4) {
    cache.summary_type = variant.summary;
    cache.summary_key = fp8_cache[0].data(), cache.summary_scale = fp8_cache[1].as<float>();
    if (int4h) cache.summary_scale = nullptr, cache.summary_scale_bias = fp8_cache[1].data();
  }
  const hils::gpu::DecodeQuery query{q_dev.data(), qr_dev.data()};
  gt::GuardedBuffer o(B * Hq * dv * 4), lse(B * Hq * 4), o_window(B * Hq * dv * 4);
  gt::GuardedBuffer lse_window(B * Hq * 4), selection(std::max<int64_t>(1, B * Hkv * K) * 4);
  gt::GuardedBuffer surrogate(std::max<int64_t>(1, B * Hq * nc) * 4);
  gt::GuardedBuffer weights(B * Hq * (K + 2) * 4);
  gt::GuardedBuffer workspace(hils::gpu::decode_workspace_bytes(spec, cache));
  hils::gpu::DecodeOutputs out;
  out.o = o.as<float>(), out.lse = lse.as<float>(), out.selection = selection.as<int32_t>();
  out.o_window = o_window.as<float>(), out.lse_window = lse_window.as<float>();
  out.surrogate = surrogate.as<float>(), out.fusion_weights = weights.as<float>();
  hils::gpu::decode_step(spec, cache, query, out, workspace.data(), nullptr, variant.kernel);
  gt::check_cuda(cudaDeviceSynchronize(), "decode_step");

  std::vector<std::string> damage;
  for (const auto& [buffer, name] :
       std::vector<std::pair<const gt::GuardedBuffer*, std::string>>{
           {&o, "o"}, {&lse, "lse"}, {&o_window, "o_window"}, {&lse_window, "lse_window"},
           {&selection, "selection"}, {&surrogate, "surrogate"}, {&weights, "fusion_weights"},
           {&workspace, "workspace"}})
    if (auto problem = buffer->guard_damage(name); !problem.empty()) damage.push_back(problem);
  if (bytes) {
    bytes->clear();
    for (const gt::GuardedBuffer* buffer : {&o, &lse, &o_window, &lse_window, &selection,
                                            &surrogate, &weights}) {
      const auto host = buffer->download();
      bytes->insert(bytes->end(), host.begin(), host.end());
    }
  }
  if (tamper) {
    for (const auto& problem : damage) std::cout << "GUARD: " << problem << "\n";
    CHECK(damage.empty());
    return {};
  }
  if (quantize_mismatches > 0)
    damage.push_back(std::string(int4h  ? "quantize_summaries_int4h"
                                 : int4 ? "quantize_summaries_int4"
                                        : "quantize_summaries_fp8") +
                     ": " + std::to_string(quantize_mismatches) + " values or scales differ from oracle::" +
                     (int4h  ? "int4_code / int4h_row_scale / round_to_fp16"
                      : int4 ? "int4_code / int4_row_scale"
                             : "round_to_fp8_e4m3 / fp8_row_scale"));
  const auto o_all = gt::heads_of(o, B * Hq, 1, dv);
  const auto lse_all = gt::head_vectors_of(lse, B * Hq, 1);
  const auto ow_all = gt::heads_of(o_window, B * Hq, 1, dv);
  const auto lw_all = gt::head_vectors_of(lse_window, B * Hq, 1);
  const auto fw_all = gt::heads_of(weights, B * Hq, 1, K + 2);
  const auto sc_all = gt::heads_of(surrogate, B * Hq, 1, nc);
  if (int4 && nc > 0) {
    int64_t score_mismatches = 0;
    check_scores_against_rows(spec, qr, key, bias, sc_all, T, &score_mismatches);
    if (score_mismatches > 0)
      damage.push_back("int4 scores: " + std::to_string(score_mismatches) +
                       " candidates differ from sigma q~ . (code x scale) + b' beyond fp32 rounding");
  }
  const auto sel_all = K > 0 ? gt::index_heads_of(selection, B * Hkv, 1, K)
                             : std::vector<hils::IndexMatrix>(B * Hkv, hils::IndexMatrix(1, 0));
  std::vector<oracle::Verdict> verdicts;
  for (int64_t b = 0; b < B; ++b) {
    oracle::KernelOutputs run;
    run.o = sequence_heads(o_all, b, Hq), run.lse = sequence_heads(lse_all, b, Hq);
    run.o_window = sequence_heads(ow_all, b, Hq);
    run.lse_window = sequence_heads(lw_all, b, Hq);
    run.fusion_weights = sequence_heads(fw_all, b, Hq);
    if (K > 0) run.selection = sequence_heads(sel_all, b, Hkv);
    if (nc > 0) {
      run.surrogate_scores = sequence_heads(sc_all, b, Hq);
      run.summary_key = sequence_heads(key, b, Hq);
      run.summary_bias = sequence_heads(bias, b, Hq);
    }
    if (selections) selections->push_back(sel_all[b * Hkv]);
    oracle::VerifyOptions options;
    options.precision = oracle::InputPrecision::bf16;
    options.score_precision = fp8     ? oracle::InputPrecision::fp8_e4m3
                              : int4h ? oracle::InputPrecision::int4_h
                              : int4  ? oracle::InputPrecision::int4
                                      : oracle::InputPrecision::bf16;
    options.queries = {T - 1};
    verdicts.push_back(oracle::verify(spec, seqs[b], run, options));
    if (!damage.empty()) {
      verdicts.back().passed = false;
      for (const auto& problem : damage) std::cout << "GUARD: " << problem << "\n";
    }
  }
  return verdicts;
}

bool reference_accepts(const MechanismSpec& spec, const AttentionInputs<double>& inputs) {
  try {
    spec.validate();
    inputs.validate(spec);
    return true;
  } catch (const hils::InvalidArgument&) {
    return false;
  }
}

// Decodes two sequences of case `c` and checks both verdicts; prints the reports.
void check_decode(const MechanismSpec& spec, const std::vector<AttentionInputs<double>>& seqs,
                  const std::string& label, const Variant& variant = kFusedBf16) {
  const auto verdicts = decode_and_verify(spec, seqs, nullptr, variant);
  for (size_t b = 0; b < verdicts.size(); ++b) {
    std::cout << "=== decode " << variant.name << " " << label << " seq " << b << " " << spec.name
              << "\n" << verdicts[b].report();
    INFO(variant.name << " " << label << " seq " << b << " " << spec.name);
    CHECK(verdicts[b].passed);
  }
}

MechanismSpec with_group_rule(MechanismSpec spec, hils::GroupRule rule, const char* name) {
  spec.group_rule = rule;
  spec.name += name;
  return spec;
}

// Decodes `seqs` with `baseline`, then with `other`: every output of `other` must equal
// `baseline`'s bit for bit and every verdict of `other` pass.
void check_same_bits(const MechanismSpec& spec, const std::vector<AttentionInputs<double>>& seqs,
                     const Variant& baseline, const Variant& other, const std::string& label) {
  std::vector<hils::IndexMatrix> selections;
  std::vector<unsigned char> expected, got;
  decode_and_verify(spec, seqs, &selections, baseline, &expected);
  const auto verdicts = decode_and_verify(spec, seqs, &selections, other, &got);
  INFO(label << " " << other.name << " against " << baseline.name);
  CHECK(expected.size() > 0);
  CHECK(got == expected);
  for (const auto& verdict : verdicts) CHECK(verdict.passed);
}

}  // namespace

TEST_CASE("gpu decode over the case table passes the oracle", "[gpu]") {
  int64_t checked = 0;
  for (const char* preset : {"hils", "lmk", "nsa"}) {
    for (const Case& c : hils::cases::kCaseTable) {
      const MechanismSpec base = hils::cases::with_case_geometry(hils::preset(preset), c);
      const std::vector<AttentionInputs<double>> seqs{
          hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
      if (!reference_accepts(base, seqs.front())) continue;
      std::vector<MechanismSpec> specs{base};
      if (std::string(preset) == "hils") {
        specs.push_back(with_group_rule(base, hils::GroupRule::sum_probabilities, "+sum_prob"));
        specs.push_back(with_group_rule(base, hils::GroupRule::max_raw, "+max_raw"));
        MechanismSpec one = base;
        one.softmax1 = true, one.name += "+softmax1";
        specs.push_back(one);
      }
      for (const auto& spec : specs) {
        check_decode(spec, seqs, c.name, kFusedBf16);
        check_decode(spec, seqs, c.name, kFusedFp8);
        check_decode(spec, seqs, c.name, kFusedInt4);
        if (&spec == &specs.front()) check_decode(spec, seqs, c.name, kD5Bf16);
        if (&spec == &specs.front()) check_decode(spec, seqs, c.name, kD5Int4);
        if (c.d == 64) {  // where fused (d39: int4 dots on the tensor cores), d29 and d36 differ
          check_decode(spec, seqs, c.name, kD29Fp8);
          check_decode(spec, seqs, c.name, kD36Int4);
          check_decode(spec, seqs, c.name, kD40Int4h);
        }
        ++checked;
      }
    }
  }
  REQUIRE(checked > 20);
}

TEST_CASE("gpu decode with exact and near ties passes the oracle", "[gpu]") {
  const Case c = hils::cases::case_named("longer_blocks");
  for (double perturbation : {0.0, 1e-7, 1e-5}) {
    const std::vector<AttentionInputs<double>> seqs{gt::tied_inputs(c, perturbation),
                                                    gt::tied_inputs(c, perturbation)};
    for (const char* preset : {"hils", "lmk", "nsa"}) {
      const MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
      std::ostringstream label;
      label << "longer_blocks ties " << perturbation;
      for (const Variant& variant : kAllVariants)
        check_decode(spec, seqs, label.str(), variant);
    }
  }
}

// Exact twins (chunks 2, 5, 9, 13, 17) score bit-identically: a twin may be chosen only after
// every lower-indexed twin. K sweeps 1..12 so that the cut falls inside the twins.
TEST_CASE("gpu decode with exact ties keeps the lower chunk", "[gpu]") {
  const Case c = hils::cases::case_named("longer_blocks");
  const std::vector<AttentionInputs<double>> seqs{gt::tied_inputs(c, 0.0)};
  int64_t cuts_through_twins = 0, violations = 0;
  for (const Variant& variant : kAllVariants)
  for (const char* preset : {"hils", "lmk", "nsa"}) {
    for (int64_t K = 1; K <= 12; ++K) {
      MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
      spec.K = K;
      std::vector<hils::IndexMatrix> selections;
      const auto verdicts = decode_and_verify(spec, seqs, &selections, variant);
      INFO(variant.name << " " << preset << " K " << K);
      CHECK(verdicts.front().passed);
      std::vector<bool> chosen(c.T / c.S + 1, false);
      for (int64_t i = 0; i < K; ++i)
        if (selections.front()(0, i) >= 0) chosen[selections.front()(0, i)] = true;
      bool gap = false;
      int64_t count = 0;
      for (int64_t twin : {2, 5, 9, 13, 17}) {
        if (chosen[twin] && gap) ++violations;
        gap = gap || !chosen[twin];
        count += chosen[twin];
      }
      cuts_through_twins += count > 0 && count < 5;
    }
  }
  std::cout << "decode ties: selections cutting through the twins " << cuts_through_twins
            << ", violations " << violations << "\n";
  CHECK(violations == 0);
  CHECK(cuts_through_twins > 0);
}

namespace {

// The chunk the double reference selects first for KV group 0 of `in` at its last slot.
int64_t reference_top_chunk(MechanismSpec spec, const AttentionInputs<double>& in) {
  spec.K = 1;
  hils::RunOptions options;
  options.queries = {in.T() - 1};
  return hils::run_mechanism(spec, in, options).selection.front()(0, 0);
}

// Decodes case `c` twice per preset: the second sequence has the chunk that the reference ranks
// first (group 0) copied onto two of `spots` outside its selection tile, so that the three exact
// twins sit in three tiles at the top of the ranking and K = 1, 2 cut through them. Every
// verdict must pass, and a twin may be chosen only after every lower-indexed one. Returns the
// selections that cut through the twins.
int64_t check_cross_tile_ties(const Case& c, const std::vector<int64_t>& spots,
                              const std::vector<int64_t>& Ks,
                              const std::vector<Variant>& variants, const char* label,
                              int64_t* violations) {
  constexpr int64_t kTileChunks = 256;  // candidates per group-score tile (decode/common.cuh)
  int64_t cuts_through_twins = 0;
  for (const char* preset : {"hils", "nsa"}) {
    const MechanismSpec base = hils::cases::with_case_geometry(hils::preset(preset), c);
    auto tied = hils::cases::make_inputs<double>(c, /*salt=*/0x3711e5);
    const int64_t source = reference_top_chunk(base, tied);
    std::vector<int64_t> twins{source};
    for (int64_t spot : spots)
      if (spot / kTileChunks != source / kTileChunks && twins.size() < 3) twins.push_back(spot);
    REQUIRE(twins.size() == 3);
    for (size_t i = 1; i < twins.size(); ++i) gt::duplicate_chunk(tied, c.S, source, twins[i], 0.0);
    std::sort(twins.begin(), twins.end());
    const std::vector<AttentionInputs<double>> seqs{hils::cases::make_inputs<double>(c), tied};
    for (const Variant& variant : variants)
    for (int64_t K : Ks) {
      MechanismSpec spec = base;
      spec.K = K;
      std::vector<hils::IndexMatrix> selections;
      const auto verdicts = decode_and_verify(spec, seqs, &selections, variant);
      for (size_t b = 0; b < verdicts.size(); ++b) {
        std::cout << "=== decode " << variant.name << " " << label << " K=" << K << " seq " << b
                  << " " << spec.name << "\n" << verdicts[b].report();
        INFO(variant.name << " " << label << " K " << K << " seq " << b << " " << spec.name);
        CHECK(verdicts[b].passed);
      }
      std::vector<bool> chosen(c.T / c.S + 1, false);
      for (int64_t i = 0; i < K; ++i)
        if (selections[1](0, i) >= 0) chosen[selections[1](0, i)] = true;
      bool gap = false;
      int64_t count = 0;
      for (int64_t twin : twins) {
        if (chosen[twin] && gap) ++*violations;
        gap = gap || !chosen[twin];
        count += chosen[twin];
      }
      cuts_through_twins += count > 0 && count < static_cast<int64_t>(twins.size());
    }
  }
  return cuts_through_twins;
}

}  // namespace

// 700 candidates: the group-score kernel ranks three 256-chunk tiles, each keeps its K best and
// the select block ranks those (K > 256: each tile keeps 256). The top chunk is copied into the
// other tiles so that exact ties cross tiles; a copy may be chosen only after every
// lower-indexed one.
TEST_CASE("gpu decode over several selection tiles passes the oracle", "[gpu]") {
  const Case c{"decode_three_tiles", 2812, 4, 8, 8, 4, 2, 16, 16, true, 1.0};
  int64_t violations = 0;
  const int64_t cuts = check_cross_tile_ties(c, {20, 300, 600}, {1, 2, 3, 8, 33, 300}, kAllVariants,
                                             "three tiles", &violations);
  std::cout << "decode three tiles: selections cutting through the twins " << cuts
            << ", violations " << violations << "\n";
  CHECK(violations == 0);
  CHECK(cuts > 0);
}

// ~2600 candidates, K <= 32: eleven 256-chunk group-score tiles each keep their K best (warp
// sorts and a merge tree) and the select block merges the eleven lists (one per warp); the top
// chunk is copied into two other tiles (of 20, 1100, 2200) so that exact ties reach the select's
// merge tree from different warps.
TEST_CASE("gpu decode over eleven selection tiles passes the oracle", "[gpu]") {
  const Case c{"decode_eleven_tiles", 10400, 4, 8, 8, 4, 2, 16, 16, true, 1.0};
  int64_t violations = 0;
  const int64_t cuts = check_cross_tile_ties(c, {20, 1100, 2200}, {1, 2, 3, 8, 32},
                                             {kFusedBf16, kFusedFp8, kD29Fp8},
                                             "eleven tiles", &violations);
  std::cout << "decode eleven tiles: selections cutting through the twins " << cuts
            << ", violations " << violations << "\n";
  CHECK(violations == 0);
  CHECK(cuts > 0);
}

// The benchmark's shape class on the tensor-core chunk tiles (d = dv = 64, S = 64) with 16 query
// heads per KV group, so that the tile's A fragment rows 8..15 carry heads too (the case table's
// longer_blocks has 2 per group, the verify dumps 4).
TEST_CASE("gpu decode with 16 heads per group passes the oracle", "[gpu]") {
  const Case c{"decode_group16", 1411, 64, 128, 6, 16, 1, 64, 64, true, 1.0};
  const std::vector<AttentionInputs<double>> seqs{
      hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
  for (const char* preset : {"hils", "nsa"}) {
    const MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
    for (const Variant& variant : {kFusedBf16, kFusedFp8, kFusedInt4, kD29Fp8, kD35Int4, kD40Int4h})
      check_decode(spec, seqs, c.name, variant);
  }
}

// d34 is d29 with two score tiles per launch-1 block (four tiles per head here: two blocks); d35
// is d29 (int4: d34) with the select's warps taking the kept lists as sorted and four-warp chunk
// tiles; d36 is d35 whose chunk tiles select (K = 32; other K take d35's launches): each gives
// the bits of the one before (d29 gave the removed d21's, measured at 512K, B = 1, 8 and 32);
// d39 with fp8 or bf16 summaries runs d36's kernels: d36's bits.
TEST_CASE("gpu decode kernels that differ in launches or cache policy give the same bits", "[gpu]") {
  const Case c{"decode_d64_four_tiles", 3300, 4, 64, 8, 4, 2, 64, 64, true, 1.0};
  const std::vector<AttentionInputs<double>> seqs{
      hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
  const std::vector<std::pair<Variant, Variant>> pairs{
      {kD29Fp8, kD34Fp8}, {kD29Bf16, kD34Bf16}, {kD29Int4, kD34Int4},
      {kD34Fp8, kD35Fp8}, {kD34Bf16, kD35Bf16}, {kD34Int4, kD35Int4},
      {kD35Fp8, kD36Fp8}, {kD35Bf16, kD36Bf16}, {kD35Int4, kD36Int4},
      {kD36Fp8, kD39Fp8}, {kD36Bf16, kD39Bf16}};
  for (const char* preset : {"hils", "nsa"})
    for (int64_t K : {1, 8, 32})
      for (const auto& [baseline, other] : pairs) {
        MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
        spec.K = K;
        check_same_bits(spec, seqs, baseline, other, std::string(preset) + " K " + std::to_string(K));
      }
}

// d40 reads (s16, b'16) pairs only with int4_h summaries; with fp8 or int4 summaries it runs d39's
// kernels: d39's bits (four score tiles per head, two launch-1 blocks; K = 32 selects in the
// chunk tiles, K = 8 through the select launch).
TEST_CASE("gpu decode d40 with fp8 or int4 summaries gives d39's bits", "[gpu]") {
  const Case c{"decode_d64_four_tiles", 3300, 4, 64, 8, 4, 2, 64, 64, true, 1.0};
  const std::vector<AttentionInputs<double>> seqs{
      hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
  for (int64_t K : {8, 32})
    for (const auto& [baseline, other] :
         std::vector<std::pair<Variant, Variant>>{{kD39Fp8, kD40Fp8}, {kD39Int4, kD40Int4}}) {
      MechanismSpec spec = hils::cases::with_case_geometry(hils::preset("hils"), c);
      spec.K = K;
      check_same_bits(spec, seqs, baseline, other, "K " + std::to_string(K));
    }
}

// d34's launch-1 blocks take two score tiles each: eleven tiles per head (2,600 chunks at d = 64)
// leave the last block one tile and the tile past it; the outputs are d29's bit for bit.
TEST_CASE("gpu decode d34 over an odd number of score tiles gives d29's bits", "[gpu]") {
  const Case c{"decode_d64_eleven_tiles", 10400, 4, 64, 8, 4, 2, 64, 64, true, 1.0};
  const std::vector<AttentionInputs<double>> seqs{
      hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
  for (int64_t K : {1, 8, 32})
    for (const auto& [baseline, other] : std::vector<std::pair<Variant, Variant>>{
             {kD29Fp8, kD34Fp8}, {kD29Bf16, kD34Bf16}, {kD29Int4, kD34Int4}}) {
      MechanismSpec spec = hils::cases::with_case_geometry(hils::preset("hils"), c);
      spec.K = K;
      check_same_bits(spec, seqs, baseline, other, "K " + std::to_string(K));
    }
}

// d35's chunk tiles split a chunk's 64 slots over four warps and hand the sums from warp to warp;
// the cases above have S = 4 (warps 1-3 see only masked slots), so here every warp holds slots:
// S = 64, with and without landmarks (all 64 slots attendable: nsa only), peaked queries in the
// second; one group-score tile per KV group (40-odd candidates: the select's presorted list of
// warp 0, the other warps' lists empty). The outputs are d34's bit for bit. (Two tiles at S = 64 need
// T > 16K, which the double-precision reference took > 60 s for in session 16's run 1.)
TEST_CASE("gpu decode d35 over full 64-slot chunks gives d34's bits", "[gpu]") {
  const Case landmarks{"decode_d64_s64_landmarks", 3000, 64, 256, 32, 8, 2, 64, 64, true, 1.0};
  const Case plain{"decode_d64_s64_no_landmarks", 2500, 64, 128, 32, 4, 1, 64, 64, false, 4.0};
  for (const Case& c : {landmarks, plain}) {
    const std::vector<AttentionInputs<double>> seqs{
        hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
    // Without landmarks only nsa (mean keys): hils' landmark-query prior needs landmarks.
    for (const char* preset : c.landmarks ? std::vector<const char*>{"hils", "nsa"}
                                          : std::vector<const char*>{"nsa"})
      for (int64_t K : {8, 32})
        for (const auto& [baseline, other] : std::vector<std::pair<Variant, Variant>>{
                 {kD34Fp8, kD35Fp8}, {kD34Bf16, kD35Bf16}, {kD34Int4, kD35Int4},
                 {kD35Fp8, kD36Fp8}, {kD35Int4, kD36Int4}}) {
          MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
          spec.K = K;
          check_same_bits(spec, seqs, baseline, other,
                          c.name + (" " + std::string(preset)) + " K " + std::to_string(K));
        }
  }
}

// d35's select takes each group-score tile's kept list as sorted (K = 32; K = 1, 2 sort, and cut
// through the twins), d36's chunk tiles merge those lists themselves (eight per warp: the
// eleven tiles fill warps 0-2 unevenly); exact ties that cross tiles (the top chunk copied into
// two other tiles) must keep the lower chunk, and every verdict pass; d39 int4 too (its twins
// sit in other mma rows, lanes and warps and must still score alike).
TEST_CASE("gpu decode d35 over several group-score tiles keeps the lower chunk", "[gpu]") {
  const Case four{"decode_d64_four_tiles", 3300, 4, 64, 8, 4, 2, 64, 64, true, 1.0};
  const Case eleven{"decode_d64_eleven_tiles", 10400, 4, 64, 8, 4, 2, 64, 64, true, 1.0};
  const std::vector<std::pair<Case, std::vector<int64_t>>> shapes{{four, {20, 300, 600, 780}},
                                                                 {eleven, {20, 1100, 2200}}};
  for (const auto& [c, twins] : shapes) {
    int64_t violations = 0;
    const int64_t cuts = check_cross_tile_ties(c, twins, {1, 2, 32},
                                               {kD35Fp8, kD35Int4, kD35Bf16, kD36Fp8, kD36Int4,
                                                kD39Int4, kD40Int4h},
                                               c.name, &violations);
    std::cout << "decode d35 " << c.name << ": selections cutting through the twins " << cuts
              << ", violations " << violations << "\n";
    CHECK(violations == 0);
    CHECK(cuts > 0);
  }
}

// d36's chunk tiles merge eight kept lists per warp and load (at 512K: 32 tiles, eight per warp);
// eleven 256-chunk tiles give warps 0-2 three lists and warp 3 two. The outputs are d35's (its
// select: one list per warp of 1,024 threads) bit for bit.
TEST_CASE("gpu decode d36 over eleven group-score tiles gives d35's bits", "[gpu]") {
  const Case c{"decode_d64_eleven_tiles", 10400, 4, 64, 8, 4, 2, 64, 64, true, 1.0};
  const std::vector<AttentionInputs<double>> seqs{
      hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
  MechanismSpec spec = hils::cases::with_case_geometry(hils::preset("hils"), c);
  spec.K = 32;
  for (const auto& [baseline, other] :
       std::vector<std::pair<Variant, Variant>>{{kD35Fp8, kD36Fp8}, {kD35Int4, kD36Int4}})
    check_same_bits(spec, seqs, baseline, other, "K 32");
}

// The versions removed in session 17 keep their codes out of use: decode_step and the C API refuse
// each with an error that names it, the commit holding its code and the kept codes (before any
// input is looked at); the kept codes keep their values and pass that check (an empty call then
// fails on its inputs instead). The scan probes removed with d21 and d24 likewise.
TEST_CASE("gpu decode refuses the kernel codes removed in session 17", "[gpu]") {
  static_assert(static_cast<int>(hils::gpu::DecodeKernel::fused) == 0 &&
                    static_cast<int>(hils::gpu::DecodeKernel::d5) == 1 &&
                    static_cast<int>(hils::gpu::DecodeKernel::d29) == 15 &&
                    static_cast<int>(hils::gpu::DecodeKernel::d34) == 20 &&
                    static_cast<int>(hils::gpu::DecodeKernel::d35) == 21 &&
                    static_cast<int>(hils::gpu::DecodeKernel::d36) == 22 &&
                    static_cast<int>(hils::gpu::DecodeKernel::d39) == 25 &&
                    static_cast<int>(hils::gpu::DecodeKernel::d40) == 26,
                "DecodeKernel codes are hils_gpu_decode::kernel values and never change");
  const std::vector<std::pair<int, std::string>> removed{
      {2, "d8"},   {3, "d13"},  {4, "d16"},  {5, "d17"},  {6, "d18"},  {7, "d19"},
      {8, "d21"},  {9, "d23"},  {10, "d24"}, {11, "d25"}, {23, "d37"}, {24, "d38"}};
  const std::string kept =
      "0 (fused = d39), 1 (d5), 15 (d29), 20 (d34), 21 (d35), 22 (d36), 25 (d39) or 26 (d40)";
  hils::gpu::DecodeOutputs out;
  for (const auto& [code, name] : removed) {
    const std::string expected = "decode: kernel " + std::to_string(code) + " (" + name +
                                 ") was removed in session 17 (gpu/NOTES.md \"Kernels removed in "
                                 "session 17\"; its code is at commit 5a3f9d2); expected one of " +
                                 kept;
    INFO("code " << code);
    try {
      hils::gpu::decode_step(MechanismSpec{}, hils::gpu::DecodeCache{}, hils::gpu::DecodeQuery{},
                             out, nullptr, nullptr, static_cast<hils::gpu::DecodeKernel>(code));
      FAIL("decode_step accepted a removed kernel code");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()) == expected);
    }
    hils_gpu_decode p{};
    p.kernel = code;
    const hils_gpu_decode_outputs none{};
    CHECK(hils_gpu_decode_step(&p, &none, nullptr, nullptr) == 2);
    CHECK(std::string(hils_gpu_decode_last_error()) == expected);
  }
  for (int code : {0, 1, 15, 20, 21, 22, 25, 26}) {  // kept: refused for the empty inputs, not the code
    hils_gpu_decode p{};
    p.kernel = code;
    const hils_gpu_decode_outputs none{};
    INFO("code " << code);
    CHECK(hils_gpu_decode_step(&p, &none, nullptr, nullptr) == 2);
    const std::string error = hils_gpu_decode_last_error();
    CHECK(error.find("decode: B = 0") == 0);
  }
  for (int code : {12, 27, -1}) {  // never a kernel
    hils_gpu_decode p{};
    p.kernel = code;
    const hils_gpu_decode_outputs none{};
    CHECK(hils_gpu_decode_step(&p, &none, nullptr, nullptr) == 2);
    CHECK(std::string(hils_gpu_decode_last_error()) ==
          "decode: kernel = " + std::to_string(code) + ", expected " + kept);
  }
  for (const auto& [probe, name] :
       std::vector<std::pair<int, std::string>>{{0, "d21_scan"}, {1, "d24_scan"}}) {
    hils_gpu_decode p{};
    CHECK(hils_gpu_decode_scan_probe(&p, probe, nullptr, nullptr) == 2);
    CHECK(std::string(hils_gpu_decode_last_error()) ==
          "decode_scan_probe: probe " + std::to_string(probe) + " (" + name +
              ") was removed in session 17 (gpu/NOTES.md \"Kernels removed in session 17\"; its "
              "code is at commit 5a3f9d2); expected one of 2 (d25_scan), 3 (loads_only), 4 "
              "(flat_read) or 5 (tail_handoffs)");
  }
}


// int4_h (gpu/NOTES.md "d40"): the quantizer refuses, naming the field and the row, a key row
// whose scale fp16 cannot hold in its normal range and a b' beyond fp16's range; the rows before
// it are stored as the oracle says. Only d40 scans int4_h summaries: the other kernels refuse
// them (before any launch).
TEST_CASE("gpu decode int4_h: refused rows and kernels", "[gpu]") {
  constexpr int64_t d = 4;
  auto quantize = [&](const std::vector<float>& key, const std::vector<float>& bias) {
    const int64_t rows = static_cast<int64_t>(bias.size());
    Matrix<double> k(rows, d), b(1, rows);
    for (int64_t i = 0; i < rows * d; ++i) k(i / d, i % d) = key[i];
    for (int64_t i = 0; i < rows; ++i) b(0, i) = bias[i];
    auto key_dev = gt::upload(gt::pack_heads({k}, DType::f32));
    auto bias_dev = gt::upload(gt::pack_heads({b}, DType::f32));
    gt::GuardedBuffer codes(rows * d / 2), pairs(rows * 4);
    try {
      hils::gpu::quantize_summaries_int4h(key_dev.as<float>(), bias_dev.as<float>(), rows, d,
                                          codes.data(), pairs.data());
      return std::string();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
  };
  const std::vector<float> good{1.0f, -2.0f, 0.5f, 3.0f};
  CHECK(quantize(good, {0.25f}).empty());
  CHECK(quantize({0, 0, 0, 0}, {0.0f}).empty());  // an all-zero row: scale 1, as int4's
  std::vector<float> two = good;
  two.insert(two.end(), {1e-5f, 0.0f, 0.0f, 0.0f});  // row 1: s = 1.4e-6 < 2^-14
  CHECK(quantize(two, {0.0f, 0.0f}).find("summary_key row 1:") != std::string::npos);
  two.assign(good.begin(), good.end());
  two.insert(two.end(), {5e5f, 0.0f, 0.0f, 0.0f});  // row 1: s16 beyond 65504
  CHECK(quantize(two, {0.0f, 0.0f}).find("summary_key row 1:") != std::string::npos);
  two.assign(good.begin(), good.end());
  two.insert(two.end(), {NAN, 0.0f, 0.0f, 0.0f});
  CHECK(quantize(two, {0.0f, 0.0f}).find("summary_key row 1:") != std::string::npos);
  CHECK(quantize(good, {70000.0f}).find("summary_bias row 0:") != std::string::npos);
  CHECK(quantize(good, {INFINITY}).find("summary_bias row 0:") != std::string::npos);
  CHECK(quantize(good, {65519.0f}).empty());  // rounds to 65504
  // Only d40 scans int4_h (validated first: the error names the kernel, not the inputs).
  const Case c = hils::cases::case_named("longer_blocks");
  const std::vector<AttentionInputs<double>> seqs{hils::cases::make_inputs<double>(c)};
  const MechanismSpec spec = hils::cases::with_case_geometry(hils::preset("hils"), c);
  for (const auto kernel : {hils::gpu::DecodeKernel::fused, hils::gpu::DecodeKernel::d5,
                            hils::gpu::DecodeKernel::d36, hils::gpu::DecodeKernel::d39}) {
    INFO("kernel " << static_cast<int>(kernel));
    const Variant wrong{kernel, hils::gpu::SummaryType::int4_h, "int4_h on another kernel"};
    try {
      decode_and_verify(spec, seqs, nullptr, wrong);
      FAIL("a kernel other than d40 accepted int4_h summaries");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()) == "decode: summary_type 3 (int4_h) is scanned by kernel 26 (d40) only, got kernel " +
                                         std::to_string(static_cast<int>(kernel)));
    }
  }
}

// A row with a NaN or an infinity is stored marked by the fp8 and int4 quantizers (scale NaN,
// the codes of 0), without a synchronisation; the finite rows beside it get the bits they get
// alone (gpu/NOTES.md "Non-finite summary rows (session 22)"). Main before session 22 stored
// such rows with a finite scale (fp8: Inf as 448 x s, NaN kept; int4: NaN as code 0).
TEST_CASE("gpu decode fp8 and int4 quantizers mark a non-finite row", "[gpu]") {
  constexpr int64_t d = 4;
  const std::vector<float> good{1.0f, -2.0f, 0.5f, 3.0f}, other{0.25f, 7.0f, -1.5f, 0.0f};
  struct Stored {
    std::vector<unsigned char> codes;
    std::vector<float> scale;
  };
  auto quantize = [&](bool int4, const std::vector<float>& key) {
    const int64_t rows = static_cast<int64_t>(key.size()) / d;
    Matrix<double> k(rows, d);
    for (int64_t i = 0; i < rows * d; ++i) k(i / d, i % d) = key[i];
    auto key_dev = gt::upload(gt::pack_heads({k}, DType::f32));
    const int64_t row_bytes = int4 ? d / 2 : d;
    gt::GuardedBuffer codes(rows * row_bytes), scale(rows * 4);
    if (int4)
      hils::gpu::quantize_summaries_int4(key_dev.as<float>(), rows, d, codes.data(), scale.as<float>());
    else
      hils::gpu::quantize_summaries_fp8(key_dev.as<float>(), rows, d, codes.data(), scale.as<float>());
    gt::check_cuda(cudaDeviceSynchronize(), "quantize");
    CHECK(codes.guard_damage("codes").empty());
    CHECK(scale.guard_damage("scale").empty());
    Stored out{codes.download(), std::vector<float>(rows)};
    const auto s = scale.download();
    std::memcpy(out.scale.data(), s.data(), rows * 4);
    return out;
  };
  for (const bool int4 : {false, true}) {
    const int64_t row_bytes = int4 ? d / 2 : d;
    const unsigned char zero_code = int4 ? 0x88 : 0x00;
    const Stored alone = quantize(int4, [&] { auto v = good; v.insert(v.end(), other.begin(), other.end()); return v; }());
    for (const float bad : {NAN, INFINITY, -INFINITY}) {
      for (int64_t at = 0; at < d; ++at) {
        INFO((int4 ? "int4" : "fp8") << " value " << bad << " at " << at);
        std::vector<float> key = good;
        std::vector<float> poisoned = other;
        poisoned[at] = bad;
        key.insert(key.end(), poisoned.begin(), poisoned.end());
        key.insert(key.end(), other.begin(), other.end());
        const Stored got = quantize(int4, key);
        CHECK(std::isnan(got.scale[1]));
        for (int64_t i = 0; i < row_bytes; ++i) CHECK(static_cast<int>(got.codes[row_bytes + i]) == zero_code);
        // rows 0 and 2: the bits of the same rows without the marked one between them
        CHECK(got.scale[0] == alone.scale[0]);
        CHECK(got.scale[2] == alone.scale[1]);
        for (int64_t i = 0; i < row_bytes; ++i) {
          CHECK(got.codes[i] == alone.codes[i]);
          CHECK(got.codes[2 * row_bytes + i] == alone.codes[row_bytes + i]);
        }
      }
    }
  }
}

namespace {

// o, lse and selection of one step from the bytes decode_and_verify returns (o, lse, o_window,
// lse_window, selection, ...).
struct StepOutputs {
  std::vector<float> o, lse;
  std::vector<int32_t> selection;
};
StepOutputs step_outputs(const std::vector<unsigned char>& bytes, int64_t B, int64_t Hq,
                         int64_t Hkv, int64_t dv, int64_t K) {
  StepOutputs out{std::vector<float>(B * Hq * dv), std::vector<float>(B * Hq),
                  std::vector<int32_t>(B * Hkv * K)};
  const unsigned char* at = bytes.data();
  std::memcpy(out.o.data(), at, out.o.size() * 4);
  std::memcpy(out.lse.data(), at + out.o.size() * 4, out.lse.size() * 4);
  const size_t selection_at = 2 * (out.o.size() + out.lse.size()) * 4;  // after o_window, lse_window
  std::memcpy(out.selection.data(), at + selection_at, out.selection.size() * 4);
  return out;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

}  // namespace

// One summary row (sequence 1, the first head of KV group 1, chunk 3) made NaN or infinite in one
// value before it is stored: every head of that group of that sequence gets NaN o and lse (its
// selection ranked a NaN score: no output of it is plausible), and every other head and group
// the bits of the untouched cache, o, lse and selection (gpu/NOTES.md "Non-finite summary rows
// (session 22)"). Every kept kernel, bf16, fp8 and int4 rows, K below and above the 809
// candidates; int4_h refuses such a row (test "gpu decode int4_h: refused rows and kernels").
TEST_CASE("gpu decode with a non-finite summary row gives its group NaN outputs", "[gpu]") {
  const Case c{"decode_d64_four_tiles", 3300, 4, 64, 8, 4, 2, 64, 64, true, 1.0};
  const std::vector<AttentionInputs<double>> seqs{
      hils::cases::make_inputs<double>(c), hils::cases::make_inputs<double>(c, kSecondSequenceSalt)};
  const int64_t B = 2, Hq = c.Hq, Hkv = c.Hkv, G = Hq / Hkv, dv = c.dv;
  const int64_t bad_b = 1, bad_g = 1, bad_chunk = 3;
  const Variant kD40Int4Rows{hils::gpu::DecodeKernel::d40, hils::gpu::SummaryType::int4, "d40 int4"};
  for (const char* preset : {"hils", "nsa"})
    for (int64_t K : {8, 32, 1000})
      for (const Variant& variant : {kFusedBf16, kFusedFp8, kFusedInt4, kD5Bf16, kD5Int4, kD29Fp8,
                                     kD35Int4, kD36Bf16, kD40Int4Rows}) {
        MechanismSpec spec = hils::cases::with_case_geometry(hils::preset(preset), c);
        spec.K = K;
        std::vector<unsigned char> clean_bytes, bad_bytes;
        decode_and_verify(spec, seqs, nullptr, variant, &clean_bytes, [](auto&) {});
        const StepOutputs clean = step_outputs(clean_bytes, B, Hq, Hkv, dv, K);
        for (const double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
          INFO(preset << " K " << K << " " << variant.name << " value " << bad);
          decode_and_verify(spec, seqs, nullptr, variant, &bad_bytes, [&](std::vector<Matrix<double>>& key) {
            key[bad_b * Hq + bad_g * G](bad_chunk, 5) = bad;
          });
          const StepOutputs got = step_outputs(bad_bytes, B, Hq, Hkv, dv, K);
          int64_t finite_in_group = 0, changed_elsewhere = 0;
          for (int64_t item = 0; item < B * Hq; ++item) {
            const bool hit = item / Hq == bad_b && item % Hq / G == bad_g;
            for (int64_t i = item * dv; i <= (item + 1) * dv; ++i) {  // the head's o, then its lse
              const float found = i < (item + 1) * dv ? got.o[i] : got.lse[item];
              const float expected = i < (item + 1) * dv ? clean.o[i] : clean.lse[item];
              if (hit) finite_in_group += !std::isnan(found);
              else changed_elsewhere += !same_bits(found, expected);
            }
          }
          for (int64_t bg = 0; bg < B * Hkv; ++bg)
            if (bg != bad_b * Hkv + bad_g)
              for (int64_t i = bg * K; i < (bg + 1) * K; ++i)
                changed_elsewhere += got.selection[i] != clean.selection[i];
          CHECK(finite_in_group == 0);
          CHECK(changed_elsewhere == 0);
        }
      }
}
