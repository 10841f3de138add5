// MX quantize / dequantize on the CPU: the exact reference kernels (docs/design/mx-format.md), multithreaded.
//
// Quantize works on tiles of at most 128 rows ("panels") by 128 columns. Every scale block
// (1x32, 1x128, 32x1, 128x1, 128x128) lies inside exactly one tile, because panels start at a
// block start (row 0, or a group start when blocks run along R) and column tiles start at
// multiples of 128. So a tile is loaded once as fp32, its block amaxes and bytes are computed, and
// it writes its own disjoint part of q, qt, scale_c and scale_r: tiles run in parallel unlocked.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cpu {
namespace {

constexpr int64_t kTile = 128;  // largest block edge: panel height and column tile width

enum class Blocking {
  kAlongC,  // 1x32, 1x128: each row's blocks are independent of every other row
  kAlongR,  // 32x1, 128x1: each column's blocks are independent of every other column
  kSquare,  // 128x128 tiles
};

// A run of consecutive rows processed together. in_group: the rows form one scale block along R
// (or, for kAlongC, just a batch of independent rows); otherwise they lie past the last group and
// are written as zeros. run0: scale_r index of the panel's first 32-run (grouped compact layout).
struct Panel {
  int64_t r0, r1;
  int64_t run0;
  bool in_group;
};

struct Plan {
  Blocking blocking;
  std::vector<Panel> panels;
  int64_t scale_r_used = 0;  // scale_r entries [0, used) are written by tiles, the rest are 0
};

// Panels: for blocks along C, offs is ignored on purpose: rows are independent, so groups cannot
// change any block, and every row is quantized (none is zeroed). For blocks along R (and square
// tiles), each group's rows are cut into block_r-row blocks starting at the group's start; the
// last may be partial. Rows past the last group's end belong to no block and become zeros.
Plan make_plan(const QuantizeArgs& a) {
  Plan plan;
  const int64_t R = a.x.shape[1];
  const int block_r = a.cfg.block_r;
  plan.blocking = block_r == 1 ? Blocking::kAlongC
                  : a.cfg.block_c == 1 ? Blocking::kAlongR
                                       : Blocking::kSquare;
  if (plan.blocking == Blocking::kAlongC) {
    for (int64_t r0 = 0; r0 < R; r0 += kTile) plan.panels.push_back({r0, std::min(R, r0 + kTile), 0, true});
    return plan;
  }
  Groups groups;
  if (a.offs.present) {
    groups = groups_from_offsets(a.offs.t, R);
  } else {
    groups.start = {0};
    groups.end = {R};
    groups.block_start = {0};
  }
  int64_t covered = 0;  // groups are back to back from row 0 (the clamping guarantees it)
  for (int64_t g = 0; g < groups.count(); ++g) {
    const int64_t start = groups.start[g], end = groups.end[g];
    for (int64_t r0 = start; r0 < end; r0 += block_r)
      plan.panels.push_back({r0, std::min(end, r0 + block_r), groups.block_start[g] + (r0 - start) / kBlock, true});
    plan.scale_r_used = groups.block_start[g] + cdiv(end - start, kBlock);
    covered = end;
  }
  for (int64_t r0 = covered; r0 < R; r0 += kTile) plan.panels.push_back({r0, std::min(R, r0 + kTile), -1, false});
  return plan;
}

// Per-thread tile buffers.
struct Scratch {
  float x[kTile * kTile];
  uint8_t q[kTile * kTile];
  uint32_t col_amax[kTile];
  uint8_t col_byte[kTile];
};

inline float to_f32(uint16_t bf16) { return bf16_to_f32(bf16); }
inline float to_f32(float f) { return f; }

inline uint32_t amax_of(const float* x, int64_t n) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = amax_fold(amax, x[i]);
  return amax;
}

inline void quantize_run(const float* x, int64_t n, uint8_t scale, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = quantize_element(x[i], scale);
}

class TileQuantizer {
 public:
  TileQuantizer(const QuantizeArgs& a, const Plan& plan) : a_(a), plan_(plan) {}

