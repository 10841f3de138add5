// tile128 grouped GEMM, forward/dgrad (groups along M), bf16 output, CUTLASS's ping-pong schedule
// (A/B against the cooperative one: MXMOE_GEMM_PINGPONG=1). See gemm_sm90_tile128_impl.cuh.
#include "cuda/gemm_sm90_tile128_impl.cuh"

MXMOE_TILE128_FWD_CFG(bf16_pp, cutlass::bfloat16_t, true)
