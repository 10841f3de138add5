// torch.ops.mxmoe.* of the MoE kernel family: routing metadata, gather (dispatch), combine and its
// weight gradient (from the expert outputs, or from the down projection's dgrad and SwiGLU's input),
// per-group row sums (bias gradients), SwiGLU forward/backward. Each op allocates its outputs with
// torch (shapes from the inputs' shapes only, the rules of the fakes in mxmoe/ops.py), lets the core
// validate every argument and launches on torch's current stream.
#include <cstdint>
#include <string>
#include <tuple>

#include "ops_core.hpp"

namespace mxmoe {
namespace ops {
namespace {

// Sizes for the allocation from possibly malformed operands (the core then rejects them by name).
int64_t size_or0(const Tensor& t, int64_t d) { return t.dim() > d ? t.size(d) : 0; }

float to_float(double v) { return static_cast<float>(v); }

}  // namespace

std::tuple<Tensor, Tensor, Tensor> moe_routing(Tensor topk_idx, int64_t num_experts) {
  const char* op = "moe_routing";
  require_dims(topk_idx, "topk_idx", 2, 2, op);
  Launch L(topk_idx);
  const Tensor idx = dense(topk_idx);
  const int64_t T = idx.size(0), k = idx.size(1);
  if (k != 0 && T > INT32_MAX / k)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         "topk_idx: expected T*k < 2^31 entries (int32 indices), got T = " + std::to_string(T) + ", k = " +
             std::to_string(k));
  // The workspace query validates num_experts (and the device) before anything is allocated.
  const int64_t bytes = mxmoe_moe_routing_workspace_size(T * k, num_experts, L.device);
  if (bytes < 0)
    fail(op, num_experts >= 1 && num_experts <= (int64_t(1) << 20) ? MXMOE_ERR_UNSUPPORTED : MXMOE_ERR_INVALID_ARGUMENT,
         mxmoe_last_error());
  Tensor offs = empty({num_experts}, ScalarType::Int, L.device);
  Tensor perm = empty({T * k}, ScalarType::Int, L.device);
  Tensor inv = empty({T, k}, ScalarType::Int, L.device);
  OptTensor ws;
  if (bytes > 0) ws = empty({cdiv(bytes, 4)}, ScalarType::Int, L.device);  // uninitialized scratch
  mxmoe_tensor iv = view(idx, "topk_idx", op), ov = view(offs, "offs", op), pv = view(perm, "perm", op),
               invv = view(inv, "inv", op);
  OptView wv(ws, "workspace", op);
  check(mxmoe_moe_routing(&iv, num_experts, &ov, &pv, &invv, wv.get(), L.stream), op);
  return {offs, perm, inv};
}

Tensor moe_gather(Tensor x, Tensor perm, int64_t k, OptTensor row_scale, ScalarType out_dtype) {
  const char* op = "moe_gather";
  Launch L(x);
  const Tensor xd = dense(x), pd = dense(perm);
  OptTensor sd;
  if (row_scale) sd = dense(*row_scale);
  Tensor out = empty({size_or0(pd, 0), size_or0(xd, 1)}, out_dtype, L.device);
  mxmoe_tensor xv = view(xd, "x", op), pv = view(pd, "perm", op), outv = view(out, "out", op);
  OptView sv(sd, "row_scale", op);
  check(mxmoe_moe_gather(&xv, &pv, k, sv.get(), &outv, L.stream), op);
  return out;
}

Tensor moe_gather_mm_bf16(Tensor x, Tensor perm, int64_t k, Tensor w, bool w_kn, Tensor offs) {
  const char* op = "moe_gather_mm_bf16";
  Launch L(x);
  const Tensor xd = dense(x), pd = dense(perm), wd = dense(w), od = dense(offs);
  require_dims(wd, "w", 3, 3, op);
  Tensor out = empty({size_or0(pd, 0), wd.size(w_kn ? 2 : 1)}, ScalarType::BFloat16, L.device);
  mxmoe_tensor xv = view(xd, "x", op), pv = view(pd, "perm", op), wv = view(wd, "w", op), ov = view(od, "offs", op),
               outv = view(out, "out", op);
  check(mxmoe_grouped_mm_bf16_gather(&xv, &pv, k, &wv, w_kn ? 1 : 0, &ov, &outv, L.stream), op);
  return out;
}

Tensor moe_kgather_mm_bf16(Tensor a, Tensor b, Tensor perm, int64_t k, bool gather_b, Tensor offs) {
  const char* op = "moe_kgather_mm_bf16";
  Launch L(a);
  const Tensor ad = dense(a), bd = dense(b), pd = dense(perm), od = dense(offs);
  require_dims(ad, "a", 2, 2, op);
  require_dims(bd, "b", 2, 2, op);
  Tensor out = empty({size_or0(od, 0), ad.size(1), bd.size(1)}, ScalarType::BFloat16, L.device);
  mxmoe_tensor av = view(ad, "a", op), bv = view(bd, "b", op), pv = view(pd, "perm", op), ov = view(od, "offs", op),
               outv = view(out, "out", op);
  check(mxmoe_grouped_mm_bf16_kgather(&av, &bv, &pv, k, gather_b ? 1 : 0, &ov, &outv, L.stream), op);
  return out;
}

std::tuple<Tensor, Tensor> moe_swiglu_mm_bf16(Tensor x, Tensor perm, int64_t k, Tensor w13, OptTensor bias,
                                              int64_t layout, double alpha, double limit, double up_offset,
                                              Tensor offs) {
  const char* op = "moe_swiglu_mm_bf16";
  Launch L(x);
  const Tensor xd = dense(x), pd = dense(perm), wd = dense(w13), od = dense(offs);
  OptTensor bd;
  if (bias) bd = dense(*bias);
  require_dims(wd, "w13", 3, 3, op);
  const int64_t M = size_or0(pd, 0), N = wd.size(1);
  Tensor h = empty({M, N}, ScalarType::BFloat16, L.device);
  Tensor act = empty({M, N / 2}, ScalarType::BFloat16, L.device);
  mxmoe_tensor xv = view(xd, "x", op), pv = view(pd, "perm", op), wv = view(wd, "w13", op), ov = view(od, "offs", op),
               hv = view(h, "h", op), av = view(act, "act", op);
  OptView bv(bd, "bias", op);
  check(mxmoe_grouped_mm_bf16_gather_swiglu(&xv, &pv, k, &wv, &ov, bv.get(), static_cast<int32_t>(layout),
                                            static_cast<float>(alpha), static_cast<float>(limit),
                                            static_cast<float>(up_offset), &hv, &av, L.stream),
        op);
  return {h, act};
}

std::tuple<Tensor, Tensor, Tensor> moe_dswiglu_mm_bf16(Tensor dout, Tensor perm, int64_t k, Tensor w2, Tensor h,
                                                       OptTensor row_scale, int64_t layout, double alpha, double limit,
                                                       double up_offset, Tensor offs, bool want_act) {
  const char* op = "moe_dswiglu_mm_bf16";
  Launch L(dout);
  const Tensor dd = dense(dout), pd = dense(perm), wd = dense(w2), hd = dense(h), od = dense(offs);
  OptTensor sd;
  if (row_scale) sd = dense(*row_scale);
  require_dims(wd, "w2", 3, 3, op);
  const int64_t M = size_or0(pd, 0), I = wd.size(2);
  Tensor dh = empty({M, 2 * I}, ScalarType::BFloat16, L.device);
  Tensor tw = empty({M, (I + 127) / 128}, ScalarType::Float, L.device);
  Tensor act = empty({want_act ? M : 0, I}, ScalarType::BFloat16, L.device);  // (0, I) when not wanted
  mxmoe_tensor dv = view(dd, "dout", op), pv = view(pd, "perm", op), wv = view(wd, "w2", op), hv = view(hd, "h", op),
               ov = view(od, "offs", op), dhv = view(dh, "dh", op), twv = view(tw, "tw_part", op),
               av = view(act, "act", op);
  OptView sv(sd, "row_scale", op);
  check(mxmoe_grouped_mm_bf16_gather_dswiglu(&dv, &pv, k, sv.get(), &wv, &ov, &hv, static_cast<int32_t>(layout),
                                             static_cast<float>(alpha), static_cast<float>(limit),
                                             static_cast<float>(up_offset), &dhv, &twv, want_act ? &av : nullptr,
                                             L.stream),
        op);
  return {dh, tw, act};
}

bool moe_gather_mm_bf16_available(int64_t m, int64_t n, int64_t kdim, int64_t groups, int64_t t, int64_t fanout,
                                  bool w_kn, int64_t device) {
  return mxmoe_grouped_mm_bf16_gather_available(m, n, kdim, groups, t, fanout, w_kn ? 1 : 0,
                                                static_cast<int32_t>(device)) == 1;
}

Tensor moe_combine(Tensor y, Tensor inv, OptTensor weights, ScalarType out_dtype) {
  const char* op = "moe_combine";
  Launch L(y);
  const Tensor yd = dense(y), id = dense(inv);
  OptTensor wd;
  if (weights) wd = dense(*weights);
  Tensor out = empty({size_or0(id, 0), size_or0(yd, 1)}, out_dtype, L.device);
  mxmoe_tensor yv = view(yd, "y", op), iv = view(id, "inv", op), outv = view(out, "out", op);
  OptView wv(wd, "weights", op);
  check(mxmoe_moe_combine(&yv, &iv, wv.get(), &outv, L.stream), op);
  return out;
}

Tensor moe_combine_weight_grad(Tensor dout, Tensor y, Tensor inv) {
  const char* op = "moe_combine_weight_grad";
  Launch L(dout);
  const Tensor dd = dense(dout), yd = dense(y), id = dense(inv);
  Tensor dw = empty({size_or0(id, 0), size_or0(id, 1)}, ScalarType::Float, L.device);
  mxmoe_tensor dv = view(dd, "dout", op), yv = view(yd, "y", op), iv = view(id, "inv", op), wv = view(dw, "dw", op);
  check(mxmoe_moe_combine_weight_grad(&dv, &yv, &iv, &wv, L.stream), op);
  return dw;
}

Tensor moe_swiglu_weight_grad(Tensor dy, Tensor h, Tensor inv, int64_t layout, double alpha, double limit,
                              double up_offset) {
  const char* op = "moe_swiglu_weight_grad";
  Launch L(dy);
  const Tensor dd = dense(dy), hd = dense(h), id = dense(inv);
  Tensor dw = empty({size_or0(id, 0), size_or0(id, 1)}, ScalarType::Float, L.device);
  mxmoe_tensor dv = view(dd, "dy", op), hv = view(hd, "h", op), iv = view(id, "inv", op), wv = view(dw, "dw", op);
  check(mxmoe_moe_swiglu_weight_grad(&dv, &hv, &iv, to_i32(layout, "layout", op), to_float(alpha), to_float(limit),
                                     to_float(up_offset), &wv, L.stream),
        op);
  return dw;
}

Tensor moe_group_sum(Tensor x, Tensor offs) {
  const char* op = "moe_group_sum";
  Launch L(x);
  const Tensor xd = dense(x), od = dense(offs);
  Tensor out = empty({size_or0(od, 0), size_or0(xd, 1)}, ScalarType::Float, L.device);
  mxmoe_tensor xv = view(xd, "x", op), ov = view(od, "offs", op), outv = view(out, "out", op);
  check(mxmoe_moe_group_sum(&xv, &ov, &outv, L.stream), op);
  return out;
}

Tensor swiglu(Tensor h, int64_t layout, double alpha, double limit, double up_offset) {
  const char* op = "swiglu";
  Launch L(h);
  const Tensor hd = dense(h);
  Tensor y = empty({size_or0(hd, 0), size_or0(hd, 1) / 2}, hd.scalar_type(), L.device);
  mxmoe_tensor hv = view(hd, "h", op), yv = view(y, "y", op);
  check(mxmoe_swiglu(&hv, to_i32(layout, "layout", op), to_float(alpha), to_float(limit), to_float(up_offset), &yv,
                     L.stream),
        op);
  return y;
}

Tensor swiglu_backward(Tensor dy, Tensor h, int64_t layout, double alpha, double limit, double up_offset) {
  const char* op = "swiglu_backward";
  Launch L(dy);
  const Tensor dd = dense(dy), hd = dense(h);
  Tensor dh = empty(shape_of(hd), hd.scalar_type(), L.device);
  mxmoe_tensor dv = view(dd, "dy", op), hv = view(hd, "h", op), dhv = view(dh, "dh", op);
  check(mxmoe_swiglu_backward(&dv, &hv, to_i32(layout, "layout", op), to_float(alpha), to_float(limit),
                              to_float(up_offset), &dhv, L.stream),
        op);
  return dh;
}

}  // namespace ops
}  // namespace mxmoe