  // Tile (b, panel, [c0, c1)).
  template <typename In>
  void run(int64_t b, const Panel& p, int64_t c0, int64_t c1, Scratch& s) const {
    const int64_t rows = p.r1 - p.r0, cols = c1 - c0;
    if (!p.in_group) {
      write_zeros(b, p, c0, c1);
      return;
    }
    load<In>(b, p, c0, c1, s);
    switch (plan_.blocking) {
      case Blocking::kAlongC: {
        // Blocks are block_c wide (a multiple of 32 that divides 128) and start at multiples of
        // block_c, so each lies inside the tile; the last one of a row may be partial.
        const int64_t bc = a_.cfg.block_c;
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = s.x + r * kTile;
          uint8_t* qr = s.q + r * kTile;
          for (int64_t k0 = 0; k0 < cols; k0 += bc) {
            const int64_t n = std::min(bc, cols - k0);
            const uint8_t byte = e8m0_from_amax_bits(amax_of(xr + k0, n), a_.cfg.mode);
            quantize_run(xr + k0, n, byte, qr + k0);
            write_scale_c(b, p.r0 + r, c0 + k0, c0 + k0 + n, byte);
          }
        }
        break;
      }
      case Blocking::kAlongR: {
        // The panel is one block per column.
        std::fill(s.col_amax, s.col_amax + cols, 0u);
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = s.x + r * kTile;
          for (int64_t c = 0; c < cols; ++c) s.col_amax[c] = amax_fold(s.col_amax[c], xr[c]);
        }
        for (int64_t c = 0; c < cols; ++c) s.col_byte[c] = e8m0_from_amax_bits(s.col_amax[c], a_.cfg.mode);
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = s.x + r * kTile;
          uint8_t* qr = s.q + r * kTile;
          for (int64_t c = 0; c < cols; ++c) qr[c] = quantize_element(xr[c], s.col_byte[c]);
        }
        write_scale_r(b, p, c0, c1, s.col_byte);
        break;
      }
      case Blocking::kSquare: {
        uint32_t amax = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = s.x + r * kTile;
          for (int64_t c = 0; c < cols; ++c) amax = amax_fold(amax, xr[c]);
        }
        const uint8_t byte = e8m0_from_amax_bits(amax, a_.cfg.mode);
        for (int64_t r = 0; r < rows; ++r) {
          quantize_run(s.x + r * kTile, cols, byte, s.q + r * kTile);
          write_scale_c(b, p.r0 + r, c0, c1, byte);
        }
        std::fill(s.col_byte, s.col_byte + cols, byte);
        write_scale_r(b, p, c0, c1, s.col_byte);
        break;
      }
    }
    write_data(b, p, c0, c1, s.q);
  }

 private:
  template <typename In>
  void load(int64_t b, const Panel& p, int64_t c0, int64_t c1, Scratch& s) const {
    const mxmoe_tensor& x = a_.x;
    const In* base = static_cast<const In*>(x.data) + b * x.strides[0] + c0 * x.strides[2];
    const int64_t cs = x.strides[2];
    for (int64_t r = p.r0; r < p.r1; ++r) {
      const In* src = base + r * x.strides[1];
      float* dst = s.x + (r - p.r0) * kTile;
      if (cs == 1) {
        for (int64_t c = 0; c < c1 - c0; ++c) dst[c] = to_f32(src[c]);
      } else {
        for (int64_t c = 0; c < c1 - c0; ++c) dst[c] = to_f32(src[c * cs]);
      }
    }
  }

  // Copies the tile's codes (row-major in the scratch) to q and, transposed, to qt. Strides are
  // read into locals: byte stores may alias them, which would force a reload per element.
  void write_data(int64_t b, const Panel& p, int64_t c0, int64_t c1, const uint8_t* tile) const {
    const int64_t rows = p.r1 - p.r0, cols = c1 - c0;
    if (a_.q.present) {
      const mxmoe_tensor& q = a_.q.t;
      const int64_t rs = q.strides[1], cs = q.strides[2];
      uint8_t* base = at<uint8_t>(q, b * q.strides[0] + p.r0 * rs + c0 * cs);
      for (int64_t r = 0; r < rows; ++r) {
        uint8_t* dst = base + r * rs;
        const uint8_t* src = tile + r * kTile;
        if (cs == 1) {
          std::memcpy(dst, src, static_cast<size_t>(cols));
        } else {
          for (int64_t c = 0; c < cols; ++c) dst[c * cs] = src[c];
        }
      }
    }
    if (a_.qt.present) {
      const mxmoe_tensor& qt = a_.qt.t;
      const int64_t cs = qt.strides[1], rs = qt.strides[2];
      uint8_t* base = at<uint8_t>(qt, b * qt.strides[0] + c0 * cs + p.r0 * rs);
      for (int64_t c = 0; c < cols; ++c) {
        uint8_t* dst = base + c * cs;
        for (int64_t r = 0; r < rows; ++r) dst[r * rs] = tile[r * kTile + c];
      }
    }
  }

  // Rows outside every group: zero data, and zero scale_c (square tiles; rows have no block).
  void write_zeros(int64_t b, const Panel& p, int64_t c0, int64_t c1) const {
    static const uint8_t kZeros[kTile * kTile] = {};
    write_data(b, p, c0, c1, kZeros);
    if (a_.scale_c.present)
      for (int64_t r = p.r0; r < p.r1; ++r) write_scale_c(b, r, c0, c1, 0);
  }

  // scale_c[b, r, j] = byte for every 32-run j inside columns [c0, c1).
  void write_scale_c(int64_t b, int64_t r, int64_t c0, int64_t c1, uint8_t byte) const {
    if (!a_.scale_c.present) return;
    const mxmoe_tensor& sc = a_.scale_c.t;
    const int64_t js = sc.strides[2];
    uint8_t* dst = at<uint8_t>(sc, b * sc.strides[0] + r * sc.strides[1]);
    for (int64_t j = c0 / kBlock; j < cdiv(c1, kBlock); ++j) dst[j * js] = byte;
  }

  // scale_r[b, c, run0 + i] = byte of column c for every 32-run i of the panel (a partial last
  // run included).
  void write_scale_r(int64_t b, const Panel& p, int64_t c0, int64_t c1, const uint8_t* col_byte) const {
    if (!a_.scale_r.present) return;
    const mxmoe_tensor& sr = a_.scale_r.t;
    const int64_t cs = sr.strides[1], is = sr.strides[2];
    const int64_t runs = cdiv(p.r1 - p.r0, kBlock);
    uint8_t* base = at<uint8_t>(sr, b * sr.strides[0] + p.run0 * is);
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < runs; ++i) base[c * cs + i * is] = col_byte[c - c0];
  }

  const QuantizeArgs& a_;
  const Plan& plan_;
};

