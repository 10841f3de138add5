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

// What a phase quantizes: a tensor x (kind 0), or a computed input of mxmoe_quantize_fused_source
// (the fused MoE layer's dispatch, SwiGLU and their backward) whose logical (R, C) is never stored.
struct Input {
  int64_t kind = 0;
  Tensor a;  // x itself, or the source's a
  OptTensor b, perm, row_scale;
  int64_t k = 1, layout = 0;
  double alpha = 1.0, limit = 0.0, up_offset = 0.0;

  explicit Input(Tensor x) : a(dense(x)) {}
  Input(int64_t kind_, Tensor a_, OptTensor b_, OptTensor perm_, OptTensor row_scale_, int64_t k_, int64_t layout_,
        double alpha_, double limit_, double up_offset_, const char* op)
      : kind(kind_), k(k_), layout(layout_), alpha(alpha_), limit(limit_), up_offset(up_offset_) {
    if (kind < MXMOE_SOURCE_GATHER || kind > MXMOE_SOURCE_SWIGLU_BACKWARD)
      fail(op, MXMOE_ERR_INVALID_ARGUMENT,
           "src_kind: expected GATHER (1), SWIGLU (2) or SWIGLU_BACKWARD (3), got " + std::to_string(kind));
    require_dims(a_, "src_a", 2, 2, op);
    a = dense(a_);
    if (b_) b = dense(*b_);
    if (perm_) {
      require_dims(*perm_, "perm", 1, 1, op);
      perm = dense(*perm_);
    }
    if (row_scale_) row_scale = dense(*row_scale_);
    if (kind == MXMOE_SOURCE_GATHER && !perm)
      fail(op, MXMOE_ERR_INVALID_ARGUMENT, "perm: required for a GATHER source");
  }
  bool three() const { return kind == 0 && a.dim() == 3; }
  int64_t lead() const { return three() ? a.size(0) : 0; }
  int64_t rows() const {
    if (kind == MXMOE_SOURCE_GATHER) return perm->size(0);
    return kind == 0 ? a.size(-2) : a.size(0);
  }
  int64_t cols() const { return kind == MXMOE_SOURCE_SWIGLU ? a.size(1) / 2 : a.size(-1); }
};

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

  Side(const Input& x, const OptTensor& offs, bool is_row, int64_t bits_, ScalarType dq_dtype, int32_t device,
       const char* op)
      : device(device), bits(bits_) {
    const bool three = x.three();
    const int64_t lead = x.lead();
    const int64_t r = x.rows(), c = x.cols();
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

// flag: record the quantization on the capturing stream under a conditional node on this device
// int32 (mxmoe_quantize_fused_if; x itself only).
void run_fused(const char* op, const Input& x, const OptTensor& offs, int64_t row_block, int64_t col_block,
               bool tile128, int64_t mode, const Side& row, const Side& col, const Launch& L,
               const Tensor* flag = nullptr) {
  OptView ov(offs, "offs", op);
  const mxmoe_fused_config cfg{to_i32(row_block, "row_block", op), to_i32(col_block, "col_block", op),
                               tile128 ? 1 : 0, static_cast<mxmoe_scale_mode>(to_i32(mode, "mode", op))};
  if (x.kind == 0) {
    mxmoe_tensor xv = view(x.a, "x", op);
    if (flag != nullptr) {
      mxmoe_tensor fv = view(*flag, "flag", op);
      check(mxmoe_quantize_fused_if(&fv, &xv, ov.get(), cfg, row.get(), col.get(), L.stream), op);
    } else {
      check(mxmoe_quantize_fused(&xv, ov.get(), cfg, row.get(), col.get(), L.stream), op);
    }
    return;
  }
  mxmoe_tensor av = view(x.a, "src_a", op);
  OptView bv(x.b, "src_b", op), pv(x.perm, "perm", op), sv(x.row_scale, "row_scale", op);
  mxmoe_fused_source src{};
  src.kind = static_cast<mxmoe_source_kind>(x.kind);
  src.a = &av;
  src.b = bv.get();
  src.perm = pv.get();
  src.row_scale = sv.get();
  src.k = x.k;
  src.layout = to_i32(x.layout, "layout", op);
  src.alpha = static_cast<float>(x.alpha);
  src.limit = static_cast<float>(x.limit);
  src.up_offset = static_cast<float>(x.up_offset);
  check(mxmoe_quantize_fused_source(&src, ov.get(), cfg, row.get(), col.get(), L.stream), op);
}

// torch._grouped_mm's output with the rows past the (clamped) groups zeroed: torch leaves them unwritten.
Tensor zero_tail(Tensor out, const Tensor& offs_clamped, const Launch& L, const char* op) {
  if (offs_clamped.numel() > 0) zero_rows_into(out, offs_clamped, L, op);
  return out;
}

}  // namespace

