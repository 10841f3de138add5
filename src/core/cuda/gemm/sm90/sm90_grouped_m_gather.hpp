// The sm_90a FP8 grouped GEMM on routed rows of a per-token operand (the gather variant of
// sm90_fp8_grouped_m_1x128_128x128.cuh), behind plain types like sm90_grouped_m.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/sm90/sm90_grouped_m.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {

// out (M, N) = A[rows] (M, K) . B[g] (N, K)^T (+ bias[g]) per row group, GEMM row r reading row
// gather[r] / fanout of A (a_rows, K) (a negative or out-of-range index: a zero row); with row_scale,
// out row r is scaled by row_scale[gather[r]] in fp32 before the bias. GroupedMRun's a / a_scale /
// as_s0 describe the per-token operand; m is the routed row count (gather's length).
struct GroupedMGatherRun : GroupedMRun {
  const int32_t* gather = nullptr;
  int64_t fanout = 1;
  int64_t a_rows = 0;
  int64_t lda = 0;  // A's row stride in bytes
  const float* row_scale = nullptr;
};

// Whether sm90_grouped_m_gather takes a call of this shape on `device` (an sm_90 GPU, the shape
// limits of the kernel, the group table in shared memory). Launches nothing.
bool sm90_grouped_m_gather_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows, int64_t lda,
                                 int64_t fanout, bool out_bf16, int device);

// Launches on r.stream and returns true, or returns false having launched nothing where
// sm90_grouped_m_gather_takes says no (or a base is not 16-byte aligned). Throws on CUDA errors.
bool sm90_grouped_m_gather(const GroupedMGatherRun& r);

// The bf16 form of the gather GEMM (the bf16 MoE layer): GroupedMGatherRun with a and b bf16, k and lda
// counted in bytes (2 K, 2 lda), no scales, bias or row_scale; B[g] (N, K) or, b_kn, (K, N). Whether it
// takes a call (here m, n, k in elements; K % 8 == 0, or with b_kn K % 64 == 0 and N % 64 == 0), and the
// launch (false: nothing launched, where it does not take the call or a base is not 16-byte aligned).
bool sm90_grouped_m_gather_bf16_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                      int64_t fanout, bool b_kn, int device);
bool sm90_grouped_m_gather_bf16(const GroupedMGatherRun& r, bool b_kn);

// The gather GEMM of the MoE layer's down-projection dgrad with the dSwiGLU epilogue
// (sm90_fp8_grouped_m_gather_dswiglu_1x128.cuh): dY' = A[rows] . B[g]^T (M, N = I) is not stored; the
// kernel writes dH = act'(h, row_scale * bf16(dY')) (M, 2I) as the tile128 operands (rowwise dh_q /
// dh_scale, columnwise per group dh_qt / dh_scale_t with n_r runs) and tw_part (M, I / 128), the
// per-128-column partials of <bf16(dY'), act(h)>. out, bias: unused; row_scale required.
struct GroupedMGatherDSwigluRun : GroupedMGatherRun {
  const uint16_t* h = nullptr;  // (M, 2I) bf16, gate | up (concatenated)
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  int mode = 0;  // mxmoe_scale_mode
  uint8_t* dh_q = nullptr;
  uint8_t* dh_scale = nullptr;
  uint8_t* dh_qt = nullptr;
  uint8_t* dh_scale_t = nullptr;
  int64_t n_r = 0;
  float* tw_part = nullptr;
};

// Whether sm90_grouped_m_gather_dswiglu takes a call of this shape (n = I: a multiple of 128,
// concatenated gate | up halves only). Launches nothing.
bool sm90_grouped_m_gather_dswiglu_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                         int64_t lda, int64_t fanout, int layout, int device);

// Launches on r.stream and returns true (also for m == 0: the outputs' tails are written), or returns
// false having launched nothing where sm90_grouped_m_gather_dswiglu_takes says no or a base is not
// 16-byte aligned. Throws on CUDA errors.
bool sm90_grouped_m_gather_dswiglu(const GroupedMGatherDSwigluRun& r);

