// Fused quantization on the CPU: the reference semantics of mxmoe_quantize_fused, by composition
// of the exact CPU kernels (quantize, dequantize, scales_to_blocked) through temporaries. The CUDA
// backend does the same in one pass over x and must match these bytes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "common/moe_activation.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cpu {
namespace {

// A contiguous host temporary of shape (b, d1, d2).
struct Temp {
  std::vector<uint8_t> bytes;
  mxmoe_tensor t{};
  bool present = false;

  Temp() = default;
  Temp(const Temp& o) { *this = o; }
  Temp& operator=(const Temp& o) {
    bytes = o.bytes;
    t = o.t;
    present = o.present;
    t.data = bytes.empty() ? nullptr : bytes.data();
    return *this;
  }

  void make(mxmoe_dtype dtype, int64_t b, int64_t d1, int64_t d2) {
    bytes.assign(static_cast<size_t>(b * d1 * d2 * dtype_size(dtype)), 0);
    t = mxmoe_tensor{};
    t.data = bytes.data();
    t.dtype = dtype;
    t.ndim = 3;
    t.shape[0] = b;
    t.shape[1] = d1;
    t.shape[2] = d2;
    t.strides[2] = 1;
    t.strides[1] = d2;
    t.strides[0] = d1 * d2;
    t.device = -1;
    present = true;
  }
  OptTensor opt() const {
    OptTensor o;
    o.present = present;
    o.t = t;
    return o;
  }
};

// Outputs are contiguous (validated) and have the temporary's shape.
void copy_into(const OptTensor& dst, const Temp& src) {
  if (!dst.present) return;
  if (!src.bytes.empty()) std::memcpy(dst.t.data, src.bytes.data(), src.bytes.size());
}

// dst (B, C, R) = src (B, R, C) transposed, elements of dtype_size bytes.
void transpose_into(const mxmoe_tensor& dst, const Temp& src) {
  const int64_t B = src.t.shape[0], R = src.t.shape[1], C = src.t.shape[2];
  const int64_t es = dtype_size(src.t.dtype);
  const uint8_t* s = src.bytes.data();
  uint8_t* d = static_cast<uint8_t*>(dst.data);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(d + ((b * C + c) * R + r) * es, s + ((b * R + r) * C + c) * es, static_cast<size_t>(es));
}

struct SideQuant {
  Temp q, qt, scale;
};

// Every output of one side from its quantization (q, qt, scale temporaries).
void emit(const FusedArgs& a, const FusedSide& s, const SideQuant& sq, bool is_row) {
  const int64_t B = a.x.shape[0], R = a.x.shape[1], C = a.x.shape[2];
  copy_into(s.q, sq.q);
  copy_into(s.qt, sq.qt);
  copy_into(s.scale, sq.scale);
  if (s.scale_blocked.present) {
    BlockedArgs ba;
    ba.scale = sq.scale.t;
    ba.blocked = s.scale_blocked.t;
    ba.kind = s.blocked_kind;
    if (s.blocked_kind == MXMOE_BLOCKED_GROUPS_M || s.blocked_kind == MXMOE_BLOCKED_GROUPS_K) ba.offs = a.offs;
    ba.m_tokens = R;  // GROUPS_K: groups of the R tokens, clamped at R like the quantizer's
    scales_to_blocked(ba);
  }
  // Round trips: one dequantize per output dtype.
  for (const mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
    const bool to_dq = s.dq.present && s.dq.t.dtype == dt, to_dqt = s.dqt.present && s.dqt.t.dtype == dt;
    if (!to_dq && !to_dqt) continue;
    Temp out;
    out.make(dt, B, R, C);
    DequantizeArgs da;
    da.q = sq.q.t;
    da.scale = sq.scale.t;
    da.axis = is_row ? 1 : 0;
    if (!is_row) da.offs = a.offs;  // rowwise blocks run along C: the token groups do not apply
    da.out = out.t;
    dequantize(da);
    if (to_dq) copy_into(s.dq, out);
    if (to_dqt) transpose_into(s.dqt.t, out);
  }
}

bool wants_q(const FusedSide& s) { return s.q.present || s.dq.present || s.dqt.present; }

// The computed input of mxmoe_quantize_fused_source, materialized (R, C) in a's dtype: the
// reference for the CUDA kernels, which compute the same values while they load.
std::vector<uint8_t> materialize(const FusedSource& s, int64_t R, int64_t C) {
  const bool f32 = s.a.dtype == MXMOE_DTYPE_F32;
  const size_t es = f32 ? 4 : 2;
  std::vector<uint8_t> buf(static_cast<size_t>(R * C) * es);
  if (R == 0 || C == 0) return buf;  // nothing to compute (R may be huge with C == 0)
  auto get = [](const mxmoe_tensor& t, int64_t i) {
    return t.dtype == MXMOE_DTYPE_F32 ? static_cast<const float*>(t.data)[i]
                                      : bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
  };
  auto put = [&](int64_t i, float v) {
    if (f32) reinterpret_cast<float*>(buf.data())[i] = v;
    else reinterpret_cast<uint16_t*>(buf.data())[i] = f32_to_bf16(v);
  };
  if (s.kind == MXMOE_SOURCE_GATHER) {
    const int32_t* perm = static_cast<const int32_t*>(s.perm.t.data);
    const float* rs = s.row_scale.present ? static_cast<const float*>(s.row_scale.t.data) : nullptr;
    const int64_t n = s.a.shape[0] * s.k;
    for (int64_t r = 0; r < R; ++r) {
      if (perm[r] < 0 || n == 0) continue;  // a padding row: zeros (buf starts zeroed)
      const int64_t e = std::min<int64_t>(perm[r], n - 1);  // clamped, never OOB
      const int64_t src = e / s.k;
      for (int64_t c = 0; c < C; ++c) {
        const float v = get(s.a, src * C + c);
        if (rs == nullptr) {
          if (f32) put(r * C + c, v);
          else reinterpret_cast<uint16_t*>(buf.data())[r * C + c] = static_cast<const uint16_t*>(s.a.data)[src * C + c];
        } else {
          put(r * C + c, mul_rn(v, rs[e]));
        }
      }
    }
    return buf;
  }
  const SwigluParams p{s.layout, s.alpha, s.limit, s.up_offset};
  const int64_t I = s.kind == MXMOE_SOURCE_SWIGLU ? C : C / 2;  // gate/up width
  auto gate_up = [&](int64_t r, int64_t i, float& g, float& u) {
    const int64_t row = r * 2 * I;
    g = get(s.a, row + (s.layout == 0 ? i : 2 * i));
    u = get(s.a, row + (s.layout == 0 ? I + i : 2 * i + 1));
  };
  // SWIGLU_BACKWARD with row_scale: dy row r times row_scale.flat[perm[r]] (clamped; 0 for a padding row).
  const float* rs = s.row_scale.present ? static_cast<const float*>(s.row_scale.t.data) : nullptr;
  const int32_t* perm = s.perm.present ? static_cast<const int32_t*>(s.perm.t.data) : nullptr;
  const int64_t n_entries = rs ? s.row_scale.t.shape[0] * s.k : 0;
  for (int64_t r = 0; r < R; ++r) {
    float factor = 1.f;
    if (rs != nullptr) factor = perm[r] < 0 || n_entries == 0 ? 0.f : rs[std::min<int64_t>(perm[r], n_entries - 1)];
    for (int64_t i = 0; i < I; ++i) {
      float g, u;
      gate_up(r, i, g, u);
      if (s.kind == MXMOE_SOURCE_SWIGLU) {
        put(r * C + i, swiglu_value(g, u, p));
      } else {
        float dg, du;
        const float dy = get(s.b, r * I + i);
        swiglu_grad(g, u, rs != nullptr ? mul_rn(dy, factor) : dy, p, &dg, &du);
        put(r * C + (s.layout == 0 ? i : 2 * i), dg);
        put(r * C + (s.layout == 0 ? I + i : 2 * i + 1), du);
      }
    }
  }
  return buf;
}

}  // namespace

