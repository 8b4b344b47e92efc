#include "sources/llama2c.hpp"

#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "hils/attention.hpp"
#include "io/file_error.hpp"

namespace hils::sources {

namespace {

constexpr int64_t kHeaderBytes = 7 * 4;

// Reads float32 weights in file order.
class WeightReader {
 public:
  WeightReader(std::vector<float> data) : data_(std::move(data)) {}
  Matrix<double> matrix(int64_t rows, int64_t cols) {
    Matrix<double> m(rows, cols);
    for (int64_t i = 0; i < rows * cols; ++i) m.data()[i] = data_[offset_ + i];
    offset_ += rows * cols;
    return m;
  }
  Vector<double> vector(int64_t n) {
    Vector<double> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = data_[offset_ + i];
    offset_ += n;
    return v;
  }
  void skip(int64_t n) { offset_ += n; }

 private:
  std::vector<float> data_;
  int64_t offset_ = 0;
};

// Floats in the file after the header, legacy RoPE tables included.
int64_t expected_floats(const Llama2cConfig& c) {
  int64_t L = c.n_layers, hs = c.head_dim();
  int64_t n = c.vocab_size * c.dim                              // token embedding
              + L * c.dim                                       // attention norm
              + L * c.dim * c.dim + 2 * L * c.kv_dim() * c.dim  // wq, wk, wv
              + L * c.dim * c.dim                               // wo
              + L * c.dim                                       // ffn norm
              + 3 * L * c.hidden_dim * c.dim                    // w1, w2, w3
              + c.dim                                           // final norm
              + c.seq_len * hs;                                 // two legacy RoPE tables
  if (!c.shared_classifier) n += c.vocab_size * c.dim;
  return n;
}

Llama2cConfig read_header(const std::filesystem::path& path, std::ifstream& in) {
  int32_t header[7];
  in.read(reinterpret_cast<char*>(header), kHeaderBytes);
  if (in.gcount() != kHeaderBytes)
    io::fail(path, "header", "7 int32 (28 bytes)", fmt::format("{} bytes", in.gcount()));
  Llama2cConfig c;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  c.shared_classifier = header[5] > 0;
  c.vocab_size = std::abs(static_cast<int64_t>(header[5]));
  c.seq_len = header[6];
  auto positive = [&](int64_t value, const char* name) {
    if (value < 1 || value > (1 << 20))
      io::fail(path, std::string("header ") + name, "1..2^20", std::to_string(value));
  };
  positive(c.dim, "dim");
  positive(c.hidden_dim, "hidden_dim");
  positive(c.n_layers, "n_layers");
  positive(c.n_heads, "n_heads");
  positive(c.n_kv_heads, "n_kv_heads");
  positive(c.vocab_size, "vocab_size");
  positive(c.seq_len, "seq_len");
  if (c.dim % c.n_heads != 0 || c.head_dim() % 2 != 0)
    io::fail(path, "header dim, n_heads", "dim a multiple of n_heads with an even head dim",
             fmt::format("dim={} n_heads={}", c.dim, c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0)
    io::fail(path, "header n_heads, n_kv_heads", "n_heads a multiple of n_kv_heads",
             fmt::format("n_heads={} n_kv_heads={}", c.n_heads, c.n_kv_heads));
  return c;
}

// x / rms(x) * weight, per row (llama2.c rmsnorm).
Matrix<double> rms_norm(const Matrix<double>& x, const Vector<double>& weight, double eps) {
  Matrix<double> out(x.rows(), x.cols());
  for (int64_t t = 0; t < x.rows(); ++t) {
    double mean_square = x.row(t).squaredNorm() / static_cast<double>(x.cols());
    out.row(t) = x.row(t).cwiseProduct(weight.transpose()) / std::sqrt(mean_square + eps);
  }
  return out;
}

// Columns [h*hs, (h+1)*hs) of x as one head's [T x hs] matrix.
std::vector<Matrix<double>> split_heads(const Matrix<double>& x, int64_t heads, int64_t hs) {
  std::vector<Matrix<double>> out;
  for (int64_t h = 0; h < heads; ++h) out.emplace_back(x.middleCols(h * hs, hs));
  return out;
}

}  // namespace

Llama2cModel Llama2cModel::load(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    io::fail(path, "", "a llama2.c checkpoint file", "no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) io::fail(path, "", "a readable file", "a file that cannot be opened");
  Llama2cModel model;
  model.config_ = read_header(path, in);
  const auto& c = model.config_;
  int64_t floats = expected_floats(c);
  auto size = static_cast<int64_t>(std::filesystem::file_size(path));
  if (size != kHeaderBytes + 4 * floats)
    io::fail(path, "", fmt::format("{} bytes for the header's shapes", kHeaderBytes + 4 * floats),
             fmt::format("{} bytes (truncated or not this format)", size));
  std::vector<float> data(floats);
  in.read(reinterpret_cast<char*>(data.data()), 4 * floats);
  if (in.gcount() != 4 * floats) io::fail(path, "weights", "all weights", "a short read");
  for (float value : data)
    if (!std::isfinite(value)) io::fail(path, "weights", "finite values", "NaN or Inf");

  WeightReader r(std::move(data));
  const int64_t L = c.n_layers, D = c.dim, KV = c.kv_dim(), H = c.hidden_dim;
  model.embedding_ = r.matrix(c.vocab_size, D);
  model.layers_.resize(L);
  for (auto& layer : model.layers_) layer.attention_norm = r.vector(D);
  for (auto& layer : model.layers_) layer.wq = r.matrix(D, D);
  for (auto& layer : model.layers_) layer.wk = r.matrix(KV, D);
  for (auto& layer : model.layers_) layer.wv = r.matrix(KV, D);
  for (auto& layer : model.layers_) layer.wo = r.matrix(D, D);
  for (auto& layer : model.layers_) layer.ffn_norm = r.vector(D);
  for (auto& layer : model.layers_) layer.w1 = r.matrix(H, D);
  for (auto& layer : model.layers_) layer.w2 = r.matrix(D, H);
  for (auto& layer : model.layers_) layer.w3 = r.matrix(H, D);
  model.final_norm_ = r.vector(D);
  r.skip(c.seq_len * c.head_dim());  // legacy RoPE tables: recomputed, not read
  model.classifier_ = c.shared_classifier ? model.embedding_ : r.matrix(c.vocab_size, D);
  (void)L;
  return model;
}

void rotate_llama2c(Matrix<double>& x, double theta) {
  const int64_t d = x.cols();
  for (int64_t t = 0; t < x.rows(); ++t) {
    for (int64_t i = 0; i < d; i += 2) {
      double angle = static_cast<double>(t) * std::pow(theta, -static_cast<double>(i) / d);
      double c = std::cos(angle), s = std::sin(angle);
      double a = x(t, i), b = x(t, i + 1);
      x(t, i) = a * c - b * s;
      x(t, i + 1) = a * s + b * c;
    }
  }
}

Matrix<double> Llama2cModel::forward(const std::vector<int32_t>& tokens,
                                     std::vector<LayerTrace>* trace) const {
  const auto& c = config_;
  const auto T = static_cast<int64_t>(tokens.size());
  require(T >= 1 && T <= c.seq_len, "tokens", fmt::format("1..{} tokens", c.seq_len),
          std::to_string(T));
  Matrix<double> x(T, c.dim);
  for (int64_t t = 0; t < T; ++t) {
    require(tokens[t] >= 0 && tokens[t] < c.vocab_size, "token id",
            fmt::format("0..{}", c.vocab_size - 1), std::to_string(tokens[t]));
    x.row(t) = embedding_.row(tokens[t]);
  }
  const int64_t hs = c.head_dim(), G = c.n_heads / c.n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  // S and W play no part in full attention; no landmark slots in a real model's sequence.
  const Geometry geometry(T, 1, 1, false);
  std::vector<int64_t> all_queries;
  if (trace) trace->clear();
  for (const auto& layer : layers_) {
    Matrix<double> xb = rms_norm(x, layer.attention_norm, c.norm_eps);
    LayerTrace step;
    step.hidden = x;
    step.q_unrotated = split_heads(xb * layer.wq.transpose(), c.n_heads, hs);
    step.k_unrotated = split_heads(xb * layer.wk.transpose(), c.n_kv_heads, hs);
    step.v = split_heads(xb * layer.wv.transpose(), c.n_kv_heads, hs);
    step.q = step.q_unrotated;
    step.k = step.k_unrotated;
    for (auto& m : step.q) rotate_llama2c(m, c.rope_theta);
    for (auto& m : step.k) rotate_llama2c(m, c.rope_theta);
    Matrix<double> attended(T, c.dim);
    for (int64_t h = 0; h < c.n_heads; ++h) {
      auto result = full_attention<double>(step.q[h], step.k[h / G], step.v[h / G], geometry,
                                           scale, all_queries);
      attended.middleCols(h * hs, hs) = result.o;
    }
    x += attended * layer.wo.transpose();
    Matrix<double> xf = rms_norm(x, layer.ffn_norm, c.norm_eps);
    Matrix<double> gate = xf * layer.w1.transpose();
    Matrix<double> up = xf * layer.w3.transpose();
    gate = gate.unaryExpr([](double g) { return g / (1.0 + std::exp(-g)); }).cwiseProduct(up);
    x += gate * layer.w2.transpose();
    if (trace) trace->push_back(std::move(step));
  }
  return rms_norm(x, final_norm_, c.norm_eps) * classifier_.transpose();
}

double mean_next_token_nll(const Matrix<double>& logits, const std::vector<int32_t>& tokens) {
  const auto T = static_cast<int64_t>(tokens.size());
  require(logits.rows() == T && T >= 2, "logits", "one row per token and T >= 2",
          fmt::format("{} rows for {} tokens", logits.rows(), T));
  double total = 0;
  for (int64_t t = 0; t + 1 < T; ++t) {
    double max = logits.row(t).maxCoeff();
    double lse = max + std::log((logits.row(t).array() - max).exp().sum());
    total += lse - logits(t, tokens[t + 1]);
  }
  return total / static_cast<double>(T - 1);
}

io::ActivationFile activations_from_trace(const Llama2cConfig& config,
                                          const std::vector<LayerTrace>& trace,
                                          const std::vector<int32_t>& tokens,
                                          nlohmann::json source) {
  io::ActivationFile file;
  auto& meta = file.meta;
  meta.n_layers = static_cast<int64_t>(trace.size());
  meta.Hq = config.n_heads;
  meta.Hkv = config.n_kv_heads;
  meta.T = static_cast<int64_t>(tokens.size());
  meta.d = meta.dv = config.head_dim();
  meta.d_model = config.dim;
  meta.rotated = true;
  meta.rope_pairing = "interleaved";
  meta.rope_theta = config.rope_theta;
  meta.tokens = tokens;
  meta.landmarks.assign(meta.T, 0);  // trained without landmark slots
  for (int64_t t = 0; t < meta.T; ++t) meta.position_ids.push_back(t);
  meta.source = std::move(source);
  for (const auto& step : trace) {
    io::LayerActivations layer;
    layer.inputs.q = step.q;
    layer.inputs.k = step.k;
    layer.inputs.v = step.v;
    layer.q_unrotated = step.q_unrotated;
    layer.k_unrotated = step.k_unrotated;
    layer.hidden = step.hidden;
    file.layers.push_back(std::move(layer));
  }
  return file;
}

}  // namespace hils::sources
