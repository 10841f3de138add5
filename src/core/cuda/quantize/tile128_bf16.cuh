// The tile128 recipe's quantize passes on bf16 input, one read of x each (tile128_bf16.cu):
//   activations: rowwise 1x128 (codes + compact scales, x's orientation) and columnwise 128x1 per
//                token group (transposed codes + compact scales), from x or a computed input;
//   weights:     one 128x128 quantization (tile = true) serving both orientations (codes, their
//                transpose, both scale layouts).
// quantize.cu routes the requests it can take here; everything else stays on the general kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/source.cuh"

namespace mxmoe {
namespace cuda {

struct Tile128Pass {
  // x: logical (B, R, C) bf16, 16-byte aligned, C % 8 == 0 (for a computed input: the tensor read).
  const void* x = nullptr;
  int B = 1, R = 0, C = 0;
  // Token groups along R (2D only; nullptr: none), G <= 512.
  const int32_t* offs = nullptr;
  long long offs_stride = 1;
  int G = 0;
  int mode = 0;       // mxmoe_scale_mode
  bool tile = false;  // one 128x128 quantization for both sides
  // Outputs (nullptr: not wanted). Row side: q (B, R, C) codes, scale_c (B*R, C/32) compact scales;
  // column side: qt (B, C, R) transposed codes, scale_r (B*C, n_r) compact scales along R.
  uint8_t* q = nullptr;
  uint8_t* scale_c = nullptr;
  uint8_t* qt = nullptr;
  uint8_t* scale_r = nullptr;
  long long n_r = 0;
  bool row_codes = false;  // rowwise 1x128 quantization wanted (not tile): q / scale_c
  bool col_codes = false;  // columnwise 128x1 wanted (not tile): qt / scale_r
  // A computed input (src.kind 0: x itself), as quant::Params (quantize/kernels.cuh).
  qk::SourceP src{};
  bool tma = false;  // the route chose the weights' TMA kernel (quantize_route.cpp, weights_tma_takes)
};

// The weights' request the route gave the TMA kernel (a.tma: quantize_route.cpp, weights_tma_takes) on
// Hopper (sm90_bf16_quantize_128x128.cu): false, launching nothing, on another architecture or past
// its tile count.
bool launch_tile128_weights_sm90(const Tile128Pass& a, int device, cudaStream_t stream);

// Runs the pass on `stream` (device = x's device, already current). The caller has checked that the
// request is one this kernel takes (see quantize.cu's launch()).
void launch_tile128_pass(const Tile128Pass& a, int device, cudaStream_t stream);

}  // namespace cuda
}  // namespace mxmoe
