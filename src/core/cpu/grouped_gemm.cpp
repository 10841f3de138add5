// Grouped GEMMs on MX operands, the CPU reference: operands are dequantized to fp32 once per group
// (bit-identical to mxmoe::dequantize_element), then a cache-blocked fp32 GEMM accumulates in fp32.
//
// Both entry points reduce to the same per-group product C (rows x cols) = X (rows x L) . Y^T with
// X row-major and Y stored transposed (L x cols) so the inner loop runs along contiguous output
// columns: a multiply and an add per element with no reduction, which vectorizes without
// reassociation (the build forbids fast-math and FMA contraction). Each output element is summed
// over L in order 0..L-1, and the tiling does not depend on the thread count, so results are
// deterministic whatever MXMOE_NUM_THREADS is.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "common/moe_activation.hpp"
#include "common/parallel.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cpu {
namespace {

constexpr int64_t kMR = 6;    // micro-tile rows (register blocking)
constexpr int64_t kNR = 16;   // micro-tile columns; Y^T rows are padded to a multiple of this
constexpr int64_t kMC = 72;   // rows per task
constexpr int64_t kNC = 256;  // columns per task
constexpr int64_t kKC = 256;  // reduction slice kept hot in cache

// Eight floats; the unaligned, aliasing variant is how memory is read and written.
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_u __attribute__((vector_size(32), aligned(4), may_alias));

// c[r][0..16) += sum_{l<len} x[r*ldx + l] * y[l*16 + 0..16) for r < ROWS, c row stride ldc.
// Accumulators live in registers across the slice; loading the running sum from c and continuing
// keeps the summation order sequential in l. Compiled for AVX2 where available.
template <int ROWS>
// target_clones needs ifunc (Linux); clang supports it on templates from clang 15 on.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && (!defined(__clang__) || __clang_major__ >= 15)
__attribute__((target_clones("avx2", "default")))
#endif
void micro_kernel(const float* x, int64_t ldx, const float* y, float* c, int64_t ldc, int64_t len) {
  v8f acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    acc[r][0] = *reinterpret_cast<const v8f_u*>(c + r * ldc);
    acc[r][1] = *reinterpret_cast<const v8f_u*>(c + r * ldc + 8);
  }
  for (int64_t l = 0; l < len; ++l) {
    const v8f y0 = *reinterpret_cast<const v8f_u*>(y + l * kNR);
    const v8f y1 = *reinterpret_cast<const v8f_u*>(y + l * kNR + 8);
    for (int r = 0; r < ROWS; ++r) {
      const float xv = x[r * ldx + l];
      acc[r][0] += xv * y0;
      acc[r][1] += xv * y1;
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    *reinterpret_cast<v8f_u*>(c + r * ldc) = acc[r][0];
    *reinterpret_cast<v8f_u*>(c + r * ldc + 8) = acc[r][1];
  }
}

void micro(int64_t rows, const float* x, int64_t ldx, const float* y, float* c, int64_t ldc,
           int64_t len) {
  switch (rows) {
    case 6: micro_kernel<6>(x, ldx, y, c, ldc, len); break;
    case 5: micro_kernel<5>(x, ldx, y, c, ldc, len); break;
    case 4: micro_kernel<4>(x, ldx, y, c, ldc, len); break;
    case 3: micro_kernel<3>(x, ldx, y, c, ldc, len); break;
    case 2: micro_kernel<2>(x, ldx, y, c, ldc, len); break;
    default: micro_kernel<1>(x, ldx, y, c, ldc, len); break;
  }
}

// Y^T is stored as panels of kNR columns, each panel (len x kNR) contiguous: element (l, c) at
// (c / kNR) * len * kNR + l * kNR + c % kNR. A micro-kernel then streams one contiguous block
// instead of rows a power-of-two stride apart, which would all land in the same cache sets.
inline int64_t panel_index(int64_t l, int64_t c, int64_t len) {
  return (c / kNR) * len * kNR + l * kNR + c % kNR;
}

// C = X (rows x len, row stride len) . Yt (len x cols, in panels, cols padded to kNR), then
// store(row, col0, values, count) for each row of each output tile.
template <typename Store>
void gemm(const float* x, const float* yt, int64_t rows, int64_t cols, int64_t len, Store store) {
  const int64_t cols_p = round_up(cols, kNR);
  const int64_t mt = cdiv(rows, kMC), nt = cdiv(cols, kNC);
  // Enough work per thread to pay for starting it (~100k multiply-adds).
  const int64_t task_work = std::max<int64_t>(1, std::min(rows, kMC) * std::min(cols_p, kNC) * len);
  parallel_for(mt * nt, std::max<int64_t>(1, (1 << 17) / task_work), [&](int64_t lo, int64_t hi) {
    std::vector<float> tile(static_cast<size_t>(kMC * kNC));
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t m0 = (t / nt) * kMC, n0 = (t % nt) * kNC;
      const int64_t mr = std::min(kMC, rows - m0), nc = std::min(kNC, cols_p - n0);
      std::fill(tile.begin(), tile.begin() + kMC * kNC, 0.0f);
      for (int64_t l0 = 0; l0 < len; l0 += kKC) {
        const int64_t lc = std::min(kKC, len - l0);
        for (int64_t j = 0; j < nc; j += kNR)
          for (int64_t i = 0; i < mr; i += kMR)
            micro(std::min(kMR, mr - i), x + (m0 + i) * len + l0, len, yt + panel_index(l0, n0 + j, len),
                  tile.data() + i * kNC + j, kNC, lc);
      }
      const int64_t valid = std::min(nc, cols - n0);
      for (int64_t i = 0; i < mr; ++i) store(m0 + i, n0, tile.data() + i * kNC, valid);
    }
  });
}