template <typename In>
void quantize_typed(const QuantizeArgs& a, const Plan& plan) {
  const int64_t B = a.x.shape[0], C = a.x.shape[2];
  const int64_t panels = static_cast<int64_t>(plan.panels.size());
  const int64_t col_tiles = cdiv(C, kTile);
  const TileQuantizer tiles(a, plan);
  parallel_for(B * panels * col_tiles, 4, [&](int64_t lo, int64_t hi) {
    std::unique_ptr<Scratch> scratch(new Scratch);
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t ct = t % col_tiles, p = (t / col_tiles) % panels, b = t / (col_tiles * panels);
      const int64_t c0 = ct * kTile;
      tiles.run<In>(b, plan.panels[p], c0, std::min(C, c0 + kTile), *scratch);
    }
  });
}

// Entries of scale_r past the last group's blocks (grouped capacity ceil(R/32) + G) are 0.
void zero_unused_scale_r(const QuantizeArgs& a, int64_t used) {
  if (!a.scale_r.present) return;
  const mxmoe_tensor& sr = a.scale_r.t;
  for (int64_t b = 0; b < sr.shape[0]; ++b)
    for (int64_t c = 0; c < sr.shape[1]; ++c)
      for (int64_t i = used; i < sr.shape[2]; ++i)
        *at<uint8_t>(sr, b * sr.strides[0] + c * sr.strides[1] + i * sr.strides[2]) = 0;
}

