// A llama2.c-format Llama checkpoint (the legacy llama2.c format: a 7-integer header, then the
// weights): loader and a double-precision forward pass whose attention goes through the reference's
// full attention, with a trace of every layer's hidden state, q/k before and after RoPE, and v.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "hils/types.hpp"
#include "io/activation_file.hpp"

namespace hils::sources {

struct Llama2cConfig {
  int64_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0;
  int64_t vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;  // false when the header's vocab_size is negative
  double rope_theta = 10000.0;    // llama2.c's fixed RoPE base, interleaved pairs
  double norm_eps = 1e-5;
  int64_t head_dim() const { return dim / n_heads; }
  int64_t kv_dim() const { return head_dim() * n_kv_heads; }
};

// Row-major (out x in) weights of one transformer block.
struct Llama2cLayer {
  Vector<double> attention_norm, ffn_norm;        // [dim]
  Matrix<double> wq, wk, wv, wo, w1, w2, w3;      // [out x in]
};

// Everything one layer saw during a forward pass.
struct LayerTrace {
  Matrix<double> hidden;                    // [T x dim] residual stream entering the layer
  std::vector<Matrix<double>> q_unrotated;  // Hq x [T x head_dim]
  std::vector<Matrix<double>> k_unrotated;  // Hkv x [T x head_dim]
  std::vector<Matrix<double>> q, k;         // after RoPE
  std::vector<Matrix<double>> v;            // Hkv x [T x head_dim]
};

class Llama2cModel {
 public:
  // Validates the header and the exact file size; throws io::FileError naming the file.
  static Llama2cModel load(const std::filesystem::path& path);

  const Llama2cConfig& config() const { return config_; }

  // Logits [T x vocab] for tokens at positions 0..T-1 (T <= seq_len, ids < vocab); fills
  // `trace` (one entry per layer) when given.
  Matrix<double> forward(const std::vector<int32_t>& tokens,
                         std::vector<LayerTrace>* trace = nullptr) const;

 private:
  Llama2cConfig config_;
  Matrix<double> embedding_;   // [vocab x dim]
  std::vector<Llama2cLayer> layers_;
  Vector<double> final_norm_;  // [dim]
  Matrix<double> classifier_;  // [vocab x dim]
};

// Mean negative log-likelihood (nats/token) of tokens[t+1] given logits row t, t < T-1.
double mean_next_token_nll(const Matrix<double>& logits, const std::vector<int32_t>& tokens);

// Applies llama2.c's RoPE (interleaved pairs (2i, 2i+1), inv_freq = theta^(-2i/d)) to each row
// of x [T x d] at position = row index.
void rotate_llama2c(Matrix<double>& x, double theta);

// An activation file of every layer from a trace: q, k after RoPE (rotated=1, interleaved,
// theta), q_unrotated, k_unrotated, v, hidden; no landmark slots, position ids 0..T-1.
io::ActivationFile activations_from_trace(const Llama2cConfig& config,
                                          const std::vector<LayerTrace>& trace,
                                          const std::vector<int32_t>& tokens,
                                          nlohmann::json source);

}  // namespace hils::sources
