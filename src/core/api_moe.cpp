// C API of the MoE kernel family (routing, gather, combine, weight grads, group sum, SwiGLU):
// validation (messages name the argument and give expected vs actual), then dispatch by device.
// Nothing is written before validation passes.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mxmoe.h"
#include "api_checks.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace {

using api::check_backend;

constexpr int64_t kMaxExperts = int64_t(1) << 20;
constexpr int64_t kMaxIndex = INT32_MAX;  // int32 indices: T*k and row counts below 2^31

OptTensor optional(const mxmoe_tensor* t) {
  OptTensor o;
  if (t != nullptr) {
    o.present = true;
    o.t = *t;
  }
  return o;
}

// A 2-D bf16/f32 operand, contiguous (the kernels read whole rows).
const mxmoe_tensor& float_matrix(const mxmoe_tensor* p, const char* name) {
  const mxmoe_tensor& t = require(p, name);
  check_dtype(t, name, {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_ndim(t, name, {2});
  check_contiguous(t, name);
  return t;
}

void check_on(const mxmoe_tensor& t, const char* name, int32_t device) {
  check_device(t, name, device);
  check_contiguous(t, name);
}

// An int32 index tensor of the given shape on `device`.
const mxmoe_tensor& index_tensor(const mxmoe_tensor* p, const char* name, const std::vector<int64_t>& shape,
                                 int32_t device) {
  const mxmoe_tensor& t = require(p, name);
  check_dtype(t, name, {MXMOE_DTYPE_I32});
  check_shape(t, name, shape);
  check_on(t, name, device);
  return t;
}

// An optional (T, k) bf16/f32 per-entry factor (row_scale, weights).
void check_factor(const mxmoe_tensor* p, const char* name, int64_t t, int64_t k, int32_t device) {
  if (p == nullptr) return;
  const mxmoe_tensor& f = require(p, name);
  check_dtype(f, name, {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_shape(f, name, {t, k});
  check_on(f, name, device);
}

// Output checks: dtype set, shape, device, contiguous.
const mxmoe_tensor& output(mxmoe_tensor* p, const char* name, std::initializer_list<mxmoe_dtype> dtypes,
                           const std::vector<int64_t>& shape, int32_t device) {
  const mxmoe_tensor& t = require(p, name);
  check_dtype(t, name, dtypes);
  check_shape(t, name, shape);
  check_on(t, name, device);
  return t;
}

// Every output must share no memory with any input or with another output.
void check_separate(std::initializer_list<std::pair<const mxmoe_tensor*, const char*>> outs,
                    std::initializer_list<std::pair<const mxmoe_tensor*, const char*>> ins) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    for (const auto& i : ins)
      if (i.first != nullptr) check_no_overlap(*o->first, o->second, *i.first, i.second);
    for (auto p = outs.begin(); p != o; ++p) check_no_overlap(*o->first, o->second, *p->first, p->second);
  }
}

// T*k entries addressed by int32 indices.
int64_t entries(int64_t t, int64_t k, const char* what) {
  if (k != 0 && t > kMaxIndex / k)
    fail(what, ": expected T*k < 2^31 entries (int32 indices), got T = ", t, ", k = ", k);
  return t * k;
}

void check_experts(int64_t e) {
  if (e < 1 || e > kMaxExperts) fail("num_experts: expected 1 <= num_experts <= 2^20, got ", e);
}

void check_swiglu_params(int32_t layout, float alpha, float limit, float up_offset) {
  if (layout != MXMOE_SWIGLU_CONCAT && layout != MXMOE_SWIGLU_INTERLEAVED)
    fail("layout: expected MXMOE_SWIGLU_CONCAT (0) or MXMOE_SWIGLU_INTERLEAVED (1), got ", layout);
  if (!std::isfinite(alpha)) fail("alpha: expected a finite value, got ", alpha);
  if (!(limit >= 0.0f)) fail("limit: expected >= 0 (+inf: no clamp), got ", limit);
  if (!std::isfinite(up_offset)) fail("up_offset: expected a finite value, got ", up_offset);
}

#if defined(MXMOE_WITH_CUDA)
#define MXMOE_DISPATCH(dev, fn, args) \
  do {                                \
    if ((dev) >= 0) cuda::fn(args);   \
    else cpu::fn(args);               \
  } while (0)
#else
#define MXMOE_DISPATCH(dev, fn, args) cpu::fn(args)
#endif

}  // namespace
}  // namespace mxmoe

