// CUDA MX dequantize: q (B, R, C) e4m3 + scales along C (axis 1) or along R (axis 0), optionally
// in the grouped compact layout (offs, 2D), to bf16/f32 in q's orientation. Positions outside
// every group are written as 0. One CTA per 128x128 tile; thread t owns 8 columns of 4 rows
// (8-byte code loads, 16-byte bf16 stores). The scale index of each position along the blocked
// axis comes from a block scan of offs (clamped like groups_from_offsets) into a shared table.
#include <algorithm>
#include <vector>

#include "common/tensor.hpp"
#include "cuda/common/launch_cache.cuh"
#include "cuda/quantize/common.cuh"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

using namespace qk;

constexpr int NT = 256;

struct DqParams {
  const uint8_t* q;
  const uint8_t* scale;
  void* out;
  bool f32;
  int axis;
  long long R, C, n;  // n: scale's last dim
  const int32_t* offs;
  long long offs_stride;
  int G;
  long long rtiles, ctiles;
  bool q_vec, out_vec;
};

// One CTA per 128x128 tile; thread t owns 16 columns (one 16-byte code load) of 4 rows. All code
// and scale loads of a thread are issued before the first use.
__global__ void __launch_bounds__(NT, 3) dequant_kernel(const __grid_constant__ DqParams P) {
  __shared__ ScanSmem scan;
  __shared__ int idx_tab[128];  // scale index of the tile's positions along the blocked axis (-1: none)
  const int tid = threadIdx.x, cc = tid & 7, rs = tid >> 3;
  const long long cta = blockIdx.x;
  const long long ct = cta % P.ctiles, rt = (cta / P.ctiles) % P.rtiles, b = cta / (P.ctiles * P.rtiles);
  const long long r0 = rt * 128, c0 = ct * 128;
  const int rows = static_cast<int>(min(128LL, P.R - r0)), cols = static_cast<int>(min(128LL, P.C - c0));
  const bool along_c = P.axis == 1;
  const long long lo = along_c ? c0 : r0;  // first position of the tile along the blocked axis
  if (P.offs != nullptr) {
    if (tid < 128) idx_tab[tid] = -1;
    __syncthreads();
    scan_groups<NT>(P.offs, P.offs_stride, P.G, along_c ? P.C : P.R, 0, scan, [&](const GroupInfo& gi) {
      const long long a = max(gi.start, lo), e = min(gi.end, lo + 128);
      for (long long x = a; x < e; ++x) idx_tab[x - lo] = static_cast<int>(gi.b0 + (x - gi.start) / 32);
    });
  }
  const int lr0 = 4 * rs, lc = 16 * cc, cvalid = cols - lc;
  if (cvalid <= 0) return;
  auto idx_of = [&](int local) -> int {
    return P.offs != nullptr ? idx_tab[local] : static_cast<int>((lo + local) / 32);
  };
  const long long row0 = b * P.R + r0 + lr0;  // first row of the thread in (B*R)
  // ---- codes ----
  uint4 qv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    qv[i] = make_uint4(0, 0, 0, 0);
    if (lr0 + i < rows) {
      const uint8_t* qp = P.q + (row0 + i) * P.C + c0 + lc;
      if (P.q_vec && cvalid >= 16) {
        qv[i] = __ldg(reinterpret_cast<const uint4*>(qp));
      } else {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int e = 0; e < 16; ++e)
          if (e < cvalid) w[e >> 2] |= static_cast<uint32_t>(__ldg(qp + e)) << (8 * (e & 3));
        qv[i] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
  // ---- scales: s[i][j] for row i, column j of the thread; -1 marks positions of no group ----
  // Fast paths: one index for all 16 columns (along C) or all 4 rows (along R).
  uint32_t sw[4][4];  // scale bytes, word j>>2, byte j&3, of row i
  uint32_t in_mask[4];  // bit j: inside a group
  if (along_c) {
    int cidx0 = idx_of(lc);
    bool uniform = true;
#pragma unroll
    for (int j = 1; j < 16; ++j) uniform &= (j >= cvalid) || idx_of(lc + j) == cidx0;
    if (uniform && cidx0 >= 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t sb = lr0 + i < rows ? __ldg(P.scale + (row0 + i) * P.n + cidx0) : 0u;
        sw[i][0] = sw[i][1] = sw[i][2] = sw[i][3] = sb * 0x01010101u;
        in_mask[i] = 0xFFFFu;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        in_mask[i] = 0;
        sw[i][0] = sw[i][1] = sw[i][2] = sw[i][3] = 0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int ci = j < cvalid ? idx_of(lc + j) : -1;
          if (ci >= 0 && lr0 + i < rows) {
            sw[i][j >> 2] |= static_cast<uint32_t>(__ldg(P.scale + (row0 + i) * P.n + ci)) << (8 * (j & 3));
            in_mask[i] |= 1u << j;
          }
        }
      }
    }
  } else {
    const uint8_t* sp = P.scale + (b * P.C + c0 + lc) * P.n;
    int ridx[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ridx[i] = lr0 + i < rows ? idx_of(lr0 + i) : -1;
    const bool uniform = ridx[1] == ridx[0] && ridx[2] == ridx[0] && ridx[3] == ridx[0];
    uint32_t w0[4] = {0, 0, 0, 0};
    if (ridx[0] >= 0) {
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (j < cvalid) w0[j >> 2] |= static_cast<uint32_t>(__ldg(sp + j * P.n + ridx[0])) << (8 * (j & 3));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (uniform || i == 0) {
        sw[i][0] = w0[0]; sw[i][1] = w0[1]; sw[i][2] = w0[2]; sw[i][3] = w0[3];
      } else {
        sw[i][0] = sw[i][1] = sw[i][2] = sw[i][3] = 0;
        if (ridx[i] >= 0) {
#pragma unroll
          for (int j = 0; j < 16; ++j)
            if (j < cvalid) sw[i][j >> 2] |= static_cast<uint32_t>(__ldg(sp + j * P.n + ridx[i])) << (8 * (j & 3));
        }
      }
      in_mask[i] = ridx[i] >= 0 ? 0xFFFFu : 0u;
    }
  }
  // ---- values ----
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (lr0 + i >= rows) continue;
    const long long off = (row0 + i) * P.C + c0 + lc;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // 8 columns at a time
      const int valid = cvalid - 8 * h;
      if (valid <= 0) continue;
      const uint2 q8 = h == 0 ? make_uint2(qv[i].x, qv[i].y) : make_uint2(qv[i].z, qv[i].w);
      uint8_t s8[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) s8[e] = static_cast<uint8_t>(sw[i][2 * h + (e >> 2)] >> (8 * (e & 3)));
      float v[8];
      dequant8(q8, s8, v);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (!((in_mask[i] >> (8 * h + e)) & 1u)) v[e] = 0.f;
      if (P.f32) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = canon_f32(v[e]);
        float* o = static_cast<float*>(P.out) + off + 8 * h;
        if (P.out_vec) {
          if (valid >= 4) *reinterpret_cast<float4*>(o) = make_float4(v[0], v[1], v[2], v[3]);
          if (valid >= 8) *reinterpret_cast<float4*>(o + 4) = make_float4(v[4], v[5], v[6], v[7]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (e < valid) o[e] = v[e];
        }
      } else {
        uint16_t* o = static_cast<uint16_t*>(P.out) + off + 8 * h;
        const uint4 hh = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                                    pack_bf16x2(v[6], v[7]));
        if (P.out_vec && valid >= 8) {
          *reinterpret_cast<uint4*>(o) = hh;
        } else {
          const uint32_t hw[4] = {hh.x, hh.y, hh.z, hh.w};
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (e < valid) o[e] = static_cast<uint16_t>(hw[e >> 1] >> (16 * (e & 1)));
        }
      }
    }
  }
}

