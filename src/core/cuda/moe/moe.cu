// The MoE kernel family on the device: routing (CUB radix sort + one finishing kernel), gather,
// combine, combine weight grad, SwiGLU weight grad, per-group row sums and SwiGLU forward/backward.
// Each kernel is one pass over its operands, 16-byte vector accesses when rows and pointers allow (8
// elements per access unit, scalar fallback otherwise: the same values either way), launches on the
// caller's stream, never syncs the host and allocates nothing (CUDA-graph safe). Results equal the
// CPU reference (cpu/moe.cpp) bit for bit: the same separately rounded fp32 operations in the same
// order (fixed reduction trees from common/moe_activation.hpp, no float atomics); SwiGLU and the
// SwiGLU weight grad up to expf.
#include <cuda_runtime.h>

// CUB inside our own namespace: no symbol of ours can collide with the CUB of another library in the
// process (torch wraps its copy the same way).
#ifndef CUB_WRAPPED_NAMESPACE
#define CUB_WRAPPED_NAMESPACE mxmoe_cub
#endif
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/error.hpp"
#include "common/int_math.hpp"
#include "common/moe_activation.hpp"
#include "common/tensor.hpp"
#include "cuda/common/bf16_pack.cuh"
#include "cuda/common/launch_cache.cuh"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

namespace cubns = ::CUB_WRAPPED_NAMESPACE::cub;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": ", cudaGetErrorString(e));
}
void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

// Makes `device` current for the scope (restores the caller's device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
    else prev_ = -1;
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// ---- element access ------------------------------------------------------------------------------
// bf16 is carried as uint16_t bits, f32 as float. One "unit" of a vector access is 8 consecutive
// elements: one 16-byte access for bf16, two for f32.
struct NoFactor {};

__device__ __forceinline__ float ld1(const uint16_t* p, int64_t i) { return bf16_to_f32(__ldg(p + i)); }
__device__ __forceinline__ float ld1(const float* p, int64_t i) { return __ldg(p + i); }
// Stores round once (RNE) and write NaN canonically (canon_nan), as the CPU reference.
__device__ __forceinline__ void st1(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(canon_nan(v)); }
__device__ __forceinline__ void st1(float* p, int64_t i, float v) { p[i] = canon_nan(v); }

__device__ __forceinline__ void unpack2(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return pack_bf16x2(lo, hi); }  // NaN as 0x7FC0

// p: 16-byte aligned.
__device__ __forceinline__ void ld8(const uint16_t* p, float (&v)[8]) {
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
  unpack2(q.x, v[0], v[1]);
  unpack2(q.y, v[2], v[3]);
  unpack2(q.z, v[4], v[5]);
  unpack2(q.w, v[6], v[7]);
}
__device__ __forceinline__ void ld8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void st8(uint16_t* p, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}
__device__ __forceinline__ void st8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(canon_nan(v[0]), canon_nan(v[1]), canon_nan(v[2]), canon_nan(v[3]));
  reinterpret_cast<float4*>(p)[1] = make_float4(canon_nan(v[4]), canon_nan(v[5]), canon_nan(v[6]), canon_nan(v[7]));
}

// A (T, k) factor (row_scale, weights) at flat index i; NoFactor: none.
__device__ __forceinline__ float factor(const uint16_t* f, int64_t i) { return ld1(f, i); }
__device__ __forceinline__ float factor(const float* f, int64_t i) { return ld1(f, i); }

__device__ __forceinline__ int64_t clamp_index(int64_t v, int64_t n) { return v < 0 ? 0 : (v >= n ? n - 1 : v); }

// ---- row tiling ------------------------------------------------------------------------------------
// Blocks of 256 threads = tx threads along a row's units x ty rows; a grid-stride loop over rows.
constexpr int kThreads = 256;
struct Tiling {
  dim3 block, grid;
};
Tiling row_tiling(int64_t rows, int64_t units, int device) {
  int tx = 1;
  while (tx < units && tx < kThreads) tx *= 2;
  const int ty = kThreads / tx;
  const int64_t want = cdiv(rows, ty), cap = int64_t(sm_count(device)) * 16;
  Tiling t;
  t.block = dim3(tx, ty);
  t.grid = dim3(static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap))));
  return t;
}

#define MXMOE_ROWS_LOOP(rows)                                                                              \
  for (int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; r < (rows); r += int64_t(gridDim.x) * blockDim.y)
#define MXMOE_UNITS_LOOP(u, units) for (int64_t u = threadIdx.x; u < (units); u += blockDim.x)

