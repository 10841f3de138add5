// Helpers for the C++ tests: owning host buffers that hand out mxmoe_tensor views, random data,
// bf16 conversion. Deliberately independent of the library's internals.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace mxtest {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// bf16 helpers written plainly (round to nearest even through integer math on the bits).
inline uint16_t to_bf16(float f) {
  uint32_t u = bits_of(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}
inline float from_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

inline size_t elem_size(mxmoe_dtype d) {
  switch (d) {
    case MXMOE_DTYPE_BF16: return 2;
    case MXMOE_DTYPE_F32: return 4;
    case MXMOE_DTYPE_I32: return 4;
    case MXMOE_DTYPE_F64: return 8;
    case MXMOE_DTYPE_I64: return 8;
    default: return 1;
  }
}

// A contiguous host tensor owning its bytes.
struct Buffer {
  std::vector<int64_t> shape;
  mxmoe_dtype dtype = MXMOE_DTYPE_F32;
  std::vector<uint8_t> bytes;

  Buffer() = default;
  Buffer(std::vector<int64_t> s, mxmoe_dtype d, uint8_t fill = 0) : shape(std::move(s)), dtype(d) {
    bytes.assign(static_cast<size_t>(numel()) * elem_size(d), fill);
  }
  int64_t numel() const {
    int64_t n = 1;
    for (auto v : shape) n *= v;
    return n;
  }
  template <typename T>
  T* data() { return reinterpret_cast<T*>(bytes.data()); }
  template <typename T>
  const T* data() const { return reinterpret_cast<const T*>(bytes.data()); }
  uint8_t u8(int64_t i) const { return bytes[static_cast<size_t>(i)]; }

  // Element i as float (bf16 or f32 buffers).
  float get(int64_t i) const {
    return dtype == MXMOE_DTYPE_BF16 ? from_bf16(data<uint16_t>()[i]) : data<float>()[i];
  }
  void set(int64_t i, float v) {
    if (dtype == MXMOE_DTYPE_BF16)
      data<uint16_t>()[i] = to_bf16(v);
    else
      data<float>()[i] = v;
  }

  mxmoe_tensor view() {
    mxmoe_tensor t{};
    t.data = bytes.empty() ? nullptr : bytes.data();
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.strides[i] = stride;
      stride *= shape[i];
    }
    t.device = -1;
    return t;
  }
};

inline Buffer offsets(const std::vector<int32_t>& ends) {
  Buffer b({static_cast<int64_t>(ends.size())}, MXMOE_DTYPE_I32);
  if (!ends.empty()) std::memcpy(b.bytes.data(), ends.data(), ends.size() * 4);
  return b;
}

// Random normal values with per-row magnitude spread over many binades (exercises many scales).
inline Buffer random_input(std::vector<int64_t> shape, mxmoe_dtype dtype, uint32_t seed,
                           float spread_log2 = 20.0f) {
  Buffer b(std::move(shape), dtype);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> u(-spread_log2, spread_log2);
  const int64_t row = b.shape.back();
  float mag = 1.f;
  for (int64_t i = 0; i < b.numel(); ++i) {
    if (i % 16 == 0) mag = std::ldexp(1.0f, static_cast<int>(u(rng)));
    (void)row;
    b.set(i, n(rng) * mag);
  }
  return b;
}

