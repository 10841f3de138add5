// Helpers for the C++ tests: owning host buffers that hand out mxmoe_tensor views, random data,
// bf16 conversion. Deliberately independent of the library's internals.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
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

}  // namespace mxtest
