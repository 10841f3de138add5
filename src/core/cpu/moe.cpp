// The MoE kernel family on the CPU: the exact reference of the CUDA kernels (cuda/moe/moe.cu), bit for
// bit (SwiGLU up to expf, see common/moe_activation.hpp). Every output element is computed by one
// thread in a fixed order, so results do not depend on the thread count. The project compiles C++
// with -ffp-contract=off: a * b + c below is two roundings, as __fmul_rn / __fadd_rn on the device.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/moe_activation.hpp"
#include "common/parallel.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cpu {
namespace {

// Typed element access: bf16 stored as uint16_t bits, f32 as float.
inline float ld(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
inline float ld(const float* p, int64_t i) { return p[i]; }
// Stores round once (RNE) and write NaN canonically (canon_nan), as the CUDA kernels.
inline void st(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(canon_nan(v)); }
inline void st(float* p, int64_t i, float v) { p[i] = canon_nan(v); }

// Calls fn with a typed pointer (const uint16_t* for bf16, const float* for f32) to t's data.
template <class Fn>
void with_input(const mxmoe_tensor& t, Fn&& fn) {
  if (t.dtype == MXMOE_DTYPE_BF16) fn(static_cast<const uint16_t*>(t.data));
  else fn(static_cast<const float*>(t.data));
}
template <class Fn>
void with_output(const mxmoe_tensor& t, Fn&& fn) {
  if (t.dtype == MXMOE_DTYPE_BF16) fn(static_cast<uint16_t*>(t.data));
  else fn(static_cast<float*>(t.data));
}

inline int64_t clamp_index(int64_t v, int64_t n) { return v < 0 ? 0 : (v >= n ? n - 1 : v); }

// Rows per parallel chunk: about 64K elements of work.
int64_t row_grain(int64_t per_row) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, per_row)); }

// A (T, k) factor (row_scale, weights) as fp32 at flat index i.
inline float factor(const OptTensor& f, int64_t i) { return load_f32(f.t, i); }

}  // namespace

void moe_routing(const MoeRoutingArgs& a) {
  const int64_t T = a.topk_idx.shape[0], K = a.topk_idx.shape[1], n = T * K, E = a.num_experts;
  auto* offs = static_cast<int32_t*>(a.offs.data);
  auto* perm = static_cast<int32_t*>(a.perm.data);
  auto* inv = static_cast<int32_t*>(a.inv.data);
  // Key of entry i: its expert id when in [0, E), else E (dropped).
  std::vector<int32_t> key(static_cast<size_t>(n));
  if (a.topk_idx.dtype == MXMOE_DTYPE_I64) {
    const auto* id = static_cast<const int64_t*>(a.topk_idx.data);
    for (int64_t i = 0; i < n; ++i) key[i] = (id[i] >= 0 && id[i] < E) ? static_cast<int32_t>(id[i]) : static_cast<int32_t>(E);
  } else {
    const auto* id = static_cast<const int32_t*>(a.topk_idx.data);
    for (int64_t i = 0; i < n; ++i) key[i] = (id[i] >= 0 && id[i] < E) ? id[i] : static_cast<int32_t>(E);
  }
  // Stable counting sort by key.
  std::vector<int64_t> next(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < n; ++i) ++next[key[i]];
  int64_t run = 0;
  for (int64_t e = 0; e <= E; ++e) {
    const int64_t c = next[e];
    next[e] = run;
    run += c;
    if (e < E) offs[e] = static_cast<int32_t>(run);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = next[key[i]]++;
    perm[p] = static_cast<int32_t>(i);
    inv[i] = static_cast<int32_t>(p);
  }
}

