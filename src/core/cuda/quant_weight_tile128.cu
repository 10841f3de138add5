// The tile128 recipe's weight quantizer: one 128x128 quantization of W (G, N, K) viewed rowwise
// (q, scale_c: the forward operand) and columnwise (qt, scale_r: the dgrad operand), no token groups,
// no round trip or blocked outputs. One CTA per tile: 16-byte loads of the whole tile into
// registers (8 rows x 8 columns per thread), one block-wide amax, the codes staged in shared memory
// for the transposed 16-byte stores. Every byte is the shared codec's (mx_format.hpp), so the result
// is the CPU core's bit for bit (gtest CudaQuantize.FusedWeightTile128). Opt-in while it is slower
// than the general tile kernel (measured 2026-12-01, docs/perf/quantize.md version 8: the transpose's
// shared-memory reads conflict 8 ways): MXMOE_QUANT_WEIGHT_TILE=1 routes those requests here.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "common/error.hpp"
#include "cuda/launch_cache.cuh"
#include "cuda/quant_common.cuh"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

using qk::cuda_check;
using qk::DeviceGuard;

constexpr int kT = 128;        // tile edge
constexpr int kThreads = 256;  // 16 column chunks of 8 x 16 row groups

struct WeightTileParams {
  const void* x = nullptr;
  long long B = 1;
  int R = 0, C = 0;
  long long n_r = 0;  // scale_r's last dim
  int mode = 0;
  uint8_t* q[2] = {nullptr, nullptr};   // row-major codes (the row and/or the column side's q)
  uint8_t* qt[2] = {nullptr, nullptr};  // transposed codes
  uint8_t* scale_c = nullptr;           // (B, R, C/32)
  uint8_t* scale_r = nullptr;           // (B, C, n_r)
  int rtiles = 0, ctiles = 0;
  bool x_vec = false, q_vec = false, qt_vec = false;
};

