// CUDA MX dequantize: q (B, R, C) e4m3 + scales along C (axis 1) or along R (axis 0), optionally
// in the grouped compact layout (offs, 2D), to bf16/f32 in q's orientation. Positions outside
// every group are written as 0. One CTA per 128x128 tile; thread t owns 8 columns of 4 rows
// (8-byte code loads, 16-byte bf16 stores). The scale index of each position along the blocked
// axis comes from a block scan of offs (clamped like groups_from_offsets) into a shared table.
#include <vector>

#include "common/tensor.hpp"
#include "cuda/quant_common.cuh"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

using namespace qk;

constexpr int NT = 512;

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

__global__ void __launch_bounds__(NT, 2) dequant_kernel(const __grid_constant__ DqParams P) {
  __shared__ ScanSmem scan;
  __shared__ int idx_tab[128];  // scale index of the tile's positions along the blocked axis (-1: none)
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4;
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
  const int lr0 = 4 * rs, lc = 8 * cc, cvalid = cols - lc;
  if (cvalid <= 0) return;
  auto idx_of = [&](int local) -> long long {
    return P.offs != nullptr ? static_cast<long long>(idx_tab[local]) : (lo + local) / 32;
  };
  long long cidx[8];
  bool c_uniform = true;
  if (along_c) {
#pragma unroll
    for (int j = 0; j < 8; ++j) cidx[j] = j < cvalid ? idx_of(lc + j) : -1;
#pragma unroll
    for (int j = 1; j < 8; ++j) c_uniform &= (j >= cvalid) || cidx[j] == cidx[0];
  }
  for (int i = 0; i < 4; ++i) {
    const int lr = lr0 + i;
    if (lr >= rows) break;
    const long long row = b * P.R + r0 + lr;  // row in (B*R)
    const uint8_t* qp = P.q + row * P.C + c0 + lc;
    uint2 qv;
    if (P.q_vec) {
      qv = __ldg(reinterpret_cast<const uint2*>(qp));
    } else {
      uint32_t w[2] = {0, 0};
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < cvalid) w[e >> 2] |= static_cast<uint32_t>(__ldg(qp + e)) << (8 * (e & 3));
      qv = make_uint2(w[0], w[1]);
    }
    uint8_t s8[8];
    bool inside[8];
    if (along_c) {
      const uint8_t* sp = P.scale + row * P.n;
      if (c_uniform && cidx[0] >= 0) {
        const uint8_t s = __ldg(sp + cidx[0]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          s8[j] = s;
          inside[j] = true;
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          inside[j] = cidx[j] >= 0;
          s8[j] = inside[j] ? __ldg(sp + cidx[j]) : 0;
        }
      }
    } else {
      const long long ri = idx_of(lr);
      const uint8_t* sp = P.scale + (b * P.C + c0 + lc) * P.n + ri;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        inside[j] = ri >= 0;
        s8[j] = (ri >= 0 && j < cvalid) ? __ldg(sp + j * P.n) : 0;
      }
    }
    float v[8];
    dequant8(qv, s8, v);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (!inside[j]) v[j] = 0.f;
    const long long off = row * P.C + c0 + lc;
    if (P.f32) {
      float* o = static_cast<float*>(P.out) + off;
      if (P.out_vec) {
        if (cvalid >= 4) *reinterpret_cast<float4*>(o) = make_float4(v[0], v[1], v[2], v[3]);
        if (cvalid >= 8) *reinterpret_cast<float4*>(o + 4) = make_float4(v[4], v[5], v[6], v[7]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (e < cvalid) o[e] = v[e];
      }
    } else {
      uint16_t* o = static_cast<uint16_t*>(P.out) + off;
      uint32_t h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = out_bf16(v[e]);
      if (P.out_vec) {
        *reinterpret_cast<uint4*>(o) =
            make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (e < cvalid) o[e] = static_cast<uint16_t>(h[e]);
      }
    }
  }
}

}  // namespace

void dequantize(const DequantizeArgs& a) {
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
  p.q_vec = aligned(p.q, 8) && p.C % 8 == 0;
  p.out_vec = aligned(p.out, 16) && p.C % (p.f32 ? 4 : 8) == 0;
  const long long grid = B * p.rtiles * p.ctiles;
  if (grid <= 0) return;
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