// Blocks along C without groups: a 32-block is 4 consecutive 8-code units of the flat tensor
// (C % 32 == 0), so unit k has codes at 8k and its scale at k/4. Grid-stride, 8 units per lane per
// step with every load issued first; no shared memory. A lane's 8 codes become one 16-byte bf16
// store, so each warp store instruction writes 512 contiguous bytes (with 16-code units, two 16-byte
// stores per lane half-filled 32 sectors each: 40 % excess sectors in Nsight Compute).
struct DqRowParams {
  const uint8_t* q;
  const uint8_t* scale;
  void* out;
  bool f32;
  long long nunits;
};

__global__ void __launch_bounds__(256, 4) dequant_rows_kernel(const __grid_constant__ DqRowParams P) {
  constexpr int U = 8;
  const int lane = threadIdx.x & 31;
  const long long warp0 = (static_cast<long long>(blockIdx.x) * 256 + threadIdx.x) >> 5;
  const long long stride = static_cast<long long>(gridDim.x) * 8 * (32 * U);
  for (long long base = warp0 * (32 * U); base < P.nunits; base += stride) {
    uint2 qv[U];
    uint32_t sb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 32 * u + lane;
      qv[u] = make_uint2(0, 0);
      sb[u] = 0;
      if (k < P.nunits) {
        qv[u] = __ldg(reinterpret_cast<const uint2*>(P.q) + k);
        sb[u] = __ldg(P.scale + (k >> 2));
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 32 * u + lane;
      if (k >= P.nunits) continue;
      uint8_t s8[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) s8[e] = static_cast<uint8_t>(sb[u]);
      float v[8];
      dequant8(qv[u], s8, v);
      if (P.f32) {
        float4* o = reinterpret_cast<float4*>(static_cast<float*>(P.out) + 8 * k);
        o[0] = make_float4(canon_f32(v[0]), canon_f32(v[1]), canon_f32(v[2]), canon_f32(v[3]));
        o[1] = make_float4(canon_f32(v[4]), canon_f32(v[5]), canon_f32(v[6]), canon_f32(v[7]));
      } else {
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(P.out) + 8 * k) =
            make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
      }
    }
  }
}

}  // namespace