// Calls fn(ptr) with t's data typed by dtype (uint16_t for bf16, float for f32).
template <class Fn>
void typed_in(const mxmoe_tensor& t, Fn&& fn) {
  if (t.dtype == MXMOE_DTYPE_BF16) fn(static_cast<const uint16_t*>(t.data));
  else fn(static_cast<const float*>(t.data));
}
template <class Fn>
void typed_out(const mxmoe_tensor& t, Fn&& fn) {
  if (t.dtype == MXMOE_DTYPE_BF16) fn(static_cast<uint16_t*>(t.data));
  else fn(static_cast<float*>(t.data));
}
// An optional factor: NoFactor* (null) when absent.
template <class Fn>
void typed_factor(const OptTensor& f, Fn&& fn) {
  if (!f.present) fn(static_cast<const NoFactor*>(nullptr));
  else typed_in(f.t, fn);
}

// ==== routing ========================================================================================

int end_bit_of(int64_t num_experts) {
  int bits = 0;
  while ((int64_t(1) << bits) <= num_experts) ++bits;  // keys 0..E need ceil(log2(E + 1)) bits
  return bits;
}

size_t sort_temp_bytes(int64_t n, int64_t num_experts) {
  size_t bytes = 0;
  check_cuda(cubns::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                               static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                               static_cast<int32_t*>(nullptr), static_cast<int>(n), 0,
                                               end_bit_of(num_experts), cudaStream_t(0)),
             "cub::DeviceRadixSort::SortPairs (temp size)");
  return bytes;
}

constexpr int64_t kAlign = 256;

template <class Id>
__global__ void routing_keys_kernel(const Id* __restrict__ ids, int64_t n, int64_t num_experts, uint32_t* keys,
                                    int32_t* vals) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    keys[i] = static_cast<uint32_t>(id >= 0 && id < num_experts ? id : num_experts);
    vals[i] = static_cast<int32_t>(i);
  }
}

// inv[perm[p]] = p for every sorted position p; offs[e] = number of sorted keys <= e (upper bound).
__global__ void routing_finish_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ perm, int64_t n,
                                      int64_t num_experts, int32_t* __restrict__ offs, int32_t* __restrict__ inv) {
  const int64_t total = n > num_experts ? n : num_experts;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    if (i < n) {
      const int64_t f = perm[i];
      if (f >= 0 && f < n) inv[f] = static_cast<int32_t>(i);
    }
    if (i < num_experts) {
      int64_t lo = 0, hi = n;  // first position whose key is > i
      while (lo < hi) {
        const int64_t mid = (lo + hi) >> 1;
        if (keys[mid] <= static_cast<uint32_t>(i)) lo = mid + 1;
        else hi = mid;
      }
      offs[i] = static_cast<int32_t>(lo);
    }
  }
}

unsigned grid_1d(int64_t n, int device) {
  const int64_t want = cdiv(std::max<int64_t>(n, 1), kThreads), cap = int64_t(sm_count(device)) * 8;
  return static_cast<unsigned>(std::min(want, cap));
}

// ==== gather ==========================================================================================

template <bool kVec, class TX, class TO, class TS>
__global__ void gather_kernel(const TX* __restrict__ x, const int32_t* __restrict__ perm, int64_t n, int64_t nk,
                              int64_t k, const TS* __restrict__ scale, TO* __restrict__ out, int64_t H) {
  constexpr bool kScale = !std::is_same<TS, NoFactor>::value;
  constexpr bool kCopy = !kScale && std::is_same<TX, TO>::value;
  const int64_t units = kVec ? H / 8 : H;
  MXMOE_ROWS_LOOP(n) {
    const int32_t pr = __ldg(perm + r);
    TO* o = out + r * H;
    if (pr < 0 || nk == 0) {  // a padding row: zeros (uniform over the row's threads)
      MXMOE_UNITS_LOOP(u, kVec ? H * static_cast<int64_t>(sizeof(TO)) / 16 : H) {
        if constexpr (kVec) reinterpret_cast<uint4*>(o)[u] = make_uint4(0, 0, 0, 0);
        else o[u] = TO(0);
      }
      continue;
    }
    const int64_t src = clamp_index(pr, nk);
    const TX* xr = x + (src / k) * H;
    float s = 1.0f;
    if constexpr (kScale) s = factor(scale, src);
    MXMOE_UNITS_LOOP(u, units) {
      if constexpr (kVec) {
        if constexpr (kCopy) {  // the same bits (NaN payloads included)
          const uint4* a = reinterpret_cast<const uint4*>(xr + u * 8);
          uint4* b = reinterpret_cast<uint4*>(o + u * 8);
          for (int q = 0; q < static_cast<int>(sizeof(TX)) / 2; ++q) b[q] = __ldg(a + q);
        } else {
          float v[8];
          ld8(xr + u * 8, v);
          if constexpr (kScale)
            for (int e = 0; e < 8; ++e) v[e] = mul_rn(v[e], s);
          st8(o + u * 8, v);
        }
      } else {
        if constexpr (kCopy) o[u] = xr[u];
        else if constexpr (kScale) st1(o, u, mul_rn(ld1(xr, u), s));
        else st1(o, u, ld1(xr, u));
      }
    }
  }
}

