// CUDA blocked ("swizzled") scale layouts, the formula of docs/design/mx-format.md
//   S[i][j] -> ((i/128) * (Wp/4) + j/4) * 512 + (i%32) * 16 + ((i%128)/32) * 4 + j%4
// for every layout kind (WHOLE, GROUPS_M, GROUPS_K, PER_EXPERT), both directions.
//
// As on the CPU, a kind is a list of segments (sub-matrices blocked as a whole at their own byte
// offset, back to back from byte 0). A CTA moves one "unit": 128 rows (a band) by 128 columns (32
// 512-byte blocks) of one segment, staged in shared memory (rows padded to 33 words, so the
// gather of 4 rows 32 apart is conflict-free): coalesced reads of the scale rows, 16-byte stores
// of whole blocks (or the reverse). Group segments come from a block scan of offs on the device
// (clamped like groups_from_offsets). Bytes no segment covers are zero-filled by all CTAs together
// (blocked tails; in the inverse, scale entries outside every group).
#include "cuda/quantize/common.cuh"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

using namespace qk;

constexpr int NT = 256;
constexpr int kLd = 33;   // shared words per staged row (32 + 1 pad)
constexpr int kBlk = 32;  // 512-byte blocks per unit (128 scale columns)

struct BlkParams {
  uint8_t* scale;  // (B, H, W) contiguous
  uint8_t* blocked;
  long long size;  // blocked bytes
  int kind;
  int B;
  long long H, W, Wp, bands, chunks;
  long long m_tokens;
  const int32_t* offs;
  long long offs_stride;
  int G;
  long long umax;  // GROUPS_K: unit slots per band
  long long pmax;  // GROUPS_M: panel slots
  bool to_blocked;
  bool blk_vec;  // blocked base 16-byte aligned
};

struct Unit {
  bool valid;
  long long src;      // byte offset of the segment's (0, 0) in scale
  long long seg_rows, seg_cols;
  long long band, chunk;
  long long blk0;     // index (in 512-byte blocks) of the unit's first block in `blocked`
  int nblk;
};

struct BlkSmem {
  ScanSmem scan;
  long long g_start, g_end, g_p0, g_b0, g_np, g_u0;
  int found;
  uint32_t tile[128 * kLd];
};

