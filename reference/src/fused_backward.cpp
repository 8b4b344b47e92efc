#include "fused_backward.hpp"

#ifdef HILS_FUSED_KERNELS

#include <algorithm>
#include <atomic>

namespace hils::detail {

namespace {

constexpr int64_t kTileRows = kQueryBlock;               // queries per tile
constexpr int64_t kTileKeys = kTileVectors * kLanes;     // keys per tile: one register tile wide

int64_t padded_to_lanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// A thread's scratch for one tile, kept between tiles (no allocation or zeroing per tile).
// Padding columns hold values of earlier tiles (finite): they are masked or never summed.
struct Workspace {
  std::vector<double, Eigen::aligned_allocator<double>> q_scaled, keys_t, values_t, p, ds, p_t,
      ds_t, column_mask;
  void reserve(int64_t d, int64_t dv) {
    auto grow = [](auto& buffer, int64_t size) {
      if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
    };
    grow(q_scaled, kTileRows * d);
    grow(keys_t, d * kTileKeys);
    grow(values_t, dv * kTileKeys);
    for (auto* square : {&p, &ds, &p_t, &ds_t}) grow(*square, kTileRows * kTileKeys);
    grow(column_mask, kTileKeys);
  }
};

// Query rows [t0, t0 + n) of head h against keys [k0, k0 + width) of its KV group g: P~ and
// dS of the tile in L1 (rows: queries), then dq of the rows from dS and the keys, and, from
// P~ and dS transposed (rows: keys), dv and dk of the keys. sigma is folded into dS.
void tile_backward(const SoftmaxGradientInputs& in, int64_t h, int64_t g, int64_t t0, int64_t n,
                   int64_t k0, int64_t width, Workspace& w, Matrix<double>& dq,
                   Matrix<double>& dk, Matrix<double>& dv) {
  const auto& q = in.q[static_cast<size_t>(h)];
  const auto& d_o = in.d_o[static_cast<size_t>(h)];
  const auto& k = in.k[static_cast<size_t>(g)];
  const auto& v = in.v[static_cast<size_t>(g)];
  const Vector<double>& lambda = *in.lambda[static_cast<size_t>(h)];
  const Vector<double>& delta = *in.delta[static_cast<size_t>(h)];
  const int64_t d = q.cols(), dv_cols = v.cols();
  const int64_t padded = padded_to_lanes(width), rows_padded = padded_to_lanes(n);
  const double* q_rows = q.row(t0).data();
  for (int64_t i = 0; i < n * d; ++i) w.q_scaled[static_cast<size_t>(i)] = q_rows[i] * in.scale;
  transpose_rows(k.row(k0).data(), d, width, d, w.keys_t.data(), padded);
  transpose_rows(v.row(k0).data(), dv_cols, width, dv_cols, w.values_t.data(), padded);
  const bool columns_masked = key_column_mask(in.geometry, k0, width, padded, w.column_mask.data());
  // Logits s into p and do.v into ds, kTileQueries rows at a time.
  for (int64_t i = 0; i < n; i += kTileQueries) {
    const int64_t count = std::min<int64_t>(kTileQueries, n - i);
    chunk_logits_rows(count, w.q_scaled.data() + i * d, d, w.keys_t.data(), padded,
                      w.p.data() + i * padded);
    chunk_logits_rows(count, d_o.row(t0 + i).data(), dv_cols, w.values_t.data(), padded,
                      w.ds.data() + i * padded);
  }
  // P~ = exp(s - lambda) (0 where masked, or for lambda = +inf), dS = sigma P~ (do.v - delta).
  const __m512d sigma = _mm512_set1_pd(in.scale);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = t0 + r;
    double* p_row = w.p.data() + r * padded;
    double* ds_row = w.ds.data() + r * padded;
    mask_row(p_row, k0, width, padded, in.window_only ? in.geometry.window_left(t) : 0, t,
             w.column_mask.data(), columns_masked);
    const __m512d shift = _mm512_set1_pd(lambda(t)), offset = _mm512_set1_pd(delta(t));
    for (int64_t j = 0; j < padded; j += kLanes) {
      const __m512d p = exp_nonpositive8(_mm512_sub_pd(_mm512_loadu_pd(p_row + j), shift));
      const __m512d ds = _mm512_mul_pd(_mm512_sub_pd(_mm512_loadu_pd(ds_row + j), offset), p);
      _mm512_storeu_pd(p_row + j, p);
      _mm512_storeu_pd(ds_row + j, _mm512_mul_pd(ds, sigma));
    }
  }
  for (int64_t i = 0; i < n; i += kTileQueries)
    weighted_values_rows(std::min<int64_t>(kTileQueries, n - i), w.ds.data() + i * padded, padded,
                         width, k.row(k0).data(), d, dq.row(t0 + i).data(), d);
  transpose_rows(w.p.data(), padded, n, padded, w.p_t.data(), rows_padded);
  transpose_rows(w.ds.data(), padded, n, padded, w.ds_t.data(), rows_padded);
  for (int64_t j = 0; j < width; j += kTileQueries) {
    const int64_t count = std::min<int64_t>(kTileQueries, width - j);
    weighted_values_rows(count, w.p_t.data() + j * rows_padded, rows_padded, n,
                         d_o.row(t0).data(), dv_cols, dv.row(k0 + j).data(), dv_cols);
    weighted_values_rows(count, w.ds_t.data() + j * rows_padded, rows_padded, n, q_rows, d,
                         dk.row(k0 + j).data(), d);
  }
}

// The tiles (i, j) of the backward: query block i against key block j, for j from first[i]
// (the first key block any query of block i attends) to i. Grouped for the threads into units
// of side x side tiles, (I, J): the tiles of blocks i in [I side, (I + 1) side) and j in
// [J side, (J + 1) side), i ascending then j descending. The units run in waves c = I - J
// ascending (then KV group, then I); a unit waits for the one before it with the same I (same
// dq rows) and the one before it with the same J (same dk, dv rows). So dq of block i adds its
// tiles in descending j and dk, dv of block j in ascending i, whatever the side or the threads.
struct Schedule {
  struct Unit {
    int64_t g, I, J;
    int64_t after_rows, after_keys;  // indices of the units to wait for, or -1
  };
  int64_t blocks, side;
  std::vector<int64_t> first;
  std::vector<Unit> units;