// ==== combine ========================================================================================

template <bool kVec, class TY, class TO, class TW>
__global__ void combine_kernel(const TY* __restrict__ y, int64_t n_rows, const int32_t* __restrict__ inv, int64_t T,
                               int64_t k, const TW* __restrict__ w, TO* __restrict__ out, int64_t H) {
  constexpr bool kWeights = !std::is_same<TW, NoFactor>::value;
  const int64_t units = kVec ? H / 8 : H;
  MXMOE_ROWS_LOOP(T) {
    const int32_t* it = inv + r * k;
    MXMOE_UNITS_LOOP(u, units) {
      if constexpr (kVec) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int64_t j = 0; j < k; ++j) {
          float v[8];
          ld8(y + clamp_index(__ldg(it + j), n_rows) * H + u * 8, v);
          if constexpr (kWeights) {
            const float wj = factor(w, r * k + j);
            for (int e = 0; e < 8; ++e) acc[e] = add_rn(acc[e], mul_rn(wj, v[e]));
          } else {
            for (int e = 0; e < 8; ++e) acc[e] = add_rn(acc[e], v[e]);
          }
        }
        st8(out + r * H + u * 8, acc);
      } else {
        float acc = 0.f;
        for (int64_t j = 0; j < k; ++j) {
          const float v = ld1(y + clamp_index(__ldg(it + j), n_rows) * H, u);
          if constexpr (kWeights) acc = add_rn(acc, mul_rn(factor(w, r * k + j), v));
          else acc = add_rn(acc, v);
        }
        st1(out + r * H, u, acc);
      }
    }
  }
}

// ==== combine weight grad =============================================================================
// One warp per (t, j): lane l sums the elements of the 8-element chunks c = l, l + 32, ... in increasing
// order, then the xor butterfly (lane l < off adds lane l + off: the CPU's tree, addition commutes).
constexpr int kWarpsPerBlock = kThreads / 32;

template <bool kVec, class TD, class TY>
__global__ void weight_grad_kernel(const TD* __restrict__ dout, const TY* __restrict__ y, int64_t n_rows,
                                   const int32_t* __restrict__ inv, int64_t n, int64_t k, int64_t H,
                                   float* __restrict__ dw) {
  static_assert(kDotLanes == 32 && kDotChunk == 8, "one warp, 8-element chunks");
  const int lane = threadIdx.x & 31;
  const int64_t chunks = cdiv(H, kDotChunk);
  for (int64_t i = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); i < n;
       i += int64_t(gridDim.x) * kWarpsPerBlock) {
    const TD* d = dout + (i / k) * H;
    const TY* yr = y + clamp_index(__ldg(inv + i), n_rows) * H;
    float acc = 0.f;
    for (int64_t c = lane; c < chunks; c += 32) {
      if constexpr (kVec) {
        float a[8], b[8];
        ld8(d + c * 8, a);
        ld8(yr + c * 8, b);
        for (int e = 0; e < 8; ++e) acc = add_rn(acc, mul_rn(a[e], b[e]));
      } else {
        const int64_t h1 = min(H, c * 8 + 8);
        for (int64_t h = c * 8; h < h1; ++h) acc = add_rn(acc, mul_rn(ld1(d, h), ld1(yr, h)));
      }
    }
    for (int off = 16; off >= 1; off >>= 1) acc = add_rn(acc, __shfl_xor_sync(0xFFFFFFFFu, acc, off));
    if (lane == 0) dw[i] = canon_nan(acc);
  }
}