__global__ void __launch_bounds__(NT) blocked_kernel(const __grid_constant__ BlkParams P) {
  __shared__ BlkSmem sm;
  const int tid = threadIdx.x;
  const long long cta = blockIdx.x;
  Unit u{};
  u.valid = false;
  if (P.kind == MXMOE_BLOCKED_WHOLE || P.kind == MXMOE_BLOCKED_PER_EXPERT) {
    const long long chunk = cta % P.chunks, band = (cta / P.chunks) % P.bands, b = cta / (P.chunks * P.bands);
    u.valid = true;
    u.src = b * P.H * P.W;
    u.seg_rows = P.H;
    u.seg_cols = P.W;
    u.band = band;
    u.chunk = chunk;
    u.blk0 = b * P.bands * (P.Wp / 4) + band * (P.Wp / 4) + chunk * kBlk;
    u.nblk = static_cast<int>(min(static_cast<long long>(kBlk), P.Wp / 4 - chunk * kBlk));
  } else {
    const bool gm = P.kind == MXMOE_BLOCKED_GROUPS_M;
    long long key, chunk = 0, band = 0;
    if (gm) {
      chunk = cta % P.chunks;
      key = cta / P.chunks;  // panel (global band) index
    } else {
      band = cta / P.umax;
      key = cta % P.umax;  // unit index among the groups' column chunks
    }
    if (tid == 0) sm.found = 0;
    const ScanTotals tot = scan_groups<NT>(P.offs, P.offs_stride, P.G, gm ? P.H : P.m_tokens, gm ? 0 : kBlk, sm.scan,
                                           [&](const GroupInfo& gi) {
                                             const long long first = gm ? gi.p0 : gi.u0;
                                             const long long n = gm ? gi.panels : gi.units;
                                             if (key >= first && key < first + n) {
                                               sm.found = 1;
                                               sm.g_start = gi.start;
                                               sm.g_end = gi.end;
                                               sm.g_p0 = gi.p0;
                                               sm.g_b0 = gi.b0;
                                               sm.g_np = gi.panels;
                                               sm.g_u0 = gi.u0;
                                             }
                                           });
    // Everything no segment covers: the blocked tail, or (inverse) scale entries of no group.
    const long long covered_bytes = gm ? 128 * tot.panels * P.Wp : 4 * tot.panels * (128 * P.bands);
    long long lo, hi;
    if (P.to_blocked) {
      grid_share(max(0LL, P.size - covered_bytes), lo, hi, 16);
      zero_bytes_cta<NT>(P.blocked, covered_bytes + lo, covered_bytes + hi);
    } else if (gm) {
      const long long from = tot.covered * P.W;
      grid_share(max(0LL, P.H * P.W - from), lo, hi, 16);
      zero_bytes_cta<NT>(P.scale, from + lo, from + hi);
    } else if (tot.blocks < P.W) {
      grid_share(P.H, lo, hi);
      for (long long r = lo; r < hi; ++r) zero_bytes_cta<NT>(P.scale + r * P.W, tot.blocks, P.W);
    }
    if (sm.found) {
      u.valid = true;
      if (gm) {
        u.src = sm.g_start * P.W;
        u.seg_rows = sm.g_end - sm.g_start;
        u.seg_cols = P.W;
        u.band = key - sm.g_p0;
        u.chunk = chunk;
        u.blk0 = key * (P.Wp / 4) + chunk * kBlk;
        u.nblk = static_cast<int>(min(static_cast<long long>(kBlk), P.Wp / 4 - chunk * kBlk));
      } else {
        const long long np = sm.g_np;  // Wp_g / 4
        u.src = sm.g_b0;
        u.seg_rows = P.H;
        u.seg_cols = (sm.g_end - sm.g_start + 31) / 32;
        u.band = band;
        u.chunk = key - sm.g_u0;
        u.blk0 = sm.g_p0 * P.bands + band * np + u.chunk * kBlk;
        u.nblk = static_cast<int>(min(static_cast<long long>(kBlk), np - u.chunk * kBlk));
      }
    }
  }
  if (!u.valid || u.nblk <= 0) return;  // uniform per CTA

  const long long row0 = u.band * 128, col0 = u.chunk * 128;
  uint32_t* T = sm.tile;
  uint8_t* blk = P.blocked + u.blk0 * 512;
  if (P.to_blocked) {
    // 128 rows x 128 bytes: thread t moves 16 bytes of rows (t >> 3) + 32k.
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int row = (tid >> 3) + 32 * k, quad = tid & 7;
      const long long gr = row0 + row, gc = col0 + 16 * quad;
      uint32_t w[4] = {0, 0, 0, 0};
      if (gr < u.seg_rows && gc < u.seg_cols) {
        const uint8_t* s = P.scale + u.src + gr * P.W + gc;
        if (gc + 16 <= u.seg_cols && aligned(s, 16)) {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(s));
          w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
        } else {
          for (int e = 0; e < 16; ++e)
            if (gc + e < u.seg_cols) w[e >> 2] |= static_cast<uint32_t>(__ldg(s + e)) << (8 * (e & 3));
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) T[row * kLd + 4 * quad + e] = w[e];
    }
    __syncthreads();
    for (int id = tid; id < u.nblk * 32; id += NT) {
      const int b = id >> 5, r = id & 31;
      const uint4 v = make_uint4(T[r * kLd + b], T[(32 + r) * kLd + b], T[(64 + r) * kLd + b], T[(96 + r) * kLd + b]);
      uint8_t* d = blk + b * 512 + r * 16;
      if (P.blk_vec) {
        *reinterpret_cast<uint4*>(d) = v;
      } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        for (int e = 0; e < 16; ++e) d[e] = static_cast<uint8_t>(w[e >> 2] >> (8 * (e & 3)));
      }
    }
  } else {
    for (int id = tid; id < u.nblk * 32; id += NT) {
      const int b = id >> 5, r = id & 31;
      const uint8_t* s = blk + b * 512 + r * 16;
      uint32_t w[4];
      if (P.blk_vec) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(s));
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
      } else {
        for (int q = 0; q < 4; ++q) {
          w[q] = 0;
          for (int e = 0; e < 4; ++e) w[q] |= static_cast<uint32_t>(__ldg(s + 4 * q + e)) << (8 * e);
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) T[(32 * q + r) * kLd + b] = w[q];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int row = (tid >> 3) + 32 * k, quad = tid & 7;
      const long long gr = row0 + row, gc = col0 + 16 * quad;
      if (gr < u.seg_rows && gc < u.seg_cols) {
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = T[row * kLd + 4 * quad + e];
        uint8_t* d = P.scale + u.src + gr * P.W + gc;
        if (gc + 16 <= u.seg_cols && aligned(d, 16)) {
          *reinterpret_cast<uint4*>(d) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
          for (int e = 0; e < 16; ++e)
            if (gc + e < u.seg_cols) d[e] = static_cast<uint8_t>(w[e >> 2] >> (8 * (e & 3)));
        }
      }
    }
  }
}

