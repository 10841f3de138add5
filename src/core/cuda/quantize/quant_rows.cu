// The rowwise streaming kernel: rowwise-only requests in x's orientation.
#include "cuda/quantize/kernels.cuh"

namespace mxmoe {
namespace cuda {
namespace {

// ---- rowwise-only requests: a streaming kernel --------------------------------------------------
// Blocks of 1x32 / 1x128 along C are runs of 32 / 128 consecutive elements of the flat tensor
// (C % 32 == 0; C % 128 == 0 for 1x128), so q, scale_c and dq need no row index at all: chunk k
// (8 elements) has codes at 8k, its 32-run's scale at k/4. Each warp takes 4 x 32 consecutive
// chunks per step (16-byte loads, all four issued first); no shared memory, no barriers.
template <typename In>
__device__ __forceinline__ void rows_load(const RowParams& P, long long base, Frag<In>& f) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(In));  // elements per 16-byte load
  const int lane = threadIdx.x & 31;
  f.zero();
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const long long k = base + 32 * u + lane;
    if (k < P.nchunks) {
      const In* src = static_cast<const In*>(P.x) + 8 * k;
#pragma unroll
      for (int h = 0; h < 8 / kPer; ++h) f.load16(u, h, src + kPer * h);
    }
  }
}

// PF: software pipelining, the next step's loads are issued before this step's math and stores.
template <typename In, int BLK, bool PF>
__global__ void __launch_bounds__(256, PF ? 3 : 4) quant_rows_kernel(const __grid_constant__ RowParams P) {
  constexpr int U = 4;
  const int lane = threadIdx.x & 31;
  const long long warp0 = (static_cast<long long>(blockIdx.x) * 256 + threadIdx.x) >> 5;
  const long long nwarps = static_cast<long long>(gridDim.x) * 8;
  const long long stride = nwarps * (32 * U);
  const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(P.mode);
  Frag<In> nxt;
  if (PF) rows_load<In>(P, warp0 * (32 * U), nxt);
  for (long long base = warp0 * (32 * U); base < P.nchunks; base += stride) {
    Frag<In> f;
    if (PF) {
      f = nxt;
      if (base + stride < P.nchunks) rows_load<In>(P, base + stride, nxt);
    } else {
      rows_load<In>(P, base, f);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 32 * u + lane;
      uint32_t m = f.row_amax(u);
      m = max(m, __shfl_xor_sync(kFull, m, 1));
      m = max(m, __shfl_xor_sync(kFull, m, 2));
      if (BLK == 128) {
        m = max(m, __shfl_xor_sync(kFull, m, 4));
        m = max(m, __shfl_xor_sync(kFull, m, 8));
      }
      if (k >= P.nchunks) continue;
      const uint8_t sb = e8m0_from_amax_bits(m, mode);
      uint2 q;
      if (sb == kE8M0Nan) {
        q = make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
      } else {
        float v[8], r[8];
        f.values(u, v);
        const float rc = e8m0_reciprocal_f32(sb);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = rc;
        q = quant8(v, r);
      }
      if (P.q) *reinterpret_cast<uint2*>(P.q + 8 * k) = q;
      if (P.scale && (k & 3) == 0) P.scale[k >> 2] = sb;
      if (P.dq) {
        float sf[8], v[8];
        const float sc = e8m0_to_f32(sb);
#pragma unroll
        for (int e = 0; e < 8; ++e) sf[e] = sc;
        dequant8f(q, sf, v);
        store_f8(P.dq, 8 * k, v, 8, P.dq_f32, true);
      }
    }
  }
}

}  // namespace

namespace quant {

void launch_rows(const RowParams& rp, bool bf16, int row_block, bool pf, int device, cudaStream_t stream) {
  if (rp.nchunks == 0) return;
  auto go = [&](auto kernel) {
    const int blocks = occupancy(kernel, device, 256, 0), sms = sm_count(device);
    const long long need = cdiv(rp.nchunks, 8 * 32 * 4);
    const long long grid = std::max(1LL, std::min(need, static_cast<long long>(std::max(1, blocks)) * sms));
    kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(rp);
    cuda_check(cudaGetLastError(), "quantize: kernel launch");
  };
  if (bf16) {
    if (row_block == 32) pf ? go(quant_rows_kernel<uint16_t, 32, true>) : go(quant_rows_kernel<uint16_t, 32, false>);
    else pf ? go(quant_rows_kernel<uint16_t, 128, true>) : go(quant_rows_kernel<uint16_t, 128, false>);
  } else {
    if (row_block == 32) pf ? go(quant_rows_kernel<float, 32, true>) : go(quant_rows_kernel<float, 32, false>);
    else pf ? go(quant_rows_kernel<float, 128, true>) : go(quant_rows_kernel<float, 128, false>);
  }
}

}  // namespace quant
}  // namespace cuda
}  // namespace mxmoe