void moe_gather(const MoeGatherArgs& a) {
  const int64_t H = a.x.shape[1], n = a.perm.shape[0], K = a.k, nk = a.x.shape[0] * a.k;
  if (n == 0 || H == 0) return;
  const auto* perm = static_cast<const int32_t*>(a.perm.data);
  const bool copy = !a.row_scale.present && a.x.dtype == a.out.dtype;
  const int64_t row_bytes = H * dtype_size(a.x.dtype);
  with_input(a.x, [&](auto x) {
    with_output(a.out, [&](auto out) {
      parallel_for(n, row_grain(H), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          auto* o = out + r * H;
          if (perm[r] < 0 || nk == 0) {  // a padding row: zeros
            std::memset(o, 0, static_cast<size_t>(H * dtype_size(a.out.dtype)));
            continue;
          }
          const int64_t src = clamp_index(perm[r], nk);
          const auto* xr = x + (src / K) * H;
          if (copy) {
            std::memcpy(o, xr, static_cast<size_t>(row_bytes));  // the same bits, NaN payloads included
          } else if (a.row_scale.present) {
            const float s = factor(a.row_scale, src);
            for (int64_t h = 0; h < H; ++h) st(o, h, mul_rn(ld(xr, h), s));
          } else {
            for (int64_t h = 0; h < H; ++h) st(o, h, ld(xr, h));
          }
        }
      });
    });
  });
}

void moe_combine(const MoeCombineArgs& a) {
  const int64_t N = a.y.shape[0], H = a.y.shape[1], T = a.inv.shape[0], K = a.inv.shape[1];
  if (T == 0 || H == 0) return;
  const auto* inv = static_cast<const int32_t*>(a.inv.data);
  with_input(a.y, [&](auto y) {
    with_output(a.out, [&](auto out) {
      parallel_for(T, row_grain(H * std::max<int64_t>(K, 1)), [&](int64_t t0, int64_t t1) {
        std::vector<float> acc(static_cast<size_t>(H));
        for (int64_t t = t0; t < t1; ++t) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < K; ++j) {
            const auto* yr = y + clamp_index(inv[t * K + j], N) * H;
            if (a.weights.present) {
              const float w = factor(a.weights, t * K + j);
              for (int64_t h = 0; h < H; ++h) acc[h] = add_rn(acc[h], mul_rn(w, ld(yr, h)));
            } else {
              for (int64_t h = 0; h < H; ++h) acc[h] = add_rn(acc[h], ld(yr, h));
            }
          }
          for (int64_t h = 0; h < H; ++h) st(out + t * H, h, acc[h]);
        }
      });
    });
  });
}

void moe_combine_weight_grad(const MoeWeightGradArgs& a) {
  const int64_t T = a.dout.shape[0], H = a.dout.shape[1], N = a.y.shape[0], K = a.inv.shape[1];
  const int64_t n = T * K;
  if (n == 0) return;
  const auto* inv = static_cast<const int32_t*>(a.inv.data);
  auto* dw = static_cast<float*>(a.dw.data);
  with_input(a.dout, [&](auto dout) {
    with_input(a.y, [&](auto y) {
      parallel_for(n, row_grain(H), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const auto* d = dout + (i / K) * H;
          const auto* yr = y + clamp_index(inv[i], N) * H;
          float lane[kDotLanes] = {};
          for (int64_t h = 0; h < H; ++h) {
            float& acc = lane[(h / kDotChunk) % kDotLanes];
            acc = add_rn(acc, mul_rn(ld(d, h), ld(yr, h)));
          }
          for (int off = kDotLanes / 2; off >= 1; off /= 2)
            for (int l = 0; l < off; ++l) lane[l] = add_rn(lane[l], lane[l + off]);
          dw[i] = canon_nan(lane[0]);
        }
      });
    });
  });
}