__device__ __forceinline__ float to_f32(uint16_t v) { return bf16_to_f32(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }

// 8 consecutive elements of a row (16 bytes of bf16, 32 of fp32), zeros past `valid`.
template <typename In>
__device__ __forceinline__ void load8(const In* src, int valid, bool vec, float* out) {
  if (vec && valid >= 8) {
    if constexpr (sizeof(In) == 2) {
      const uint4 w = *reinterpret_cast<const uint4*>(src);
      const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[2 * i] = bits_f32(u[i] << 16);
        out[2 * i + 1] = bits_f32(u[i] & 0xFFFF0000u);
      }
    } else {
      const float4 a = *reinterpret_cast<const float4*>(src);
      const float4 b = *reinterpret_cast<const float4*>(src + 4);
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
      out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = i < valid ? to_f32(src[i]) : 0.0f;
}

template <typename In>
__global__ void __launch_bounds__(kThreads) weight_tile128_kernel(WeightTileParams p) {
  __shared__ uint8_t codes[kT][kT + 16];  // +16: the column reads of the transpose spread over banks
  __shared__ uint32_t red[kThreads / 32];
  const long long t = blockIdx.x;
  const int ct = static_cast<int>(t % p.ctiles);
  const long long rest = t / p.ctiles;
  const int rt = static_cast<int>(rest % p.rtiles);
  const long long b = rest / p.rtiles;
  const int r0 = rt * kT, c0 = ct * kT;
  const int nr = min(kT, p.R - r0), nc = min(kT, p.C - c0);
  const int cc = (threadIdx.x % 16) * 8, rg = threadIdx.x / 16;  // column chunk, first row
  const In* x = static_cast<const In*>(p.x) + (b * p.R + r0) * static_cast<long long>(p.C) + c0;

  float v[8][8];
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = rg + 16 * i;
    if (r < nr) {
      load8(x + static_cast<long long>(r) * p.C + cc, nc - cc, p.x_vec, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = amax_fold(amax, v[i][j]);
  }
  // Block-wide amax (NaN-aware: amax_fold keeps a NaN once seen).
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) amax = amax_fold(amax, bits_f32(__shfl_xor_sync(0xffffffffu, amax, d)));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = amax_fold(amax, bits_f32(red[w]));
  const uint8_t s = e8m0_from_amax_bits(amax, static_cast<mxmoe_scale_mode>(p.mode));

  // Codes: row-major stores (8 bytes per row chunk) and the shared tile for the transpose.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = rg + 16 * i;
    uint8_t c8[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) c8[j] = quantize_element(v[i][j], s);
    if (r < nr) {
      // One 8-byte shared store (the row stride, 144, keeps it aligned).
      uint2 packed;
      packed.x = c8[0] | (c8[1] << 8) | (c8[2] << 16) | (static_cast<uint32_t>(c8[3]) << 24);
      packed.y = c8[4] | (c8[5] << 8) | (c8[6] << 16) | (static_cast<uint32_t>(c8[7]) << 24);
      *reinterpret_cast<uint2*>(&codes[r][cc]) = packed;
      const long long off = (b * p.R + r0 + r) * static_cast<long long>(p.C) + c0 + cc;
      for (int k = 0; k < 2; ++k) {
        uint8_t* q = p.q[k];
        if (q == nullptr) continue;
        if (p.q_vec && nc - cc >= 8) {
          uint2 w;
          w.x = c8[0] | (c8[1] << 8) | (c8[2] << 16) | (static_cast<uint32_t>(c8[3]) << 24);
          w.y = c8[4] | (c8[5] << 8) | (c8[6] << 16) | (static_cast<uint32_t>(c8[7]) << 24);
          *reinterpret_cast<uint2*>(q + off) = w;
        } else {
          for (int j = 0; j < 8 && cc + j < nc; ++j) q[off + j] = c8[j];
        }
      }
    }
  }
  // Scale bytes: 4 per row of the tile (one per 32 columns), 4 per column (one per 32-row run).
  if (p.scale_c != nullptr && threadIdx.x < nr) {
    uint8_t* dst = p.scale_c + (b * p.R + r0 + threadIdx.x) * static_cast<long long>(p.C / 32) + c0 / 32;
    for (int j = 0; j < (nc + 31) / 32; ++j) dst[j] = s;
  }
  if (p.scale_r != nullptr && threadIdx.x >= kT && threadIdx.x - kT < nc) {
    uint8_t* dst = p.scale_r + (b * p.C + c0 + (threadIdx.x - kT)) * p.n_r;
    for (int j = 0; j < (nr + 31) / 32 && r0 / 32 + j < p.n_r; ++j) dst[r0 / 32 + j] = s;
  }
  if (p.qt[0] == nullptr && p.qt[1] == nullptr) return;
  __syncthreads();
  // Transposed codes: qt row c (length R) gets the tile's column c, 16 rows per store. A warp's lanes
  // take 32 consecutive columns at the same rows, so their shared reads are 32 consecutive bytes
  // (no bank conflict; v1 gave a warp 8 row groups 16 rows apart: one bank, 8-way conflicts).
#pragma unroll
  for (int k = 0; k < (kT * kT / 16) / kThreads; ++k) {
    const int idx = threadIdx.x + k * kThreads;
    const int c = idx % kT, rc = (idx / kT) * 16;
    if (c >= nc || rc >= nr) continue;
    uint8_t col[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) col[j] = codes[rc + j][c];
    const long long off = (b * p.C + c0 + c) * static_cast<long long>(p.R) + r0 + rc;
    for (int m = 0; m < 2; ++m) {
      uint8_t* qt = p.qt[m];
      if (qt == nullptr) continue;
      if (p.qt_vec && nr - rc >= 16) {
        uint4 w;
        uint32_t* wp = &w.x;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          wp[j] = col[4 * j] | (col[4 * j + 1] << 8) | (col[4 * j + 2] << 16) |
                  (static_cast<uint32_t>(col[4 * j + 3]) << 24);
        *reinterpret_cast<uint4*>(qt + off) = w;
      } else {
        for (int j = 0; j < 16 && rc + j < nr; ++j) qt[off + j] = col[j];
      }
    }
  }
}

bool aligned_to(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

bool try_quantize_weight_tile128(const FusedArgs& a) {
  if (!a.tile128 || a.offs.present) return false;
  const char* env = std::getenv("MXMOE_QUANT_WEIGHT_TILE");  // read per call: tests switch it
  if (env == nullptr || std::atoi(env) == 0) return false;
  for (const FusedSide* s : {&a.row, &a.col})
    if (s->active && (s->dq.present || s->dqt.present || s->scale_blocked.present)) return false;
  const int64_t B = a.x.shape[0], R = a.x.shape[1], C = a.x.shape[2];
  if (R >= (int64_t{1} << 31) - kT || C >= (int64_t{1} << 31) - kT || C % 32 != 0) return false;
  WeightTileParams p;
  p.x = a.x.data;
  p.B = B;
  p.R = static_cast<int>(R);
  p.C = static_cast<int>(C);
  p.n_r = a.n_r;
  p.mode = a.mode;
  int nq = 0, nqt = 0;
  for (const FusedSide* s : {&a.row, &a.col}) {
    if (!s->active) continue;
    if (s->q.present) p.q[nq++] = static_cast<uint8_t*>(s->q.t.data);
    if (s->qt.present) p.qt[nqt++] = static_cast<uint8_t*>(s->qt.t.data);
  }
  if (a.row.active && a.row.scale.present) p.scale_c = static_cast<uint8_t*>(a.row.scale.t.data);
  if (a.col.active && a.col.scale.present) p.scale_r = static_cast<uint8_t*>(a.col.scale.t.data);
  const bool bf16 = a.x.dtype == MXMOE_DTYPE_BF16;
  p.x_vec = aligned_to(a.x.data, 16) && C % 8 == 0;
  p.q_vec = C % 8 == 0 && (!p.q[0] || aligned_to(p.q[0], 8)) && (!p.q[1] || aligned_to(p.q[1], 8));
  p.qt_vec = R % 16 == 0 && (!p.qt[0] || aligned_to(p.qt[0], 16)) && (!p.qt[1] || aligned_to(p.qt[1], 16));
  p.rtiles = static_cast<int>((R + kT - 1) / kT);
  p.ctiles = static_cast<int>((C + kT - 1) / kT);
  const long long tiles = B * p.rtiles * p.ctiles;
  if (tiles <= 0) return true;
  if (tiles > 0x7FFFFFFFLL) return false;
  DeviceGuard guard(a.x.device);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (bf16)
    weight_tile128_kernel<uint16_t><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(p);
  else
    weight_tile128_kernel<float><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(p);
  cuda_check(cudaGetLastError(), "quantize_fused: weight tile kernel launch");
  return true;
}

}  // namespace cuda
}  // namespace mxmoe