// e4m3 code -> value, from dequantize_element at unit scale (byte 127). code value * 2^(s-127) is
// then the same single fp32 multiply dequantize_element does, so the bits are identical (NaN
// codes and the NaN scale give the canonical NaN either way), at a table lookup per element.
const float* e4m3_table() {
  static const auto table = [] {
    std::vector<float> t(256);
    for (int q = 0; q < 256; ++q) t[q] = dequantize_element(static_cast<uint8_t>(q), 127);
    return t;
  }();
  return table.data();
}

// A strided 2-D view of MX data: element (r, l) at data[r*rs + l*ls], its scale byte at
// scale[r*srs + (l/32)*sbs] (pointers already offset to the group's first element and block).
struct MxView {
  const uint8_t* data;
  int64_t rs, ls;
  const uint8_t* scale;
  int64_t srs, sbs;
  float scale_of(int64_t r, int64_t l) const { return e8m0_to_f32(scale[r * srs + (l / kBlock) * sbs]); }
};

// dst (rows x len, row-major) = dequantized v. Parallel over rows.
void dequant_rows(const MxView& v, int64_t rows, int64_t len, float* dst) {
  const float* lut = e4m3_table();
  parallel_for(rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, len)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t r = lo; r < hi; ++r)
                   for (int64_t l0 = 0; l0 < len; l0 += kBlock) {
                     const float sv = v.scale_of(r, l0);
                     const uint8_t* src = v.data + r * v.rs;
                     for (int64_t l = l0; l < std::min(len, l0 + kBlock); ++l)
                       dst[r * len + l] = lut[src[l * v.ls]] * sv;
                   }
               });
}

