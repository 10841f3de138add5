// C API of the tile128 grouped GEMMs (include/mxmoe/mxmoe.h, "Hopper FP8 grouped GEMMs"):
// validation once, then dispatch: host tensors -> the exact CPU reference (cpu::grouped_mm,
// cpu::grouped_mm_kgroups; coarse-block operands are valid MX operands), CUDA tensors -> the Hopper
// FP8 kernels (cuda/gemm_tile128.cu). Nothing is written before validation passes.
#include <cstdint>
#include <limits>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/mxmoe.h"
#include "api_checks.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace {

using api::check_backend;
using api::check_offs;

void check_e4m3(const mxmoe_tensor& t, const char* name, int ndim, int32_t device) {
  check_dtype(t, name, {MXMOE_DTYPE_E4M3});
  check_ndim(t, name, {ndim});
  check_device(t, name, device);
}

void check_scale(const mxmoe_tensor& t, const char* name, const std::vector<int64_t>& shape, int32_t device) {
  check_dtype(t, name, {MXMOE_DTYPE_E8M0});
  check_shape(t, name, shape);
  check_device(t, name, device);
}

// Device path: the FP8 kernels read dense tensors through TMA.
[[maybe_unused]] void check_device_layout(const mxmoe_tensor& t, const char* name, bool aligned16) {
  if (!is_contiguous(t)) fail(name, ": expected a contiguous tensor on ", device_str(t.device));
  if (aligned16 && reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    fail(name, ": expected a 16-byte aligned data pointer on ", device_str(t.device), ", got ", t.data);
}

[[maybe_unused]] void check_int32_dims(std::initializer_list<int64_t> dims, const char* what) {
  for (int64_t d : dims)
    if (d > std::numeric_limits<int32_t>::max())
      fail_status(MXMOE_ERR_UNSUPPORTED, what, ": dimensions must be < 2^31 on CUDA, got ", d);
}

// Workspace view -> (pointer, bytes); required on a device.
[[maybe_unused]] int64_t workspace_bytes(const mxmoe_tensor* ws, int32_t device, int64_t need, void** data) {
  *data = nullptr;
  if (device < 0) return 0;
  if (ws == nullptr) fail("workspace: expected a device tensor of at least ", need, " bytes, got NULL");
  const mxmoe_tensor& w = require(ws, "workspace");
  check_device(w, "workspace", device);
  check_contiguous(w, "workspace");
  const int64_t bytes = numel(w) * dtype_size(w.dtype);
  if (bytes < need) fail("workspace: expected at least ", need, " bytes, got ", bytes);
  *data = w.data;
  return bytes;
}

}  // namespace
}  // namespace mxmoe

using namespace mxmoe;

extern "C" {

int64_t mxmoe_grouped_mm_tile128_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g, int32_t device) {
  try {
    clear_last_error();
    if (m < 0 || n < 0 || k < 0 || g < 0) fail("workspace size: expected non-negative shapes, got m=", m, " n=", n, " k=", k, " g=", g);
    if (device < 0) return 0;
    check_backend(device, "device");
#if defined(MXMOE_WITH_CUDA)
    return cuda::grouped_mm_tile128_workspace_size(m, n, k, g, device);
#endif
  } catch (const Error& e) {
    set_last_error(e.what());
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
  }
  return -1;
}

int64_t mxmoe_grouped_mm_tile128_kgroups_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g,
                                                        int32_t device) {
  try {
    clear_last_error();
    if (m < 0 || n < 0 || k < 0 || g < 0) fail("workspace size: expected non-negative shapes, got m=", m, " n=", n, " k=", k, " g=", g);
    if (device < 0) return 0;
    check_backend(device, "device");
#if defined(MXMOE_WITH_CUDA)
    return cuda::grouped_mm_tile128_kgroups_workspace_size(m, n, k, g, device);
#endif
  } catch (const Error& e) {
    set_last_error(e.what());
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
  }
  return -1;
}

