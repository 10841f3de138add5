// Fused quantization (one read of x: rowwise and/or columnwise MX operands, blocked scales, the MX
// round trip) and the sm90 recipe phases built on it: each phase is the whole forward or backward of
// one grouped_mm in one op, so a training step crosses the dispatcher twice per grouped GEMM instead
// of once per kernel, and only the outputs a phase needs are allocated.
#include <torch/csrc/stable/ops.h>

#include <array>
#include <string>

#include "ops_core.hpp"

namespace mxmoe {
namespace ops {
namespace {

// Output bits of one side (the FUSED_* constants of mxmoe/ops.py).
enum : int64_t { kQ = 1, kQT = 2, kScale = 4, kBlocked = 8, kDQ = 16, kDQT = 32 };
constexpr const char* kNames[6] = {"q", "qt", "scale", "scale_blocked", "dq", "dqt"};

// The outputs of one side of mxmoe_quantize_fused: shapes as the C API checks them (the fakes in
// mxmoe/ops.py use the same rules), allocated only where wanted; an output not asked for becomes an
// empty (0,) tensor only when an op returns it (allocations are most of an op's host time).
struct Side {
  std::array<Tensor, 6> t;
  std::array<ScalarType, 6> dtype{};
  int32_t device = -1;
  std::array<mxmoe_tensor, 6> v{};
  mxmoe_fused_side side{};
  int64_t bits = 0;

  Side(const Tensor& x, const OptTensor& offs, bool is_row, int64_t bits_, ScalarType dq_dtype, int32_t device,
       const char* op)
      : device(device), bits(bits_) {
    const bool three = x.dim() == 3;
    const int64_t lead = three ? x.size(0) : 0;
    const int64_t r = x.size(-2), c = x.size(-1);
    const int64_t g = offs ? offs->size(0) : 0;
    const int64_t n_r = offs ? cdiv(r, kBlock) + g : r / kBlock;
    const int64_t sh = is_row ? r : c, sw = is_row ? c / kBlock : n_r;
    int64_t bsize = 0;
    if (three)
      bsize = mxmoe_blocked_size(MXMOE_BLOCKED_PER_EXPERT, sh, sw, lead);
    else if (offs && is_row)
      bsize = mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, r, c / kBlock, g);
    else if (offs)
      bsize = mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_K, c, r, g);
    else
      bsize = mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, sh, sw, 0);
    auto lead_shape = [&](int64_t a, int64_t b) {
      return three ? std::vector<int64_t>{lead, a, b} : std::vector<int64_t>{a, b};
    };
    const std::vector<int64_t> shapes[6] = {lead_shape(r, c), lead_shape(c, r), lead_shape(sh, sw),
                                            {bsize},          lead_shape(r, c), lead_shape(c, r)};
    mxmoe_tensor** slots[6] = {&side.q, &side.qt, &side.scale, &side.scale_blocked, &side.dq, &side.dqt};
    for (int i = 0; i < 6; ++i) {
      dtype[i] = i >= 4 ? dq_dtype : (i < 2 ? ScalarType::Float8_e4m3fn : ScalarType::Float8_e8m0fnu);
      if (wants(i)) {
        t[i] = empty(shapes[i], dtype[i], device);
        v[i] = view(t[i], kNames[i], op);
        *slots[i] = &v[i];
      }
    }
  }
  bool wants(int i) const { return (bits & (int64_t(1) << i)) != 0; }
  const mxmoe_fused_side* get() const { return bits ? &side : nullptr; }
  // Output i: the computed tensor, or an empty (0,) placeholder when it was not asked for.
  Tensor out(int i) const { return wants(i) ? t[i] : none_output(dtype[i], device); }
  const Tensor& q() const { return t[0]; }
  const Tensor& scale() const { return t[2]; }
  const Tensor& dq() const { return t[4]; }
};

void run_fused(const char* op, const Tensor& x, const OptTensor& offs, int64_t row_block, int64_t col_block,
               bool tile128, int64_t mode, const Side& row, const Side& col, const Launch& L) {
  mxmoe_tensor xv = view(x, "x", op);
  OptView ov(offs, "offs", op);
  const mxmoe_fused_config cfg{to_i32(row_block, "row_block", op), to_i32(col_block, "col_block", op),
                               tile128 ? 1 : 0, static_cast<mxmoe_scale_mode>(to_i32(mode, "mode", op))};
  check(mxmoe_quantize_fused(&xv, ov.get(), cfg, row.get(), col.get(), L.stream), op);
}