// ==== SwiGLU weight grad ================================================================================
// weight_grad_kernel's lanes and tree with the products dy[r, i] * swiglu(h[r])_i, r = inv[t, j]: one
// warp per (t, j), lane l sums the 8-element chunks c = l, l + 32, ... in increasing order.
template <bool kVec, bool kInter, class TD>
__global__ void swiglu_weight_grad_kernel(const TD* __restrict__ dy, const uint16_t* __restrict__ h, int64_t n_rows,
                                          int64_t I, const int32_t* __restrict__ inv, int64_t n, SwigluParams p,
                                          float* __restrict__ dw) {
  static_assert(kDotLanes == 32 && kDotChunk == 8, "one warp, 8-element chunks");
  const int lane = threadIdx.x & 31;
  const int64_t chunks = cdiv(I, kDotChunk);
  for (int64_t e = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); e < n;
       e += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int64_t r = clamp_index(__ldg(inv + e), n_rows);
    const TD* d = dy + r * I;
    const uint16_t* hr = h + r * 2 * I;
    float acc = 0.f;
    for (int64_t c = lane; c < chunks; c += 32) {
      if constexpr (kVec) {
        float g[8], u[8], v[8];
        if constexpr (kInter) {
          float a[8], b[8];
          ld8(hr + c * 16, a);
          ld8(hr + c * 16 + 8, b);
          for (int q = 0; q < 4; ++q) g[q] = a[2 * q], u[q] = a[2 * q + 1], g[q + 4] = b[2 * q], u[q + 4] = b[2 * q + 1];
        } else {
          ld8(hr + c * 8, g);
          ld8(hr + I + c * 8, u);
        }
        ld8(d + c * 8, v);
        for (int q = 0; q < 8; ++q) acc = add_rn(acc, mul_rn(v[q], swiglu_value(g[q], u[q], p)));
      } else {
        const int64_t i1 = min(I, c * 8 + 8);
        for (int64_t i = c * 8; i < i1; ++i) {
          const float g = ld1(hr, kInter ? 2 * i : i), u = ld1(hr, kInter ? 2 * i + 1 : I + i);
          acc = add_rn(acc, mul_rn(ld1(d, i), swiglu_value(g, u, p)));
        }
      }
    }
    for (int off = 16; off >= 1; off >>= 1) acc = add_rn(acc, __shfl_xor_sync(0xFFFFFFFFu, acc, off));
    if (lane == 0) dw[e] = canon_nan(acc);
  }
}

// ==== group sum =======================================================================================
// One block per (group, 256-column tile): 32 column threads x kSumLanes row lanes; thread (c, i) sums
// 8 columns over the group's rows s + i, s + i + 16, ...; the lanes meet in shared memory in the tree.
constexpr int kSumCols = 8 * 32;

template <bool kVec, class TX>
__global__ void __launch_bounds__(32 * kSumLanes) group_sum_kernel(const TX* __restrict__ x, int64_t M, int64_t C,
                                                                   const int32_t* __restrict__ offs, int64_t G,
                                                                   int64_t col_tiles, float* __restrict__ out) {
  __shared__ float part[kSumLanes][8][32];  // [row lane][column within the thread's 8][column thread]
  __shared__ int64_t red[32 * kSumLanes / 32];
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int64_t b = blockIdx.x; b < G * col_tiles; b += gridDim.x) {
    const int64_t g = b / col_tiles, c0 = (b % col_tiles) * kSumCols + threadIdx.x * 8;
    // start = min(M, max(0, offs[0..g-1])), end = min(M, max(start, offs[g])): groups_from_offsets.
    int64_t mx = 0;
    for (int64_t q = tid; q < g; q += 32 * kSumLanes) mx = max(mx, static_cast<int64_t>(__ldg(offs + q)));
    for (int off = 16; off >= 1; off >>= 1) mx = max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
    __syncthreads();  // red/part reuse across iterations
    if ((tid & 31) == 0) red[tid >> 5] = mx;
    __syncthreads();
    int64_t start = 0;
    for (int q = 0; q < kSumLanes; ++q) start = max(start, red[q]);
    start = min(start, M);
    const int64_t end = min(M, max(start, static_cast<int64_t>(__ldg(offs + g))));
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (c0 < C) {
      for (int64_t r = start + threadIdx.y; r < end; r += kSumLanes) {
        if constexpr (kVec) {
          float v[8];
          ld8(x + r * C + c0, v);
          for (int e = 0; e < 8; ++e) acc[e] = add_rn(acc[e], v[e]);
        } else {
          for (int e = 0; e < 8; ++e)
            if (c0 + e < C) acc[e] = add_rn(acc[e], ld1(x + r * C, c0 + e));
        }
      }
    }
    for (int e = 0; e < 8; ++e) part[threadIdx.y][e][threadIdx.x] = acc[e];
    __syncthreads();
    for (int off = kSumLanes / 2; off >= 1; off >>= 1) {
      if (static_cast<int>(threadIdx.y) < off)
        for (int e = 0; e < 8; ++e)
          part[threadIdx.y][e][threadIdx.x] = add_rn(part[threadIdx.y][e][threadIdx.x], part[threadIdx.y + off][e][threadIdx.x]);
      __syncthreads();
    }
    if (threadIdx.y == 0 && c0 < C) {
      float* o = out + g * C + c0;
      if (kVec) {
        float v[8];
        for (int e = 0; e < 8; ++e) v[e] = part[0][e][threadIdx.x];
        st8(o, v);  // canonical NaN
      } else {
        for (int e = 0; e < 8; ++e)
          if (c0 + e < C) o[e] = canon_nan(part[0][e][threadIdx.x]);
      }
    }
  }
}