// dst (len x cols padded to kNR, in panels) = dequantized v (cols x len) transposed, padding
// columns zero. Works on tiles of one scale block (32 along len) by 32 columns staged in a small
// buffer, read in the source's contiguous order and written out as contiguous panel rows.
void dequant_transposed(const MxView& v, int64_t cols, int64_t len, float* dst) {
  const float* lut = e4m3_table();
  const int64_t cols_p = round_up(cols, kNR);
  if (cols == 0 || len == 0) return;  // an empty operand: nothing to transpose
  parallel_for(cdiv(len, kBlock), std::max<int64_t>(1, (1 << 16) / (kBlock * cols_p)),
               [&](int64_t lo, int64_t hi) {
                 float tile[kBlock][32];
                 float sv[32];
                 for (int64_t tl = lo; tl < hi; ++tl) {
                   const int64_t l0 = tl * kBlock, nl = std::min<int64_t>(len - l0, kBlock);
                   for (int64_t c0 = 0; c0 < cols; c0 += 32) {
                     const int64_t nc = std::min<int64_t>(cols - c0, 32);
                     for (int64_t c = 0; c < nc; ++c) sv[c] = v.scale_of(c0 + c, l0);
                     const uint8_t* src = v.data + c0 * v.rs + l0 * v.ls;
                     if (v.rs <= v.ls) {  // columns contiguous (the dgrad view of W)
                       for (int64_t l = 0; l < nl; ++l)
                         for (int64_t c = 0; c < nc; ++c) tile[l][c] = lut[src[c * v.rs + l * v.ls]] * sv[c];
                     } else {
                       for (int64_t c = 0; c < nc; ++c)
                         for (int64_t l = 0; l < nl; ++l) tile[l][c] = lut[src[c * v.rs + l * v.ls]] * sv[c];
                     }
                     for (int64_t l = 0; l < nl; ++l)
                       for (int64_t c = 0; c < nc; c += kNR)
                         std::memcpy(dst + panel_index(l0 + l, c0 + c, len), tile[l] + c,
                                     sizeof(float) * std::min(kNR, nc - c));
                   }
                   for (int64_t l = l0; l < l0 + nl; ++l)
                     for (int64_t c = cols; c < cols_p; ++c) dst[panel_index(l, c, len)] = 0.0f;
                 }
               });
}

// Row `row` of a 2-D output view from fp32 values (+ optional bias row), converted to out's dtype.
struct RowStore {
  const mxmoe_tensor& out;
  int64_t base;  // element offset of the output matrix
  const mxmoe_tensor* bias;
  int64_t bias_base;
  void operator()(int64_t row, int64_t col0, const float* v, int64_t count) const {
    float with_bias[kNC];  // count <= kNC
    if (bias != nullptr) {
      const int64_t bs = bias->strides[1];
      for (int64_t j = 0; j < count; ++j) {
        const int64_t i = bias_base + (col0 + j) * bs;
        const float b = bias->dtype == MXMOE_DTYPE_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(bias->data)[i])
                                                        : static_cast<const float*>(bias->data)[i];
        with_bias[j] = v[j] + b;
      }
      v = with_bias;
    }
    const int64_t o = base + row * out.strides[out.ndim - 2] + col0 * out.strides[out.ndim - 1];
    const int64_t cs = out.strides[out.ndim - 1];
    if (out.dtype == MXMOE_DTYPE_BF16) {
      uint16_t* dst = static_cast<uint16_t*>(out.data) + o;
      for (int64_t j = 0; j < count; ++j) dst[j * cs] = f32_to_bf16(v[j]);
    } else {
      float* dst = static_cast<float*>(out.data) + o;
      for (int64_t j = 0; j < count; ++j) dst[j * cs] = v[j];
    }
  }
};

// p + off, where an operand with no elements (K = 0) may have no storage at all: a null base stays null
// (offsetting it is undefined behaviour; nothing reads through it).
const uint8_t* at(const uint8_t* p, int64_t off) { return p == nullptr ? p : p + off; }

void zero_rows(const mxmoe_tensor& out, int64_t base, int64_t r0, int64_t r1, int64_t cols) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c)
      store_f32(out, base + r * out.strides[out.ndim - 2] + c * out.strides[out.ndim - 1], 0.0f);
}

}  // namespace