// The gather GEMM's contract written out (mxmoe_grouped_mm_tile128_gather): the routed copy of a
// per-token e4m3 operand a (T, K) + 1x32-layout scales (T, K/32), row r = row gather[r] / fanout
// (indices clamped into [0, T * fanout), a negative one: zero codes with scale 1.0).
struct RoutedCopy {
  Buffer q, scale;
  std::vector<int64_t> index;  // the clamped index of each row, -1 for a padding row
};
inline RoutedCopy routed_copy(const Buffer& a, const Buffer& as, const std::vector<int32_t>& gather, int64_t fanout) {
  const int64_t T = a.shape[0], K = a.shape[1], kb = K / 32, M = static_cast<int64_t>(gather.size());
  RoutedCopy c{Buffer({M, K}, MXMOE_DTYPE_E4M3, 0), Buffer({M, kb}, MXMOE_DTYPE_E8M0, 127), {}};
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = std::min<int64_t>(gather[static_cast<size_t>(r)], T * fanout - 1);
    c.index.push_back(i < 0 ? -1 : i);
    if (i < 0) continue;
    std::memcpy(&c.q.bytes[static_cast<size_t>(r * K)], &a.bytes[static_cast<size_t>(i / fanout * K)], K);
    std::memcpy(&c.scale.bytes[static_cast<size_t>(r * kb)], &as.bytes[static_cast<size_t>(i / fanout * kb)], kb);
  }
  return c;
}

// out row r = row_scale.flat[index[r]] * y[r] (+ bias[g]) rounded once, for the rows of the groups
// (ends), 0 past them: the gather GEMM's row-scaled output from the f32 product y (M, N) without bias.
inline Buffer row_scaled(const Buffer& y, const RoutedCopy& c, const Buffer& row_scale, const Buffer* bias,
                         const std::vector<int32_t>& ends, mxmoe_dtype out_dtype) {
  const int64_t M = y.shape[0], N = y.shape[1];
  Buffer out({M, N}, out_dtype);
  int32_t start = 0;
  for (size_t g = 0; g < ends.size(); ++g) {
    for (int64_t r = start; r < ends[g]; ++r) {
      const float w = c.index[static_cast<size_t>(r)] < 0 ? 0.f : row_scale.get(c.index[static_cast<size_t>(r)]);
      for (int64_t n = 0; n < N; ++n) {
        float v = y.get(r * N + n) * w;
        if (bias != nullptr) v = v + bias->get(static_cast<int64_t>(g) * N + n);
        out.set(r * N + n, v);
      }
    }
    start = std::max(start, ends[g]);
  }
  return out;
}