// ==== SwiGLU ==========================================================================================
// Forward: unit u of row r = outputs [8u, 8u + 8) (vector) or output u (scalar).
template <bool kVec, bool kInter, class TH>
__global__ void swiglu_kernel(const TH* __restrict__ h, int64_t N, int64_t I, SwigluParams p, TH* __restrict__ y) {
  const int64_t units = kVec ? I / 8 : I;
  MXMOE_ROWS_LOOP(N) {
    const TH* hr = h + r * 2 * I;
    TH* yr = y + r * I;
    MXMOE_UNITS_LOOP(u, units) {
      if constexpr (kVec) {
        float g[8], v[8], o[8];
        if constexpr (kInter) {
          float a[8], b[8];
          ld8(hr + u * 16, a);
          ld8(hr + u * 16 + 8, b);
          for (int e = 0; e < 4; ++e) g[e] = a[2 * e], v[e] = a[2 * e + 1], g[e + 4] = b[2 * e], v[e + 4] = b[2 * e + 1];
        } else {
          ld8(hr + u * 8, g);
          ld8(hr + I + u * 8, v);
        }
        // Plain SiLU x up (Qwen3, Mixtral, DeepSeek) without the clamp and slope operations, with the
        // moderate sigmoid where no gate value is below -87: the same values (NaNs stored canonically).
        if (swiglu_is_plain(p) && sigmoid_moderate8(g)) {
          for (int e = 0; e < 8; ++e) o[e] = swiglu_value<true, true>(g[e], v[e], p);
        } else {
          for (int e = 0; e < 8; ++e) o[e] = swiglu_value(g[e], v[e], p);
        }
        st8(yr + u * 8, o);
      } else {
        const float g = ld1(hr, kInter ? 2 * u : u), v = ld1(hr, kInter ? 2 * u + 1 : I + u);
        st1(yr, u, swiglu_value(g, v, p));
      }
    }
  }
}

template <bool kVec, bool kInter, class TH, class TD>
__global__ void swiglu_backward_kernel(const TD* __restrict__ dy, const TH* __restrict__ h, int64_t N, int64_t I,
                                       SwigluParams p, TH* __restrict__ dh) {
  const int64_t units = kVec ? I / 8 : I;
  MXMOE_ROWS_LOOP(N) {
    const TH* hr = h + r * 2 * I;
    const TD* dyr = dy + r * I;
    TH* o = dh + r * 2 * I;
    MXMOE_UNITS_LOOP(u, units) {
      if constexpr (kVec) {
        float g[8], v[8], d[8], dg[8], du[8];
        if constexpr (kInter) {
          float a[8], b[8];
          ld8(hr + u * 16, a);
          ld8(hr + u * 16 + 8, b);
          for (int e = 0; e < 4; ++e) g[e] = a[2 * e], v[e] = a[2 * e + 1], g[e + 4] = b[2 * e], v[e + 4] = b[2 * e + 1];
        } else {
          ld8(hr + u * 8, g);
          ld8(hr + I + u * 8, v);
        }
        ld8(dyr + u * 8, d);
        if (swiglu_is_plain(p) && sigmoid_moderate8(g)) {  // as the forward
          for (int e = 0; e < 8; ++e) swiglu_grad<true, true>(g[e], v[e], d[e], p, &dg[e], &du[e]);
        } else {
          for (int e = 0; e < 8; ++e) swiglu_grad(g[e], v[e], d[e], p, &dg[e], &du[e]);
        }
        if constexpr (kInter) {
          float a[8], b[8];
          for (int e = 0; e < 4; ++e) a[2 * e] = dg[e], a[2 * e + 1] = du[e], b[2 * e] = dg[e + 4], b[2 * e + 1] = du[e + 4];
          st8(o + u * 16, a);
          st8(o + u * 16 + 8, b);
        } else {
          st8(o + u * 8, dg);
          st8(o + I + u * 8, du);
        }
      } else {
        const int64_t gi = kInter ? 2 * u : u, ui = kInter ? 2 * u + 1 : I + u;
        float dg, du;
        swiglu_grad(ld1(hr, gi), ld1(hr, ui), ld1(dyr, u), p, &dg, &du);
        st1(o, gi, dg);
        st1(o, ui, du);
      }
    }
  }
}

}  // namespace

