// CUDA MX quantization (mxmoe_quantize: 1x32, 1x128, 32x1, 128x1, 128x128, 2D with token groups or
// 3D per expert; mxmoe_quantize_fused: rowwise + columnwise sides from one read of x, MX round trip
// to bf16/f32 in both orientations, scales straight into the blocked layout): the host side that
// fills the request parameters and routes each request to the family that serves it best
// (measured, docs/design/quantize.md): the tile128 pass kernel (tile128_bf16.cu), the
// rowwise streaming kernel (quant_rows.cu), the warp-tile kernel (quant_warp.cu), the slab kernel
// (quant_slab.cu) or the tile kernel (quant_tile.cu), which takes every request.
#include "cuda/quantize/kernels.cuh"
#include "cuda/quantize/tile128_bf16.cuh"

namespace mxmoe {
namespace cuda {
namespace {

using namespace quant;

// ---- host ----------------------------------------------------------------------------------------------
void fill_side(SideP& s, const OptTensor& q, const OptTensor& qt, const OptTensor& scale,
               const OptTensor& blocked, mxmoe_blocked_kind kind, const OptTensor& dq, const OptTensor& dqt,
               int64_t C) {
  s.q = q.present ? static_cast<uint8_t*>(q.t.data) : nullptr;
  s.qt = qt.present ? static_cast<uint8_t*>(qt.t.data) : nullptr;
  s.scale = scale.present ? static_cast<uint8_t*>(scale.t.data) : nullptr;
  s.blocked = blocked.present ? static_cast<uint8_t*>(blocked.t.data) : nullptr;
  s.blocked_size = blocked.present ? blocked.t.shape[0] : 0;
  s.kind = kind;
  s.dq = dq.present ? dq.t.data : nullptr;
  s.dqt = dqt.present ? dqt.t.data : nullptr;
  s.dq_f32 = dq.present && dq.t.dtype == MXMOE_DTYPE_F32;
  s.dqt_f32 = dqt.present && dqt.t.dtype == MXMOE_DTYPE_F32;
  s.q_vec = s.q == nullptr || (aligned(s.q, 8) && C % 8 == 0);
  s.dq_vec = s.dq == nullptr || (aligned(s.dq, 16) && C % (s.dq_f32 ? 4 : 8) == 0);
  s.sc_vec = s.scale == nullptr || (aligned(s.scale, 4) && (C / 32) % 4 == 0);
}

// The tile128 recipe's passes (tile128_bf16.cu): bf16 x (or a bf16 computed input), 16-byte
// aligned rows of C % 8 == 0 elements, at most kMaxTable groups, compact scales only; rowwise 1x128
// codes and/or columnwise 128x1 transposed codes, or the 128x128 tile quantization (codes in either
// orientation, both scale layouts). MXMOE_QUANT_TILE128=0 keeps them on the general kernels (A/B runs).
bool run_tile128_pass(const Params& p, const mxmoe_tensor& x, int device, cudaStream_t stream) {
  static const int env = [] {
    const char* e = std::getenv("MXMOE_QUANT_TILE128");
    return e ? std::atoi(e) : 1;
  }();
  if (!env || x.dtype != MXMOE_DTYPE_BF16 || !p.x_vec || (p.grouped && !p.table)) return false;
  if (!p.row_on && !p.col_on) return false;
  const SideP &r = p.row, &c = p.col;
  auto plain = [](const SideP& sd) { return !sd.blocked && !sd.dq && !sd.dqt && (!sd.q || aligned(sd.q, 8)); };
  if ((p.row_on && !plain(r)) || (p.col_on && !plain(c))) return false;
  Tile128Pass a;
  if (p.tile) {
    if (p.src.kind != 0) return false;  // weights are tensors; a computed input stays on the tile kernel
    if (p.col_on && c.q) return false;  // codes in x's orientation come from the row side only
    if (p.row_on && p.col_on && r.qt && c.qt) return false;
    a.q = p.row_on ? r.q : nullptr;
    a.qt = p.row_on && r.qt ? r.qt : (p.col_on ? c.qt : nullptr);
    a.scale_c = p.row_on ? r.scale : nullptr;
    a.scale_r = p.col_on ? c.scale : nullptr;
  } else {
    if (p.row_on && (p.row_block != 128 || r.qt)) return false;
    if (p.col_on && (p.col_block != 128 || c.q)) return false;
    a.row_codes = p.row_on;
    a.col_codes = p.col_on;
    if (p.row_on) a.q = r.q, a.scale_c = r.scale;
    if (p.col_on) a.qt = c.qt, a.scale_r = c.scale;
  }
  a.x = p.x;
  a.B = p.B;
  a.R = p.R;
  a.C = p.C;
  a.offs = p.grouped ? p.offs : nullptr;
  a.offs_stride = p.offs_stride;
  a.G = p.grouped ? p.G : 0;
  a.mode = p.mode;
  a.tile = p.tile;
  a.n_r = p.n_r;
  a.src = p.src;
  launch_tile128_pass(a, device, stream);
  return true;
}

void launch(Params& p, const mxmoe_tensor& x, const OptTensor& offs, void* stream) {
  if (x.shape[1] >= (int64_t{1} << 31) - 256 || x.shape[2] >= (int64_t{1} << 31) - 256)
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: dims of 2^31 elements and more are not supported on CUDA");
  p.x = x.data;
  p.B = static_cast<int>(x.shape[0]);
  p.R = static_cast<int>(x.shape[1]);
  p.C = static_cast<int>(x.shape[2]);
  p.offs = offs.present ? static_cast<const int32_t*>(offs.t.data) : nullptr;
  p.G = offs.present ? static_cast<int>(offs.t.shape[0]) : 0;
  p.offs_stride = offs.present ? offs.t.strides[0] : 1;
  if (!p.grouped) {
    p.offs = nullptr;
    p.G = 0;
  }
  p.table = p.grouped && p.G <= kMaxTable;
  p.P = static_cast<int>(cdiv(p.R, 128) + (p.grouped ? p.G + 1 : 0));
  p.ctiles = static_cast<int>(cdiv(p.C, 128));
  p.tiles = static_cast<long long>(p.B) * p.P * p.ctiles;
  const bool bf16 = x.dtype == MXMOE_DTYPE_BF16;
  p.x_vec = aligned(x.data, 16) && p.C % (bf16 ? 8 : 4) == 0;
  DeviceGuard guard(x.device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  static const int stream_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_STREAM");
    return e ? std::atoi(e) : 1;
  }();
  static const int order_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_ORDER");
    return e ? std::atoi(e) : 1;
  }();
  p.order = order_env;
  if (p.src.kind != 0) {
    // Computed inputs: the tile128 pass kernel where it takes the request, else the tile kernel
    // (every blocking, both sides, one pass).
    if (run_tile128_pass(p, x, x.device, s)) return;
    if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
    launch_tile(p, bf16, x.device, s);
    return;
  }
  // Rowwise only, outputs in x's orientation, aligned: the streaming kernel.
  const SideP& r = p.row;
  if (stream_env && p.row_on && !p.col_on && !p.tile && p.row_block > 0 && !r.qt && !r.dqt && !r.blocked &&
      p.x_vec && (p.row_block == 32 || p.C % 128 == 0) && (!r.q || aligned(r.q, 8)) && (!r.dq || aligned(r.dq, 16))) {
    RowParams rp{x.data, r.q, r.scale, r.dq, r.dq_f32, static_cast<long long>(p.B) * p.R * (p.C / 8), p.mode};
    launch_rows(rp, bf16, p.row_block, stream_env != 2, x.device, s);  // MXMOE_QUANT_STREAM=2: no pipelining
    return;
  }
  if (run_tile128_pass(p, x, x.device, s)) return;
  static const int warp_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_WARP");
    return e ? std::atoi(e) : 1;
  }();
  // 32x1 columnwise (optionally with 1x32 rowwise in x's orientation), bf16 in, compact scales: the
  // warp-tile kernel. Transposed outputs may have any alignment (handled on the device).
  auto warp_side_ok = [](const SideP& sd, bool row_side) {
    if (sd.blocked || sd.dq_f32 || sd.dqt_f32) return false;
    if (row_side && (sd.qt || sd.dqt)) return false;
    return (!sd.q || aligned(sd.q, 4)) && (!sd.dq || aligned(sd.dq, 8));
  };
  // Default route (measured, docs/design/quantize.md): only requests whose column side is
  // round trips in x's orientation (the sm90 exact recipe's dY pass), where the warp-tile kernel
  // beat the slab kernel on every shape; codes and transposed outputs stay on the slab kernel
  // (equal or better there, 2x better with jagged groups). MXMOE_QUANT_WARP=2|3|4 sends every
  // eligible request here (A/B runs), 0 none.
  const bool warp_default = !p.col.q && !p.col.qt && !p.col.dqt;
  if (warp_env && (warp_env >= 2 || warp_default) && bf16 && aligned(x.data, 8) && p.C % 8 == 0 && !p.tile &&
      p.col_on && p.col_block == 32 &&
      warp_side_ok(p.col, false) &&
      (!p.row_on || (p.row_block == 32 && p.C % 32 == 0 && warp_side_ok(p.row, true))) && (!p.grouped || p.table)) {
    launch_warp(p, warp_env, x.device, s);
    return;
  }
  static const int slab_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_SLAB");
    return e ? std::atoi(e) : 1;
  }();
  // Blocks of at most 32 rows (no 128x1, no 128x128) and a group table that fits: 32-row slabs.
  if (slab_env && !p.tile && p.col_block != 128 && (!p.grouped || p.table)) {
    launch_slab(p, bf16, x.device, s);
    return;
  }
  if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
  launch_tile(p, bf16, x.device, s);
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  Params p;
  p.mode = a.cfg.mode;
  p.n_r = a.n_r;
  const OptTensor none;
  const int64_t C = a.x.shape[2];
  if (a.cfg.block_r == 1) {
    // Blocks along C: rows are independent, offs does not matter.
    p.row_block = a.cfg.block_c;
    p.row_on = true;
    fill_side(p.row, a.q, a.qt, a.scale_c, none, MXMOE_BLOCKED_WHOLE, none, none, C);
  } else if (a.cfg.block_c == 1) {
    p.col_block = a.cfg.block_r;
    p.col_on = true;
    p.grouped = a.offs.present;
    fill_side(p.col, a.q, a.qt, a.scale_r, none, MXMOE_BLOCKED_WHOLE, none, none, C);
  } else {
    p.tile = true;
    p.grouped = a.offs.present;
    p.row_on = true;
    fill_side(p.row, a.q, a.qt, a.scale_c, none, MXMOE_BLOCKED_WHOLE, none, none, C);
    if (a.scale_r.present) {
      p.col_on = true;
      fill_side(p.col, none, none, a.scale_r, none, MXMOE_BLOCKED_WHOLE, none, none, C);
    }
  }
  launch(p, a.x, a.offs, a.stream);
}