void grouped_mm(const GroupedMMArgs& a) {
  if (numel(a.out) == 0) return;  // no output element: no operand is read (they may be huge views)
  const int64_t M = a.a.shape[0], K = a.a.shape[1], N = a.b.shape[1];
  const Groups g = groups_from_offsets(a.offs, M);
  const int64_t np = round_up(N, kNR);
  std::vector<float> x, yt(static_cast<size_t>(K * np));
  const auto* A = static_cast<const uint8_t*>(a.a.data);
  const auto* As = static_cast<const uint8_t*>(a.a_scale.data);
  const auto* B = static_cast<const uint8_t*>(a.b.data);
  const auto* Bs = static_cast<const uint8_t*>(a.b_scale.data);
  for (int64_t i = 0; i < g.count(); ++i) {
    const int64_t s = g.start[i], rows = g.end[i] - s;
    if (rows == 0) continue;  // this expert's weights are not needed
    const MxView av{at(A, s * a.a.strides[0]), a.a.strides[0], a.a.strides[1],
                    at(As, s * a.a_scale.strides[0]), a.a_scale.strides[0], a.a_scale.strides[1]};
    const MxView bv{at(B, i * a.b.strides[0]), a.b.strides[1], a.b.strides[2],
                    at(Bs, i * a.b_scale.strides[0]), a.b_scale.strides[1], a.b_scale.strides[2]};
    x.resize(static_cast<size_t>(rows * K));
    dequant_rows(av, rows, K, x.data());
    dequant_transposed(bv, N, K, yt.data());
    const mxmoe_tensor* bias = a.bias.present ? &a.bias.t : nullptr;
    const int64_t bias_base = bias ? i * bias->strides[0] : 0;
    gemm(x.data(), yt.data(), rows, N, K,
         RowStore{a.out, s * a.out.strides[0], bias, bias_base});
  }
  // Rows past the last group belong to no expert.
  zero_rows(a.out, 0, g.count() ? g.end.back() : 0, M, N);
}

void grouped_mm_kgroups(const GroupedMMKArgs& a) {
  if (numel(a.out) == 0) return;  // no output element: no operand is read (they may be huge views)
  const int64_t N = a.a.shape[0], M = a.a.shape[1], K = a.b.shape[0];
  const Groups g = groups_from_offsets(a.offs, M);
  const int64_t kp = round_up(K, kNR);
  std::vector<float> x, yt;
  const auto* A = static_cast<const uint8_t*>(a.a.data);
  const auto* As = static_cast<const uint8_t*>(a.a_scale.data);
  const auto* B = static_cast<const uint8_t*>(a.b.data);
  const auto* Bs = static_cast<const uint8_t*>(a.b_scale.data);
  for (int64_t i = 0; i < g.count(); ++i) {
    const int64_t s = g.start[i], len = g.end[i] - s, base = i * a.out.strides[0];
    if (len == 0) {
      zero_rows(a.out, base, 0, N, K);
      continue;
    }
    // Group i's tokens [s, s+len); their scales start at compact block block_start[i].
    const int64_t blk = g.block_start[i];
    const MxView av{at(A, s * a.a.strides[1]), a.a.strides[0], a.a.strides[1],
                    at(As, blk * a.a_scale.strides[1]), a.a_scale.strides[0], a.a_scale.strides[1]};
    const MxView bv{at(B, s * a.b.strides[1]), a.b.strides[0], a.b.strides[1],
                    at(Bs, blk * a.b_scale.strides[1]), a.b_scale.strides[0], a.b_scale.strides[1]};
    x.resize(static_cast<size_t>(N * len));
    yt.resize(static_cast<size_t>(len * kp));
    dequant_rows(av, N, len, x.data());
    dequant_transposed(bv, K, len, yt.data());
    gemm(x.data(), yt.data(), N, K, len, RowStore{a.out, base, nullptr, 0});
  }
}

namespace {
mxmoe_tensor make_view(void* data, mxmoe_dtype dtype, std::initializer_list<int64_t> shape) {
  mxmoe_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t v : shape) t.shape[d++] = v;
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.strides[i] = stride;
    stride *= t.shape[i];
  }
  t.device = -1;
  return t;
}
}  // namespace