// ==== entry points ====================================================================================

int64_t moe_routing_workspace_size(int64_t n, int64_t num_experts, int32_t device) {
  if (n == 0) return 0;
  DeviceScope scope(device);
  return kAlign + 3 * round_up(4 * n, kAlign) + static_cast<int64_t>(sort_temp_bytes(n, num_experts));
}

void moe_routing(const MoeRoutingArgs& a) {
  DeviceScope scope(a.topk_idx.device);
  const int dev = a.topk_idx.device;
  cudaStream_t s = as_stream(a.stream);
  const int64_t n = a.topk_idx.shape[0] * a.topk_idx.shape[1], E = a.num_experts;
  auto* offs = static_cast<int32_t*>(a.offs.data);
  auto* perm = static_cast<int32_t*>(a.perm.data);
  auto* inv = static_cast<int32_t*>(a.inv.data);
  if (n == 0) {  // every expert empty
    check_cuda(cudaMemsetAsync(offs, 0, static_cast<size_t>(E) * 4, s), "moe_routing: cudaMemsetAsync");
    return;
  }
  // Workspace: [keys | values | sorted keys | CUB temp storage], each 256-byte aligned.
  size_t temp = sort_temp_bytes(n, E);
  const int64_t need = kAlign + 3 * round_up(4 * n, kAlign) + static_cast<int64_t>(temp);
  if (a.workspace == nullptr || a.workspace_bytes < need)
    fail("workspace: expected at least ", need, " bytes, got ", a.workspace == nullptr ? 0 : a.workspace_bytes);
  char* base = static_cast<char*>(a.workspace);
  base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  auto* keys = reinterpret_cast<uint32_t*>(base);
  auto* vals = reinterpret_cast<int32_t*>(base + round_up(4 * n, kAlign));
  auto* sorted = reinterpret_cast<uint32_t*>(base + 2 * round_up(4 * n, kAlign));
  void* temp_ptr = base + 3 * round_up(4 * n, kAlign);

  const unsigned grid = grid_1d(n, dev);
  if (a.topk_idx.dtype == MXMOE_DTYPE_I64)
    routing_keys_kernel<<<grid, kThreads, 0, s>>>(static_cast<const int64_t*>(a.topk_idx.data), n, E, keys, vals);
  else
    routing_keys_kernel<<<grid, kThreads, 0, s>>>(static_cast<const int32_t*>(a.topk_idx.data), n, E, keys, vals);
  check_launch("moe_routing: keys kernel");
  // Stable LSD radix sort of (key, flat index) pairs on the key's low ceil(log2(E+1)) bits: the sorted
  // values are perm itself.
  check_cuda(cubns::DeviceRadixSort::SortPairs(temp_ptr, temp, keys, sorted, vals, perm, static_cast<int>(n), 0,
                                               end_bit_of(E), s),
             "moe_routing: cub::DeviceRadixSort::SortPairs");
  routing_finish_kernel<<<grid_1d(std::max(n, E), dev), kThreads, 0, s>>>(sorted, perm, n, E, offs, inv);
  check_launch("moe_routing: finish kernel");
}

