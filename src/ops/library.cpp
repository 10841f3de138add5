// torch.ops.mxmoe: the schemas and their CPU and CUDA kernels (the same bodies: the core dispatches
// on the tensors' device). Fakes for torch.compile live in mxmoe/ops.py; autograd in mxmoe/grouped.py.
#include "ops_core.hpp"

using namespace mxmoe::ops;

STABLE_TORCH_LIBRARY(mxmoe, m) {
  m.def("quantize(Tensor x, Tensor? offs, int block_r, int block_c, int mode, bool want_q, bool want_qt, "
        "bool want_scale_c, bool want_scale_r) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("dequantize(Tensor q, Tensor scale, int axis, Tensor? offs, ScalarType out_dtype) -> Tensor");
  m.def("scales_to_blocked(Tensor scale, int kind, Tensor? offs) -> Tensor");
  m.def("scales_from_blocked(Tensor blocked, int kind, Tensor? offs, SymInt[] scale_shape) -> Tensor");
  m.def("grouped_mm_mx(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, Tensor? bias, "
        "ScalarType out_dtype) -> Tensor");
  m.def("grouped_mm_mx_kgroups(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, "
        "ScalarType out_dtype) -> Tensor");
  m.def("grouped_mm_tile128(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, Tensor? bias, "
        "ScalarType out_dtype) -> Tensor");
  m.def("grouped_mm_tile128_kgroups(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, "
        "ScalarType out_dtype) -> Tensor");
  m.def("check_offsets(Tensor offs, SymInt m) -> ()");
  m.def("zero_rows_past_groups(Tensor(a!) x, Tensor offs) -> ()");
  m.def("clamp_offsets(Tensor offs, SymInt m) -> Tensor");
  m.def("_dense_grouped_mm(Tensor a, Tensor b, Tensor offs) -> Tensor");
  m.def("quantize_fused(Tensor x, Tensor? offs, int row_block, int col_block, bool tile128, int mode, "
        "int row_outputs, int col_outputs, ScalarType dq_dtype) -> Tensor[]");
  m.def("sm90_tile128_weight(Tensor w, int mode) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("sm90_tile128_forward(Tensor a, Tensor w_q, Tensor w_scale, Tensor offs, Tensor? bias, int mode, "
        "ScalarType out_dtype, bool want_a_col) -> (Tensor, Tensor, Tensor)");
  m.def("sm90_tile128_backward(Tensor dy, Tensor w_qt, Tensor w_scale, Tensor? a_qt, Tensor? a_scale, "
        "Tensor offs, int mode, bool need_da, bool need_dw, ScalarType a_dtype, ScalarType w_dtype) -> (Tensor, Tensor)");
  m.def("sm90_exact_weight(Tensor w, int mode) -> (Tensor, Tensor, Tensor)");
  // The weight cache under CUDA graphs (mxmoe/weight_cache.py): the capture being recorded on the
  // device's current stream (0: none), and a weight pass recorded under a conditional node on flag.
  m.def("capture_id(int device) -> int");
  m.def("weight_forms_if(Tensor(a!) flag, Tensor w, int form, int mode) -> Tensor[]");
  m.def("sm90_exact_forward(Tensor a, Tensor w_dq, Tensor offs, int mode, bool want_a_col) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("sm90_exact_backward(Tensor dy, Tensor w_q, Tensor w_scale, Tensor? a_q, Tensor? a_scale, Tensor offs, "
        "int mode, bool need_da, bool need_dw) -> (Tensor, Tensor)");
  // The fused MoE layer's computed inputs (src_kind: 1 GATHER, 2 SWIGLU, 3 SWIGLU_BACKWARD).
#define SRC "int src_kind, Tensor src_a, Tensor? src_b, Tensor? perm, Tensor? row_scale, int k, int layout, " \
            "float alpha, float limit, float up_offset, "
  m.def("quantize_fused_source(" SRC "Tensor? offs, int row_block, int col_block, bool tile128, int mode, "
        "int row_outputs, int col_outputs, ScalarType dq_dtype) -> Tensor[]");
  m.def("moe_tile128_forward(" SRC "Tensor w_q, Tensor w_scale, Tensor offs, Tensor? bias, int mode, "
        "ScalarType out_dtype, bool want_a_col) -> (Tensor, Tensor, Tensor)");
  m.def("moe_tile128_backward(" SRC "Tensor w_qt, Tensor w_scale, Tensor? a_qt, Tensor? a_scale, Tensor offs, "
        "int mode, bool need_da, bool need_dw, ScalarType a_dtype, ScalarType w_dtype) -> (Tensor, Tensor)");
  m.def("moe_tile128_dswiglu_dgrad(Tensor dout, Tensor perm, int k, Tensor row_scale, Tensor w2_qt, "
        "Tensor w2_scale, Tensor h, float alpha, float limit, float up_offset, Tensor offs, int mode) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("moe_tile128_up_wgrad(Tensor dh_qt, Tensor dh_scale_t, Tensor x, Tensor perm, int k, Tensor offs, int mode, "
        "ScalarType w_dtype) -> Tensor");
  m.def("moe_tile128_dswiglu_available(int i, int k, int groups, int t, int fanout, int device) -> bool");
  m.def("moe_tile128_swiglu_forward(Tensor x, Tensor perm, int k, Tensor w13_q, Tensor w13_scale, Tensor? b13, "
        "int layout, float alpha, "
        "float limit, float up_offset, Tensor w2_q, Tensor w2_scale, Tensor offs, Tensor? b2, int mode, "
        "bool want_col) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("moe_exact_forward(" SRC "Tensor w_dq, Tensor offs, int mode, bool want_a_col) -> (Tensor, Tensor, Tensor)");
  m.def("moe_exact_backward(" SRC "Tensor w_q, Tensor w_scale, Tensor? a_q, Tensor? a_scale, Tensor offs, "
        "int mode, bool need_da, bool need_dw) -> (Tensor, Tensor)");
#undef SRC
  // MoE kernel family (ops_moe.cpp; layouts and numerics in include/mxmoe/mxmoe.h).
  m.def("moe_routing(Tensor topk_idx, int num_experts) -> (Tensor offs, Tensor perm, Tensor inv)");
  m.def("moe_gather(Tensor x, Tensor perm, int k, Tensor? row_scale, ScalarType out_dtype) -> Tensor");
  m.def("moe_gather_mm_bf16(Tensor x, Tensor perm, int k, Tensor w, bool w_kn, Tensor offs) -> Tensor");
  m.def("moe_gather_mm_bf16_available(int m, int n, int kdim, int groups, int t, int fanout, bool w_kn, "
        "int device) -> bool");
  m.def("moe_kgather_mm_bf16(Tensor a, Tensor b, Tensor perm, int k, bool gather_b, Tensor offs) -> Tensor");
  m.def("moe_swiglu_mm_bf16(Tensor x, Tensor perm, int k, Tensor w13, Tensor? bias, int layout, float alpha, "
        "float limit, float up_offset, Tensor offs) -> (Tensor, Tensor)");
  m.def("moe_dswiglu_mm_bf16(Tensor dout, Tensor perm, int k, Tensor w2, Tensor h, Tensor? row_scale, int layout, "
        "float alpha, float limit, float up_offset, Tensor offs, bool want_act=False) -> (Tensor, Tensor, Tensor)");
  m.def("moe_combine(Tensor y, Tensor inv, Tensor? weights, ScalarType out_dtype) -> Tensor");
  m.def("moe_combine_weight_grad(Tensor dout, Tensor y, Tensor inv) -> Tensor");
  m.def("moe_swiglu_weight_grad(Tensor dy, Tensor h, Tensor inv, int layout, float alpha, float limit, "
        "float up_offset) -> Tensor");
  m.def("moe_group_sum(Tensor x, Tensor offs) -> Tensor");
  m.def("swiglu(Tensor h, int layout, float alpha, float limit, float up_offset) -> Tensor");
  m.def("swiglu_backward(Tensor dy, Tensor h, int layout, float alpha, float limit, float up_offset) -> Tensor");
  m.def("build_info() -> str");
  m.def("sm90_gemm_config(int kind, int m, int n, int k, int groups, bool out_bf16) -> str");
}

#define MXMOE_KERNELS(m)                                                      \
  m.impl("quantize", TORCH_BOX(&quantize));                                   \
  m.impl("dequantize", TORCH_BOX(&dequantize));                               \
  m.impl("scales_to_blocked", TORCH_BOX(&scales_to_blocked));                 \
  m.impl("scales_from_blocked", TORCH_BOX(&scales_from_blocked));             \
  m.impl("grouped_mm_mx", TORCH_BOX(&grouped_mm_mx));                         \
  m.impl("grouped_mm_mx_kgroups", TORCH_BOX(&grouped_mm_mx_kgroups));         \
  m.impl("grouped_mm_tile128", TORCH_BOX(&grouped_mm_tile128));               \
  m.impl("grouped_mm_tile128_kgroups", TORCH_BOX(&grouped_mm_tile128_kgroups)); \
  m.impl("check_offsets", TORCH_BOX(&check_offsets));                         \
  m.impl("zero_rows_past_groups", TORCH_BOX(&zero_rows_past_groups));         \
  m.impl("clamp_offsets", TORCH_BOX(&clamp_offsets));                         \
  m.impl("_dense_grouped_mm", TORCH_BOX(&dense_grouped_mm));                  \
  m.impl("quantize_fused", TORCH_BOX(&quantize_fused));                       \
  m.impl("sm90_tile128_weight", TORCH_BOX(&sm90_tile128_weight));             \
  m.impl("sm90_tile128_forward", TORCH_BOX(&sm90_tile128_forward));           \
  m.impl("sm90_tile128_backward", TORCH_BOX(&sm90_tile128_backward));         \
  m.impl("sm90_exact_weight", TORCH_BOX(&sm90_exact_weight));                 \
  m.impl("weight_forms_if", TORCH_BOX(&weight_forms_if));                     \
  m.impl("sm90_exact_forward", TORCH_BOX(&sm90_exact_forward));               \
  m.impl("sm90_exact_backward", TORCH_BOX(&sm90_exact_backward));             \
  m.impl("quantize_fused_source", TORCH_BOX(&quantize_fused_source));         \
  m.impl("moe_tile128_forward", TORCH_BOX(&moe_tile128_forward));             \
  m.impl("moe_tile128_backward", TORCH_BOX(&moe_tile128_backward));           \
  m.impl("moe_tile128_dswiglu_dgrad", TORCH_BOX(&moe_tile128_dswiglu_dgrad)); \
  m.impl("moe_tile128_up_wgrad", TORCH_BOX(&moe_tile128_up_wgrad));           \
  m.impl("moe_tile128_swiglu_forward", TORCH_BOX(&moe_tile128_swiglu_forward));     \
  m.impl("moe_exact_forward", TORCH_BOX(&moe_exact_forward));                 \
  m.impl("moe_exact_backward", TORCH_BOX(&moe_exact_backward))

#define MXMOE_MOE_KERNELS(m)                                               \
  m.impl("moe_routing", TORCH_BOX(&moe_routing));                          \
  m.impl("moe_gather", TORCH_BOX(&moe_gather));                            \
  m.impl("moe_gather_mm_bf16", TORCH_BOX(&moe_gather_mm_bf16));            \
  m.impl("moe_kgather_mm_bf16", TORCH_BOX(&moe_kgather_mm_bf16));          \
  m.impl("moe_dswiglu_mm_bf16", TORCH_BOX(&moe_dswiglu_mm_bf16));          \
  m.impl("moe_swiglu_mm_bf16", TORCH_BOX(&moe_swiglu_mm_bf16));            \
  m.impl("moe_combine", TORCH_BOX(&moe_combine));                          \
  m.impl("moe_combine_weight_grad", TORCH_BOX(&moe_combine_weight_grad));  \
  m.impl("moe_swiglu_weight_grad", TORCH_BOX(&moe_swiglu_weight_grad));    \
  m.impl("moe_group_sum", TORCH_BOX(&moe_group_sum));                      \
  m.impl("swiglu", TORCH_BOX(&swiglu));                                    \
  m.impl("swiglu_backward", TORCH_BOX(&swiglu_backward))

STABLE_TORCH_LIBRARY_IMPL(mxmoe, CPU, m) {
  MXMOE_KERNELS(m);
  MXMOE_MOE_KERNELS(m);
}
STABLE_TORCH_LIBRARY_IMPL(mxmoe, CUDA, m) {
  MXMOE_KERNELS(m);
  MXMOE_MOE_KERNELS(m);
}
// build_info and sm90_gemm_config read no tensor: a CompositeExplicitAutograd kernel serves every device.
STABLE_TORCH_LIBRARY_IMPL(mxmoe, CompositeExplicitAutograd, m) {
  m.impl("build_info", TORCH_BOX(&build_info));
  m.impl("sm90_gemm_config", TORCH_BOX(&sm90_gemm_config));
  m.impl("moe_tile128_dswiglu_available", TORCH_BOX(&moe_tile128_dswiglu_available));
  m.impl("moe_gather_mm_bf16_available", TORCH_BOX(&moe_gather_mm_bf16_available));
  m.impl("capture_id", TORCH_BOX(&capture_id));
}