  int64_t rows_end(int64_t I) const { return std::min(blocks, (I + 1) * side); }
  // The key blocks of unit (., J) that query block i attends: [lowest, highest].
  int64_t highest(int64_t i, int64_t J) const { return std::min(i, (J + 1) * side - 1); }
  int64_t lowest(int64_t i, int64_t J) const {
    return std::max(J * side, first[static_cast<size_t>(i)]);
  }
};

Schedule schedule_tiles(const SoftmaxGradientInputs& in, int64_t groups) {
  const int64_t T = in.geometry.T();
  Schedule s;
  s.blocks = (T + kTileRows - 1) / kTileRows;
  // 4 x 4 tiles (256 queries x 256 keys: ~1 MiB of rows at d = 64, in L2) when there are many,
  // fewer when T is short, so that the last waves (few units) take little time.
  s.side = std::clamp<int64_t>(s.blocks / 16, 1, 4);
  s.first.assign(static_cast<size_t>(s.blocks), 0);
  for (int64_t i = 0; i < s.blocks; ++i) {
    int64_t left = 0;
    if (in.window_only) {
      left = i * kTileRows;
      for (int64_t t = i * kTileRows; t < std::min(T, (i + 1) * kTileRows); ++t)
        left = std::min(left, in.geometry.window_left(t));
    }
    s.first[static_cast<size_t>(i)] = left / kTileKeys;
  }
  const int64_t sides = (s.blocks + s.side - 1) / s.side;
  auto has_tiles = [&](int64_t I, int64_t J) {
    for (int64_t i = I * s.side; i < s.rows_end(I); ++i)
      if (s.lowest(i, J) <= s.highest(i, J)) return true;
    return false;
  };
  std::vector<int64_t> last_of_rows(static_cast<size_t>(groups * sides), -1),
      last_of_keys(static_cast<size_t>(groups * sides), -1);
  for (int64_t c = 0; c < sides; ++c)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t I = c; I < sides; ++I) {
        if (!has_tiles(I, I - c)) continue;
        auto& rows = last_of_rows[static_cast<size_t>(g * sides + I)];
        auto& keys = last_of_keys[static_cast<size_t>(g * sides + I - c)];
        s.units.push_back({g, I, I - c, rows, keys});
        rows = keys = static_cast<int64_t>(s.units.size()) - 1;
      }
  return s;
}

}  // namespace

void fused_softmax_backward(const SoftmaxGradientInputs& in, std::vector<Matrix<double>>& dq,
                            std::vector<Matrix<double>>& dk, std::vector<Matrix<double>>& dv) {
  const int64_t T = in.geometry.T(), Hq = static_cast<int64_t>(in.q.size());
  const int64_t Hkv = static_cast<int64_t>(in.k.size()), G = Hq / Hkv;
  if (T == 0) return;
  static_assert(kTileRows == kTileKeys, "query block i and key block j cover the same slots");
  const Schedule s = schedule_tiles(in, Hkv);
  // A unit waits for the two before it (lower in the order, so handed out earlier and running,
  // done or skipped by a stop): no barrier between waves, and no atomics on the outputs.
  std::vector<std::atomic<int>> done(s.units.size());
  auto mark_done = [&](int64_t unit) {
    done[static_cast<size_t>(unit)].store(1, std::memory_order_release);
    done[static_cast<size_t>(unit)].notify_all();
  };
  auto wait_for = [&](int64_t unit) {
    if (unit < 0) return;
    const auto& flag = done[static_cast<size_t>(unit)];
    while (flag.load(std::memory_order_acquire) == 0) flag.wait(0, std::memory_order_acquire);
  };
  const int64_t d = in.q.front().cols(), dv_cols = in.v.front().cols();
  parallel_units(
      static_cast<int64_t>(s.units.size()),
      [&](int64_t unit) {
        struct Done {  // also when a tile throws: nothing waits forever
          decltype(mark_done)& mark;
          int64_t unit;
          ~Done() { mark(unit); }
        } const marks{mark_done, unit};
        const Schedule::Unit& u = s.units[static_cast<size_t>(unit)];
        wait_for(u.after_rows);
        wait_for(u.after_keys);
        thread_local Workspace w;
        w.reserve(d, dv_cols);
        for (int64_t i = u.I * s.side; i < s.rows_end(u.I); ++i)
          for (int64_t j = s.highest(i, u.J); j >= s.lowest(i, u.J); --j) {
            const int64_t t0 = i * kTileRows, k0 = j * kTileKeys;
            for (int64_t h = u.g * G; h < (u.g + 1) * G; ++h)
              tile_backward(in, h, u.g, t0, std::min(kTileRows, T - t0), k0,
                            std::min(kTileKeys, T - k0), w, dq[static_cast<size_t>(h)],
                            dk[static_cast<size_t>(u.g)], dv[static_cast<size_t>(u.g)]);
          }
      },
      mark_done);
}

}  // namespace hils::detail

#endif