void moe_gather(const MoeGatherArgs& a) {
  const int64_t H = a.x.shape[1], n = a.perm.shape[0];
  if (n == 0 || H == 0) return;
  DeviceScope scope(a.x.device);
  const bool vec = H % 8 == 0 && aligned16(a.x.data) && aligned16(a.out.data);
  const Tiling t = row_tiling(n, vec ? H / 8 : H, a.x.device);
  cudaStream_t s = as_stream(a.stream);
  const auto* perm = static_cast<const int32_t*>(a.perm.data);
  typed_in(a.x, [&](auto x) {
    typed_out(a.out, [&](auto out) {
      typed_factor(a.row_scale, [&](auto scale) {
        using TX = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
        using TO = std::remove_pointer_t<decltype(out)>;
        using TS = std::remove_const_t<std::remove_pointer_t<decltype(scale)>>;
        const int64_t nk = a.x.shape[0] * a.k;
        if (vec) gather_kernel<true, TX, TO, TS><<<t.grid, t.block, 0, s>>>(x, perm, n, nk, a.k, scale, out, H);
        else gather_kernel<false, TX, TO, TS><<<t.grid, t.block, 0, s>>>(x, perm, n, nk, a.k, scale, out, H);
      });
    });
  });
  check_launch("moe_gather");
}

void moe_combine(const MoeCombineArgs& a) {
  const int64_t N = a.y.shape[0], H = a.y.shape[1], T = a.inv.shape[0], K = a.inv.shape[1];
  if (T == 0 || H == 0) return;
  DeviceScope scope(a.y.device);
  cudaStream_t s = as_stream(a.stream);
  const bool vec = H % 8 == 0 && aligned16(a.y.data) && aligned16(a.out.data);
  const Tiling t = row_tiling(T, vec ? H / 8 : H, a.y.device);
  const auto* inv = static_cast<const int32_t*>(a.inv.data);
  typed_in(a.y, [&](auto y) {
    typed_out(a.out, [&](auto out) {
      typed_factor(a.weights, [&](auto w) {
        using TY = std::remove_const_t<std::remove_pointer_t<decltype(y)>>;
        using TO = std::remove_pointer_t<decltype(out)>;
        using TW = std::remove_const_t<std::remove_pointer_t<decltype(w)>>;
        if (vec) combine_kernel<true, TY, TO, TW><<<t.grid, t.block, 0, s>>>(y, N, inv, T, K, w, out, H);
        else combine_kernel<false, TY, TO, TW><<<t.grid, t.block, 0, s>>>(y, N, inv, T, K, w, out, H);
      });
    });
  });
  check_launch("moe_combine");
}

void moe_combine_weight_grad(const MoeWeightGradArgs& a) {
  const int64_t T = a.dout.shape[0], H = a.dout.shape[1], N = a.y.shape[0], K = a.inv.shape[1];
  const int64_t n = T * K;
  if (n == 0) return;
  DeviceScope scope(a.dout.device);
  cudaStream_t s = as_stream(a.stream);
  const bool vec = H % 8 == 0 && aligned16(a.dout.data) && aligned16(a.y.data);
  const int64_t want = cdiv(n, kWarpsPerBlock), cap = int64_t(sm_count(a.dout.device)) * 16;
  const unsigned grid = static_cast<unsigned>(std::min(want, cap));
  const auto* inv = static_cast<const int32_t*>(a.inv.data);
  auto* dw = static_cast<float*>(a.dw.data);
  typed_in(a.dout, [&](auto d) {
    typed_in(a.y, [&](auto y) {
      using TD = std::remove_const_t<std::remove_pointer_t<decltype(d)>>;
      using TY = std::remove_const_t<std::remove_pointer_t<decltype(y)>>;
      if (vec) weight_grad_kernel<true, TD, TY><<<grid, kThreads, 0, s>>>(d, y, N, inv, n, K, H, dw);
      else weight_grad_kernel<false, TD, TY><<<grid, kThreads, 0, s>>>(d, y, N, inv, n, K, H, dw);
    });
  });
  check_launch("moe_combine_weight_grad");
}

void moe_swiglu_weight_grad(const MoeSwigluWeightGradArgs& a) {
  const int64_t N = a.dy.shape[0], I = a.dy.shape[1], T = a.inv.shape[0], K = a.inv.shape[1];
  const int64_t n = T * K;
  if (n == 0) return;
  DeviceScope scope(a.dy.device);
  cudaStream_t s = as_stream(a.stream);
  const SwigluParams p{a.layout, a.alpha, a.limit, a.up_offset};
  const bool inter = a.layout == kSwigluInterleaved;
  const bool vec = I % 8 == 0 && aligned16(a.dy.data) && aligned16(a.h.data);
  const int64_t want = cdiv(n, kWarpsPerBlock), cap = int64_t(sm_count(a.dy.device)) * 16;
  const unsigned grid = static_cast<unsigned>(std::min(want, cap));
  const auto* inv = static_cast<const int32_t*>(a.inv.data);
  const auto* h = static_cast<const uint16_t*>(a.h.data);  // bf16
  auto* dw = static_cast<float*>(a.dw.data);
  typed_in(a.dy, [&](auto d) {
    using TD = std::remove_const_t<std::remove_pointer_t<decltype(d)>>;
    if (vec && inter) swiglu_weight_grad_kernel<true, true, TD><<<grid, kThreads, 0, s>>>(d, h, N, I, inv, n, p, dw);
    else if (vec) swiglu_weight_grad_kernel<true, false, TD><<<grid, kThreads, 0, s>>>(d, h, N, I, inv, n, p, dw);
    else if (inter) swiglu_weight_grad_kernel<false, true, TD><<<grid, kThreads, 0, s>>>(d, h, N, I, inv, n, p, dw);
    else swiglu_weight_grad_kernel<false, false, TD><<<grid, kThreads, 0, s>>>(d, h, N, I, inv, n, p, dw);
  });
  check_launch("moe_swiglu_weight_grad");
}

