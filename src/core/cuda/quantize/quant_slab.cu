// The slab kernel: 32-row slabs (blocks spanning at most 32 rows), 128-thread CTAs.
#include "cuda/quantize/kernels.cuh"

namespace mxmoe {
namespace cuda {
namespace {

// Transposed store of a 32 x 128 slab: shared row c holds the slab's 32 elements of column c
// (E bytes each, rows in order, rows padded to an odd word count); the CTA then writes each
// destination row as 4-byte words (funnel-shifted when the row start is not 4-byte aligned).
template <int E>
__device__ __forceinline__ void transpose_slab(uint32_t* sm, uint8_t* dst, long long ld, int rows, int cols,
                                               const uint32_t (&w)[8][E]) {
  constexpr int RWS = 8 * E + 1;  // shared words per row
  constexpr int NWM = 8 * E + 1;  // destination words per row at most (a shifted start adds one)
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t* p = sm + (8 * cc + j) * RWS + rs * E;
#pragma unroll
    for (int e = 0; e < E; ++e) p[e] = w[j][e];
  }
  __syncthreads();
  const int nbytes = rows * E;
  if ((reinterpret_cast<uintptr_t>(dst) & 3u) == 0 && ((ld * E) & 3) == 0) {
    // Every destination row starts 4-byte aligned: thread t writes word t % (8E) of rows
    // t / (8E) + k * (NS / 8E), whole words except a partial last one.
    constexpr int WPR = 8 * E, RPS = NS / WPR;
    const int wi = tid % WPR;
    const int k0 = 4 * wi;
    for (int c = tid / WPR; c < cols; c += RPS) {
      if (k0 >= nbytes) continue;
      uint8_t* d = dst + static_cast<long long>(c) * ld * E + k0;
      const uint32_t val = sm[c * RWS + wi];
      if (k0 + 4 <= nbytes) {
        *reinterpret_cast<uint32_t*>(d) = val;
      } else {
        for (int m = 0; k0 + m < nbytes; ++m) d[m] = static_cast<uint8_t>(val >> (8 * m));
      }
    }
    __syncthreads();
    return;
  }
  for (int idx = tid; idx < cols * NWM; idx += NS) {
    const int c = idx / NWM, wi = idx - c * NWM;
    uint8_t* rowp = dst + static_cast<long long>(c) * ld * E;
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(rowp) & 3u);
    const int nw = (shift + nbytes + 3) >> 2;
    if (wi >= nw) continue;
    uint8_t* al = rowp - shift;
    const uint32_t* srow = sm + c * RWS;
    uint32_t val;
    if (shift == 0) {
      val = srow[wi];
    } else {
      const uint32_t lo = wi > 0 ? srow[wi - 1] : 0u;
      const uint32_t hi = wi < 8 * E ? srow[wi] : 0u;
      val = __funnelshift_r(lo, hi, 8 * (4 - shift));
    }
    const int k0 = 4 * wi - shift;
    if (k0 >= 0 && k0 + 4 <= nbytes) {
      *reinterpret_cast<uint32_t*>(al + 4 * wi) = val;
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m)
        if (k0 + m >= 0 && k0 + m < nbytes) al[4 * wi + m] = static_cast<uint8_t>(val >> (8 * m));
    }
  }
  __syncthreads();
}