void moe_swiglu_weight_grad(const MoeSwigluWeightGradArgs& a) {
  const int64_t N = a.dy.shape[0], I = a.dy.shape[1], T = a.inv.shape[0], K = a.inv.shape[1];
  const int64_t n = T * K;
  if (n == 0) return;
  const SwigluParams p{a.layout, a.alpha, a.limit, a.up_offset};
  const bool inter = a.layout == kSwigluInterleaved;
  const auto* inv = static_cast<const int32_t*>(a.inv.data);
  const auto* h = static_cast<const uint16_t*>(a.h.data);  // bf16
  auto* dw = static_cast<float*>(a.dw.data);
  with_input(a.dy, [&](auto dy) {
    parallel_for(n, row_grain(4 * I), [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t r = clamp_index(inv[e], N);
        const auto* d = dy + r * I;
        const uint16_t* hr = h + r * 2 * I;
        float lane[kDotLanes] = {};
        for (int64_t i = 0; i < I; ++i) {
          const float act = swiglu_value(ld(hr, inter ? 2 * i : i), ld(hr, inter ? 2 * i + 1 : I + i), p);
          float& acc = lane[(i / kDotChunk) % kDotLanes];
          acc = add_rn(acc, mul_rn(ld(d, i), act));
        }
        for (int off = kDotLanes / 2; off >= 1; off /= 2)
          for (int l = 0; l < off; ++l) lane[l] = add_rn(lane[l], lane[l + off]);
        dw[e] = canon_nan(lane[0]);
      }
    });
  });
}

void moe_group_sum(const MoeGroupSumArgs& a) {
  const int64_t M = a.x.shape[0], C = a.x.shape[1], G = a.offs.shape[0];
  if (G == 0 || C == 0) return;
  const Groups groups = groups_from_offsets(a.offs, M);
  auto* out = static_cast<float*>(a.out.data);
  constexpr int64_t kCols = 64;  // columns per task
  const int64_t col_tasks = cdiv(C, kCols);
  with_input(a.x, [&](auto x) {
    parallel_for(G * col_tasks, 1, [&](int64_t w0, int64_t w1) {
      std::vector<float> lane(static_cast<size_t>(kSumLanes * kCols));
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t g = w / col_tasks, c0 = (w % col_tasks) * kCols, nc = std::min(kCols, C - c0);
        std::fill(lane.begin(), lane.end(), 0.0f);
        const int64_t s = groups.start[g], e = groups.end[g];
        for (int64_t r = s; r < e; ++r) {
          float* l = lane.data() + ((r - s) % kSumLanes) * kCols;
          const auto* xr = x + r * C + c0;
          for (int64_t c = 0; c < nc; ++c) l[c] = add_rn(l[c], ld(xr, c));
        }
        for (int off = kSumLanes / 2; off >= 1; off /= 2)
          for (int i = 0; i < off; ++i)
            for (int64_t c = 0; c < nc; ++c) lane[i * kCols + c] = add_rn(lane[i * kCols + c], lane[(i + off) * kCols + c]);
        for (int64_t c = 0; c < nc; ++c) out[g * C + c0 + c] = canon_nan(lane[c]);
      }
    });
  });
}

void swiglu(const SwigluArgs& a) {
  const int64_t N = a.h.shape[0], C = a.h.shape[1], I = C / 2;
  if (N == 0 || I == 0) return;
  const SwigluParams p{a.layout, a.alpha, a.limit, a.up_offset};
  const bool inter = a.layout == kSwigluInterleaved;
  // Element offsets of gate i and up i within a row of h.
  auto gate_at = [&](int64_t i) { return inter ? 2 * i : i; };
  auto up_at = [&](int64_t i) { return inter ? 2 * i + 1 : I + i; };
  with_input(a.h, [&](auto h) {
    with_output(a.out, [&](auto out) {
      if (!a.dy.present) {
        parallel_for(N, row_grain(I), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const auto* hr = h + r * C;
            for (int64_t i = 0; i < I; ++i) st(out + r * I, i, swiglu_value(ld(hr, gate_at(i)), ld(hr, up_at(i)), p));
          }
        });
        return;
      }
      with_input(a.dy.t, [&](auto dy) {
        parallel_for(N, row_grain(I), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const auto* hr = h + r * C;
            auto* o = out + r * C;
            for (int64_t i = 0; i < I; ++i) {
              float dg, du;
              swiglu_grad(ld(hr, gate_at(i)), ld(hr, up_at(i)), ld(dy + r * I, i), p, &dg, &du);
              st(o, gate_at(i), dg);
              st(o, up_at(i), du);
            }
          }
        });
      });
    });
  });
}

}  // namespace cpu
}  // namespace mxmoe
