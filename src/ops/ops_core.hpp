// The op bodies (ops_core.cpp: one per core entry point; ops_fused.cpp: fused quantization and the
// sm90 recipe phases). library.cpp registers them under torch.ops.mxmoe.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "tensor_bridge.hpp"

namespace mxmoe {
namespace ops {

int32_t to_i32(int64_t v, const char* name, const char* op);

// Where an op runs: the tensor's device made current, and torch's current stream there.
struct Launch {
  explicit Launch(const Tensor& t);
  int32_t device;
  DeviceScope scope;
  void* stream;
};

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize(Tensor x, OptTensor offs, int64_t block_r, int64_t block_c,
                                                    int64_t mode, bool want_q, bool want_qt, bool want_scale_c,
                                                    bool want_scale_r);
Tensor dequantize(Tensor q, Tensor scale, int64_t axis, OptTensor offs, ScalarType out_dtype);
Tensor scales_to_blocked(Tensor scale, int64_t kind, OptTensor offs);
Tensor scales_from_blocked(Tensor blocked, int64_t kind, OptTensor offs, std::vector<int64_t> scale_shape);
Tensor grouped_mm_mx(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, OptTensor bias,
                     ScalarType out_dtype);
Tensor grouped_mm_mx_kgroups(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, ScalarType out_dtype);
Tensor grouped_mm_tile128(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, OptTensor bias,
                          ScalarType out_dtype);
Tensor grouped_mm_tile128_kgroups(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs,
                                  ScalarType out_dtype);
void check_offsets(Tensor offs, int64_t m);
void zero_rows_past_groups(Tensor x, Tensor offs);
Tensor clamp_offsets(Tensor offs, int64_t m);
Tensor dense_grouped_mm(Tensor a, Tensor b, Tensor offs);
std::string build_info();
// The configuration a tile128 GEMM of this shape gets on Hopper (mxmoe_sm90_gemm_config's text).
std::string sm90_gemm_config(int64_t kind, int64_t m, int64_t n, int64_t k, int64_t groups, bool out_bf16);

std::vector<Tensor> quantize_fused(Tensor x, OptTensor offs, int64_t row_block, int64_t col_block, bool tile128,
                                   int64_t mode, int64_t row_outputs, int64_t col_outputs, ScalarType dq_dtype);

// sm90 recipe phases: the weight's quantized forms (once per optimizer step, mxmoe/weight_cache.py)
// and a whole forward or backward of one grouped_mm in one op (ops_fused.cpp).
std::tuple<Tensor, Tensor, Tensor, Tensor> sm90_tile128_weight(Tensor w, int64_t mode);
std::tuple<Tensor, Tensor, Tensor> sm90_tile128_forward(Tensor a, Tensor w_q, Tensor w_scale, Tensor offs,
                                                        OptTensor bias, int64_t mode, ScalarType out_dtype,
                                                        bool want_a_col);
std::tuple<Tensor, Tensor> sm90_tile128_backward(Tensor dy, Tensor w_qt, Tensor w_scale, OptTensor a_qt,
                                                 OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                                 bool need_dw, ScalarType a_dtype, ScalarType w_dtype);
std::tuple<Tensor, Tensor, Tensor> sm90_exact_weight(Tensor w, int64_t mode);
// A weight pass recorded on the capturing stream under a conditional node on the device int32 `flag`
// (mxmoe_quantize_fused_if): form 0 sm90_tile128_weight's forms, 1 sm90_exact_weight's.
std::vector<Tensor> weight_forms_if(Tensor flag, Tensor w, int64_t form, int64_t mode);
int64_t capture_id(int64_t device);
std::tuple<Tensor, Tensor, Tensor> sm90_exact_forward(Tensor a, Tensor w_dq, Tensor offs, int64_t mode,
                                                      bool want_a_col);
std::tuple<Tensor, Tensor> sm90_exact_backward(Tensor dy, Tensor w_q, Tensor w_scale, OptTensor a_q,
                                               OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                               bool need_dw);

// A computed input of the fused MoE layer (mxmoe_quantize_fused_source): src_kind GATHER (rows of
// src_a in perm's order, optionally times row_scale), SWIGLU (of h = src_a) or SWIGLU_BACKWARD (dh
// from h = src_a and dy = src_b). The moe_* phases are the sm90 ones with A (or dY) computed.
#define MXMOE_SOURCE_ARGS                                                                                 \
  int64_t src_kind, Tensor src_a, OptTensor src_b, OptTensor perm, OptTensor row_scale, int64_t k, int64_t layout, \
      double alpha, double limit, double up_offset
std::vector<Tensor> quantize_fused_source(MXMOE_SOURCE_ARGS, OptTensor offs, int64_t row_block, int64_t col_block,
                                          bool tile128, int64_t mode, int64_t row_outputs, int64_t col_outputs,
                                          ScalarType dq_dtype);
std::tuple<Tensor, Tensor, Tensor> moe_tile128_forward(MXMOE_SOURCE_ARGS, Tensor w_q, Tensor w_scale, Tensor offs,
                                                       OptTensor bias, int64_t mode, ScalarType out_dtype,
                                                       bool want_a_col);
std::tuple<Tensor, Tensor> moe_tile128_backward(MXMOE_SOURCE_ARGS, Tensor w_qt, Tensor w_scale, OptTensor a_qt,
                                                OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                                bool need_dw, ScalarType a_dtype, ScalarType w_dtype);
// The tile128 layer's down-projection dgrad with dSwiGLU in its epilogue: dout (T, H) quantized once per
// token, the gather GEMM with the dSwiGLU epilogue (mxmoe_grouped_mm_tile128_gather_dswiglu) reading h
// (M, 2I). Returns dH's rowwise form (dh_q, dh_scale: the up projection's dgrad operand, with
// grouped_mm_tile128), its columnwise form (dh_qt, dh_scale_t: moe_tile128_up_wgrad's) and tw_part
// (M, I / 128), the routing weights' gradient's per-tile partials.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> moe_tile128_dswiglu_dgrad(Tensor dout, Tensor perm, int64_t k,
                                                                             Tensor row_scale, Tensor w2_qt,
                                                                             Tensor w2_scale, Tensor h, double alpha,
                                                                             double limit, double up_offset, Tensor offs,
                                                                             int64_t mode);
// dW13 = dH^T . dispatch(x) on dH's columnwise form: x (T, H) is the layer's input, its routed rows'
// 128x1 wgrad operand built here; offs the layer's aligned routing (the wgrad reads groups in place).
Tensor moe_tile128_up_wgrad(Tensor dh_qt, Tensor dh_scale_t, Tensor x, Tensor perm, int64_t k, Tensor offs,
                            int64_t mode, ScalarType w_dtype);
// Whether that op's kernel takes a call with I, K = H, groups, T tokens, fanout on `device` (-1: the
// host, always); the routed row count is not asked (it only needs to be below 2^31).
bool moe_tile128_dswiglu_available(int64_t i, int64_t k, int64_t groups, int64_t t, int64_t fanout, int64_t device);
// The tile128 layer's forward with concatenated halves: x per token, the gather GEMM with the SwiGLU
// epilogue (mxmoe_grouped_mm_tile128_gather_swiglu: h and act(h)'s FP8 forms), then o = act(h) . w2 (+ b2)
// on the rowwise form. Returns (h, o, act_qt, act_scale_t); the last two (the down projection's wgrad
// operand) are empty without want_col.
std::tuple<Tensor, Tensor, Tensor, Tensor> moe_tile128_swiglu_forward(Tensor x, Tensor perm, int64_t k, Tensor w13_q,
                                                                       Tensor w13_scale, OptTensor b13, int64_t layout,
                                                                       double alpha, double limit,
                                                                       double up_offset, Tensor w2_q, Tensor w2_scale,
                                                                       Tensor offs, OptTensor b2, int64_t mode,
                                                                       bool want_col);
std::tuple<Tensor, Tensor, Tensor> moe_exact_forward(MXMOE_SOURCE_ARGS, Tensor w_dq, Tensor offs, int64_t mode,
                                                     bool want_a_col);
std::tuple<Tensor, Tensor> moe_exact_backward(MXMOE_SOURCE_ARGS, Tensor w_q, Tensor w_scale, OptTensor a_q,
                                              OptTensor a_scale, Tensor offs, int64_t mode, bool need_da,
                                              bool need_dw);

// MoE kernel family (ops_moe.cpp): routing metadata, gather, combine (+ its weight gradient),
// per-group row sums, SwiGLU forward/backward.
std::tuple<Tensor, Tensor, Tensor> moe_routing(Tensor topk_idx, int64_t num_experts);
Tensor moe_gather(Tensor x, Tensor perm, int64_t k, OptTensor row_scale, ScalarType out_dtype);
// The bf16 layer's gather GEMM: x[perm // k] (M, K) . w[g] per group of offs, w (G, N, K) or, w_kn,
// (G, K, N) (mxmoe_grouped_mm_bf16_gather); and whether a device takes that call.
Tensor moe_gather_mm_bf16(Tensor x, Tensor perm, int64_t k, Tensor w, bool w_kn, Tensor offs);
bool moe_gather_mm_bf16_available(int64_t m, int64_t n, int64_t kdim, int64_t groups, int64_t t, int64_t fanout,
                                  bool w_kn, int64_t device);
// The bf16 layer's wgrad on routed rows: (G, M, N) = per group of offs, a_r^T b_r over its routed rows r,
// the rows of b (gather_b) or of a read as x[perm // k] (mxmoe_grouped_mm_bf16_kgather).
Tensor moe_kgather_mm_bf16(Tensor a, Tensor b, Tensor perm, int64_t k, bool gather_b, Tensor offs);
// The bf16 layer's up projection with SwiGLU in its epilogue: (h (M, 2I), act (M, I)) bf16 from x's rows
// x[perm // k] . w13[g]^T (mxmoe_grouped_mm_bf16_gather_swiglu).
std::tuple<Tensor, Tensor> moe_swiglu_mm_bf16(Tensor x, Tensor perm, int64_t k, Tensor w13, OptTensor bias,
                                              int64_t layout, double alpha, double limit, double up_offset,
                                              Tensor offs);
// The bf16 layer's down-projection dgrad with dSwiGLU in its epilogue: (dH (M, 2I) bf16, tw_part (M, ceil(I/128))
// f32, act(h) (M, I) bf16 where want_act, else (0, I)) from dout's rows x[perm // k] . w2[g] (w2 (G, H, I) as it
// lies) and h (mxmoe_grouped_mm_bf16_gather_dswiglu).
std::tuple<Tensor, Tensor, Tensor> moe_dswiglu_mm_bf16(Tensor dout, Tensor perm, int64_t k, Tensor w2, Tensor h,
                                                       OptTensor row_scale, int64_t layout, double alpha, double limit,
                                                       double up_offset, Tensor offs, bool want_act);
Tensor moe_combine(Tensor y, Tensor inv, OptTensor weights, ScalarType out_dtype);
Tensor moe_combine_weight_grad(Tensor dout, Tensor y, Tensor inv);
Tensor moe_swiglu_weight_grad(Tensor dy, Tensor h, Tensor inv, int64_t layout, double alpha, double limit,
                              double up_offset);
Tensor moe_group_sum(Tensor x, Tensor offs);
Tensor swiglu(Tensor h, int64_t layout, double alpha, double limit, double up_offset);
Tensor swiglu_backward(Tensor dy, Tensor h, int64_t layout, double alpha, double limit, double up_offset);

// Shared pieces.
void require_dims(const Tensor& t, const char* name, int64_t lo, int64_t hi, const char* op);
Tensor dequantize_into(const Tensor& q, const Tensor& scale, int32_t axis, const OptTensor& offs, ScalarType out_dtype,
                       const Launch& L, const char* op);
void zero_rows_into(const Tensor& x, const Tensor& offs, const Launch& L, const char* op);
void tile128_mm_into(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                     const Tensor& offs, const OptTensor& bias, Tensor& out, const Launch& L, const char* op);
// The tile128 forward / dgrad GEMM on routed rows: out row r reads row perm[r] / k of the per-token
// operand a (mxmoe_grouped_mm_tile128_gather); row_scale (T, k) f32 scales the rows after the GEMM.
void tile128_gather_mm_into(const Tensor& a, const Tensor& a_scale, const Tensor& perm, int64_t k,
                            const OptTensor& row_scale, const Tensor& b, const Tensor& b_scale, const Tensor& offs,
                            const OptTensor& bias, Tensor& out, const Launch& L, const char* op);
// in_place: the MoE layer's phases, whose token groups start at multiples of 16 (align_routing): no
// staging copies in the workspace (mxmoe_grouped_mm_tile128_kgroups_in_place).
void tile128_mm_kgroups_into(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                             const Tensor& offs, Tensor& out, const Launch& L, const char* op, bool in_place = false);
Tensor clamp_offsets_into(const Tensor& offs, int64_t m, const Launch& L, const char* op);
Tensor aten_grouped_mm(const Tensor& a, const Tensor& b, const Tensor& offs);

}  // namespace ops
}  // namespace mxmoe