void grouped_mm_gather(const GroupedMMGatherArgs& ga) {
  const GroupedMMArgs& a = ga.mm;
  if (numel(a.out) == 0) return;
  const int64_t T = a.a.shape[0], K = a.a.shape[1], M = a.out.shape[0], N = a.b.shape[1], kb = K / kBlock;
  const int64_t max_index = T * ga.fanout - 1;
  // The routed rows, materialized: zero codes with scale 1.0 (127) for padding rows.
  std::vector<uint8_t> q(static_cast<size_t>(M * K), 0), sc(static_cast<size_t>(M * kb), 127);
  const auto* A = static_cast<const uint8_t*>(a.a.data);
  const auto* As = static_cast<const uint8_t*>(a.a_scale.data);
  const auto* idx = static_cast<const int32_t*>(ga.gather.data);
  std::vector<int64_t> index(static_cast<size_t>(M), -1);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = std::min<int64_t>(idx[r * ga.gather.strides[0]], max_index);
    if (i < 0) continue;
    index[r] = i;
    const int64_t src = i / ga.fanout;
    for (int64_t c = 0; c < K; ++c) q[r * K + c] = A[src * a.a.strides[0] + c * a.a.strides[1]];
    for (int64_t c = 0; c < kb; ++c) sc[r * kb + c] = As[src * a.a_scale.strides[0] + c * a.a_scale.strides[1]];
  }
  GroupedMMArgs m = a;
  m.a = make_view(q.data(), MXMOE_DTYPE_E4M3, {M, K});
  m.a_scale = make_view(sc.data(), MXMOE_DTYPE_E8M0, {M, kb});
  if (!ga.row_scale.present) {
    grouped_mm(m);
    return;
  }
  // out = row_scale[index] * (A B^T) (+ bias), in fp32 and rounded once, as the kernel's epilogue.
  std::vector<float> y(static_cast<size_t>(M * N));
  m.bias = OptTensor{};
  m.out = make_view(y.data(), MXMOE_DTYPE_F32, {M, N});
  grouped_mm(m);
  const Groups g = groups_from_offsets(a.offs, M);
  const mxmoe_tensor& rs = ga.row_scale.t;
  for (int64_t gi = 0; gi < g.count(); ++gi) {
    for (int64_t r = g.start[gi]; r < g.end[gi]; ++r) {
      const float w = index[r] < 0 ? 0.f : load_f32(rs, (index[r] / ga.fanout) * rs.strides[0] + (index[r] % ga.fanout) * rs.strides[1]);
      for (int64_t c = 0; c < N; ++c) {
        float v = y[r * N + c] * w;
        if (a.bias.present) v = v + load_f32(a.bias.t, gi * a.bias.t.strides[0] + c * a.bias.t.strides[1]);
        store_f32(a.out, r * a.out.strides[0] + c * a.out.strides[1], v);
      }
    }
  }
  zero_rows(a.out, 0, g.count() ? g.end.back() : 0, M, N);
}

void grouped_mm_bf16_gather(const Bf16GatherMMArgs& x) {
  const int64_t T = x.a.shape[0], K = x.a.shape[1], M = x.out.shape[0], N = x.out.shape[1];
  auto* out = static_cast<uint16_t*>(x.out.data);
  std::fill(out, out + M * N, uint16_t{0});  // padding rows and rows past the last group
  if (M == 0 || N == 0) return;
  const auto* A = static_cast<const uint16_t*>(x.a.data);
  const auto* B = static_cast<const uint16_t*>(x.b.data);
  const auto* idx = static_cast<const int32_t*>(x.gather.data);
  const int64_t max_index = T * x.fanout - 1;
  const Groups g = groups_from_offsets(x.offs, M);
  std::vector<int64_t> group_of(static_cast<size_t>(M), -1);
  for (int64_t gi = 0; gi < g.count(); ++gi)
    for (int64_t r = g.start[gi]; r < g.end[gi]; ++r) group_of[r] = gi;
  // B[g]'s element (n, k): (N, K) row-major, or (K, N) with b_kn.
  const int64_t sn = x.b_kn ? 1 : K, sk = x.b_kn ? N : 1;
  parallel_for(M, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> arow(static_cast<size_t>(K));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = std::min<int64_t>(idx[r], max_index);
      if (group_of[r] < 0 || i < 0) continue;
      const uint16_t* src = A + (i / x.fanout) * K;
      for (int64_t k = 0; k < K; ++k) arow[k] = bf16_to_f32(src[k]);
      const uint16_t* bg = B + group_of[r] * N * K;
      for (int64_t n = 0; n < N; ++n) {
        float acc = 0.f;
        for (int64_t k = 0; k < K; ++k) acc = std::fma(arow[k], bf16_to_f32(bg[n * sn + k * sk]), acc);
        out[r * N + n] = f32_to_bf16(acc);
      }
    }
  });
}

