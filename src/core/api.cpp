// The C API: validates every argument once (clear messages naming the argument, expected vs
// actual), normalizes views to a fixed rank, then dispatches to the CPU or CUDA backend by device.
// Nothing is written before validation passes.
#include <algorithm>
#include <cstring>
#include <utility>

#include "common/env.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/mxmoe.h"
#include "api_checks.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace {

using api::as_3d;
using api::batched;
using api::check_backend;

OptTensor optional(const mxmoe_tensor* t) {
  OptTensor o;
  if (t != nullptr) {
    o.present = true;
    o.t = *t;
  }
  return o;
}

void check_offs_view(const mxmoe_tensor& offs, const mxmoe_tensor& like) { api::check_offs(offs, like.device); }


// out must share no memory with any (present) input.
void check_no_overlap_inputs(const mxmoe_tensor& out,
                             std::initializer_list<std::pair<const mxmoe_tensor*, const char*>> inputs) {
  for (const auto& in : inputs)
    if (in.first != nullptr) check_no_overlap(out, "out", *in.first, in.second);
}

bool valid_block(const mxmoe_quant_config& c) {
  return (c.block_r == 1 && (c.block_c == 32 || c.block_c == 128)) ||
         (c.block_c == 1 && (c.block_r == 32 || c.block_r == 128)) ||
         (c.block_r == 128 && c.block_c == 128);
}

void check_mode(mxmoe_scale_mode mode) {
  if (mode < MXMOE_SCALE_RCEIL || mode > MXMOE_SCALE_EVEN)
    fail("mode: expected RCEIL (0), FLOOR (1), CEIL (2) or EVEN (3), got ", static_cast<int>(mode));
}

}  // namespace

