// The tile kernel: it serves every request of mxmoe_quantize (1x32, 1x128, 32x1, 128x1, 128x128;
// 2D with token groups or 3D per expert) and mxmoe_quantize_fused (rowwise + columnwise sides from
// one read of x, MX round trip to bf16/f32 in both orientations, scales straight into the blocked
// layout).
//
// Work decomposition (as the CPU core's): a CTA owns one tile of at most 128 rows ("panel") by 128
// columns. Without groups, panels start at multiples of 128. With groups (offs), panels start at
// each group's start and never cross its end, then rows past the last group form "tail" panels;
// the panel of a CTA is found by a block scan of offs on the device (no host sync; offs is
// clamped exactly like groups_from_offsets, so nothing is ever read or written out of bounds).
// Every 32x1/128x1/128x128 block then lies inside one tile, and each 128-row panel x 128-column
// tile maps to exactly one 512-byte block of every blocked scale layout.
//
// Thread layout (512 threads): thread t owns columns 8*(t%16) .. +7 of rows 4*(t/16) .. +3, loaded
// as 16-byte vectors. Rowwise amaxes reduce across 4 (1x32) or 16 (1x128) lanes with shuffles;
// columnwise amaxes reduce over the thread's 4 rows, then across the warp (xor 16) and across warps
// through shared memory. Codes go out as 8-byte stores in x's orientation; transposed outputs are
// staged in a swizzled shared tile and leave as full 4-byte words per lane (128 B per warp).
#include "cuda/quantize/kernels.cuh"