void run_blocked(const BlockedArgs& a, bool to_blocked) {
  BlkParams p{};
  p.scale = static_cast<uint8_t*>(a.scale.data);
  p.blocked = static_cast<uint8_t*>(a.blocked.data);
  p.size = a.blocked.shape[0];
  p.kind = a.kind;
  p.B = static_cast<int>(a.scale.shape[0]);
  p.H = a.scale.shape[1];
  p.W = a.scale.shape[2];
  p.offs = a.offs.present ? static_cast<const int32_t*>(a.offs.t.data) : nullptr;
  p.G = a.offs.present ? static_cast<int>(a.offs.t.shape[0]) : 0;
  p.offs_stride = a.offs.present ? a.offs.t.strides[0] : 1;
  p.m_tokens = a.m_tokens;
  p.to_blocked = to_blocked;
  p.blk_vec = aligned(p.blocked, 16);
  long long grid = 0;
  switch (a.kind) {
    case MXMOE_BLOCKED_WHOLE:
    case MXMOE_BLOCKED_PER_EXPERT:
      p.Wp = (p.W + 3) / 4 * 4;
      p.bands = cdiv(p.H, 128);
      p.chunks = cdiv(p.Wp, 128);
      grid = p.B * p.bands * p.chunks;
      break;
    case MXMOE_BLOCKED_GROUPS_M:
      p.Wp = (p.W + 3) / 4 * 4;
      p.bands = cdiv(p.H, 128);
      p.chunks = cdiv(p.Wp, 128);
      p.pmax = cdiv(p.H, 128) + p.G + 1;
      grid = p.chunks > 0 ? p.pmax * p.chunks : 0;
      // No columns: the buffer is empty, and in the inverse the scale is empty too.
      break;
    case MXMOE_BLOCKED_GROUPS_K:
      p.bands = cdiv(p.H, 128);
      p.umax = cdiv(cdiv(p.m_tokens, 128) + p.G, kBlk) + p.G;
      grid = p.bands * p.umax;
      break;
  }
  if (grid <= 0) return;
  if (grid > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "blocked scales: tensor too large for one launch");
  DeviceGuard guard(a.scale.device);
  blocked_kernel<<<static_cast<unsigned>(grid), NT, 0, static_cast<cudaStream_t>(a.stream)>>>(p);
  cuda_check(cudaGetLastError(), "blocked scales: kernel launch");
}

}  // namespace

void scales_to_blocked(const BlockedArgs& a) { run_blocked(a, true); }
void scales_from_blocked(const BlockedArgs& a) { run_blocked(a, false); }

}  // namespace cuda
}  // namespace mxmoe
