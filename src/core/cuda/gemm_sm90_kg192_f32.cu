// tile128 grouped GEMM, wgrad (groups along the reduction), f32 output, CTA tile 128x192 (selected by
// MXMOE_TILE128_KG_TILE=192; see gemm_tile128.cu). See gemm_sm90_tile128_impl.cuh.
#include "cuda/gemm_sm90_tile128_impl.cuh"

MXMOE_TILE128_KG(f32_n192, float, 192)
