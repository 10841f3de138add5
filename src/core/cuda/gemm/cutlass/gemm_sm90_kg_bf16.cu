// tile128 grouped GEMM, wgrad (groups along the reduction), bf16 output. See gemm_sm90_tile128_impl.cuh.
#include "cuda/gemm/cutlass/gemm_sm90_tile128_impl.cuh"

MXMOE_TILE128_KG(bf16, cutlass::bfloat16_t, 128)
