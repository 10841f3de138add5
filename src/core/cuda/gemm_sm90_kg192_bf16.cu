// tile128 grouped GEMM, wgrad (groups along the reduction), bf16 output, CTA tile 128x192 (selected by
// MXMOE_TILE128_KG_TILE=192; see gemm_tile128.cu). See gemm_sm90_tile128_impl.cuh.
#include "cuda/gemm_sm90_tile128_impl.cuh"

MXMOE_TILE128_KG(bf16_n192, cutlass::bfloat16_t, 192)
