// Generic MX grouped GEMMs on CUDA (any 1x32 MX operands): simple, correct kernels that serve the
// GPU tests and the exact recipes' reference path, not the fast path (the tile128 recipe runs on
// the FP8 tensor cores in gemm_tile128.cu; the exact recipes' fast path is the fused MX round trip
// plus a bf16 grouped GEMM).
//
// Numerics: every element is dequantized exactly (mxmoe::dequantize_element), products and sums are
// separate IEEE fp32 operations (__fmul_rn, __fadd_rn: no FMA contraction) accumulated in order of
// the reduction index from 0, and bias is added once in fp32 before the output cast. That is the
// CPU reference's order (cpu/grouped_gemm.cpp), so results match it bit for bit.
//
// Layout of the work: 64x64 output tiles, 256 threads, 4x4 outputs each, the reduction in steps of
// one 32-element MX block staged (dequantized) in shared memory. Offsets are read on the device and
// clamped like groups_from_offsets; grids are sized from static upper bounds (no host sync).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/error.hpp"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

constexpr int kT = 64;    // output tile rows and columns
constexpr int kKS = 32;   // reduction step: one MX block
constexpr int kPad = 4;   // smem row padding (floats)

struct View2 {  // strided 2-D byte view
  const uint8_t* p;
  int64_t s0, s1;
  __device__ uint8_t at(int64_t i, int64_t j) const { return p[i * s0 + j * s1]; }
};

__device__ __forceinline__ void store_out(void* out, mxmoe_dtype dt, int64_t off, float v) {
  if (dt == MXMOE_DTYPE_BF16)
    static_cast<uint16_t*>(out)[off] = f32_to_bf16(v);
  else
    static_cast<float*>(out)[off] = v;
}

__device__ __forceinline__ float load_in(const void* p, mxmoe_dtype dt, int64_t off) {
  return dt == MXMOE_DTYPE_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[off])
                                : static_cast<const float*>(p)[off];
}

// Group g's [start, end) under the clamping rule, plus its first 32-run in the compact layout.
struct Grp {
  int64_t start, end, blk;
};

struct MmParams {
  View2 a, as;        // A (M, K), a_scale (M, K/32)
  const uint8_t* b;   // B (G, N, K)
  int64_t bs0, bs1, bs2;
  const uint8_t* bsc;  // b_scale (G, N, K/32)
  int64_t bss0, bss1, bss2;
  const int32_t* offs;
  int64_t offs_s;
  int groups;
  int64_t m, n, k;
  const void* bias;
  mxmoe_dtype bias_dt;
  int64_t bias_s0, bias_s1;
  void* out;
  mxmoe_dtype out_dt;
  int64_t out_s0, out_s1;
};

// Tile t of the per-group tiling (ceil(len_g/64) tiles per group, in group order): its group and
// first row. Returns false for tiles past the last one (the grid is an upper bound).
__device__ bool find_tile(const int32_t* offs, int64_t offs_s, int groups, int64_t m, int64_t t,
                          int* g_out, int64_t* row0, int64_t* row_end) {
  int64_t prev = 0, tiles = 0;
  for (int g = 0; g < groups; ++g) {
    const int64_t o = offs[g * offs_s];
    const int64_t e = o < prev ? prev : (o > m ? m : o);
    const int64_t nt = (e - prev + kT - 1) / kT;
    if (t < tiles + nt) {
      *g_out = g;
      *row0 = prev + (t - tiles) * kT;
      *row_end = e;
      return true;
    }
    tiles += nt;
    prev = e;
  }
  return false;
}

