// CUDA MX quantization (mxmoe_quantize: 1x32, 1x128, 32x1, 128x1, 128x128, 2D with token groups or
// 3D per expert; mxmoe_quantize_fused: rowwise + columnwise sides from one read of x, MX round trip
// to bf16/f32 in both orientations, scales straight into the blocked layout): the host side that
// fills the request parameters and routes each request to the family that serves it best
// (quantize_route.hpp: measured, docs/design/quantize.md): the tile128 pass kernel (tile128_bf16.cu),
// the rowwise streaming kernel (quant_rows.cu), the warp-tile kernel (quant_warp.cu), the slab kernel
// (quant_slab.cu) or the tile kernel (quant_tile.cu), which takes every request.
#include "cuda/quantize/kernels.cuh"
#include "cuda/quantize/quantize_route.hpp"
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

// The tile128 recipe's pass of a request it takes (quantize_route.cpp, tile128_takes): rowwise 1x128
// codes and/or columnwise 128x1 transposed codes, or the 128x128 tile quantization (tma: the weights'
// TMA kernel where the device is Hopper).
void run_tile128_pass(const Params& p, bool tma, int device, cudaStream_t stream) {
  const SideP &r = p.row, &c = p.col;
  Tile128Pass a;
  if (p.tile) {
    a.q = p.row_on ? r.q : nullptr;
    a.qt = p.row_on && r.qt ? r.qt : (p.col_on ? c.qt : nullptr);
    a.scale_c = p.row_on ? r.scale : nullptr;
    a.scale_r = p.col_on ? c.scale : nullptr;
  } else {
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
  a.tma = tma;
  launch_tile128_pass(a, device, stream);
}

// Alignment of a base pointer in bytes, up to 16 (16 for none).
int alignment(const void* ptr) {
  int a = 16;
  while (ptr && a > 1 && !aligned(ptr, a)) a /= 2;
  return a;
}

RouteSide route_side(const SideP& s) {
  RouteSide r;
  r.q = s.q != nullptr;
  r.qt = s.qt != nullptr;
  r.scale = s.scale != nullptr;
  r.blocked = s.blocked != nullptr;
  r.dq = s.dq != nullptr;
  r.dqt = s.dqt != nullptr;
  r.dq_f32 = s.dq_f32;
  r.dqt_f32 = s.dqt_f32;
  r.q_align = alignment(s.q);
  r.qt_align = alignment(s.qt);
  r.dq_align = alignment(s.dq);
  return r;
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
  // The route (quantize_route.hpp): which kernel family serves the request, and its settings.
  QuantizeRequest q;
  q.B = p.B;
  q.R = p.R;
  q.C = p.C;
  q.bf16 = bf16;
  q.x_align8 = aligned(x.data, 8);
  q.x_vec = p.x_vec;
  q.src_kind = p.src.kind;
  q.row_on = p.row_on;
  q.col_on = p.col_on;
  q.row_block = p.row_block;
  q.col_block = p.col_block;
  q.tile = p.tile;
  q.grouped = p.grouped;
  q.groups = p.G;
  q.table = p.table;
  q.row = route_side(p.row);
  q.col = route_side(p.col);
  const QuantizeRoute route = select_quantize_route(q);
  note_route(q, route);
  p.order = route.order;
  DeviceGuard guard(x.device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (route.kernel) {
    case QuantKernel::kRows: {
      const SideP& r = p.row;
      RowParams rp{x.data, r.q, r.scale, r.dq, r.dq_f32, static_cast<long long>(p.B) * p.R * (p.C / 8), p.mode};
      launch_rows(rp, bf16, p.row_block, route.rows_pipelined, x.device, s);
      return;
    }
    case QuantKernel::kTile128:
      run_tile128_pass(p, route.tma, x.device, s);
      return;
    case QuantKernel::kWarp:
      launch_warp(p, route.warp_pipe ? 0 : route.warp_budget, x.device, s);
      return;
    case QuantKernel::kSlab:
      launch_slab(p, bf16, x.device, s);
      return;
    case QuantKernel::kTile:
      if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
      p.stages = route.stages;
      launch_tile(p, bf16, x.device, s);
      return;
  }
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