void dequantize(const DequantizeArgs& a) {
  if (dequantize_along_r_warp(a)) return;  // along R, bf16 out: warp tiles (quant_warp.cu)
  DqParams p{};
  p.q = static_cast<const uint8_t*>(a.q.data);
  p.scale = static_cast<const uint8_t*>(a.scale.data);
  p.out = a.out.data;
  p.f32 = a.out.dtype == MXMOE_DTYPE_F32;
  p.axis = a.axis;
  const long long B = a.q.shape[0];
  p.R = a.q.shape[1];
  p.C = a.q.shape[2];
  p.n = a.scale.shape[2];
  p.offs = a.offs.present ? static_cast<const int32_t*>(a.offs.t.data) : nullptr;
  p.G = a.offs.present ? static_cast<int>(a.offs.t.shape[0]) : 0;
  p.offs_stride = a.offs.present ? a.offs.t.strides[0] : 1;
  p.rtiles = cdiv(p.R, 128);
  p.ctiles = cdiv(p.C, 128);
  p.q_vec = aligned(p.q, 16) && p.C % 16 == 0;
  p.out_vec = aligned(p.out, 16) && p.C % (p.f32 ? 4 : 8) == 0;
  const long long grid = B * p.rtiles * p.ctiles;
  if (grid <= 0) return;
  if (p.axis == 1 && p.offs == nullptr && aligned(p.q, 16) && aligned(p.out, 16) && p.C % 32 == 0) {
    DqRowParams rp{p.q, p.scale, p.out, p.f32, B * p.R * p.C / 8};
    DeviceGuard guard(a.q.device);
    const int blocks = occupancy(dequant_rows_kernel, a.q.device, 256, 0), sms = sm_count(a.q.device);
    const long long need = cdiv(rp.nunits, 8 * 32 * 8);
    const long long g = std::max(1LL, std::min(need, static_cast<long long>(std::max(1, blocks)) * sms));
    dequant_rows_kernel<<<static_cast<unsigned>(g), 256, 0, static_cast<cudaStream_t>(a.stream)>>>(rp);
    cuda_check(cudaGetLastError(), "dequantize: kernel launch");
    return;
  }
  if (grid > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "dequantize: tensor too large for one launch");
  DeviceGuard guard(a.q.device);
  dequant_kernel<<<static_cast<unsigned>(grid), NT, 0, static_cast<cudaStream_t>(a.stream)>>>(p);
  cuda_check(cudaGetLastError(), "dequantize: kernel launch");
}

// Checked mode: copy offs to the host (a sync) and run the host validation, same messages.
void check_offsets(const mxmoe_tensor& offs, int64_t m, void* stream) {
  const int64_t n = offs.shape[0];
  std::vector<int32_t> host(static_cast<size_t>(n));
  if (n > 0) {
    DeviceGuard guard(offs.device);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int64_t st = offs.strides[0];
    if (st == 1) {
      cuda_check(cudaMemcpyAsync(host.data(), offs.data, n * 4, cudaMemcpyDeviceToHost, s), "check_offsets: copy");
    } else {
      cuda_check(cudaMemcpy2DAsync(host.data(), 4, offs.data, st * 4, 4, n, cudaMemcpyDeviceToHost, s),
                 "check_offsets: copy");
    }
    cuda_check(cudaStreamSynchronize(s), "check_offsets: sync");
  }
  mxmoe_tensor h = offs;
  h.data = host.data();
  h.strides[0] = 1;
  h.device = -1;
  check_offsets_host(h, m);
}

}  // namespace cuda
}  // namespace mxmoe