namespace mxmoe {
namespace cuda {
namespace {

struct Smem {
  ScanSmem scan;
  long long covered, tot_panels;
  long long g_start, g_end, g_p0, g_b0, g_np;
  int found;
  uint8_t tile_byte;
  uint32_t red[16];
  uint32_t srow[128];  // rowwise scale bytes of the tile: 4 per row (one per 32 columns)
  uint32_t scol[128];  // columnwise scale bytes: 4 per column (one per 32-row run)
};

// One tile: rows [r0, r1) of batch entry b, columns [128 ct, +128).
struct TileInfo {
  int b, p, ct;
  int r0, r1;
  int run0, gp0, gnp;  // first scale_r run of the panel; its group's first panel and panel count
  bool in_group, valid;
};

// ---- tiles -------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait(int pending) {
  if (pending >= 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Tile index -> rows. Uniform over the CTA; without a shared group table it scans offs (syncs).
__device__ __forceinline__ TileInfo resolve(const Params& P, Smem& sm, const int* table, long long tile) {
  TileInfo t{};
  t.valid = false;
  if (tile >= P.tiles) return t;
  {
    // 32-bit index math (the host guarantees tiles < 2^31).
    const int ti = static_cast<int>(tile), per_b = P.P * P.ctiles;
    t.b = ti / per_b;
    const int u = ti - t.b * per_b;
    if (P.order == 0) {
      t.p = u / P.ctiles;
      t.ct = u - t.p * P.ctiles;
    } else {
      // 8 panels x 8 column tiles per super-tile: x rows are read in 2 KB runs (8 tiles of 256 B)
      // and transposed outputs written in 1 KB runs per row, both DRAM-page friendly.
      const int sp = u / (8 * P.ctiles);
      const int v = u - sp * 8 * P.ctiles;
      const int h = min(8, P.P - 8 * sp);
      const int sc = v / (8 * h);
      const int y = v - sc * 8 * h;
      const int w = min(8, P.ctiles - 8 * sc);
      const int py = y / w;
      t.p = 8 * sp + py;
      t.ct = 8 * sc + (y - py * w);
    }
  }
  if (!P.grouped) {
    t.r0 = 128 * t.p;
    t.r1 = min(P.R, t.r0 + 128);
    t.run0 = t.r0 / 32;
    t.gp0 = 0;
    t.gnp = P.P;
    t.in_group = true;
  } else {
    long long start = 0, end = 0, p0 = 0, b0 = 0, np = 0;
    bool found = false;
    if (P.table) {
      if (t.p < sm.tot_panels) {
        const int* tstart = table;
        const int* tp0 = table + kMaxTable;
        const int* tb0 = table + 2 * kMaxTable;
        const int lo = table_group(tp0, P.G, t.p);
        start = tstart[lo];
        end = lo + 1 < P.G ? tstart[lo + 1] : sm.covered;
        p0 = tp0[lo];
        b0 = tb0[lo];
        np = (lo + 1 < P.G ? tp0[lo + 1] : sm.tot_panels) - p0;
        found = true;
      }
    } else {
      __syncthreads();
      if (threadIdx.x == 0) sm.found = 0;
      const int p = t.p;
      scan_groups<NT>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
        if (p >= gi.p0 && p < gi.p0 + gi.panels) {
          sm.found = 1;
          sm.g_start = gi.start;
          sm.g_end = gi.end;
          sm.g_p0 = gi.p0;
          sm.g_b0 = gi.b0;
          sm.g_np = gi.panels;
        }
      });
      found = sm.found != 0;
      start = sm.g_start;
      end = sm.g_end;
      p0 = sm.g_p0;
      b0 = sm.g_b0;
      np = sm.g_np;
    }
    if (found) {
      t.r0 = static_cast<int>(start + 128 * (t.p - p0));
      t.r1 = static_cast<int>(min(end, static_cast<long long>(t.r0) + 128));
      t.run0 = static_cast<int>(b0 + 4 * (t.p - p0));
      t.gp0 = static_cast<int>(p0);
      t.gnp = static_cast<int>(np);
      t.in_group = true;
    } else {
      const long long r0 = sm.covered + 128 * (t.p - sm.tot_panels);
      t.r0 = static_cast<int>(min(r0, static_cast<long long>(P.R)));
      t.r1 = static_cast<int>(min(static_cast<long long>(P.R), r0 + 128));
      t.in_group = false;
    }
  }
  t.valid = t.r0 < t.r1 && P.C - 128 * t.ct > 0;
  return t;
}

__device__ __forceinline__ bool needs_x(const Params& P, const TileInfo& t) {
  return t.valid && (P.row_block > 0 || ((P.tile || P.col_block > 0) && t.in_group));
}

// Issue this thread's 16-byte copies of tile t into its private slots (zero-filled past the edges).
template <typename In>
__device__ __forceinline__ void prefetch(const Params& P, const TileInfo& t, uint8_t* slot) {
  if (!P.x_vec || !needs_x(P, t)) return;
  const int tid = threadIdx.x, lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
  const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
  const In* xb = static_cast<const In*>(P.x) +
                 ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
  constexpr int kPer = 16 / static_cast<int>(sizeof(In));  // elements per 16-byte chunk
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool rok = lr0 + i < rows;
    const In* src = xb + static_cast<long long>(lr0 + i) * P.C;
#pragma unroll
    for (int h = 0; h < 8 / kPer; ++h) {
      const bool ok = rok && cvalid >= kPer * (h + 1);
      cp_async16(slot + ((i * (8 / kPer) + h) * NT + tid) * 16, ok ? static_cast<const void*>(src + kPer * h) : P.x,
                 ok ? 16 : 0);
    }
  }
}

// ---- computed inputs (mxmoe_quantize_fused_source; the SwiGLU values come from quantize/source.cuh) ----
// The thread's chunk (row r, logical columns c .. c+7, cvalid of them valid) of the computed input
// into row i of f: the values the CPU reference materializes (cpu/fused.cpp), bit for bit.
template <typename In>
__device__ __forceinline__ void load_source_row(const Params& P, Frag<In>& f, int i, long long r, long long c,
                                                int cvalid) {
  if (P.src.kind == MXMOE_SOURCE_GATHER) {
    const long long e = gather_entry(P.src, r);
    if (e < 0) return;  // a padding row (or nothing to gather): f's row stays zero
    f.load(i, static_cast<const In*>(P.x) + (e / P.src.k) * P.C + c, cvalid, P.x_vec);
    if (P.src.row_scale != nullptr) {
      const float sc = __ldg(P.src.row_scale + e);
      float v[8];
      f.values(i, v);
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = mul_rn(v[q], sc);
      f.set(i, v);
    }
    return;
  }
  // SWIGLU / SWIGLU_BACKWARD: bf16 only, C % 8 == 0 (checked on the host), so cvalid >= 8 here.
  float v[8];
  swiglu_source8(static_cast<const uint16_t*>(P.x), P.C, P.src, r, c, v);
  f.set(i, v);
}

// ---- one tile ---------------------------------------------------------------------------------------
template <typename In>
__device__ __forceinline__ void process_tile(const Params& P, Smem& sm, uint32_t* dsm, const TileInfo& t,
                                             const Frag<In>& f) {
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4, lane = tid & 31, warp = tid >> 5;
  const int b = t.b;
  const long long p = t.p, ct = t.ct;
  const long long c0 = 128 * ct;
  const int r0 = t.r0;
  const int cols = static_cast<int>(min(128LL, P.C - c0));
  const int rows = t.r1 - t.r0;
  const bool in_group = t.in_group;
  const int lr0 = 4 * rs;        // first local row of this thread
  const int lc = 8 * cc;         // first local column
  const int cvalid = cols - lc;  // valid columns of this thread's chunk (<= 0: none)
  const bool col_q = P.tile || P.col_block > 0;
  const bool row_q = P.row_block > 0;

  // ---- rowwise quantization (1 x row_block) ----
  uint2 rq[4];
  uint32_t rsb = 0;  // scale byte of each of the thread's 4 rows (byte i)
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
      const uint8_t s = e8m0_from_amax_bits(m, static_cast<mxmoe_scale_mode>(P.mode));
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

  // ---- columnwise / tile quantization ----
  uint2 cq[4];
  uint32_t csb[2] = {0, 0};  // scale byte of each of the thread's 8 columns (byte j&3 of word j>>2)
  if (col_q) {
    if (in_group) {
      uint32_t m[8];
      f.col_amax(m);
#pragma unroll
      for (int e = 0; e < 8; ++e) m[e] = max(m[e], __shfl_xor_sync(kFull, m[e], 16));
      uint32_t* colpart = dsm;  // [16 warps][128 columns]
      if (lane < 16) {
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc) = make_uint4(m[0], m[1], m[2], m[3]);
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc + 4) = make_uint4(m[4], m[5], m[6], m[7]);
      }
      __syncthreads();
      uint8_t* scolb = reinterpret_cast<uint8_t*>(sm.scol);
      const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(P.mode);
      if (P.tile) {
        if (tid < 128) {
          uint32_t a = 0;
#pragma unroll
          for (int w = 0; w < 16; ++w) a = max(a, colpart[w * 128 + tid]);
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(kFull, a, o));
          if (lane == 0) sm.red[warp] = a;
        }
        __syncthreads();
        const uint8_t s = e8m0_from_amax_bits(max(max(sm.red[0], sm.red[1]), max(sm.red[2], sm.red[3])), mode);
        if (tid == 0) sm.tile_byte = s;
        if (tid < 128) sm.scol[tid] = s * 0x01010101u;
        csb[0] = csb[1] = s * 0x01010101u;
      } else {
        if (P.col_block == 32) {
          const int k = tid >> 7, c = tid & 127;
          const uint32_t a = max(max(colpart[(4 * k) * 128 + c], colpart[(4 * k + 1) * 128 + c]),
                                 max(colpart[(4 * k + 2) * 128 + c], colpart[(4 * k + 3) * 128 + c]));
          scolb[c * 4 + k] = e8m0_from_amax_bits(a, mode);
        } else if (tid < 128) {
          uint32_t a = 0;
#pragma unroll
          for (int w = 0; w < 16; ++w) a = max(a, colpart[w * 128 + tid]);
          sm.scol[tid] = e8m0_from_amax_bits(a, mode) * 0x01010101u;
        }
        __syncthreads();
        // Byte k of the 8 column words (lc..lc+7): the scale of this thread's 32-run.
        const int k = rs >> 3;
        const uint4 a = *reinterpret_cast<const uint4*>(sm.scol + lc);
        const uint4 c = *reinterpret_cast<const uint4*>(sm.scol + lc + 4);
        const uint32_t sel = static_cast<uint32_t>(k | ((k + 4) << 4));  // byte k of x, byte k of y
        csb[0] = __byte_perm(__byte_perm(a.x, a.y, sel), __byte_perm(a.z, a.w, sel), 0x5410);
        csb[1] = __byte_perm(__byte_perm(c.x, c.y, sel), __byte_perm(c.z, c.w, sel), 0x5410);
      }
      // NaN scale bytes (0xFF) -> those columns' codes are 0x7F.
      uint32_t mk[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t z = ~csb[h];  // 0x00 bytes where the scale byte is 0xFF
        mk[h] = __vcmpeq4(z, 0u);
      }
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
      // Rows past the last group: zeros (scale byte 0 dequantizes them to +0).
#pragma unroll
      for (int i = 0; i < 4; ++i) cq[i] = make_uint2(0, 0);
      if (tid < 128) sm.scol[tid] = 0;
      if (P.tile && tid == 0) sm.tile_byte = 0;
    }
    __syncthreads();  // scol / tile_byte visible to every thread
  }

  // ---- outputs of one side ----
  // is_row: rowwise side (scale_c, blocked by rows); else columnwise side (scale_r).
  auto emit = [&](const SideP& S, bool is_row, const uint2(&qd)[4], bool per_row_scale) {
    auto scale_of = [&](int i, int j) -> uint8_t {
      return static_cast<uint8_t>(per_row_scale ? (rsb >> (8 * i)) : (csb[j >> 2] >> (8 * (j & 3))));
    };
    const long long xrow0 = static_cast<long long>(b) * P.R + r0;  // (b, r0) row index in (B*R)
    if (S.q) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lr0 + i < rows) store_q8(S.q + (xrow0 + lr0 + i) * P.C + c0 + lc, qd[i], cvalid, S.q_vec);
    }
    if (S.dq) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (lr0 + i < rows) {
          uint8_t s8[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) s8[j] = scale_of(i, j);
          float v[8];
          dequant8(qd[i], s8, v);
          store_f8(S.dq, (xrow0 + lr0 + i) * P.C + c0 + lc, v, cvalid, S.dq_f32, S.dq_vec);
        }
      }
    }
    const long long xcol0 = static_cast<long long>(b) * P.C + c0;  // (b, c0) row index in (B*C)
    if (S.qt) {
      uint32_t w[8][1];
      codes_by_column(qd, w);
      transpose_store<1>(dsm, S.qt + xcol0 * P.R + r0, P.R, rows, cols, w);
    }
    if (S.dqt) {
      float v[4][8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint8_t s8[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) s8[j] = scale_of(i, j);
        dequant8(qd[i], s8, v[i]);
      }
      if (S.dqt_f32) {
        uint32_t w[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) w[j][i] = __float_as_uint(canon_f32(v[i][j]));
        transpose_store<4>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 4, P.R, rows, cols, w);
      } else {
        uint32_t w[8][2];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          w[j][0] = pack_bf16x2(v[0][j], v[1][j]);
          w[j][1] = pack_bf16x2(v[2][j], v[3][j]);
        }
        transpose_store<2>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 2, P.R, rows, cols, w);
      }
    }
    if (is_row && (S.scale || S.blocked)) {
      // srow: byte j of row i = scale of columns 32j..32j+31 of the tile.
      if (P.tile) {
        if (tid < 128) sm.srow[tid] = sm.tile_byte * 0x01010101u;
      } else if ((cc & 3) == 0) {
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
        if (S.sc_vec && nj == 4) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int j = 0; j < nj; ++j) d[j] = static_cast<uint8_t>(val >> (8 * j));
        }
      }
      if (S.blocked && in_group && tid < 128) {
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_M) blk = p * P.ctiles + ct;
        else blk = (static_cast<long long>(b) * P.P + p) * P.ctiles + ct;
        const int i = (tid & 3) * 32 + (tid >> 2);
        const uint32_t val = i < rows ? (sm.srow[i] & jmask) : 0u;
        uint8_t* d = S.blocked + blk * 512 + 4 * tid;
        if ((reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int k = 0; k < 4; ++k) d[k] = static_cast<uint8_t>(val >> (8 * k));
        }
      }
    }
    if (!is_row && in_group && (S.scale || S.blocked)) {
      // scol: byte k of column c = scale of rows 32k..32k+31 of the panel.
      const int nruns = (rows + 31) / 32;
      const uint32_t kmask = nruns >= 4 ? 0xFFFFFFFFu : ((1u << (8 * nruns)) - 1u);
      if (S.scale && tid < cols) {
        uint8_t* d = S.scale + (xcol0 + tid) * P.n_r + t.run0;
        const uint32_t val = sm.scol[tid];
        if (nruns == 4 && (reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int k = 0; k < nruns; ++k) d[k] = static_cast<uint8_t>(val >> (8 * k));
        }
      }
      if (S.blocked && tid < 128) {
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_K) blk = static_cast<long long>(t.gp0) * P.ctiles + ct * t.gnp + (p - t.gp0);
        else blk = (static_cast<long long>(b) * P.ctiles + ct) * P.P + p;
        const int i = (tid & 3) * 32 + (tid >> 2);
        const uint32_t val = i < cols ? (sm.scol[i] & kmask) : 0u;
        uint8_t* d = S.blocked + blk * 512 + 4 * tid;
        if ((reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int k = 0; k < 4; ++k) d[k] = static_cast<uint8_t>(val >> (8 * k));
        }
      }
    }
  };

  if (P.row_on) {
    if (P.tile) emit(P.row, true, cq, false);  // the rowwise view of the tile quantization
    else emit(P.row, true, rq, true);
  }
  if (P.col_on) emit(P.col, false, cq, false);
}