mxmoe_status mxmoe_grouped_mm_tile128(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                      const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                      const mxmoe_tensor* offs_, const mxmoe_tensor* bias_,
                                      mxmoe_tensor* out_, const mxmoe_tensor* workspace_,
                                      void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& a = require(a_, "a");
  check_dtype(a, "a", {MXMOE_DTYPE_E4M3});
  check_ndim(a, "a", {2});
  check_backend(a.device, "a");
  const int32_t dev = a.device;
  const int64_t M = a.shape[0], K = a.shape[1];
  if (K % kBlock != 0) fail("a: expected the contraction dim K to be a multiple of 32, got ", K);
  const mxmoe_tensor& b = require(b_, "b");
  check_e4m3(b, "b", 3, dev);
  const int64_t G = b.shape[0], N = b.shape[1];
  if (b.shape[2] != K) fail("b: expected contraction dim (last) ", K, " to match a, got ", b.shape[2]);
  const mxmoe_tensor& as = require(a_scale_, "a_scale");
  check_scale(as, "a_scale", {M, K / kBlock}, dev);
  const mxmoe_tensor& bs = require(b_scale_, "b_scale");
  check_scale(bs, "b_scale", {G, N, K / kBlock}, dev);
  const mxmoe_tensor& offs = require(offs_, "offs");
  check_offs(offs, dev);
  check_shape(offs, "offs", {G});
  GroupedMMArgs args;
  if (bias_ != nullptr) {
    const mxmoe_tensor& bias = require(bias_, "bias");
    check_dtype(bias, "bias", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
    check_shape(bias, "bias", {G, N});
    check_device(bias, "bias", dev);
    args.bias.present = true;
    args.bias.t = bias;
  }
  const mxmoe_tensor& out = require(out_, "out");
  check_dtype(out, "out", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_shape(out, "out", {M, N});
  check_device(out, "out", dev);
  check_contiguous(out, "out");
  for (auto* in : {&a, &as, &b, &bs, &offs}) check_no_overlap(out, "out", *in, "an input");
  if (bias_ != nullptr) check_no_overlap(out, "out", *bias_, "bias");
  void* ws = nullptr;
  int64_t ws_bytes = 0;
  if (dev >= 0) {
#if defined(MXMOE_WITH_CUDA)
    check_device_layout(a, "a", true);
    check_device_layout(b, "b", true);
    check_device_layout(as, "a_scale", false);
    check_device_layout(bs, "b_scale", false);
    check_device_layout(offs, "offs", false);
    check_device_layout(out, "out", true);
    if (N % 16 != 0) fail("b: expected N (dim 1) to be a multiple of 16 on CUDA, got ", N);
    check_int32_dims({M, N, K, G}, "grouped_mm_tile128");
    const int64_t need = cuda::grouped_mm_tile128_workspace_size(M, N, K, G, dev);
    ws_bytes = workspace_bytes(workspace_, dev, need, &ws);
    check_no_overlap(*workspace_, "workspace", out, "out");
    for (auto* in : {&a, &as, &b, &bs, &offs}) check_no_overlap(*workspace_, "workspace", *in, "an input");
#endif
  }
  args.a = a;
  args.a_scale = as;
  args.b = b;
  args.b_scale = bs;
  args.offs = offs;
  args.out = out;
  args.stream = stream;
  if (dev >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_tile128(args, ws, ws_bytes);
#else
    (void)ws, (void)ws_bytes, (void)workspace_;
#endif
  } else {
    cpu::grouped_mm(args);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_grouped_mm_tile128_kgroups(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                              const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                              const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                                              const mxmoe_tensor* workspace_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& a = require(a_, "a");
  check_dtype(a, "a", {MXMOE_DTYPE_E4M3});
  check_ndim(a, "a", {2});
  check_backend(a.device, "a");
  const int32_t dev = a.device;
  const int64_t N = a.shape[0], M = a.shape[1];
  const mxmoe_tensor& b = require(b_, "b");
  check_e4m3(b, "b", 2, dev);
  const int64_t K = b.shape[0];
  if (b.shape[1] != M) fail("b: expected token dim (last) ", M, " to match a, got ", b.shape[1]);
  const mxmoe_tensor& offs = require(offs_, "offs");
  check_offs(offs, dev);
  const int64_t G = offs.shape[0];
  const int64_t cap = mxmoe_grouped_scale_capacity(M, G);
  const mxmoe_tensor& as = require(a_scale_, "a_scale");
  check_scale(as, "a_scale", {N, cap}, dev);
  const mxmoe_tensor& bs = require(b_scale_, "b_scale");
  check_scale(bs, "b_scale", {K, cap}, dev);
  const mxmoe_tensor& out = require(out_, "out");
  check_dtype(out, "out", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_shape(out, "out", {G, N, K});
  check_device(out, "out", dev);
  check_contiguous(out, "out");
  for (auto* in : {&a, &as, &b, &bs, &offs}) check_no_overlap(out, "out", *in, "an input");
  void* ws = nullptr;
  int64_t ws_bytes = 0;
  if (dev >= 0) {
#if defined(MXMOE_WITH_CUDA)
    check_device_layout(a, "a", false);  // groups are staged when A/B cannot be read in place
    check_device_layout(b, "b", false);
    check_device_layout(as, "a_scale", false);
    check_device_layout(bs, "b_scale", false);
    check_device_layout(offs, "offs", false);
    check_device_layout(out, "out", true);
    if (K % 16 != 0) fail("b: expected K (dim 0) to be a multiple of 16 on CUDA, got ", K);
    check_int32_dims({M, N, K, G, cap}, "grouped_mm_tile128_kgroups");
    const int64_t need = cuda::grouped_mm_tile128_kgroups_workspace_size(M, N, K, G, dev);
    ws_bytes = workspace_bytes(workspace_, dev, need, &ws);
    check_no_overlap(*workspace_, "workspace", out, "out");
    for (auto* in : {&a, &as, &b, &bs, &offs}) check_no_overlap(*workspace_, "workspace", *in, "an input");
#endif
  }
  GroupedMMKArgs args;
  args.a = a;
  args.a_scale = as;
  args.b = b;
  args.b_scale = bs;
  args.offs = offs;
  args.out = out;
  args.stream = stream;
  if (dev >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_tile128_kgroups(args, ws, ws_bytes);
#else
    (void)ws, (void)ws_bytes, (void)workspace_;
#endif
  } else {
    cpu::grouped_mm_kgroups(args);
  }
  MXMOE_API_END
}

}  // extern "C"