void quantize_fused(const FusedArgs& a) {
  if (a.src.kind != 0) {
    const std::vector<uint8_t> buf = materialize(a.src, a.x.shape[1], a.x.shape[2]);
    FusedArgs b = a;
    b.src = FusedSource{};
    b.x.data = const_cast<uint8_t*>(buf.data());
    quantize_fused(b);
    return;
  }
  const int64_t B = a.x.shape[0], R = a.x.shape[1], C = a.x.shape[2];
  if (B * R * C == 0) {
    // Nothing to quantize: every output is empty or all zero bytes (grouped scale capacity and
    // blocked padding of empty groups). No intermediates sized by the other, possibly huge, dims.
    for (const FusedSide* side : {&a.row, &a.col}) {
      if (!side->active) continue;
      for (const OptTensor* o : {&side->q, &side->qt, &side->scale, &side->scale_blocked, &side->dq, &side->dqt})
        if (o->present && numel(o->t) > 0)
          std::memset(o->t.data, 0, static_cast<size_t>(numel(o->t) * dtype_size(o->t.dtype)));
    }
    return;
  }
  auto quantize_side = [&](int32_t block_r, int32_t block_c, bool with_offs, bool row_scale, bool col_scale,
                           bool want_q, bool want_qt, SideQuant& row_out, SideQuant& col_out) {
    QuantizeArgs qa;
    qa.x = a.x;
    if (with_offs) qa.offs = a.offs;
    qa.cfg = mxmoe_quant_config{block_r, block_c, a.mode};
    qa.n_r = a.n_r;
    Temp q, qt, sc, sr;
    if (want_q) q.make(MXMOE_DTYPE_E4M3, B, R, C);
    if (want_qt) qt.make(MXMOE_DTYPE_E4M3, B, C, R);
    if (row_scale) sc.make(MXMOE_DTYPE_E8M0, B, R, C / kBlock);
    if (col_scale) sr.make(MXMOE_DTYPE_E8M0, B, C, a.n_r);
    qa.q = q.opt();
    qa.qt = qt.opt();
    qa.scale_c = sc.opt();
    qa.scale_r = sr.opt();
    quantize(qa);
    if (row_scale) {
      row_out.q = q;
      row_out.qt = qt;
      row_out.scale = sc;
    }
    if (col_scale) {
      col_out.q = q;
      col_out.qt = qt;
      col_out.scale = sr;
    }
  };
  SideQuant row, col;
  if (a.tile128) {
    // One 128x128 quantization, viewed through scale_c (rowwise side) and scale_r (columnwise).
    const bool want_q = (a.row.active && wants_q(a.row)) || (a.col.active && wants_q(a.col));
    const bool want_qt = (a.row.active && a.row.qt.present) || (a.col.active && a.col.qt.present);
    quantize_side(128, 128, true, a.row.active, a.col.active, want_q || !want_qt, want_qt, row, col);
  } else {
    if (a.row.active)
      quantize_side(1, a.row.block, false, true, false, wants_q(a.row) || !a.row.qt.present, a.row.qt.present, row,
                    col);
    if (a.col.active)
      quantize_side(a.col.block, 1, true, false, true, wants_q(a.col) || !a.col.qt.present, a.col.qt.present, row,
                    col);
  }
  if (a.row.active) emit(a, a.row, row, true);
  if (a.col.active) emit(a, a.col, col, false);
}

}  // namespace cpu
}  // namespace mxmoe