namespace {

std::vector<Tensor> quantize_fused_input(const char* op, const Input& x, const OptTensor& offs, int64_t row_block,
                                         int64_t col_block, bool tile128, int64_t mode, int64_t row_outputs,
                                         int64_t col_outputs, ScalarType dq_dtype) {
  Launch L(x.a);
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

// ---- the phases, on a tensor or a computed input ------------------------------------------------------

// Whether a tile128 GEMM on the gathered rows of `a` runs as the gather GEMM (the per-token operand
// read through perm, no routed copy): a GATHER source, bf16 output, and a build / device that runs it
// (the sm_90a kernel, or the CPU reference).
bool gather_gemm(const Input& a, const Tensor& w, const Tensor& offs, ScalarType out_dtype, const Launch& L) {
  if (a.kind != MXMOE_SOURCE_GATHER || out_dtype != ScalarType::BFloat16 || w.dim() != 3) return false;
  return mxmoe_grouped_mm_tile128_gather_available(a.rows(), w.size(1), w.size(2), offs.size(0), a.a.size(0), a.k,
                                                   L.device) == 1;
}

// x (T, K) quantized once per token, 1x128 along K: the rows a gather GEMM reads through the routing.
void quantize_per_token(const char* op, const Input& x, int64_t mode, const Side& x_row, const Launch& L) {
  const Side x_none(x, std::nullopt, false, 0, ScalarType::BFloat16, L.device, op);
  run_fused(op, x, std::nullopt, 128, 128, false, mode, x_row, x_none, L);
}

// The operands of a gather GEMM over the routed rows of `a` (a GATHER source without row scale, x its
// tensor): x quantized once per token into x_row (1x128 along K: the codes each routed copy of the row
// would get), and, when a_col wants outputs, the wgrad operand of the routed rows (128x1 along them
// per group) from a columnwise-only pass over the gathered rows.
void quantize_gathered(const char* op, const Input& a, const Input& x, const Tensor& offs, int64_t mode,
                       const Side& x_row, const Side& a_col, const Launch& L) {
  quantize_per_token(op, x, mode, x_row, L);
  if (a_col.bits) {
    const Side a_none(a, offs, true, 0, ScalarType::BFloat16, L.device, op);
    run_fused(op, a, offs, 128, 128, false, mode, a_none, a_col, L);
  }
}

std::tuple<Tensor, Tensor, Tensor> tile128_forward(const char* op, const Input& a, const Tensor& w_q,
                                                   const Tensor& w_scale, const Tensor& offs, const OptTensor& bias,
                                                   int64_t mode, ScalarType out_dtype, bool want_a_col) {
  Launch L(a.a);
  if (!a.row_scale && gather_gemm(a, w_q, offs, out_dtype, L)) {
    const Input x(a.a);
    Side x_row(x, std::nullopt, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
    Side a_col(a, offs, false, want_a_col ? (kQT | kScale) : 0, ScalarType::BFloat16, L.device, op);
    quantize_gathered(op, a, x, offs, mode, x_row, a_col, L);
    Tensor out = empty({a.rows(), w_q.size(-2)}, out_dtype, L.device);
    tile128_gather_mm_into(x_row.q(), x_row.scale(), *a.perm, a.k, std::nullopt, w_q, w_scale, offs, bias, out, L,
                           op);
    return {out, a_col.out(1), a_col.out(2)};
  }
  // One read of A: its forward operand (1x128 along K) and its wgrad operand (128x1 along M per group).
  Side a_row(a, offs, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
  Side a_col(a, offs, false, want_a_col ? (kQT | kScale) : 0, ScalarType::BFloat16, L.device, op);
  run_fused(op, a, offs, 128, 128, false, mode, a_row, a_col, L);
  Tensor out = empty({a.rows(), w_q.dim() >= 2 ? w_q.size(-2) : 0}, out_dtype, L.device);
  tile128_mm_into(a_row.q(), a_row.scale(), w_q, w_scale, offs, bias, out, L, op);
  return {out, a_col.out(1), a_col.out(2)};
}

// in_place: offs is the MoE layer's aligned routing (every group at a multiple of 16 tokens): the
// wgrad's workspace holds no staging copies.
std::tuple<Tensor, Tensor> tile128_backward(const char* op, const Input& dy, const Tensor& w_qt,
                                            const Tensor& w_scale, const OptTensor& a_qt, const OptTensor& a_scale,
                                            const Tensor& offs, int64_t mode, bool need_da, bool need_dw,
                                            ScalarType a_dtype, ScalarType w_dtype, bool in_place) {
  if (need_dw && (!a_qt || !a_scale))
    fail(op, MXMOE_ERR_INVALID_ARGUMENT, "a_qt, a_scale: required when need_dw (A's wgrad operand from the forward)");
  Launch L(dy.a);
  if (need_da && !dy.row_scale && gather_gemm(dy, w_qt, offs, a_dtype, L)) {
    // dY's routed rows (the MoE layer's unweighted dO): as in the forward, per token plus the gather GEMM.
    const Input g(dy.a);
    Side g_row(g, std::nullopt, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
    Side dy_col(dy, offs, false, need_dw ? (kQT | kScale) : 0, ScalarType::BFloat16, L.device, op);
    quantize_gathered(op, dy, g, offs, mode, g_row, dy_col, L);
    Tensor da = empty({dy.rows(), w_qt.dim() == 3 ? w_qt.size(1) : 0}, a_dtype, L.device);
    tile128_gather_mm_into(g_row.q(), g_row.scale(), *dy.perm, dy.k, std::nullopt, w_qt, w_scale, offs, std::nullopt,
                           da, L, op);
    Tensor dw = need_dw ? empty({offs.size(0), dy.cols(), a_qt->dim() >= 1 ? a_qt->size(0) : 0}, w_dtype, L.device)
                        : none_output(w_dtype, L.device);
    if (need_dw) tile128_mm_kgroups_into(dy_col.t[1], dy_col.scale(), *a_qt, *a_scale, offs, dw, L, op, in_place);
    return {da, dw};
  }
  // One read of dY: the dgrad operand (1x128 along N) and the wgrad operand (128x1 along M per group).
  Side dy_row(dy, offs, true, need_da ? (kQ | kScale) : 0, ScalarType::BFloat16, L.device, op);
  Side dy_col(dy, offs, false, need_dw ? (kQT | kScale) : 0, ScalarType::BFloat16, L.device, op);
  if (need_da || need_dw) run_fused(op, dy, offs, 128, 128, false, mode, dy_row, dy_col, L);
  Tensor da = need_da ? empty({dy.rows(), w_qt.dim() == 3 ? w_qt.size(1) : 0}, a_dtype, L.device)
                      : none_output(a_dtype, L.device);
  Tensor dw = need_dw ? empty({offs.size(0), dy.cols(), a_qt->dim() >= 1 ? a_qt->size(0) : 0}, w_dtype, L.device)
                      : none_output(w_dtype, L.device);
  if (need_da) tile128_mm_into(dy_row.q(), dy_row.scale(), w_qt, w_scale, offs, std::nullopt, da, L, op);
  if (need_dw) tile128_mm_kgroups_into(dy_col.t[1], dy_col.scale(), *a_qt, *a_scale, offs, dw, L, op, in_place);
  return {da, dw};
}

// The down projection's dgrad with dSwiGLU in its epilogue (the tile128 layer's backward with the
// weights after the experts): dout quantized once per token, the gather GEMM writing dH's two FP8 forms
// and the routing weights' per-tile partials; dY' is never stored. The up projection's wgrad and dgrad
// on those forms are separate calls (moe_tile128_up_wgrad, grouped_mm_tile128), so that the caller can
// let h go first (mxmoe/backends/phases.py, fused_down_backward).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> tile128_dswiglu_dgrad(const char* op, const Tensor& dout_in,
                                                                         const Tensor& perm, int64_t k,
                                                                         const Tensor& row_scale, const Tensor& w2_qt,
                                                                         const Tensor& w2_scale, const Tensor& h,
                                                                         double alpha, double limit, double up_offset,
                                                                         const Tensor& offs, int64_t mode) {
  require_dims(h, "h", 2, 2, op);
  require_dims(w2_qt, "w2_qt", 3, 3, op);
  const Input dout(dout_in);
  Launch L(dout.a);
  const int64_t M = perm.size(0), I = w2_qt.size(1), G = offs.size(0);
  Side g_row(dout, std::nullopt, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
  quantize_per_token(op, dout, mode, g_row, L);
  Tensor dh_q = empty({M, 2 * I}, ScalarType::Float8_e4m3fn, L.device);
  Tensor dh_s = empty({M, 2 * I / kBlock}, ScalarType::Float8_e8m0fnu, L.device);
  Tensor dh_qt = empty({2 * I, M}, ScalarType::Float8_e4m3fn, L.device);
  Tensor dh_st = empty({2 * I, cdiv(M, kBlock) + G}, ScalarType::Float8_e8m0fnu, L.device);
  Tensor tw_part = empty({M, I / 128}, ScalarType::Float, L.device);
  mxmoe_tensor av = view(g_row.q(), "dout_q", op), asv = view(g_row.scale(), "dout_scale", op),
               pv = view(perm, "perm", op), rsv = view(dense(row_scale), "row_scale", op), bv = view(w2_qt, "w2_qt", op),
               bsv = view(w2_scale, "w2_scale", op), ov = view(offs, "offs", op), hv = view(dense(h), "h", op),
               qv = view(dh_q, "dh_q", op), sv = view(dh_s, "dh_scale", op), qtv = view(dh_qt, "dh_qt", op),
               stv = view(dh_st, "dh_scale_t", op), tv = view(tw_part, "tw_part", op);
  check(mxmoe_grouped_mm_tile128_gather_dswiglu(&av, &asv, &pv, k, &rsv, &bv, &bsv, &ov, &hv, MXMOE_SWIGLU_CONCAT,
                                                static_cast<float>(alpha), static_cast<float>(limit),
                                                static_cast<float>(up_offset),
                                                static_cast<mxmoe_scale_mode>(to_i32(mode, "mode", op)), &qv, &sv, &qtv,
                                                &stv, &tv, L.stream),
        op);
  return {dh_q, dh_s, dh_qt, dh_st, tw_part};
}

// The up projection with SwiGLU in its epilogue, then the down projection on the act(h) operand it wrote
// (the tile128 layer's forward): x quantized once per token, the gather GEMM storing h (+ b13) and
// act(h)'s FP8 forms (mxmoe_grouped_mm_tile128_gather_swiglu; concatenated or interleaved halves), GEMM2.
// Returns (h, o, act's columnwise codes and scales, or empty ones without want_col).
std::tuple<Tensor, Tensor, Tensor, Tensor> tile128_swiglu_forward(const char* op, const Tensor& x_in,
                                                                  const Tensor& perm, int64_t k, const Tensor& w13_q,
                                                                  const Tensor& w13_scale, const OptTensor& b13,
                                                                  int64_t layout, double alpha, double limit,
                                                                  double up_offset, const Tensor& w2_q,
                                                                  const Tensor& w2_scale, const Tensor& offs,
                                                                  const OptTensor& b2, int64_t mode, bool want_col) {
  require_dims(x_in, "x", 2, 2, op);
  require_dims(w13_q, "w13_q", 3, 3, op);
  require_dims(w2_q, "w2_q", 3, 3, op);
  const Input x(x_in);
  Launch L(x.a);
  const int64_t M = perm.size(0), I = w13_q.size(1) / 2, G = offs.size(0);
  Side x_row(x, std::nullopt, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
  quantize_per_token(op, x, mode, x_row, L);
  Tensor h = empty({M, 2 * I}, ScalarType::BFloat16, L.device);
  Tensor y_q = empty({M, I}, ScalarType::Float8_e4m3fn, L.device);
  Tensor y_s = empty({M, I / kBlock}, ScalarType::Float8_e8m0fnu, L.device);
  Tensor y_qt = want_col ? empty({I, M}, ScalarType::Float8_e4m3fn, L.device)
                         : none_output(ScalarType::Float8_e4m3fn, L.device);
  Tensor y_st = want_col ? empty({I, cdiv(M, kBlock) + G}, ScalarType::Float8_e8m0fnu, L.device)
                         : none_output(ScalarType::Float8_e8m0fnu, L.device);
  {
    mxmoe_tensor av = view(x_row.q(), "x_q", op), asv = view(x_row.scale(), "x_scale", op),
                 pv = view(perm, "perm", op), bv = view(w13_q, "w13_q", op), bsv = view(w13_scale, "w13_scale", op),
                 ov = view(offs, "offs", op), hv = view(h, "h", op), qv = view(y_q, "act_q", op),
                 sv = view(y_s, "act_scale", op), qtv{}, stv{}, b13v{};
    if (want_col) {
      qtv = view(y_qt, "act_qt", op);
      stv = view(y_st, "act_scale_t", op);
    }
    if (b13) b13v = view(*b13, "b13", op);
    check(mxmoe_grouped_mm_tile128_gather_swiglu(&av, &asv, &pv, k, &bv, &bsv, &ov, b13 ? &b13v : nullptr,
                                                 to_i32(layout, "layout", op),
                                                 static_cast<float>(alpha), static_cast<float>(limit),
                                                 static_cast<float>(up_offset),
                                                 static_cast<mxmoe_scale_mode>(to_i32(mode, "mode", op)), &hv, &qv,
                                                 &sv, want_col ? &qtv : nullptr, want_col ? &stv : nullptr, L.stream),
          op);
  }
  Tensor o = empty({M, w2_q.size(1)}, ScalarType::BFloat16, L.device);
  tile128_mm_into(y_q, y_s, w2_q, w2_scale, offs, b2, o, L, op);
  return {h, o, y_qt, y_st};
}

std::tuple<Tensor, Tensor, Tensor> exact_forward(const char* op, const Input& a, const Tensor& w_dq,
                                                 const Tensor& offs, int64_t mode, bool want_a_col) {
  if (w_dq.dim() != 3 || w_dq.scalar_type() != ScalarType::BFloat16)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         "w_dq: expected the (G, N, K) bfloat16 MX round trip of W (sm90_exact_weight), got " +
             std::to_string(w_dq.dim()) + " dims of " + torch::headeronly::toString(w_dq.scalar_type()));
  Launch L(a.a);
  Side a_row(a, offs, true, kDQ, ScalarType::BFloat16, L.device, op);
  Side a_col(a, offs, false, want_a_col ? (kQ | kScale) : 0, ScalarType::BFloat16, L.device, op);
  run_fused(op, a, offs, 32, 32, false, mode, a_row, a_col, L);
  const Tensor ends = clamp_offsets_into(offs, a.rows(), L, op);
  Tensor out = aten_grouped_mm(a_row.dq(), torch::stable::transpose(w_dq, -2, -1), ends);
  // Saved for backward: A along M per group (FP8 + scales, wgrad).
  return {zero_tail(out, ends, L, op), a_col.out(0), a_col.out(2)};
}

std::tuple<Tensor, Tensor> exact_backward(const char* op, const Input& dy, const Tensor& w_q, const Tensor& w_scale,
                                          const OptTensor& a_q, const OptTensor& a_scale, const Tensor& offs,
                                          int64_t mode, bool need_da, bool need_dw) {
  if (need_dw && (!a_q || !a_scale))
    fail(op, MXMOE_ERR_INVALID_ARGUMENT, "a_q, a_scale: required when need_dw (A's wgrad operand from the forward)");
  Launch L(dy.a);
  Side dy_row(dy, offs, true, need_da ? int64_t(kDQ) : 0, ScalarType::BFloat16, L.device, op);
  Side dy_col(dy, offs, false, need_dw ? int64_t(kDQ) : 0, ScalarType::BFloat16, L.device, op);
  if (need_da || need_dw) run_fused(op, dy, offs, 32, 32, false, mode, dy_row, dy_col, L);
  const Tensor ends = clamp_offsets_into(offs, dy.rows(), L, op);
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

}  // namespace

std::vector<Tensor> quantize_fused(Tensor x, OptTensor offs, int64_t row_block, int64_t col_block, bool tile128,
                                   int64_t mode, int64_t row_outputs, int64_t col_outputs, ScalarType dq_dtype) {
  const char* op = "quantize_fused";
  require_dims(x, "x", 2, 3, op);
  return quantize_fused_input(op, Input(x), offs, row_block, col_block, tile128, mode, row_outputs, col_outputs,
                              dq_dtype);
}

#define MXMOE_SOURCE(op) Input(src_kind, src_a, src_b, perm, row_scale, k, layout, alpha, limit, up_offset, op)

std::vector<Tensor> quantize_fused_source(MXMOE_SOURCE_ARGS, OptTensor offs, int64_t row_block, int64_t col_block,
                                          bool tile128, int64_t mode, int64_t row_outputs, int64_t col_outputs,
                                          ScalarType dq_dtype) {
  const char* op = "quantize_fused_source";
  return quantize_fused_input(op, MXMOE_SOURCE(op), offs, row_block, col_block, tile128, mode, row_outputs,
                              col_outputs, dq_dtype);
}

// ---- tile128 recipe on Hopper FP8 tensor cores ------------------------------------------------------

// The weight passes (sm90_*_weight), optionally recorded under a conditional node (weight_forms_if).
std::vector<Tensor> tile128_weight_pass(const char* op, Tensor w, int64_t mode, const Tensor* flag) {
  require_dims(w, "w", 2, 3, op);
  const Input x(w);
  Launch L(x.a);
  // One 128x128 quantization of W: the forward (q) and the dgrad (qt) orientation.
  Side row(x, std::nullopt, true, kQ | kScale, ScalarType::BFloat16, L.device, op);
  Side col(x, std::nullopt, false, kQT | kScale, ScalarType::BFloat16, L.device, op);
  run_fused(op, x, std::nullopt, 128, 128, true, mode, row, col, L, flag);
  return {row.q(), row.scale(), col.t[1], col.scale()};
}

std::vector<Tensor> exact_weight_pass(const char* op, Tensor w, int64_t mode, const Tensor* flag) {
  require_dims(w, "w", 2, 3, op);
  const Input x(w);
  Launch L(x.a);
  // One read of W: its MX round trip along K (the forward GEMM's bf16 operand) and W along N as
  // FP8 + scales (dgrad).
  Side row(x, std::nullopt, true, kDQ, ScalarType::BFloat16, L.device, op);
  Side col(x, std::nullopt, false, kQ | kScale, ScalarType::BFloat16, L.device, op);
  run_fused(op, x, std::nullopt, 32, 32, false, mode, row, col, L, flag);
  return {row.dq(), col.q(), col.scale()};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sm90_tile128_weight(Tensor w, int64_t mode) {
  auto t = tile128_weight_pass("sm90_tile128_weight", w, mode, nullptr);
  return {t[0], t[1], t[2], t[3]};
}

std::tuple<Tensor, Tensor, Tensor> sm90_tile128_forward(Tensor a, Tensor w_q, Tensor w_scale, Tensor offs,
                                                        OptTensor bias, int64_t mode, ScalarType out_dtype,
                                                        bool want_a_col) {
  const char* op = "sm90_tile128_forward";
  require_dims(a, "a", 2, 3, op);
  return tile128_forward(op, Input(a), w_q, w_scale, offs, bias, mode, out_dtype, want_a_col);
}

std::tuple<Tensor, Tensor> sm90_tile128_backward(Tensor dy, Tensor w_qt, Tensor w_scale, OptTensor a_qt,
                                                 OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                                 bool need_dw, ScalarType a_dtype, ScalarType w_dtype) {
  const char* op = "sm90_tile128_backward";
  require_dims(dy, "dy", 2, 3, op);
  return tile128_backward(op, Input(dy), w_qt, w_scale, a_qt, a_scale, offs, mode, need_da, need_dw, a_dtype,
                          w_dtype, false);
}

std::tuple<Tensor, Tensor, Tensor> moe_tile128_forward(MXMOE_SOURCE_ARGS, Tensor w_q, Tensor w_scale, Tensor offs,
                                                       OptTensor bias, int64_t mode, ScalarType out_dtype,
                                                       bool want_a_col) {
  const char* op = "moe_tile128_forward";
  return tile128_forward(op, MXMOE_SOURCE(op), w_q, w_scale, offs, bias, mode, out_dtype, want_a_col);
}

std::tuple<Tensor, Tensor> moe_tile128_backward(MXMOE_SOURCE_ARGS, Tensor w_qt, Tensor w_scale, OptTensor a_qt,
                                                OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                                bool need_dw, ScalarType a_dtype, ScalarType w_dtype) {
  const char* op = "moe_tile128_backward";
  return tile128_backward(op, MXMOE_SOURCE(op), w_qt, w_scale, a_qt, a_scale, offs, mode, need_da, need_dw, a_dtype,
                          w_dtype, true);  // the layer's aligned routing
}

// ---- exact recipes on Hopper: fused MX round trip + bf16 torch._grouped_mm -------------------------

std::tuple<Tensor, Tensor, Tensor> sm90_exact_weight(Tensor w, int64_t mode) {
  auto t = exact_weight_pass("sm90_exact_weight", w, mode, nullptr);
  return {t[0], t[1], t[2]};
}

std::vector<Tensor> weight_forms_if(Tensor flag, Tensor w, int64_t form, int64_t mode) {
  const char* op = "weight_forms_if";
  if (form == 0) return tile128_weight_pass(op, w, mode, &flag);
  if (form == 1) return exact_weight_pass(op, w, mode, &flag);
  fail(op, MXMOE_ERR_INVALID_ARGUMENT,
       "form: expected 0 (sm90_tile128_weight's forms) or 1 (sm90_exact_weight's), got " + std::to_string(form));
}

std::tuple<Tensor, Tensor, Tensor> sm90_exact_forward(Tensor a, Tensor w_dq, Tensor offs, int64_t mode,
                                                      bool want_a_col) {
  const char* op = "sm90_exact_forward";
  require_dims(a, "a", 2, 3, op);
  return exact_forward(op, Input(a), w_dq, offs, mode, want_a_col);
}

std::tuple<Tensor, Tensor> sm90_exact_backward(Tensor dy, Tensor w_q, Tensor w_scale, OptTensor a_q,
                                               OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                               bool need_dw) {
  const char* op = "sm90_exact_backward";
  require_dims(dy, "dy", 2, 3, op);
  return exact_backward(op, Input(dy), w_q, w_scale, a_q, a_scale, offs, mode, need_da, need_dw);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> moe_tile128_dswiglu_dgrad(Tensor dout, Tensor perm, int64_t k,
                                                                             Tensor row_scale, Tensor w2_qt,
                                                                             Tensor w2_scale, Tensor h, double alpha,
                                                                             double limit, double up_offset, Tensor offs,
                                                                             int64_t mode) {
  return tile128_dswiglu_dgrad("moe_tile128_dswiglu_dgrad", dout, perm, k, row_scale, w2_qt, w2_scale, h, alpha, limit,
                               up_offset, offs, mode);
}

Tensor moe_tile128_up_wgrad(Tensor dh_qt, Tensor dh_scale_t, Tensor x, Tensor perm, int64_t k, Tensor offs,
                            int64_t mode, ScalarType w_dtype) {
  const char* op = "moe_tile128_up_wgrad";
  require_dims(x, "x", 2, 2, op);
  require_dims(dh_qt, "dh_qt", 2, 2, op);
  Launch L(dh_qt);
  Tensor dw13 = empty({offs.size(0), dh_qt.size(0), x.size(1)}, w_dtype, L.device);
  // dispatch(x)'s wgrad operand (128x1 per group), as the forward's gather would have built it.
  const Input xs(MXMOE_SOURCE_GATHER, x, std::nullopt, perm, std::nullopt, k, 0, 1.0, 0.0, 0.0, op);
  const Side x_none(xs, offs, true, 0, ScalarType::BFloat16, L.device, op);
  const Side x_col(xs, offs, false, kQT | kScale, ScalarType::BFloat16, L.device, op);
  run_fused(op, xs, offs, 128, 128, false, mode, x_none, x_col, L);
  // offs: the layer's aligned routing (align_routing), read in place.
  tile128_mm_kgroups_into(dh_qt, dh_scale_t, x_col.t[1], x_col.scale(), offs, dw13, L, op, true);
  return dw13;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> moe_tile128_swiglu_forward(Tensor x, Tensor perm, int64_t k, Tensor w13_q,
                                                                       Tensor w13_scale, OptTensor b13, int64_t layout,
                                                                       double alpha, double limit, double up_offset,
                                                                       Tensor w2_q, Tensor w2_scale, Tensor offs,
                                                                       OptTensor b2, int64_t mode, bool want_col) {
  return tile128_swiglu_forward("moe_tile128_swiglu_forward", x, perm, k, w13_q, w13_scale, b13, layout, alpha, limit,
                                up_offset, w2_q, w2_scale, offs, b2, mode, want_col);
}

bool moe_tile128_dswiglu_available(int64_t i, int64_t k, int64_t groups, int64_t t, int64_t fanout, int64_t device) {
  return mxmoe_grouped_mm_tile128_gather_dswiglu_available(0, i, k, groups, t, fanout, MXMOE_SWIGLU_CONCAT,
                                                           static_cast<int32_t>(device)) == 1;
}

std::tuple<Tensor, Tensor, Tensor> moe_exact_forward(MXMOE_SOURCE_ARGS, Tensor w_dq, Tensor offs, int64_t mode,
                                                     bool want_a_col) {
  const char* op = "moe_exact_forward";
  return exact_forward(op, MXMOE_SOURCE(op), w_dq, offs, mode, want_a_col);
}

std::tuple<Tensor, Tensor> moe_exact_backward(MXMOE_SOURCE_ARGS, Tensor w_q, Tensor w_scale, OptTensor a_q,
                                              OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                              bool need_dw) {
  const char* op = "moe_exact_backward";
  return exact_backward(op, MXMOE_SOURCE(op), w_q, w_scale, a_q, a_scale, offs, mode, need_da, need_dw);
}

#undef MXMOE_SOURCE

}  // namespace ops
}  // namespace mxmoe