void grouped_mm_bf16_kgather(const Bf16KGatherMMArgs& x) {
  const int64_t G = x.out.shape[0], M = x.out.shape[1], N = x.out.shape[2], R = x.gather.shape[0];
  auto* out = static_cast<uint16_t*>(x.out.data);
  if (G * M * N == 0) return;
  const auto* A = static_cast<const uint16_t*>(x.a.data);
  const auto* B = static_cast<const uint16_t*>(x.b.data);
  const auto* idx = static_cast<const int32_t*>(x.gather.data);
  const int64_t T = (x.gather_b ? x.b : x.a).shape[0], max_index = T * x.fanout - 1;
  // Per routed row: its row of a and of b (-1: a zero row).
  std::vector<int64_t> ra(static_cast<size_t>(R)), rb(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = std::min<int64_t>(idx[r], max_index);
    const int64_t routed = i < 0 ? -1 : i / x.fanout;
    ra[r] = x.gather_b ? r : routed;
    rb[r] = x.gather_b ? routed : r;
  }
  const Groups g = groups_from_offsets(x.offs, R);
  parallel_for(G * M, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> acc(static_cast<size_t>(N));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t gi = i / M, m = i % M;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t r = g.start[gi]; r < g.end[gi]; ++r) {
        if (ra[r] < 0 || rb[r] < 0) continue;
        const float av = bf16_to_f32(A[ra[r] * M + m]);
        const uint16_t* brow = B + rb[r] * N;
        for (int64_t n = 0; n < N; ++n) acc[n] = std::fma(av, bf16_to_f32(brow[n]), acc[n]);
      }
      for (int64_t n = 0; n < N; ++n) out[i * N + n] = f32_to_bf16(acc[n]);
    }
  });
}

