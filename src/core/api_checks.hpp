// Validation helpers shared by the C API translation units (api.cpp, api_fused.cpp, api_gemm.cpp):
// one wording for every message (argument name, expected vs actual) and one 2D -> 3D normalization.
#pragma once

#include <vector>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mxmoe.h"
#include "ops.hpp"

namespace mxmoe {
namespace api {

// (R, C) -> (1, R, C); 3D views pass through.
inline mxmoe_tensor as_3d(const mxmoe_tensor& t) {
  if (t.ndim == 3) return t;
  mxmoe_tensor r = t;
  r.ndim = 3;
  r.shape[0] = 1;
  r.shape[1] = t.shape[0];
  r.shape[2] = t.shape[1];
  r.strides[0] = t.shape[0] * t.strides[0];
  r.strides[1] = t.strides[0];
  r.strides[2] = t.strides[1];
  return r;
}

// Shape with the leading batch dim only when the reference tensor had one.
inline std::vector<int64_t> batched(const mxmoe_tensor& ref, std::vector<int64_t> tail) {
  if (ref.ndim == 3) tail.insert(tail.begin(), ref.shape[0]);
  return tail;
}

// A valid device code; tensors on a device need a library built with CUDA.
inline void check_backend(int32_t device, const char* name) {
  if (device < -1) fail(name, ": expected device -1 (host) or a CUDA ordinal >= 0, got ", device);
#if !defined(MXMOE_WITH_CUDA)
  if (device >= 0)
    fail_status(MXMOE_ERR_UNSUPPORTED, name, ": expected a host tensor (this libmxmoe has no CUDA), got one on ",
                device_str(device));
#else
  (void)name;
#endif
}

// t: of this dtype and shape, on `device`, contiguous (one message each, in that order).
inline void check_dense(const mxmoe_tensor& t, const char* name, mxmoe_dtype dtype, const std::vector<int64_t>& shape,
                        int32_t device) {
  check_dtype(t, name, {dtype});
  check_shape(t, name, shape);
  check_device(t, name, device);
  check_contiguous(t, name);
}

// offs: 1-D int32 on the given device.
inline void check_offs(const mxmoe_tensor& offs, int32_t device) {
  check_dtype(offs, "offs", {MXMOE_DTYPE_I32});
  check_ndim(offs, "offs", {1});
  check_device(offs, "offs", device);
}

// Operands of the grouped GEMM with groups of a's rows (mxmoe_grouped_mm_mx, mxmoe_grouped_mm_tile128):
// a (M, K) e4m3 + a_scale (M, K/32), b (G, N, K) e4m3 + b_scale (G, N, K/32), offs (G) int32, optional
// bias (G, N), out (M, N) bf16/f32, dense, sharing no memory with an input; all on a's device.
// Checked in this order, one message each (api.cpp). out_rows >= 0: out has that many rows instead of
// a's (the gather variant: a is the per-token operand, out the routed rows).
GroupedMMArgs check_grouped_mm(const mxmoe_tensor* a, const mxmoe_tensor* a_scale, const mxmoe_tensor* b,
                               const mxmoe_tensor* b_scale, const mxmoe_tensor* offs, const mxmoe_tensor* bias,
                               mxmoe_tensor* out, void* stream, int64_t out_rows = -1);

// Operands of the grouped GEMM with groups along the tokens (wgrad; mxmoe_grouped_mm_mx_kgroups,
// mxmoe_grouped_mm_tile128_kgroups): a (N, M) and b (K, M) e4m3, a_scale (N, cap) and b_scale (K, cap)
// grouped compact along the M tokens, offs (G), out (G, N, K) bf16/f32, dense, no overlap.
GroupedMMKArgs check_grouped_mm_kgroups(const mxmoe_tensor* a, const mxmoe_tensor* a_scale, const mxmoe_tensor* b,
                                        const mxmoe_tensor* b_scale, const mxmoe_tensor* offs, mxmoe_tensor* out,
                                        void* stream);

}  // namespace api
}  // namespace mxmoe