using namespace mxmoe;

extern "C" {

int64_t mxmoe_moe_routing_workspace_size(int64_t n, int64_t num_experts, int32_t device) {
  return api_value([&]() -> int64_t {
    if (n < 0 || n > kMaxIndex) fail("n: expected 0 <= n < 2^31 (T*k entries), got ", n);
    check_experts(num_experts);
    if (device < -1) fail("device: expected -1 (host) or a CUDA ordinal >= 0, got ", device);
    if (device < 0) return 0;
    check_backend(device, "device");  // no CUDA in this build: UNSUPPORTED
#if defined(MXMOE_WITH_CUDA)
    return cuda::moe_routing_workspace_size(n, num_experts, device);
#else
    return -1;  // not reached: check_backend threw
#endif
  });
}

mxmoe_status mxmoe_moe_routing(const mxmoe_tensor* topk_idx_, int64_t num_experts, mxmoe_tensor* offs_,
                               mxmoe_tensor* perm_, mxmoe_tensor* inv_, const mxmoe_tensor* workspace_,
                               void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& idx = require(topk_idx_, "topk_idx");
  check_dtype(idx, "topk_idx", {MXMOE_DTYPE_I32, MXMOE_DTYPE_I64});
  check_ndim(idx, "topk_idx", {2});
  check_backend(idx.device, "topk_idx");
  check_contiguous(idx, "topk_idx");
  check_experts(num_experts);
  const int64_t T = idx.shape[0], K = idx.shape[1];
  const int64_t N = entries(T, K, "topk_idx");
  const int32_t dev = idx.device;
  const mxmoe_tensor& offs = output(offs_, "offs", {MXMOE_DTYPE_I32}, {num_experts}, dev);
  const mxmoe_tensor& perm = output(perm_, "perm", {MXMOE_DTYPE_I32}, {N}, dev);
  const mxmoe_tensor& inv = output(inv_, "inv", {MXMOE_DTYPE_I32}, {T, K}, dev);
  check_separate({{&offs, "offs"}, {&perm, "perm"}, {&inv, "inv"}}, {{&idx, "topk_idx"}});
  MoeRoutingArgs a;
  a.topk_idx = idx;
  a.num_experts = num_experts;
  a.offs = offs;
  a.perm = perm;
  a.inv = inv;
  a.stream = stream;
  if (dev >= 0) {
#if defined(MXMOE_WITH_CUDA)
    const int64_t need = cuda::moe_routing_workspace_size(N, num_experts, dev);
    if (need > 0) {
      if (workspace_ == nullptr) fail("workspace: expected a device tensor of at least ", need, " bytes, got NULL");
      const mxmoe_tensor& w = require(workspace_, "workspace");
      check_on(w, "workspace", dev);
      const int64_t bytes = numel(w) * dtype_size(w.dtype);
      if (bytes < need) fail("workspace: expected at least ", need, " bytes, got ", bytes);
      check_separate({{&w, "workspace"}}, {{&idx, "topk_idx"}, {&offs, "offs"}, {&perm, "perm"}, {&inv, "inv"}});
      a.workspace = w.data;
      a.workspace_bytes = bytes;
    }
    cuda::moe_routing(a);
#endif
  } else {
    (void)workspace_;  // the host sort needs no scratch
    cpu::moe_routing(a);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_moe_gather(const mxmoe_tensor* x_, const mxmoe_tensor* perm_, int64_t k,
                              const mxmoe_tensor* row_scale_, mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& x = float_matrix(x_, "x");
  check_backend(x.device, "x");
  const int64_t T = x.shape[0], H = x.shape[1];
  if (k < 0) fail("k: expected >= 0, got ", k);
  entries(T, k, "k");  // T * k in range
  const mxmoe_tensor& perm_any = require(perm_, "perm");
  check_ndim(perm_any, "perm", {1});
  const int64_t N = perm_any.shape[0];  // any number of rows (padded routing: more than T * k)
  if (N > kMaxIndex) fail("perm: expected fewer than 2^31 rows, got ", N);
  const mxmoe_tensor& perm = index_tensor(perm_, "perm", {N}, x.device);
  check_factor(row_scale_, "row_scale", T, k, x.device);
  const mxmoe_tensor& out = output(out_, "out", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}, {N, H}, x.device);
  check_separate({{&out, "out"}}, {{&x, "x"}, {&perm, "perm"}, {row_scale_, "row_scale"}});
  MoeGatherArgs a;
  a.x = x;
  a.perm = perm;
  a.k = k;
  a.row_scale = optional(row_scale_);
  a.out = out;
  a.stream = stream;
  MXMOE_DISPATCH(x.device, moe_gather, a);
  MXMOE_API_END
}

mxmoe_status mxmoe_moe_combine(const mxmoe_tensor* y_, const mxmoe_tensor* inv_, const mxmoe_tensor* weights_,
                               mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& y = float_matrix(y_, "y");
  check_backend(y.device, "y");
  const int64_t N = y.shape[0], H = y.shape[1];
  const mxmoe_tensor& inv = require(inv_, "inv");
  check_dtype(inv, "inv", {MXMOE_DTYPE_I32});
  check_ndim(inv, "inv", {2});
  check_on(inv, "inv", y.device);
  const int64_t T = inv.shape[0], K = inv.shape[1];
  if (T * K > 0 && N == 0)
    fail("y: expected at least 1 row to combine from (inv has ", T * K, " entries), got shape ", shape_str(y));
  check_factor(weights_, "weights", T, K, y.device);
  const mxmoe_tensor& out = output(out_, "out", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}, {T, H}, y.device);
  check_separate({{&out, "out"}}, {{&y, "y"}, {&inv, "inv"}, {weights_, "weights"}});
  MoeCombineArgs a;
  a.y = y;
  a.inv = inv;
  a.weights = optional(weights_);
  a.out = out;
  a.stream = stream;
  MXMOE_DISPATCH(y.device, moe_combine, a);
  MXMOE_API_END
}

mxmoe_status mxmoe_moe_combine_weight_grad(const mxmoe_tensor* dout_, const mxmoe_tensor* y_,
                                           const mxmoe_tensor* inv_, mxmoe_tensor* dw_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& dout = float_matrix(dout_, "dout");
  check_backend(dout.device, "dout");
  const int64_t T = dout.shape[0], H = dout.shape[1];
  const mxmoe_tensor& y = float_matrix(y_, "y");
  check_device(y, "y", dout.device);
  if (y.shape[1] != H) fail("y: expected ", H, " columns (dout's), got shape ", shape_str(y));
  const int64_t N = y.shape[0];
  const mxmoe_tensor& inv = require(inv_, "inv");
  check_dtype(inv, "inv", {MXMOE_DTYPE_I32});
  check_ndim(inv, "inv", {2});
  if (inv.shape[0] != T) fail("inv: expected ", T, " rows (dout's tokens), got shape ", shape_str(inv));
  check_on(inv, "inv", dout.device);
  const int64_t K = inv.shape[1];
  if (T * K > 0 && N == 0)
    fail("y: expected at least 1 row (inv has ", T * K, " entries), got shape ", shape_str(y));
  const mxmoe_tensor& dw = output(dw_, "dw", {MXMOE_DTYPE_F32}, {T, K}, dout.device);
  check_separate({{&dw, "dw"}}, {{&dout, "dout"}, {&y, "y"}, {&inv, "inv"}});
  MoeWeightGradArgs a;
  a.dout = dout;
  a.y = y;
  a.inv = inv;
  a.dw = dw;
  a.stream = stream;
  MXMOE_DISPATCH(dout.device, moe_combine_weight_grad, a);
  MXMOE_API_END
}

mxmoe_status mxmoe_moe_swiglu_weight_grad(const mxmoe_tensor* dy_, const mxmoe_tensor* h_, const mxmoe_tensor* inv_,
                                          int32_t layout, float alpha, float limit, float up_offset, mxmoe_tensor* dw_,
                                          void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& dy = float_matrix(dy_, "dy");
  check_backend(dy.device, "dy");
  const int64_t N = dy.shape[0], I = dy.shape[1];
  const mxmoe_tensor& h = require(h_, "h");
  check_dtype(h, "h", {MXMOE_DTYPE_BF16});
  check_ndim(h, "h", {2});
  if (h.shape[0] != N || h.shape[1] != 2 * I)
    fail("h: expected shape (", N, ", ", 2 * I, ") (dy's rows, gate and up: twice dy's columns), got shape ",
         shape_str(h));
  check_on(h, "h", dy.device);
  const mxmoe_tensor& inv = require(inv_, "inv");
  check_dtype(inv, "inv", {MXMOE_DTYPE_I32});
  check_ndim(inv, "inv", {2});
  check_on(inv, "inv", dy.device);
  const int64_t T = inv.shape[0], K = inv.shape[1];
  if (T * K > 0 && N == 0)
    fail("dy: expected at least 1 row (inv has ", T * K, " entries), got shape ", shape_str(dy));
  check_swiglu_params(layout, alpha, limit, up_offset);
  const mxmoe_tensor& dw = output(dw_, "dw", {MXMOE_DTYPE_F32}, {T, K}, dy.device);
  check_separate({{&dw, "dw"}}, {{&dy, "dy"}, {&h, "h"}, {&inv, "inv"}});
  MoeSwigluWeightGradArgs a;
  a.dy = dy;
  a.h = h;
  a.inv = inv;
  a.dw = dw;
  a.layout = layout;
  a.alpha = alpha;
  a.limit = limit;
  a.up_offset = up_offset;
  a.stream = stream;
  MXMOE_DISPATCH(dy.device, moe_swiglu_weight_grad, a);
  MXMOE_API_END
}

mxmoe_status mxmoe_moe_group_sum(const mxmoe_tensor* x_, const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                                 void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& x = float_matrix(x_, "x");
  check_backend(x.device, "x");
  const mxmoe_tensor& offs = require(offs_, "offs");
  api::check_offs(offs, x.device);
  check_contiguous(offs, "offs");
  const int64_t G = offs.shape[0], C = x.shape[1];
  const mxmoe_tensor& out = output(out_, "out", {MXMOE_DTYPE_F32}, {G, C}, x.device);
  check_separate({{&out, "out"}}, {{&x, "x"}, {&offs, "offs"}});
  MoeGroupSumArgs a;
  a.x = x;
  a.offs = offs;
  a.out = out;
  a.stream = stream;
  MXMOE_DISPATCH(x.device, moe_group_sum, a);
  MXMOE_API_END
}

mxmoe_status mxmoe_swiglu(const mxmoe_tensor* h_, int32_t layout, float alpha, float limit, float up_offset,
                          mxmoe_tensor* y_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& h = float_matrix(h_, "h");
  check_backend(h.device, "h");
  const int64_t N = h.shape[0], C = h.shape[1];
  if (C % 2 != 0) fail("h: expected an even last dim (2I: gate and up), got shape ", shape_str(h));
  check_swiglu_params(layout, alpha, limit, up_offset);
  const mxmoe_tensor& y = output(y_, "y", {h.dtype}, {N, C / 2}, h.device);
  check_separate({{&y, "y"}}, {{&h, "h"}});
  SwigluArgs a;
  a.h = h;
  a.out = y;
  a.layout = layout;
  a.alpha = alpha;
  a.limit = limit;
  a.up_offset = up_offset;
  a.stream = stream;
  MXMOE_DISPATCH(h.device, swiglu, a);
  MXMOE_API_END
}

mxmoe_status mxmoe_swiglu_backward(const mxmoe_tensor* dy_, const mxmoe_tensor* h_, int32_t layout, float alpha,
                                   float limit, float up_offset, mxmoe_tensor* dh_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& dy = float_matrix(dy_, "dy");
  check_backend(dy.device, "dy");
  const mxmoe_tensor& h = float_matrix(h_, "h");
  check_device(h, "h", dy.device);
  const int64_t N = h.shape[0], C = h.shape[1];
  if (C % 2 != 0) fail("h: expected an even last dim (2I: gate and up), got shape ", shape_str(h));
  check_shape(dy, "dy", {N, C / 2});
  check_swiglu_params(layout, alpha, limit, up_offset);
  const mxmoe_tensor& dh = output(dh_, "dh", {h.dtype}, {N, C}, h.device);
  check_separate({{&dh, "dh"}}, {{&dy, "dy"}, {&h, "h"}});
  SwigluArgs a;
  a.h = h;
  a.dy = optional(&dy);
  a.out = dh;
  a.layout = layout;
  a.alpha = alpha;
  a.limit = limit;
  a.up_offset = up_offset;
  a.stream = stream;
  MXMOE_DISPATCH(h.device, swiglu, a);
  MXMOE_API_END
}

}  // extern "C"