// The bf16 MoE layer's down-projection dgrad with the dSwiGLU epilogue (sm90_bf16_grouped_m_gather_dswiglu.cuh):
// the bf16 gather GEMM's dY' = A[rows] . B[g] (M, N = I) with B[g] (K, I) MN-major (b_kn; k and lda in
// bytes as sm90_grouped_m_gather_bf16), never stored; the kernel writes dH = act'(h, bf16(row_scale *
// bf16(dY'))) (M, 2I) bf16 (concatenated or interleaved halves; row_scale optional: 1 without) and
// tw_part (M, ceil(I / 128)), the per-128-column partials of <bf16(dY'), act(h)>, and, where act is
// given, act(h) (M, I) bf16 (the bf16 layer's dW2 operand); rows past the last group zero.
struct GroupedMGatherDSwigluBf16Run : GroupedMGatherRun {
  const uint16_t* h = nullptr;
  int layout = 0;  // kSwigluConcat or kSwigluInterleaved
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  uint16_t* dh = nullptr;
  float* tw_part = nullptr;
  uint16_t* act = nullptr;  // optional
};

// Whether it takes a call (m, n = I, k = H in elements: K and I multiples of 64). Launches nothing.
bool sm90_grouped_m_gather_dswiglu_bf16_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                              int64_t fanout, int device);
// Launches on r.stream and returns true (also for m == 0), or returns false having launched nothing.
bool sm90_grouped_m_gather_dswiglu_bf16(const GroupedMGatherDSwigluBf16Run& r);

// The bf16 MoE layer's up projection with the SwiGLU epilogue (sm90_bf16_grouped_m_gather_swiglu.cuh): the bf16
// gather GEMM's h = A[rows] . B[g]^T (+ bias[g], rounded twice as the unfused layer) (M, N = 2I) bf16 stored into
// out (gate | up halves concatenated or interleaved; k and lda in bytes as sm90_grouped_m_gather_bf16) and
// act(h) = swiglu(gate, up) (M, I) bf16 into act; rows past the last group zero in both.
struct GroupedMGatherSwigluBf16Run : GroupedMGatherRun {
  int layout = 0;  // kSwigluConcat or kSwigluInterleaved
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  uint16_t* act = nullptr;
};

// Whether it takes a call (m, n = 2I, k = H in elements; concatenated halves: 2I a multiple of 256).
// Launches nothing.
bool sm90_grouped_m_gather_swiglu_bf16_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                             int64_t fanout, int layout, int device);
// Launches on r.stream and returns true (also for m == 0), or returns false having launched nothing.
bool sm90_grouped_m_gather_swiglu_bf16(const GroupedMGatherSwigluBf16Run& r);

// The gather GEMM of the MoE layer's up projection with the SwiGLU epilogue
// (sm90_fp8_grouped_m_gather_swiglu_1x128.cuh): out = h (M, N = 2I) bf16 = A[rows] . B[g]^T (+ bias[g]),
// gate | up halves concatenated or interleaved, stored as the gather GEMM stores it, and act(h) =
// swiglu(gate, up) (M, I) as the tile128 operands: rowwise q / scale (M, I/32) and, when qt is set,
// columnwise per group qt (I, M) / scale_t (I, n_r). row_scale: unused (none); bias: interleaved halves
// only (gpt-oss's b13; with concatenated ones the launch declines it).
struct GroupedMGatherSwigluRun : GroupedMGatherRun {
  int layout = 0;  // kSwigluConcat or kSwigluInterleaved
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  int mode = 0;  // mxmoe_scale_mode
  uint8_t* q = nullptr;
  uint8_t* scale = nullptr;
  uint8_t* qt = nullptr;  // optional, with scale_t
  uint8_t* scale_t = nullptr;
  int64_t n_r = 0;
};

// Whether sm90_grouped_m_gather_swiglu takes a call of this shape (n = 2I: concatenated halves, I a
// multiple of 128; interleaved, I a multiple of 64). Launches nothing.
bool sm90_grouped_m_gather_swiglu_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                        int64_t lda, int64_t fanout, int layout, int device);

// Launches on r.stream and returns true (also for m == 0: the outputs' tails are written), or returns
// false having launched nothing where sm90_grouped_m_gather_swiglu_takes says no or a base is not
// 16-byte aligned. Throws on CUDA errors.
bool sm90_grouped_m_gather_swiglu(const GroupedMGatherSwigluRun& r);

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