// torch._grouped_mm's output with the rows past the (clamped) groups zeroed: torch leaves them unwritten.
Tensor zero_tail(Tensor out, const Tensor& offs_clamped, const Launch& L, const char* op) {
  if (offs_clamped.numel() > 0) zero_rows_into(out, offs_clamped, L, op);
  return out;
}

}  // namespace

std::vector<Tensor> quantize_fused(Tensor x, OptTensor offs, int64_t row_block, int64_t col_block, bool tile128,
                                   int64_t mode, int64_t row_outputs, int64_t col_outputs, ScalarType dq_dtype) {
  const char* op = "quantize_fused";
  require_dims(x, "x", 2, 3, op);
  Launch L(x);
  Side row(x, offs, true, row_outputs & 63, dq_dtype, L.device, op);
  Side col(x, offs, false, col_outputs & 63, dq_dtype, L.device, op);
  if ((row_outputs & ~int64_t(63)) || (col_outputs & ~int64_t(63)))
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         "row_outputs/col_outputs: expected bit sets of Q|QT|SCALE|SCALE_BLOCKED|DQ|DQT (0..63), got " +
             std::to_string(row_outputs) + ", " + std::to_string(col_outputs));
  run_fused(op, x, offs, row_block, col_block, tile128, mode, row, col, L);
  std::vector<Tensor> outs;
  outs.reserve(12);
  for (const Side* side : {&row, &col})
    for (int i = 0; i < 6; ++i) outs.push_back(side->out(i));
  return outs;
}

// ---- tile128 recipe on Hopper FP8 tensor cores ------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor, Tensor> sm90_tile128_weight(Tensor w, int64_t mode) {
  const char* op = "sm90_tile128_weight";
  require_dims(w, "w", 2, 3, op);
  w = dense(w);
  Launch L(w);
  // One 128x128 quantization of W: the forward (q) and the dgrad (qt) orientation.
  Side row(w, std::nullopt, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
  Side col(w, std::nullopt, false, kQT | kScale, ScalarType::BFloat16, L.device, op);
  run_fused(op, w, std::nullopt, 128, 128, true, mode, row, col, L);
  return {row.q(), row.scale(), col.t[1], col.scale()};
}