__global__ void __launch_bounds__(256) grouped_mm_kernel(MmParams p) {
  __shared__ float sa[kKS][kT + kPad];
  __shared__ float sb[kKS][kT + kPad];
  __shared__ int s_g;
  __shared__ int64_t s_row0, s_end;
  __shared__ bool s_ok;
  if (threadIdx.x == 0) {
    int g = 0;
    int64_t r0 = 0, re = 0;
    s_ok = find_tile(p.offs, p.offs_s, p.groups, p.m, blockIdx.y, &g, &r0, &re);
    s_g = g;
    s_row0 = r0;
    s_end = re;
  }
  __syncthreads();
  if (!s_ok) return;
  const int g = s_g;
  const int64_t row0 = s_row0, row_end = s_end, col0 = static_cast<int64_t>(blockIdx.x) * kT;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  const uint8_t* bg = p.b + g * p.bs0;
  const uint8_t* bsg = p.bsc + g * p.bss0;
  for (int64_t k0 = 0; k0 < p.k; k0 += kKS) {
    // Stage 64 rows x 32 k of A and 64 cols x 32 k of B, dequantized, k-major.
    for (int idx = threadIdx.x; idx < kT * kKS; idx += blockDim.x) {
      const int r = idx / kKS, kk = idx % kKS;
      const int64_t row = row0 + r, col = col0 + r, kg = k0 + kk;
      float va = 0.0f, vb = 0.0f;
      if (row < row_end) va = dequantize_element(p.a.at(row, kg), p.as.at(row, kg / kBlock));
      if (col < p.n) vb = dequantize_element(bg[col * p.bs1 + kg * p.bs2], bsg[col * p.bss1 + (kg / kBlock) * p.bss2]);
      sa[kk][r] = va;
      sb[kk][r] = vb;
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kKS; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = sa[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = sb[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(av[i], bv[j]));
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty + 16 * i;
    if (row >= row_end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + tx + 16 * j;
      if (col >= p.n) continue;
      float y = acc[i][j];
      if (p.bias) y = __fadd_rn(y, load_in(p.bias, p.bias_dt, g * p.bias_s0 + col * p.bias_s1));
      store_out(p.out, p.out_dt, row * p.out_s0 + col * p.out_s1, y);
    }
  }
}

// Rows [end of the last group, M) belong to no expert: zeros.
__global__ void zero_tail_rows_kernel(const int32_t* offs, int64_t offs_s, int groups, int64_t m, int64_t n,
                                      void* out, mxmoe_dtype dt, int64_t s0, int64_t s1) {
  __shared__ int64_t s_end;
  if (threadIdx.x == 0) {
    int64_t prev = 0;
    for (int g = 0; g < groups; ++g) {
      const int64_t o = offs[g * offs_s];
      prev = o < prev ? prev : (o > m ? m : o);
    }
    s_end = prev;
  }
  __syncthreads();
  const int64_t total = (m - s_end) * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = s_end + i / n, c = i % n;
    store_out(out, dt, r * s0 + c * s1, 0.0f);
  }
}

struct KgParams {
  View2 a, as;  // A (N, M), a_scale (N, cap)
  View2 b, bs;  // B (K, M), b_scale (K, cap)
  const int32_t* offs;
  int64_t offs_s;
  int groups;
  int64_t m, n, k;
  void* out;
  mxmoe_dtype out_dt;
  int64_t out_s0, out_s1, out_s2;
};

__global__ void __launch_bounds__(256) grouped_mm_kgroups_kernel(KgParams p) {
  __shared__ float sa[kKS][kT + kPad];
  __shared__ float sb[kKS][kT + kPad];
  __shared__ int64_t s_start, s_len, s_blk;
  const int g = blockIdx.z;
  if (threadIdx.x == 0) {
    int64_t prev = 0, blk = 0, start = 0, len = 0, gblk = 0;
    for (int h = 0; h <= g; ++h) {
      const int64_t o = p.offs[h * p.offs_s];
      const int64_t e = o < prev ? prev : (o > p.m ? p.m : o);
      start = prev;
      len = e - prev;
      gblk = blk;
      blk += (len + kBlock - 1) / kBlock;
      prev = e;
    }
    s_start = start;
    s_len = len;
    s_blk = gblk;
  }
  __syncthreads();
  const int64_t start = s_start, len = s_len, blk = s_blk;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kT, col0 = static_cast<int64_t>(blockIdx.x) * kT;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int64_t t0 = 0; t0 < len; t0 += kKS) {
    const int64_t sb_idx = blk + t0 / kBlock;  // this 32-run's compact scale column
    for (int idx = threadIdx.x; idx < kT * kKS; idx += blockDim.x) {
      const int r = idx / kKS, kk = idx % kKS;
      const int64_t row = row0 + r, col = col0 + r, tok = t0 + kk;
      float va = 0.0f, vb = 0.0f;
      if (tok < len) {
        if (row < p.n) va = dequantize_element(p.a.at(row, start + tok), p.as.at(row, sb_idx));
        if (col < p.k) vb = dequantize_element(p.b.at(col, start + tok), p.bs.at(col, sb_idx));
      }
      sa[kk][r] = va;
      sb[kk][r] = vb;
    }
    __syncthreads();
    const int kmax = len - t0 < kKS ? static_cast<int>(len - t0) : kKS;  // no terms past the group
    for (int kk = 0; kk < kmax; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = sa[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = sb[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(av[i], bv[j]));
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty + 16 * i;
    if (row >= p.n) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + tx + 16 * j;
      if (col >= p.k) continue;
      store_out(p.out, p.out_dt, g * p.out_s0 + row * p.out_s1 + col * p.out_s2, acc[i][j]);
    }
  }
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": kernel launch failed: ", cudaGetErrorString(e));
}

