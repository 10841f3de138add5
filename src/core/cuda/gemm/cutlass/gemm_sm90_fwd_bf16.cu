// tile128 grouped GEMM, forward/dgrad (groups along M), bf16 output. See gemm_sm90_tile128_impl.cuh.
#include "cuda/gemm/cutlass/gemm_sm90_tile128_impl.cuh"

MXMOE_TILE128_FWD(bf16, cutlass::bfloat16_t)