void moe_group_sum(const MoeGroupSumArgs& a) {
  const int64_t M = a.x.shape[0], C = a.x.shape[1], G = a.offs.shape[0];
  if (G == 0 || C == 0) return;
  DeviceScope scope(a.x.device);
  cudaStream_t s = as_stream(a.stream);
  const bool vec = C % 8 == 0 && aligned16(a.x.data) && aligned16(a.out.data);
  const int64_t tiles = cdiv(C, kSumCols);
  const int64_t want = G * tiles, cap = int64_t(sm_count(a.x.device)) * 32;
  const unsigned grid = static_cast<unsigned>(std::min(want, cap));
  const dim3 block(32, kSumLanes);
  const auto* offs = static_cast<const int32_t*>(a.offs.data);
  auto* out = static_cast<float*>(a.out.data);
  typed_in(a.x, [&](auto x) {
    using TX = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    if (vec) group_sum_kernel<true, TX><<<grid, block, 0, s>>>(x, M, C, offs, G, tiles, out);
    else group_sum_kernel<false, TX><<<grid, block, 0, s>>>(x, M, C, offs, G, tiles, out);
  });
  check_launch("moe_group_sum");
}

void swiglu(const SwigluArgs& a) {
  const int64_t N = a.h.shape[0], I = a.h.shape[1] / 2;
  if (N == 0 || I == 0) return;
  DeviceScope scope(a.h.device);
  cudaStream_t s = as_stream(a.stream);
  const SwigluParams p{a.layout, a.alpha, a.limit, a.up_offset};
  const bool inter = a.layout == kSwigluInterleaved;
  bool vec = I % 8 == 0 && aligned16(a.h.data) && aligned16(a.out.data);
  if (a.dy.present) vec = vec && aligned16(a.dy.t.data);
  const Tiling t = row_tiling(N, vec ? I / 8 : I, a.h.device);
  typed_in(a.h, [&](auto h) {
    using TH = std::remove_const_t<std::remove_pointer_t<decltype(h)>>;
    TH* out = static_cast<TH*>(a.out.data);
    if (!a.dy.present) {
      if (vec && inter) swiglu_kernel<true, true, TH><<<t.grid, t.block, 0, s>>>(h, N, I, p, out);
      else if (vec) swiglu_kernel<true, false, TH><<<t.grid, t.block, 0, s>>>(h, N, I, p, out);
      else if (inter) swiglu_kernel<false, true, TH><<<t.grid, t.block, 0, s>>>(h, N, I, p, out);
      else swiglu_kernel<false, false, TH><<<t.grid, t.block, 0, s>>>(h, N, I, p, out);
      return;
    }
    typed_in(a.dy.t, [&](auto dy) {
      using TD = std::remove_const_t<std::remove_pointer_t<decltype(dy)>>;
      if (vec && inter) swiglu_backward_kernel<true, true, TH, TD><<<t.grid, t.block, 0, s>>>(dy, h, N, I, p, out);
      else if (vec) swiglu_backward_kernel<true, false, TH, TD><<<t.grid, t.block, 0, s>>>(dy, h, N, I, p, out);
      else if (inter) swiglu_backward_kernel<false, true, TH, TD><<<t.grid, t.block, 0, s>>>(dy, h, N, I, p, out);
      else swiglu_backward_kernel<false, false, TH, TD><<<t.grid, t.block, 0, s>>>(dy, h, N, I, p, out);
    });
  });
  check_launch(a.dy.present ? "swiglu_backward" : "swiglu");
}

}  // namespace cuda
}  // namespace mxmoe