void grouped_mm_bf16_gather_dswiglu(const Bf16GatherDSwigluArgs& x) {
  const int64_t M = x.g.out.shape[0], I = x.g.out.shape[1], T = x.g.a.shape[0], ntw = (I + 127) / 128;
  // dY' as the gather GEMM stores it.
  std::vector<uint16_t> dy(static_cast<size_t>(M * I));
  Bf16GatherMMArgs g = x.g;
  g.out = make_view(dy.data(), MXMOE_DTYPE_BF16, {M, I});
  grouped_mm_bf16_gather(g);
  const Groups groups = groups_from_offsets(x.g.offs, M);
  const int64_t end = groups.count() ? groups.end.back() : 0;
  const auto* idx = static_cast<const int32_t*>(x.g.gather.data);
  const auto* h = static_cast<const uint16_t*>(x.h.data);
  auto* dh = static_cast<uint16_t*>(x.dh.data);
  auto* tw = static_cast<float*>(x.tw_part.data);
  auto* ya = x.act.present ? static_cast<uint16_t*>(x.act.t.data) : nullptr;  // act(h), optional
  const SwigluParams act{x.layout, x.alpha, x.limit, x.up_offset};
  const bool inter = x.layout == kSwigluInterleaved;
  const int64_t max_index = T * x.g.fanout - 1;
  parallel_for(M, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (r >= end) {  // past the last group: zero
        std::fill(dh + r * 2 * I, dh + (r + 1) * 2 * I, uint16_t{0});
        std::fill(tw + r * ntw, tw + (r + 1) * ntw, 0.f);
        if (ya != nullptr) std::fill(ya + r * I, ya + (r + 1) * I, uint16_t{0});
        continue;
      }
      const int64_t i = std::min<int64_t>(idx[r], max_index);
      float w = 1.f;
      if (x.row_scale.present)
        w = i < 0 ? 0.f : load_f32(x.row_scale.t, (i / x.g.fanout) * x.row_scale.t.strides[0] +
                                                      (i % x.g.fanout) * x.row_scale.t.strides[1]);
      for (int64_t t = 0; t < ntw; ++t) {
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        for (int q = 0; q < 4; ++q)
          for (int j = 0; j < 16; ++j)
            for (int e = 0; e < 2; ++e) {
              const int64_t c = 128 * t + 8 * j + 2 * q + e;
              if (c >= I) continue;
              const float d = bf16_to_f32(dy[r * I + c]);
              const int64_t gc = inter ? 2 * c : c, uc = inter ? 2 * c + 1 : I + c;  // h's gate and up columns
              const float g = bf16_to_f32(h[r * 2 * I + gc]), u = bf16_to_f32(h[r * 2 * I + uc]);
              float dg, du, y;
              swiglu_grad_value(g, u, bf16_to_f32(f32_to_bf16(mul_rn(d, w))), act, &dg, &du, &y);
              s[q] = add_rn(s[q], mul_rn(d, y));  // the kernel's order, no contraction
              dh[r * 2 * I + gc] = f32_to_bf16(dg);
              dh[r * 2 * I + uc] = f32_to_bf16(du);
              if (ya != nullptr) ya[r * I + c] = f32_to_bf16(y);
            }
        tw[r * ntw + t] = add_rn(add_rn(s[0], s[1]), add_rn(s[2], s[3]));
      }
    }
  });
}

void grouped_mm_bf16_gather_swiglu(const Bf16GatherSwigluArgs& x) {
  grouped_mm_bf16_gather(x.g);  // h, rows past the last group zero
  const int64_t M = x.g.out.shape[0], I = x.g.out.shape[1] / 2;
  auto* h = static_cast<uint16_t*>(x.g.out.data);
  auto* act = static_cast<uint16_t*>(x.act.data);
  const SwigluParams p{x.layout, x.alpha, x.limit, x.up_offset};
  const bool inter = x.layout == kSwigluInterleaved;
  const Groups groups = groups_from_offsets(x.g.offs, M);
  std::vector<int64_t> group_of(static_cast<size_t>(M), -1);
  for (int64_t gi = 0; gi < groups.count(); ++gi)
    for (int64_t r = groups.start[gi]; r < groups.end[gi]; ++r) group_of[r] = gi;
  parallel_for(M, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (x.bias.present && group_of[r] >= 0)  // + bias in fp32, rounded again (the unfused layer's add)
        for (int64_t c = 0; c < 2 * I; ++c) {
          const float b = load_f32(x.bias.t, group_of[r] * x.bias.t.strides[0] + c * x.bias.t.strides[1]);
          h[r * 2 * I + c] = f32_to_bf16(add_rn(bf16_to_f32(h[r * 2 * I + c]), b));
        }
      for (int64_t c = 0; c < I; ++c) {
        const int64_t gc = inter ? 2 * c : c, uc = inter ? 2 * c + 1 : I + c;
        // rows outside the groups: +0 (as h), not act(0, 0), which is -0 for a negative up_offset
        act[r * I + c] = group_of[r] < 0
                             ? uint16_t{0}
                             : f32_to_bf16(swiglu_value(bf16_to_f32(h[r * 2 * I + gc]), bf16_to_f32(h[r * 2 * I + uc]), p));
      }
    }
  });
}

}  // namespace cpu
}  // namespace mxmoe