// Operands of the bf16 gather GEMM (mxmoe_grouped_mm_bf16_gather): a (T, K), b (G, N, K) or, b_kn,
// (G, K, N), values multiples of 1/8 in [-2, 2] (every product and partial sum is exact in fp32, so any
// summation order gives the same bits); an index list in group order with padding rows (-1), indices
// past T * fanout (clamped) and 5 tail rows past the last group.
struct Bf16Gather {
  int64_t T, K, N, fanout;
  bool b_kn;
  std::vector<int32_t> ends, gather;
  Buffer a, b, offs, index;
};
inline Bf16Gather bf16_gather_case(int64_t T, int64_t K, int64_t N, int64_t fanout, const std::vector<int32_t>& sizes,
                                   bool b_kn, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t G = static_cast<int64_t>(sizes.size());
  Bf16Gather c{T, K, N, fanout, b_kn, {}, {}, Buffer({T, K}, MXMOE_DTYPE_BF16),
               Buffer(b_kn ? std::vector<int64_t>{G, K, N} : std::vector<int64_t>{G, N, K}, MXMOE_DTYPE_BF16), Buffer(),
               Buffer()};
  for (Buffer* t : {&c.a, &c.b})
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, static_cast<float>(static_cast<int>(rng() % 33) - 16) / 8.f);
  int32_t end = 0;
  for (int32_t s : sizes) {
    for (int32_t i = 0; i < s; ++i) {
      const uint32_t u = rng() % 32;
      c.gather.push_back(u == 0 ? -1 : (u == 1 ? static_cast<int32_t>(T * fanout + 3)
                                               : static_cast<int32_t>(rng() % (T * fanout))));
    }
    c.ends.push_back(end += s);
  }
  for (int i = 0; i < 5; ++i) c.gather.push_back(static_cast<int32_t>(rng() % (T * fanout)));  // tail rows
  c.offs = offsets(c.ends);
  c.index = Buffer({static_cast<int64_t>(c.gather.size())}, MXMOE_DTYPE_I32);
  std::memcpy(c.index.bytes.data(), c.gather.data(), c.gather.size() * 4);
  return c;
}
// The contract written out: row r of group g is a[min(gather[r], T fanout - 1) / fanout] . b[g] (zero for
// a padding row or a row past the last group), rounded to bf16. The fp32 sums are exact for
// bf16_gather_case's operands (multiples of 1/8 in [-2, 2]: every partial sum is a multiple of 1/64 below
// 4 K <= 2^13 for K <= 2048, 19 bits), so their order does not matter and the loops may run as fast as
// they like (the Qwen3-sized GPU cases take seconds, not a minute).
inline Buffer bf16_gather_expected(const Bf16Gather& c) {
  const int64_t M = static_cast<int64_t>(c.gather.size()), G = static_cast<int64_t>(c.ends.size()), K = c.K, N = c.N;
  if (K > 2048) throw std::invalid_argument("bf16_gather_expected: K <= 2048 keeps the fp32 sums exact");
  Buffer out({M, N}, MXMOE_DTYPE_BF16, 0);
  const uint16_t* A = c.a.data<uint16_t>();
  const uint16_t* B = c.b.data<uint16_t>();
  std::vector<float> bt(static_cast<size_t>(G * K * N)), acc(static_cast<size_t>(N));  // b as (G, K, N) floats
  for (int64_t g = 0; g < G; ++g)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n)
        bt[(g * K + k) * N + n] = from_bf16(c.b_kn ? B[(g * K + k) * N + n] : B[(g * N + n) * K + k]);
  int64_t g = 0;
  for (int64_t r = 0; r < M; ++r) {
    while (g < G && r >= c.ends[g]) ++g;
    const int64_t idx = std::min<int64_t>(c.gather[r], c.T * c.fanout - 1);
    if (g == G || idx < 0) continue;
    const uint16_t* arow = A + idx / c.fanout * K;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float av = from_bf16(arow[k]);
      const float* brow = bt.data() + (g * K + k) * N;
      for (int64_t n = 0; n < N; ++n) acc[n] += av * brow[n];
    }
    for (int64_t n = 0; n < N; ++n) out.data<uint16_t>()[r * N + n] = to_bf16(acc[n]);
  }
  return out;
}

// Operands of the bf16 K-grouped gather GEMM (mxmoe_grouped_mm_bf16_kgather): the routed rows of
// bf16_gather_case's index list; the plain operand (R, M or N), the gathered one (T, N or M); exact values.
struct Bf16KGather {
  int64_t T, M, N, fanout;
  bool gather_b;
  std::vector<int32_t> ends, gather;
  Buffer a, b, offs, index;
};
inline Bf16KGather bf16_kgather_case(int64_t T, int64_t M, int64_t N, int64_t fanout, const std::vector<int32_t>& sizes,
                                     bool gather_b, uint32_t seed) {
  Bf16Gather g = bf16_gather_case(T, 8, 8, fanout, sizes, false, seed);  // the index list
  const int64_t R = static_cast<int64_t>(g.gather.size());
  Bf16KGather c{T, M, N, fanout, gather_b, g.ends, g.gather, Buffer({gather_b ? R : T, M}, MXMOE_DTYPE_BF16),
                Buffer({gather_b ? T : R, N}, MXMOE_DTYPE_BF16), g.offs, g.index};
  std::mt19937 rng(seed + 1);
  for (Buffer* t : {&c.a, &c.b})
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, static_cast<float>(static_cast<int>(rng() % 33) - 16) / 8.f);
  return c;
}
// out[g] (M, N) = sum over group g's routed rows of a_r^T b_r, rounded to bf16. fp32 sums, exact here
// (multiples of 1/64 below 4 R < 2^17 for the cases' group sizes R < 2^15), so in any order.
inline Buffer bf16_kgather_expected(const Bf16KGather& c) {
  const int64_t G = static_cast<int64_t>(c.ends.size());
  Buffer out({G, c.M, c.N}, MXMOE_DTYPE_BF16, 0);
  std::vector<float> acc(static_cast<size_t>(c.M * c.N)), brow(static_cast<size_t>(c.N));
  const uint16_t* A = c.a.data<uint16_t>();
  const uint16_t* B = c.b.data<uint16_t>();
  int64_t start = 0;
  for (int64_t g = 0; g < G; ++g) {
    if (c.ends[g] - start >= (int64_t{1} << 15)) throw std::invalid_argument("bf16_kgather_expected: group too long");
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t r = start; r < c.ends[g]; ++r) {
      const int64_t idx = std::min<int64_t>(c.gather[r], c.T * c.fanout - 1);
      if (idx < 0) continue;
      const int64_t ra = c.gather_b ? r : idx / c.fanout, rb = c.gather_b ? idx / c.fanout : r;
      for (int64_t n = 0; n < c.N; ++n) brow[n] = from_bf16(B[rb * c.N + n]);
      for (int64_t m = 0; m < c.M; ++m) {
        const float av = from_bf16(A[ra * c.M + m]);
        float* arow = acc.data() + m * c.N;
        for (int64_t n = 0; n < c.N; ++n) arow[n] += av * brow[n];
      }
    }
    for (int64_t i = 0; i < c.M * c.N; ++i) out.data<uint16_t>()[g * c.M * c.N + i] = to_bf16(acc[i]);
    start = c.ends[g];
  }
  return out;
}