// ---- the kernel: persistent CTAs, x tiles prefetched with cp.async ----------------------------------
template <typename In, int S>
__global__ void __launch_bounds__(NT, 2) quant_tile_kernel(const __grid_constant__ Params P) {
  extern __shared__ uint4 dyn_smem_[];
  constexpr int kStage = 16 * Frag<In>::kChunks * NT;  // bytes of one x tile
  uint8_t* stage_base = reinterpret_cast<uint8_t*>(dyn_smem_);
  uint32_t* dsm = reinterpret_cast<uint32_t*>(stage_base + S * kStage);
  int* table = reinterpret_cast<int*>(stage_base + S * kStage + P.tr_bytes);
  __shared__ Smem sm;
  const int tid = threadIdx.x;

  // ---- setup: groups (once per CTA), then what no tile writes ----
  if (P.grouped) {
    const ScanTotals tot = scan_groups<NT>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
      if (P.table) {
        table[gi.g] = static_cast<int>(gi.start);
        table[kMaxTable + gi.g] = static_cast<int>(gi.p0);
        table[2 * kMaxTable + gi.g] = static_cast<int>(gi.b0);
      }
    });
    if (tid == 0) {
      sm.covered = tot.covered;
      sm.tot_panels = tot.panels;
    }
    // Unused grouped scale_r entries and the blocked tails, split over all CTAs (2D only).
    if (P.col_on && P.col.scale != nullptr && P.n_r > tot.blocks) {
      long long lo, hi;
      grid_share(P.C, lo, hi);
      for (long long c = lo; c < hi; ++c) zero_bytes_cta<NT>(P.col.scale + c * P.n_r, tot.blocks, P.n_r);
    }
    const long long from = tot.panels * 512 * P.ctiles;
    if (P.row_on && P.row.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.row.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NT>(P.row.blocked, from + lo, from + hi);
    }
    if (P.col_on && P.col.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.col.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NT>(P.col.blocked, from + lo, from + hi);
    }
    __syncthreads();
  }

  if (S == 0) {
    // Direct: each tile's x chunks are loaded into registers (16-byte __ldg, all issued first).
    for (long long tile = blockIdx.x; tile < P.tiles; tile += gridDim.x) {
      const TileInfo t = resolve(P, sm, table, tile);
      if (!t.valid) continue;  // uniform
      Frag<In> f;
      f.zero();
      if (needs_x(P, t)) {
        const int lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
        const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
        if (P.src.kind != 0) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (lr0 + i < rows && cvalid > 0) load_source_row<In>(P, f, i, t.r0 + lr0 + i, 128LL * t.ct + lc, cvalid);
        } else {
          const In* xb = static_cast<const In*>(P.x) +
                         ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (lr0 + i < rows && cvalid > 0) f.load(i, xb + static_cast<long long>(lr0 + i) * P.C, cvalid, P.x_vec);
        }
      }
      process_tile<In>(P, sm, dsm, t, f);
      __syncthreads();  // shared scratch (scales, partials, transposes) is reused by the next tile
    }
    return;
  }
  // ---- pipeline: S-1 tiles in flight ahead of the one being processed (cp.async) ----
  constexpr int SS = S > 1 ? S : 2;
  const long long step = gridDim.x;