void quantize_fused(const FusedArgs& a) {
  Params p;
  p.mode = a.mode;
  p.n_r = a.n_r;
  p.tile = a.tile128;
  const int64_t C = a.x.shape[2];
  if (a.row.active) {
    p.row_on = true;
    if (!a.tile128) p.row_block = a.row.block;
    fill_side(p.row, a.row.q, a.row.qt, a.row.scale, a.row.scale_blocked, a.row.blocked_kind, a.row.dq, a.row.dqt, C);
  }
  if (a.col.active) {
    p.col_on = true;
    if (!a.tile128) p.col_block = a.col.block;
    fill_side(p.col, a.col.q, a.col.qt, a.col.scale, a.col.scale_blocked, a.col.blocked_kind, a.col.dq, a.col.dqt, C);
  }
  p.grouped = a.offs.present && (a.col.active || a.tile128 || a.row.scale_blocked.present);
  if (a.src.kind == 0) {
    launch(p, a.x, a.offs, a.stream);
    return;
  }
  // A computed input: x below is its logical (1, R, C) view over the tensor the kernel reads.
  const FusedSource& s = a.src;
  const int64_t R = a.x.shape[1];
  if (a.x.shape[2] % 8 != 0 && s.kind != MXMOE_SOURCE_GATHER)
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize_fused_source: CUDA SwiGLU sources need C % 8 == 0, got C = ", C);
  if (s.kind == MXMOE_SOURCE_SWIGLU_BACKWARD && s.layout == 0 && C % 16 != 0)
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize_fused_source: CUDA concatenated SWIGLU_BACKWARD needs C % 16 == 0, got ", C);
  if (s.kind != MXMOE_SOURCE_GATHER && (!aligned(s.a.data, 16) || (s.b.data && !aligned(s.b.data, 16))))
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize_fused_source: CUDA SwiGLU sources need 16-byte aligned src.a, src.b");
  p.src.kind = s.kind;
  p.src.dy = static_cast<const uint16_t*>(s.b.data);
  p.src.perm = s.perm.present ? static_cast<const int32_t*>(s.perm.t.data) : nullptr;
  p.src.row_scale = s.row_scale.present ? static_cast<const float*>(s.row_scale.t.data) : nullptr;
  p.src.k = s.k;
  // Entries perm indexes: GATHER's rows of a times k; SWIGLU_BACKWARD's row_scale (T, k).
  p.src.perm_n = s.kind == MXMOE_SOURCE_GATHER ? s.a.shape[0] * s.k
                 : s.row_scale.present        ? s.row_scale.t.shape[0] * s.k
                                              : 1;
  p.src.act = SwigluParams{s.layout, s.alpha, s.limit, s.up_offset};
  mxmoe_tensor x = a.x;
  x.data = s.a.data;  // launch() reads the pointer, dtype and (logical) shape
  launch(p, x, a.offs, a.stream);
  (void)R;
}

}  // namespace cuda
}  // namespace mxmoe