template <typename Out>
Out from_f32(float v);
template <>
float from_f32<float>(float v) { return v; }
template <>
uint16_t from_f32<uint16_t>(float v) { return f32_to_bf16(v); }

// dequantize_element for every (scale byte, code) pair, already in the output dtype: exact by
// construction, and one lookup per element instead of decoding both bytes. 64K entries, built
// once per process.
template <typename Out>
const Out* dequantize_table() {
  static const std::vector<Out> table = [] {
    std::vector<Out> t(256 * 256);
    for (int s = 0; s < 256; ++s)
      for (int q = 0; q < 256; ++q)
        t[s * 256 + q] = from_f32<Out>(dequantize_element(static_cast<uint8_t>(q), static_cast<uint8_t>(s)));
    return t;
  }();
  return table.data();
}

template <typename Out>
void dequantize_typed(const DequantizeArgs& a) {
  const Out* table = dequantize_table<Out>();
  const mxmoe_tensor &q = a.q, &scale = a.scale, &out = a.out;
  const int64_t B = q.shape[0], R = q.shape[1], C = q.shape[2];
  const bool along_c = a.axis == 1;
  // Scale index of each position along the blocked axis; -1 outside every group.
  const int64_t len = along_c ? C : R;
  std::vector<int64_t> scale_idx(static_cast<size_t>(len), -1);
  if (a.offs.present) {
    const Groups g = groups_from_offsets(a.offs.t, len);
    for (int64_t k = 0; k < g.count(); ++k)
      for (int64_t i = g.start[k]; i < g.end[k]; ++i) scale_idx[i] = g.block_start[k] + (i - g.start[k]) / kBlock;
  } else {
    for (int64_t i = 0; i < len; ++i) scale_idx[i] = i / kBlock;
  }
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(C, 1));
  parallel_for(B * R, grain, [&](int64_t lo, int64_t hi) {
    // Blocks along R: the scales of row r are a strided column of `scale`; gather it once per
    // 32-run rather than once per row.
    std::vector<uint8_t> row_scales(along_c ? 0 : static_cast<size_t>(C));
    int64_t gathered = -1;
    const int64_t qs = q.strides[2], os = out.strides[2], ss = scale.strides[2];
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t b = row / R, r = row % R;
      const uint8_t* qr = at<const uint8_t>(q, b * q.strides[0] + r * q.strides[1]);
      Out* dst = at<Out>(out, b * out.strides[0] + r * out.strides[1]);
      if (along_c) {
        const uint8_t* sr = at<const uint8_t>(scale, b * scale.strides[0] + r * scale.strides[1]);
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = scale_idx[c];
          dst[c * os] = i < 0 ? Out(0) : table[sr[i * ss] * 256 + qr[c * qs]];
        }
        continue;
      }
      const int64_t i = scale_idx[r];
      if (i < 0) {
        for (int64_t c = 0; c < C; ++c) dst[c * os] = Out(0);
        continue;
      }
      const int64_t key = b * scale.shape[2] + i;  // (batch, scale index) of the gathered column
      if (key != gathered) {
        const uint8_t* col = at<const uint8_t>(scale, b * scale.strides[0] + i * ss);
        for (int64_t c = 0; c < C; ++c) row_scales[c] = col[c * scale.strides[1]];
        gathered = key;
      }
      for (int64_t c = 0; c < C; ++c) dst[c * os] = table[row_scales[c] * 256 + qr[c * qs]];
    }
  });
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  if (numel(a.x) == 0) {  // nothing to quantize: no plan over the (possibly huge) other dims
    zero_unused_scale_r(a, 0);
    return;
  }
  const Plan plan = make_plan(a);
  if (a.x.dtype == MXMOE_DTYPE_BF16)
    quantize_typed<uint16_t>(a, plan);
  else
    quantize_typed<float>(a, plan);
  zero_unused_scale_r(a, plan.scale_r_used);
}

void dequantize(const DequantizeArgs& a) {
  if (numel(a.out) == 0) return;
  if (a.out.dtype == MXMOE_DTYPE_BF16)
    dequantize_typed<uint16_t>(a);
  else
    dequantize_typed<float>(a);
}

}  // namespace cpu
}  // namespace mxmoe