// Makes `device` current for the call and restores the caller's device afterwards.
struct DeviceGuard {
  int prev = -1;
  DeviceGuard(int device, const char* what) {
    cudaGetDevice(&prev);
    if (prev == device) return;
    const cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": cudaSetDevice(", device, "): ", cudaGetErrorString(e));
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
  }
};

View2 view2(const mxmoe_tensor& t) {
  return View2{static_cast<const uint8_t*>(t.data), t.strides[0], t.strides[1]};
}

}  // namespace

void grouped_mm(const GroupedMMArgs& a) {
  const int64_t M = a.a.shape[0], K = a.a.shape[1], N = a.b.shape[1];
  const int G = static_cast<int>(a.offs.shape[0]);
  DeviceGuard guard(a.a.device, "grouped_mm");
  auto stream = static_cast<cudaStream_t>(a.stream);
  MmParams p{};
  p.a = view2(a.a);
  p.as = view2(a.a_scale);
  p.b = static_cast<const uint8_t*>(a.b.data);
  p.bs0 = a.b.strides[0];
  p.bs1 = a.b.strides[1];
  p.bs2 = a.b.strides[2];
  p.bsc = static_cast<const uint8_t*>(a.b_scale.data);
  p.bss0 = a.b_scale.strides[0];
  p.bss1 = a.b_scale.strides[1];
  p.bss2 = a.b_scale.strides[2];
  p.offs = static_cast<const int32_t*>(a.offs.data);
  p.offs_s = a.offs.strides[0];
  p.groups = G;
  p.m = M;
  p.n = N;
  p.k = K;
  if (a.bias.present) {
    p.bias = a.bias.t.data;
    p.bias_dt = a.bias.t.dtype;
    p.bias_s0 = a.bias.t.strides[0];
    p.bias_s1 = a.bias.t.strides[1];
  }
  p.out = a.out.data;
  p.out_dt = a.out.dtype;
  p.out_s0 = a.out.strides[0];
  p.out_s1 = a.out.strides[1];
  // Upper bound on tiles over all groups: sum ceil(len/64) <= ceil(M/64) + G.
  const int64_t tiles = (M + kT - 1) / kT + G;
  if (tiles > 65535)
    fail_status(MXMOE_ERR_UNSUPPORTED, "grouped_mm: ", M, " rows in ", G, " groups exceed this kernel's grid (65535 row tiles of 64)");
  if (M > 0 && N > 0 && G > 0) {
    dim3 grid(static_cast<unsigned>((N + kT - 1) / kT), static_cast<unsigned>(tiles));
    grouped_mm_kernel<<<grid, 256, 0, stream>>>(p);
    check_launch("grouped_mm");
  }
  if (M > 0 && N > 0) {
    zero_tail_rows_kernel<<<264, 256, 0, stream>>>(p.offs, p.offs_s, G, M, N, p.out, p.out_dt, p.out_s0, p.out_s1);
    check_launch("grouped_mm");
  }
}

void grouped_mm_kgroups(const GroupedMMKArgs& a) {
  const int64_t N = a.a.shape[0], M = a.a.shape[1], K = a.b.shape[0];
  const int G = static_cast<int>(a.offs.shape[0]);
  DeviceGuard guard(a.a.device, "grouped_mm_kgroups");
  auto stream = static_cast<cudaStream_t>(a.stream);
  KgParams p{};
  p.a = view2(a.a);
  p.as = view2(a.a_scale);
  p.b = view2(a.b);
  p.bs = view2(a.b_scale);
  p.offs = static_cast<const int32_t*>(a.offs.data);
  p.offs_s = a.offs.strides[0];
  p.groups = G;
  p.m = M;
  p.n = N;
  p.k = K;
  p.out = a.out.data;
  p.out_dt = a.out.dtype;
  p.out_s0 = a.out.strides[0];
  p.out_s1 = a.out.strides[1];
  p.out_s2 = a.out.strides[2];
  if ((N + kT - 1) / kT > 65535 || G > 65535)
    fail_status(MXMOE_ERR_UNSUPPORTED, "grouped_mm_kgroups: N = ", N, ", G = ", G, " exceed this kernel's grid");
  if (N > 0 && K > 0 && G > 0) {
    dim3 grid(static_cast<unsigned>((K + kT - 1) / kT), static_cast<unsigned>((N + kT - 1) / kT),
              static_cast<unsigned>(G));
    grouped_mm_kgroups_kernel<<<grid, 256, 0, stream>>>(p);
    check_launch("grouped_mm_kgroups");
  }
}

}  // namespace cuda
}  // namespace mxmoe