// The bf16 dSwiGLU gather GEMM's contract (mxmoe_grouped_mm_bf16_gather_dswiglu) written out from the
// gather GEMM's bf16 dY' (M, I) (bf16_gather_expected of a b_kn case, or the device gather GEMM's
// bytes): dh (M, 2I) and tw_part (M, ceil(I/128)), with act_grad(r, col, g, u, dy, &dg, &du, &y) the
// SwiGLU gradient and value of row r, column col (the caller's: mxmoe::swiglu_grad_value on the host,
// or values a device computed, since host and device expf may differ by an ulp), row weights w_of(r),
// the documented partial order; interleaved: column c's gate and up at 2c, 2c + 1 of h and dh (else
// c, I + c).
template <class ActGrad, class WeightOf>
inline std::pair<Buffer, Buffer> bf16_dswiglu_expected(const Bf16Gather& c, const Buffer& dy, const Buffer& h,
                                                       ActGrad act_grad, WeightOf w_of, bool interleaved = false) {
  const int64_t M = dy.shape[0], I = c.N, ntw = (I + 127) / 128, end = c.ends.empty() ? 0 : c.ends.back();
  Buffer dh({M, 2 * I}, MXMOE_DTYPE_BF16, 0), tw({M, ntw}, MXMOE_DTYPE_F32, 0);
  for (int64_t r = 0; r < end; ++r) {
    const float w = w_of(r);
    for (int64_t t = 0; t < ntw; ++t) {
      volatile float s[4] = {0.f, 0.f, 0.f, 0.f};  // volatile: each sum rounded as written
      for (int q = 0; q < 4; ++q)
        for (int j = 0; j < 16; ++j)
          for (int e = 0; e < 2; ++e) {
            const int64_t col = 128 * t + 8 * j + 2 * q + e;
            if (col >= I) continue;
            const float d = dy.get(r * I + col);
            volatile float dw = d * w;
            float dg, du, y;
            const int64_t gc = interleaved ? 2 * col : col, uc = interleaved ? 2 * col + 1 : I + col;
            act_grad(r, col, h.get(r * 2 * I + gc), h.get(r * 2 * I + uc), from_bf16(to_bf16(dw)), &dg, &du, &y);
            volatile float prod = d * y;
            s[q] = s[q] + prod;
            dh.set(r * 2 * I + gc, dg);
            dh.set(r * 2 * I + uc, du);
          }
      volatile float a = s[0] + s[1], b = s[2] + s[3];
      tw.set(r * ntw + t, a + b);
    }
  }
  return {dh, tw};
}

}  // namespace mxtest