template <typename In>
__device__ __forceinline__ void process_slab(const Params& P, SlabSmem& sm, uint32_t* dsm, const SlabInfo& t,
                                             const Frag<In>& f) {
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4, lane = tid & 31, warp = tid >> 5;
  const int b = t.b;
  const long long ct = t.ct, c0 = 128 * ct;
  const int r0 = t.r0, rows = t.r1 - t.r0;
  const int cols = static_cast<int>(min(128LL, P.C - c0));
  const bool in_group = t.in_group;
  const int lr0 = 4 * rs, lc = 8 * cc, cvalid = cols - lc;
  const bool row_q = P.row_block > 0, col_q = P.col_block > 0;
  const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(P.mode);

  uint2 rq[4];
  uint32_t rsb = 0;
  if (row_q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t m = f.row_amax(i);
      m = max(m, __shfl_xor_sync(kFull, m, 1));
      m = max(m, __shfl_xor_sync(kFull, m, 2));
      if (P.row_block == 128) {
        m = max(m, __shfl_xor_sync(kFull, m, 4));
        m = max(m, __shfl_xor_sync(kFull, m, 8));
      }
      const uint8_t s = e8m0_from_amax_bits(m, mode);
      rsb |= static_cast<uint32_t>(s) << (8 * i);
      if (s == kE8M0Nan) {
        rq[i] = make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
      } else {
        float v[8], r[8];
        f.values(i, v);
        const float rc = e8m0_reciprocal_f32(s);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = rc;
        rq[i] = quant8(v, r);
      }
    }
  }

  uint2 cq[4];
  uint32_t csb[2] = {0, 0};
  if (col_q) {
    if (in_group) {
      uint32_t m[8];
      f.col_amax(m);
#pragma unroll
      for (int e = 0; e < 8; ++e) m[e] = max(m[e], __shfl_xor_sync(kFull, m[e], 16));
      uint32_t* colpart = dsm;  // [4 warps][128 columns]
      if (lane < 16) {
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc) = make_uint4(m[0], m[1], m[2], m[3]);
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc + 4) = make_uint4(m[4], m[5], m[6], m[7]);
      }
      __syncthreads();
      {
        const uint32_t a = max(max(colpart[tid], colpart[128 + tid]), max(colpart[256 + tid], colpart[384 + tid]));
        sm.scol[tid] = e8m0_from_amax_bits(a, mode);
      }
      __syncthreads();
      const uint2 cw = *reinterpret_cast<const uint2*>(sm.scol + lc);
      csb[0] = cw.x;
      csb[1] = cw.y;
      uint32_t mk[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) mk[h] = __vcmpeq4(~csb[h], 0u);
      float r[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] = e8m0_reciprocal_f32(static_cast<uint8_t>(csb[j >> 2] >> (8 * (j & 3))));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v[8];
        f.values(i, v);
        cq[i] = quant8(v, r);
        cq[i].x = (cq[i].x & ~mk[0]) | (0x7F7F7F7Fu & mk[0]);
        cq[i].y = (cq[i].y & ~mk[1]) | (0x7F7F7F7Fu & mk[1]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) cq[i] = make_uint2(0, 0);
    }
  }

  auto emit = [&](const SideP& S, bool is_row, const uint2(&qd)[4]) {
    // Decoded scales: per row (rowwise) or per column (columnwise).
    auto scales_of = [&](int i, float (&sf)[8]) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        sf[j] = e8m0_to_f32(static_cast<uint8_t>(is_row ? (rsb >> (8 * i)) : (csb[j >> 2] >> (8 * (j & 3)))));
    };
    const long long xrow0 = static_cast<long long>(b) * P.R + r0;
    if (S.q) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lr0 + i < rows) store_q8(S.q + (xrow0 + lr0 + i) * P.C + c0 + lc, qd[i], cvalid, S.q_vec);
    }
    if (S.dq) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (lr0 + i < rows) {
          float sf[8], v[8];
          scales_of(i, sf);
          dequant8f(qd[i], sf, v);
          store_f8(S.dq, (xrow0 + lr0 + i) * P.C + c0 + lc, v, cvalid, S.dq_f32, S.dq_vec);
        }
      }
    }
    const long long xcol0 = static_cast<long long>(b) * P.C + c0;
    if (S.qt) {
      uint32_t w[8][1];
      codes_by_column(qd, w);
      transpose_slab<1>(dsm, S.qt + xcol0 * P.R + r0, P.R, rows, cols, w);
    }
    if (S.dqt) {
      float v[4][8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sf[8];
        scales_of(i, sf);
        dequant8f(qd[i], sf, v[i]);
      }
      if (S.dqt_f32) {
        uint32_t w[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) w[j][i] = __float_as_uint(canon_f32(v[i][j]));
        transpose_slab<4>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 4, P.R, rows, cols, w);
      } else {
        uint32_t w[8][2];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          w[j][0] = pack_bf16x2(v[0][j], v[1][j]);
          w[j][1] = pack_bf16x2(v[2][j], v[3][j]);
        }
        transpose_slab<2>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 2, P.R, rows, cols, w);
      }
    }
    if (is_row && (S.scale || S.blocked)) {
      if ((cc & 3) == 0) {
        uint8_t* srowb = reinterpret_cast<uint8_t*>(sm.srow);
#pragma unroll
        for (int i = 0; i < 4; ++i) srowb[(lr0 + i) * 4 + (cc >> 2)] = static_cast<uint8_t>(rsb >> (8 * i));
      }
      __syncthreads();
      const long long W = P.C / 32;
      const int nj = static_cast<int>(min(4LL, W - c0 / 32));
      const uint32_t jmask = nj >= 4 ? 0xFFFFFFFFu : ((1u << (8 * nj)) - 1u);
      if (S.scale && tid < rows) {
        uint8_t* d = S.scale + (xrow0 + tid) * W + c0 / 32;
        const uint32_t val = sm.srow[tid];
        if (S.sc_vec && nj == 4) *reinterpret_cast<uint32_t*>(d) = val;
        else
          for (int j = 0; j < nj; ++j) d[j] = static_cast<uint8_t>(val >> (8 * j));
      }
      if (S.blocked && in_group && tid < 32) {
        // Word 4r + q of the band's block holds row 32q + r (4 scale bytes); later quarters of the
        // last slab's band are padding.
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_M) blk = static_cast<long long>(t.gp0 + t.band) * P.ctiles + ct;
        else blk = (static_cast<long long>(b) * ((P.R + 127) / 128) + t.band) * P.ctiles + ct;
        uint8_t* base = S.blocked + blk * 512;
        const uint32_t val = tid < rows ? (sm.srow[tid] & jmask) : 0u;
        for (int qq = t.q; qq < (t.last ? 4 : t.q + 1); ++qq) {
          uint8_t* d = base + 4 * (4 * tid + qq);
          const uint32_t vv = qq == t.q ? val : 0u;
          if ((reinterpret_cast<uintptr_t>(d) & 3u) == 0) *reinterpret_cast<uint32_t*>(d) = vv;
          else
            for (int k = 0; k < 4; ++k) d[k] = static_cast<uint8_t>(vv >> (8 * k));
        }
      }
      __syncthreads();
    }
    if (!is_row && in_group && (S.scale || S.blocked)) {
      if (S.scale && tid < cols) S.scale[(xcol0 + tid) * P.n_r + t.run] = sm.scol[tid];
      if (S.blocked) {
        // Byte q of word t holds column (t & 3) * 32 + (t >> 2) of the band's run q.
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_K) blk = static_cast<long long>(t.gp0) * P.ctiles + ct * t.gnp + t.band;
        else blk = (static_cast<long long>(b) * P.ctiles + ct) * ((P.R + 127) / 128) + t.band;
        const int i = (tid & 3) * 32 + (tid >> 2);
        uint8_t* d = S.blocked + blk * 512 + 4 * tid;
        d[t.q] = i < cols ? sm.scol[i] : 0;
        if (t.last)
          for (int qq = t.q + 1; qq < 4; ++qq) d[qq] = 0;
      }
    }
  };

  if (P.row_on) emit(P.row, true, rq);
  if (P.col_on) emit(P.col, false, cq);
}