std::tuple<Tensor, Tensor, Tensor> sm90_tile128_forward(Tensor a, Tensor w_q, Tensor w_scale, Tensor offs,
                                                        OptTensor bias, int64_t mode, ScalarType out_dtype,
                                                        bool want_a_col) {
  const char* op = "sm90_tile128_forward";
  require_dims(a, "a", 2, 3, op);
  a = dense(a);
  Launch L(a);
  // One read of A: its forward operand (1x128 along K) and its wgrad operand (128x1 along M per group).
  Side a_row(a, offs, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
  Side a_col(a, offs, false, want_a_col ? (kQT | kScale) : 0, ScalarType::BFloat16, L.device, op);
  run_fused(op, a, offs, 128, 128, false, mode, a_row, a_col, L);
  Tensor out = empty({a.size(0), w_q.dim() >= 2 ? w_q.size(-2) : 0}, out_dtype, L.device);
  tile128_mm_into(a_row.q(), a_row.scale(), w_q, w_scale, offs, bias, out, L, op);
  return {out, a_col.out(1), a_col.out(2)};
}

std::tuple<Tensor, Tensor> sm90_tile128_backward(Tensor dy, Tensor w_qt, Tensor w_scale, OptTensor a_qt,
                                                 OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                                 bool need_dw, ScalarType a_dtype, ScalarType w_dtype) {
  const char* op = "sm90_tile128_backward";
  require_dims(dy, "dy", 2, 3, op);
  if (need_dw && (!a_qt || !a_scale))
    fail(op, MXMOE_ERR_INVALID_ARGUMENT, "a_qt, a_scale: required when need_dw (A's wgrad operand from the forward)");
  dy = dense(dy);
  Launch L(dy);
  // One read of dY: the dgrad operand (1x128 along N) and the wgrad operand (128x1 along M per group).
  Side dy_row(dy, offs, true, need_da ? (kQ | kScale) : 0, ScalarType::BFloat16, L.device, op);
  Side dy_col(dy, offs, false, need_dw ? (kQT | kScale) : 0, ScalarType::BFloat16, L.device, op);
  if (need_da || need_dw) run_fused(op, dy, offs, 128, 128, false, mode, dy_row, dy_col, L);
  Tensor da = need_da ? empty({dy.size(0), w_qt.dim() == 3 ? w_qt.size(1) : 0}, a_dtype, L.device)
                      : none_output(a_dtype, L.device);
  Tensor dw = need_dw ? empty({offs.size(0), dy.size(1), a_qt->dim() >= 1 ? a_qt->size(0) : 0}, w_dtype, L.device)
                      : none_output(w_dtype, L.device);
  if (need_da) tile128_mm_into(dy_row.q(), dy_row.scale(), w_qt, w_scale, offs, std::nullopt, da, L, op);
  if (need_dw) tile128_mm_kgroups_into(dy_col.t[1], dy_col.scale(), *a_qt, *a_scale, offs, dw, L, op);
  return {da, dw};
}

// ---- exact recipes on Hopper: fused MX round trip + bf16 torch._grouped_mm -------------------------

std::tuple<Tensor, Tensor, Tensor> sm90_exact_weight(Tensor w, int64_t mode) {
  const char* op = "sm90_exact_weight";
  require_dims(w, "w", 2, 3, op);
  w = dense(w);
  Launch L(w);
  // One read of W: its MX round trip along K (the forward GEMM's bf16 operand) and W along N as
  // FP8 + scales (dgrad).
  Side row(w, std::nullopt, true, kDQ, ScalarType::BFloat16, L.device, op);
  Side col(w, std::nullopt, false, kQ | kScale, ScalarType::BFloat16, L.device, op);
  run_fused(op, w, std::nullopt, 32, 32, false, mode, row, col, L);
  return {row.dq(), col.q(), col.scale()};
}

std::tuple<Tensor, Tensor, Tensor> sm90_exact_forward(Tensor a, Tensor w_dq, Tensor offs, int64_t mode,
                                                      bool want_a_col) {
  const char* op = "sm90_exact_forward";
  require_dims(a, "a", 2, 3, op);
  if (w_dq.dim() != 3 || w_dq.scalar_type() != ScalarType::BFloat16)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         "w_dq: expected the (G, N, K) bfloat16 MX round trip of W (sm90_exact_weight), got " +
             std::to_string(w_dq.dim()) + " dims of " + torch::headeronly::toString(w_dq.scalar_type()));
  a = dense(a);
  Launch L(a);
  Side a_row(a, offs, true, kDQ, ScalarType::BFloat16, L.device, op);
  Side a_col(a, offs, false, want_a_col ? (kQ | kScale) : 0, ScalarType::BFloat16, L.device, op);
  run_fused(op, a, offs, 32, 32, false, mode, a_row, a_col, L);
  const Tensor ends = clamp_offsets_into(offs, a.size(0), L, op);
  Tensor out = aten_grouped_mm(a_row.dq(), torch::stable::transpose(w_dq, -2, -1), ends);
  // Saved for backward: A along M per group (FP8 + scales, wgrad).
  return {zero_tail(out, ends, L, op), a_col.out(0), a_col.out(2)};
}

std::tuple<Tensor, Tensor> sm90_exact_backward(Tensor dy, Tensor w_q, Tensor w_scale, OptTensor a_q,
                                               OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                               bool need_dw) {
  const char* op = "sm90_exact_backward";
  require_dims(dy, "dy", 2, 3, op);
  if (need_dw && (!a_q || !a_scale))
    fail(op, MXMOE_ERR_INVALID_ARGUMENT, "a_q, a_scale: required when need_dw (A's wgrad operand from the forward)");
  dy = dense(dy);
  Launch L(dy);
  Side dy_row(dy, offs, true, need_da ? int64_t(kDQ) : 0, ScalarType::BFloat16, L.device, op);
  Side dy_col(dy, offs, false, need_dw ? int64_t(kDQ) : 0, ScalarType::BFloat16, L.device, op);
  if (need_da || need_dw) run_fused(op, dy, offs, 32, 32, false, mode, dy_row, dy_col, L);
  const Tensor ends = clamp_offsets_into(offs, dy.size(0), L, op);
  Tensor da, dw;
  if (need_da) {
    const Tensor w_n = dequantize_into(w_q, w_scale, 0, std::nullopt, ScalarType::BFloat16, L, op);  // W rounded along N, (G, N, K)
    da = zero_tail(aten_grouped_mm(dy_row.dq(), w_n, ends), ends, L, op);
  } else {
    da = none_output(ScalarType::BFloat16, L.device);
  }
  if (need_dw) {
    const Tensor a_m = dequantize_into(*a_q, *a_scale, 0, offs, ScalarType::BFloat16, L, op);  // A rounded along M per group, (M, K)
    dw = aten_grouped_mm(torch::stable::transpose(dy_col.dq(), 0, 1), a_m, ends);
  } else {
    dw = none_output(ScalarType::BFloat16, L.device);
  }
  return {da, dw};
}

}  // namespace ops
}  // namespace mxmoe