#pragma unroll
  for (int s = 0; s < SS - 1; ++s) {
    const TileInfo tn = resolve(P, sm, table, blockIdx.x + s * step);
    prefetch<In>(P, tn, stage_base + s * kStage);
    cp_async_commit();
  }
  int slot = 0;
  for (long long tile = blockIdx.x; tile < P.tiles; tile += step) {
    const TileInfo t = resolve(P, sm, table, tile);
    cp_async_wait(SS - 2);
    Frag<In> f;
    f.zero();
    if (needs_x(P, t)) {
      if (P.x_vec) {
        f.from_smem(stage_base + slot * kStage);
      } else {
        const int lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
        const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
        const In* xb = static_cast<const In*>(P.x) +
                       ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (lr0 + i < rows && cvalid > 0) f.load(i, xb + static_cast<long long>(lr0 + i) * P.C, cvalid, false);
      }
    }
    {
      const int nslot = slot + SS - 1 >= SS ? slot - 1 : slot + SS - 1;  // (slot + S - 1) % S
      const TileInfo tn = resolve(P, sm, table, tile + (SS - 1) * step);
      prefetch<In>(P, tn, stage_base + nslot * kStage);
      cp_async_commit();
    }
    if (t.valid) process_tile<In>(P, sm, dsm, t, f);
    slot = slot + 1 == SS ? 0 : slot + 1;
    __syncthreads();  // shared scratch (scales, partials, transposes) is reused by the next tile
  }
  cp_async_wait(0);
}