namespace api {

GroupedMMArgs check_grouped_mm(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_, const mxmoe_tensor* b_,
                               const mxmoe_tensor* b_scale_, const mxmoe_tensor* offs_, const mxmoe_tensor* bias_,
                               mxmoe_tensor* out_, void* stream, int64_t out_rows) {
  const mxmoe_tensor& a = require(a_, "a");
  check_dtype(a, "a", {MXMOE_DTYPE_E4M3});
  check_ndim(a, "a", {2});
  check_backend(a.device, "a");
  const int64_t M = a.shape[0], K = a.shape[1];
  if (K % kBlock != 0) fail("a: expected the contraction dim K to be a multiple of 32, got ", K);
  const mxmoe_tensor& b = require(b_, "b");
  check_dtype(b, "b", {MXMOE_DTYPE_E4M3});
  check_ndim(b, "b", {3});
  check_device(b, "b", a.device);
  const int64_t G = b.shape[0], N = b.shape[1];
  if (b.shape[2] != K) fail("b: expected contraction dim (last) ", K, " to match a, got ", b.shape[2]);
  const mxmoe_tensor& as = require(a_scale_, "a_scale");
  check_dtype(as, "a_scale", {MXMOE_DTYPE_E8M0});
  check_shape(as, "a_scale", {M, K / kBlock});
  check_device(as, "a_scale", a.device);
  const mxmoe_tensor& bs = require(b_scale_, "b_scale");
  check_dtype(bs, "b_scale", {MXMOE_DTYPE_E8M0});
  check_shape(bs, "b_scale", {G, N, K / kBlock});
  check_device(bs, "b_scale", a.device);
  const mxmoe_tensor& offs = require(offs_, "offs");
  check_offs_view(offs, a);
  check_shape(offs, "offs", {G});
  GroupedMMArgs args;
  if (bias_ != nullptr) {
    const mxmoe_tensor& bias = require(bias_, "bias");
    check_dtype(bias, "bias", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
    check_shape(bias, "bias", {G, N});
    check_device(bias, "bias", a.device);
    args.bias = optional(bias_);
  }
  const mxmoe_tensor& out = require(out_, "out");
  check_dtype(out, "out", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_shape(out, "out", {out_rows >= 0 ? out_rows : M, N});
  check_device(out, "out", a.device);
  check_contiguous(out, "out");
  check_no_overlap_inputs(
      out, {{&a, "a"}, {&as, "a_scale"}, {&b, "b"}, {&bs, "b_scale"}, {&offs, "offs"}, {bias_, "bias"}});
  args.a = a;
  args.a_scale = as;
  args.b = b;
  args.b_scale = bs;
  args.offs = offs;
  args.out = out;
  args.stream = stream;
  return args;
}

GroupedMMKArgs check_grouped_mm_kgroups(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_, const mxmoe_tensor* b_,
                                        const mxmoe_tensor* b_scale_, const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                                        void* stream) {
  const mxmoe_tensor& a = require(a_, "a");
  check_dtype(a, "a", {MXMOE_DTYPE_E4M3});
  check_ndim(a, "a", {2});
  check_backend(a.device, "a");
  const int64_t N = a.shape[0], M = a.shape[1];
  const mxmoe_tensor& b = require(b_, "b");
  check_dtype(b, "b", {MXMOE_DTYPE_E4M3});
  check_ndim(b, "b", {2});
  check_device(b, "b", a.device);
  const int64_t K = b.shape[0];
  if (b.shape[1] != M) fail("b: expected token dim (last) ", M, " to match a, got ", b.shape[1]);
  const mxmoe_tensor& offs = require(offs_, "offs");
  check_offs_view(offs, a);
  const int64_t G = offs.shape[0];
  const int64_t cap = mxmoe_grouped_scale_capacity(M, G);
  const mxmoe_tensor& as = require(a_scale_, "a_scale");
  check_dtype(as, "a_scale", {MXMOE_DTYPE_E8M0});
  check_shape(as, "a_scale", {N, cap});
  check_device(as, "a_scale", a.device);
  const mxmoe_tensor& bs = require(b_scale_, "b_scale");
  check_dtype(bs, "b_scale", {MXMOE_DTYPE_E8M0});
  check_shape(bs, "b_scale", {K, cap});
  check_device(bs, "b_scale", a.device);
  const mxmoe_tensor& out = require(out_, "out");
  check_dtype(out, "out", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_shape(out, "out", {G, N, K});
  check_device(out, "out", a.device);
  check_contiguous(out, "out");
  check_no_overlap_inputs(out, {{&a, "a"}, {&as, "a_scale"}, {&b, "b"}, {&bs, "b_scale"}, {&offs, "offs"}});
  GroupedMMKArgs args;
  args.a = a;
  args.a_scale = as;
  args.b = b;
  args.b_scale = bs;
  args.offs = offs;
  args.out = out;
  args.stream = stream;
  return args;
}

}  // namespace api
}  // namespace mxmoe

using namespace mxmoe;

extern "C" {

const char* mxmoe_version(void) { return "0.1.0"; }

int mxmoe_has_cuda(void) {
#if defined(MXMOE_WITH_CUDA)
  return 1;
#else
  return 0;
#endif
}

int mxmoe_has_tile128_gemm(void) {
#if defined(MXMOE_WITH_CUDA) && defined(MXMOE_HAVE_CUTLASS)
  return 1;
#else
  return 0;
#endif
}

mxmoe_status mxmoe_reload_env(void) {
  MXMOE_API_BEGIN
  env::reload();
  MXMOE_API_END
}

uint8_t mxmoe_e8m0_from_amax(float amax, mxmoe_scale_mode mode) {
  return e8m0_from_amax_bits(f32_bits(amax), mode);
}
float mxmoe_e8m0_to_float(uint8_t s) { return e8m0_to_f32(s); }
uint8_t mxmoe_e4m3_from_float(float y) { return e4m3_from_f32(y); }
float mxmoe_e4m3_to_float(uint8_t q) { return e4m3_to_f32(q); }

namespace {
// Overflow-checked size arithmetic for the size formulas: -1 propagates (negative or too large).
int64_t add_sz(int64_t a, int64_t b) {
  int64_t r = 0;
  return (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) ? -1 : r;
}
int64_t mul_sz(int64_t a, int64_t b) {
  int64_t r = 0;
  return (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) ? -1 : r;
}
int64_t cdiv_sz(int64_t a, int64_t b) { return a < 0 ? -1 : a / b + (a % b != 0); }
int64_t round_sz(int64_t a, int64_t b) { return mul_sz(cdiv_sz(a, b), b); }
}  // namespace

int64_t mxmoe_grouped_scale_capacity(int64_t m, int64_t g) { return add_sz(cdiv_sz(m, kBlock), g); }

int64_t mxmoe_blocked_size(mxmoe_blocked_kind kind, int64_t h, int64_t w, int64_t g) {
  switch (kind) {
    case MXMOE_BLOCKED_WHOLE: return mul_sz(round_sz(h, 128), round_sz(w, 4));
    case MXMOE_BLOCKED_GROUPS_M: return mul_sz(add_sz(h, mul_sz(128, g)), round_sz(w, 4));
    case MXMOE_BLOCKED_GROUPS_K: return mul_sz(round_sz(h, 128), add_sz(cdiv_sz(w, kBlock), mul_sz(4, g)));
    case MXMOE_BLOCKED_PER_EXPERT: return mul_sz(g, mul_sz(round_sz(h, 128), round_sz(w, 4)));
    default: break;  // invalid codes fall through to the caller's rejection
  }
  return -1;
}

mxmoe_status mxmoe_quantize(const mxmoe_tensor* x_, const mxmoe_tensor* offs_,
                            mxmoe_quant_config cfg, mxmoe_tensor* q_, mxmoe_tensor* qt_,
                            mxmoe_tensor* scale_c_, mxmoe_tensor* scale_r_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& x = require(x_, "x");
  check_dtype(x, "x", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_ndim(x, "x", {2, 3});
  check_backend(x.device, "x");
  check_mode(cfg.mode);
  if (!valid_block(cfg))
    fail("block: expected 1x32, 1x128, 32x1, 128x1 or 128x128, got ", cfg.block_r, "x", cfg.block_c);
  const bool along_c = cfg.block_c > 1, along_r = cfg.block_r > 1;
  const int64_t R = x.shape[x.ndim - 2], C = x.shape[x.ndim - 1];
  if (x.device >= 0 && !is_contiguous(x)) fail("x: expected a contiguous tensor on ", device_str(x.device));
  int64_t groups = 0;
  if (offs_ != nullptr) {
    const mxmoe_tensor& offs = require(offs_, "offs");
    check_offs_view(offs, x);
    if (x.ndim != 2) fail("offs: expected a 2D x for token groups, got x with shape ", shape_str(x));
    groups = offs.shape[0];
  }
  if (along_c && C % kBlock != 0)
    fail("x: expected the last dim (blocks along it) to be a multiple of 32, got ", C);
  // Only scale_r's (C, R/32) layout needs whole 32-runs along R; 128x128 tiles read through scale_c
  // alone have a partial edge tile instead.
  if (along_r && scale_r_ != nullptr && offs_ == nullptr && R % kBlock != 0)
    fail("x: expected dim -2 (blocks along it) to be a multiple of 32 without offs, got ", R);
  if (q_ == nullptr && qt_ == nullptr) fail("q, qt: expected at least one data output, got none");
  if (scale_c_ == nullptr && scale_r_ == nullptr)
    fail("scale_c, scale_r: expected at least one scale output, got none");
  if (scale_c_ != nullptr && !along_c)
    fail("scale_c: expected blocks along the last dim for it, got block ", cfg.block_r, "x", cfg.block_c);
  if (scale_r_ != nullptr && !along_r)
    fail("scale_r: expected blocks along dim -2 for it, got block ", cfg.block_r, "x", cfg.block_c);

  QuantizeArgs a;
  a.x = as_3d(x);
  a.offs = optional(offs_);
  a.cfg = cfg;
  a.stream = stream;
  a.n_r = along_r ? (offs_ != nullptr ? cdiv(R, kBlock) + groups : R / kBlock) : 0;
  struct Out {
    mxmoe_tensor* t;
    const char* name;
    mxmoe_dtype dtype;
    std::vector<int64_t> shape;
    OptTensor* dst;
  } outs[] = {
      {q_, "q", MXMOE_DTYPE_E4M3, batched(x, {R, C}), &a.q},
      {qt_, "qt", MXMOE_DTYPE_E4M3, batched(x, {C, R}), &a.qt},
      {scale_c_, "scale_c", MXMOE_DTYPE_E8M0, batched(x, {R, C / kBlock}), &a.scale_c},
      {scale_r_, "scale_r", MXMOE_DTYPE_E8M0, batched(x, {C, a.n_r}), &a.scale_r},
  };
  for (auto& o : outs) {
    if (o.t == nullptr) continue;
    const mxmoe_tensor& t = require(o.t, o.name);
    api::check_dense(t, o.name, o.dtype, o.shape, x.device);
    check_no_overlap(t, o.name, x, "x");
    if (offs_ != nullptr) check_no_overlap(t, o.name, *offs_, "offs");
    for (auto& other : outs)
      if (&other < &o && other.t != nullptr) check_no_overlap(t, o.name, *other.t, other.name);
    o.dst->present = true;
    o.dst->t = as_3d(t);
  }
  if (x.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::quantize(a);
#endif
  } else {
    cpu::quantize(a);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_dequantize(const mxmoe_tensor* q_, const mxmoe_tensor* scale_, int32_t axis,
                              const mxmoe_tensor* offs_, mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& q = require(q_, "q");
  check_dtype(q, "q", {MXMOE_DTYPE_E4M3});
  check_ndim(q, "q", {2, 3});
  check_backend(q.device, "q");
  if (axis != 0 && axis != 1) fail("axis: expected 0 (blocks along dim -2) or 1 (along the last dim), got ", axis);
  const mxmoe_tensor& scale = require(scale_, "scale");
  check_dtype(scale, "scale", {MXMOE_DTYPE_E8M0});
  check_device(scale, "scale", q.device);
  const int64_t R = q.shape[q.ndim - 2], C = q.shape[q.ndim - 1];
  const int64_t blocked_len = axis == 1 ? C : R;
  int64_t n;
  if (offs_ != nullptr) {
    const mxmoe_tensor& offs = require(offs_, "offs");
    check_offs_view(offs, q);
    if (q.ndim != 2) fail("offs: expected a 2D q for groups, got q with shape ", shape_str(q));
    n = cdiv(blocked_len, kBlock) + offs.shape[0];
  } else {
    if (blocked_len % kBlock != 0)
      fail("q: expected the blocked dim (", axis == 1 ? "last" : "-2", ") to be a multiple of 32, got ", blocked_len);
    n = blocked_len / kBlock;
  }
  check_shape(scale, "scale", batched(q, axis == 1 ? std::vector<int64_t>{R, n} : std::vector<int64_t>{C, n}));
  const mxmoe_tensor& out = require(out_, "out");
  check_dtype(out, "out", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_shape(out, "out", batched(q, {R, C}));
  check_device(out, "out", q.device);
  check_contiguous(out, "out");
  check_no_overlap(out, "out", q, "q");
  check_no_overlap(out, "out", scale, "scale");
  if (offs_ != nullptr) check_no_overlap(out, "out", *offs_, "offs");
  if (q.device >= 0 && (!is_contiguous(q) || !is_contiguous(scale)))
    fail("q, scale: expected contiguous tensors on ", device_str(q.device));
  DequantizeArgs a;
  a.q = as_3d(q);
  a.scale = as_3d(scale);
  a.axis = axis;
  a.offs = optional(offs_);
  a.out = as_3d(out);
  a.stream = stream;
  if (q.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::dequantize(a);
#endif
  } else {
    cpu::dequantize(a);
  }
  MXMOE_API_END
}

}  // extern "C"

namespace mxmoe {
namespace {

BlockedArgs validate_blocked(const mxmoe_tensor* scale_, mxmoe_blocked_kind kind,
                             const mxmoe_tensor* offs_, const mxmoe_tensor* blocked_,
                             const char* blocked_name, bool to_blocked, void* stream) {
  const mxmoe_tensor& scale = require(scale_, "scale");
  check_dtype(scale, "scale", {MXMOE_DTYPE_E8M0});
  check_backend(scale.device, "scale");
  check_contiguous(scale, "scale");
  BlockedArgs a;
  a.kind = kind;
  a.stream = stream;
  const bool needs_offs = kind == MXMOE_BLOCKED_GROUPS_M || kind == MXMOE_BLOCKED_GROUPS_K;
  int64_t size = 0, groups = 0;
  if (needs_offs) {
    if (offs_ == nullptr) fail("offs: expected group offsets for a grouped blocked layout, got NULL");
    const mxmoe_tensor& offs = require(offs_, "offs");
    check_offs_view(offs, scale);
    check_contiguous(offs, "offs");
    groups = offs.shape[0];
    a.offs = optional(offs_);
  }
  switch (kind) {
    case MXMOE_BLOCKED_WHOLE:
    case MXMOE_BLOCKED_GROUPS_M:
      check_ndim(scale, "scale", {2});
      size = mxmoe_blocked_size(kind, scale.shape[0], scale.shape[1], groups);
      break;
    case MXMOE_BLOCKED_GROUPS_K: {
      check_ndim(scale, "scale", {2});
      const int64_t blocks = scale.shape[1] - groups;  // ceil(M/32)
      if (blocks < 0)
        fail("scale: expected grouped compact columns ceil(M/32) + G >= G = ", groups, ", got ", scale.shape[1]);
      a.m_tokens = blocks * kBlock;
      size = mxmoe_blocked_size(kind, scale.shape[0], a.m_tokens, groups);
      break;
    }
    case MXMOE_BLOCKED_PER_EXPERT:
      check_ndim(scale, "scale", {3});
      size = mxmoe_blocked_size(kind, scale.shape[1], scale.shape[2], scale.shape[0]);
      break;
    default:
      fail("kind: expected WHOLE (0), GROUPS_M (1), GROUPS_K (2) or PER_EXPERT (3), got ", static_cast<int>(kind));
  }
  const mxmoe_tensor& blocked = require(blocked_, blocked_name);
  check_dtype(blocked, blocked_name, {MXMOE_DTYPE_E8M0});
  check_shape(blocked, blocked_name, {size});
  check_device(blocked, blocked_name, scale.device);
  check_contiguous(blocked, blocked_name);
  check_no_overlap(blocked, blocked_name, scale, "scale");
  if (a.offs.present) {
    if (to_blocked)
      check_no_overlap(blocked, blocked_name, a.offs.t, "offs");
    else
      check_no_overlap(scale, "scale", a.offs.t, "offs");
  }
  a.scale = as_3d(scale);
  a.blocked = blocked;
  return a;
}

}  // namespace
}  // namespace mxmoe

extern "C" {

mxmoe_status mxmoe_scales_to_blocked(const mxmoe_tensor* scale, mxmoe_blocked_kind kind,
                                     const mxmoe_tensor* offs, mxmoe_tensor* blocked,
                                     void* stream) {
  MXMOE_API_BEGIN
  BlockedArgs a = validate_blocked(scale, kind, offs, blocked, "blocked", true, stream);
  if (a.scale.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::scales_to_blocked(a);
#endif
  } else {
    cpu::scales_to_blocked(a);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_scales_from_blocked(const mxmoe_tensor* blocked, mxmoe_blocked_kind kind,
                                       const mxmoe_tensor* offs, mxmoe_tensor* scale,
                                       void* stream) {
  MXMOE_API_BEGIN
  BlockedArgs a = validate_blocked(scale, kind, offs, blocked, "blocked", false, stream);
  if (a.scale.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::scales_from_blocked(a);
#endif
  } else {
    cpu::scales_from_blocked(a);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_grouped_mm_mx(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                 const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                 const mxmoe_tensor* offs_, const mxmoe_tensor* bias_,
                                 mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const GroupedMMArgs args = api::check_grouped_mm(a_, a_scale_, b_, b_scale_, offs_, bias_, out_, stream);
  if (args.a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm(args);
#endif
  } else {
    cpu::grouped_mm(args);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_grouped_mm_mx_kgroups(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                         const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                         const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                                         void* stream) {
  MXMOE_API_BEGIN
  const GroupedMMKArgs args = api::check_grouped_mm_kgroups(a_, a_scale_, b_, b_scale_, offs_, out_, stream);
  if (args.a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_kgroups(args);
#endif
  } else {
    cpu::grouped_mm_kgroups(args);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_zero_rows_past_groups(mxmoe_tensor* x_, const mxmoe_tensor* offs_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& x = require(x_, "x");
  check_dtype(x, "x", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_ndim(x, "x", {2});
  check_contiguous(x, "x");
  check_backend(x.device, "x");
  const mxmoe_tensor& offs = require(offs_, "offs");
  check_offs_view(offs, x);
  check_no_overlap(x, "x", offs, "offs");
  if (x.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::zero_rows_past_groups(x, offs, stream);
#endif
  } else {
    (void)stream;
    cpu::zero_rows_past_groups(x, offs);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_clamp_offsets(const mxmoe_tensor* offs_, int64_t m, mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& offs = require(offs_, "offs");
  check_dtype(offs, "offs", {MXMOE_DTYPE_I32});
  check_ndim(offs, "offs", {1});
  check_backend(offs.device, "offs");
  if (m < 0) fail("m: expected >= 0, got ", m);
  if (m > INT32_MAX) fail("m: expected <= 2^31 - 1 (int32 offsets), got ", m);
  const mxmoe_tensor& out = require(out_, "out");
  api::check_dense(out, "out", MXMOE_DTYPE_I32, {offs.shape[0]}, offs.device);
  check_no_overlap(out, "out", offs, "offs");
  if (offs.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::clamp_offsets(offs, m, out, stream);
#endif
  } else {
    (void)stream;
    cpu::clamp_offsets(offs, m, out);
  }
  MXMOE_API_END
}

mxmoe_status mxmoe_check_offsets(const mxmoe_tensor* offs_, int64_t m, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& offs = require(offs_, "offs");
  check_dtype(offs, "offs", {MXMOE_DTYPE_I32});
  check_ndim(offs, "offs", {1});
  check_backend(offs.device, "offs");
  if (offs.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::check_offsets(offs, m, stream);
#endif
  } else {
    (void)stream;
    check_offsets_host(offs, m);
  }
  MXMOE_API_END
}

}  // extern "C"