template <typename In>
__global__ void __launch_bounds__(NS, 6) quant_slab_kernel(const __grid_constant__ Params P) {
  extern __shared__ uint4 dyn_smem_[];
  uint32_t* dsm = reinterpret_cast<uint32_t*>(dyn_smem_);
  int* table = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(dyn_smem_) + P.tr_bytes);
  __shared__ SlabSmem sm;
  const int tid = threadIdx.x;
  if (P.grouped) {
    const ScanTotals tot = scan_groups<NS>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
      table[gi.g] = static_cast<int>(gi.start);
      table[kMaxTable + gi.g] = static_cast<int>(gi.p0);
      table[2 * kMaxTable + gi.g] = static_cast<int>(gi.b0);
    });
    if (tid == 0) {
      sm.covered = tot.covered;
      sm.tot_panels = tot.panels;
      sm.tot_runs = tot.blocks;
    }
    if (P.col_on && P.col.scale != nullptr && P.n_r > tot.blocks) {
      long long lo, hi;
      grid_share(P.C, lo, hi);
      for (long long c = lo; c < hi; ++c) zero_bytes_cta<NS>(P.col.scale + c * P.n_r, tot.blocks, P.n_r);
    }
    const long long from = tot.panels * 512 * P.ctiles;
    if (P.row_on && P.row.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.row.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NS>(P.row.blocked, from + lo, from + hi);
    }
    if (P.col_on && P.col.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.col.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NS>(P.col.blocked, from + lo, from + hi);
    }
    __syncthreads();
  }
  for (long long tile = blockIdx.x; tile < P.tiles; tile += gridDim.x) {
    const SlabInfo t = resolve_slab(P, sm, table, tile);
    if (!t.valid) continue;  // uniform
    Frag<In> f;
    f.zero();
    if (P.row_block > 0 || (P.col_block > 0 && t.in_group)) {
      const int lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
      const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
      const In* xb = static_cast<const In*>(P.x) + ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lr0 + i < rows && cvalid > 0) f.load(i, xb + static_cast<long long>(lr0 + i) * P.C, cvalid, P.x_vec);
    }
    process_slab<In>(P, sm, dsm, t, f);
    __syncthreads();
  }
}

}  // namespace

namespace quant {

void launch_slab(Params& p, bool bf16, int device, cudaStream_t stream) {
  p.P = static_cast<int>(cdiv(p.R, 32) + (p.grouped ? p.G + 1 : 0));
  p.tiles = static_cast<long long>(p.B) * p.P * p.ctiles;
  if (p.tiles <= 0) return;
  if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
  int e = 0;
  for (const SideP* sd : {&p.row, &p.col}) {
    if (sd->qt) e = std::max(e, 1);
    if (sd->dqt) e = std::max(e, sd->dqt_f32 ? 4 : 2);
  }
  p.tr_bytes = std::max(2048, e == 0 ? 0 : 128 * (8 * e + 1) * 4);
  const int smem = p.tr_bytes + (p.table ? 3 * kMaxTable * 4 : 0);
  auto go = [&](auto kernel) {
    const int blocks = occupancy(kernel, device, NS, smem), sms = sm_count(device);
    if (blocks < 1) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: kernel does not fit on the device");
    const long long grid = std::min<long long>(p.tiles, static_cast<long long>(blocks) * sms);
    kernel<<<static_cast<unsigned>(grid), NS, smem, stream>>>(p);
    cuda_check(cudaGetLastError(), "quantize: kernel launch");
  };
  if (bf16) go(quant_slab_kernel<uint16_t>);
  else go(quant_slab_kernel<float>);
}

}  // namespace quant
}  // namespace cuda
}  // namespace mxmoe