template <typename In>
void launch_typed(Params& p, int device, cudaStream_t stream) {
  if (p.tiles <= 0) return;
  int e = 0;
  for (const SideP* s : {&p.row, &p.col}) {
    if (s->qt) e = std::max(e, 1);
    if (s->dqt) e = std::max(e, s->dqt_f32 ? 4 : 2);
  }
  p.tr_bytes = std::max(8192, e * 16384);
  p.stage_bytes = 16 * Frag<In>::kChunks * NT;
  const int table_bytes = p.table ? 3 * kMaxTable * 4 : 0;
  const int sms = sm_count(device);
  auto occupancy = [&](auto kernel, int stages) {
    return cuda::occupancy(kernel, device, NT, stages * p.stage_bytes + p.tr_bytes + table_bytes);
  };
  static int max_smem_cached = -1;  // the same for every device of one machine (H200s)
  int max_smem = max_smem_cached;
  if (max_smem < 0) {
    cuda_check(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "quantize: attribute");
    max_smem_cached = max_smem;
  }
  const int fixed = p.tr_bytes + table_bytes + static_cast<int>(sizeof(Smem));
  // p.stages as routed (quantize_route.hpp): 0 direct register loads, or the cp.async pipeline's depth.
  if (p.stages == 3 && 3 * p.stage_bytes + fixed > max_smem) p.stages = 2;
  if (p.stages != 0 && p.stages != 3) p.stages = 2;
  int blocks = 0;
  if (p.stages == 3) blocks = occupancy(quant_tile_kernel<In, 3>, 3);
  else if (p.stages == 2) blocks = occupancy(quant_tile_kernel<In, 2>, 2);
  else blocks = occupancy(quant_tile_kernel<In, 0>, 0);
  if (blocks < 1) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: kernel does not fit on the device");
  const int smem = p.stages * p.stage_bytes + p.tr_bytes + table_bytes;
  const long long grid = std::min<long long>(p.tiles, static_cast<long long>(blocks) * sms);
  if (p.stages == 3) quant_tile_kernel<In, 3><<<static_cast<unsigned>(grid), NT, smem, stream>>>(p);
  else if (p.stages == 2) quant_tile_kernel<In, 2><<<static_cast<unsigned>(grid), NT, smem, stream>>>(p);
  else quant_tile_kernel<In, 0><<<static_cast<unsigned>(grid), NT, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "quantize: kernel launch");
}

}  // namespace

namespace quant {

void launch_tile(Params& p, bool bf16, int device, cudaStream_t stream) {
  if (bf16) launch_typed<uint16_t>(p, device, stream);
  else launch_typed<float>(p, device, stream);
}

}  // namespace quant
}  // namespace cuda
}  // namespace mxmoe
