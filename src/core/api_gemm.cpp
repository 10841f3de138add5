// C API of the tile128 grouped GEMMs (include/mxmoe/mxmoe.h, "Hopper FP8 grouped GEMMs"):
// validation once, then dispatch: host tensors -> the exact CPU reference (cpu::grouped_mm,
// cpu::grouped_mm_kgroups; coarse-block operands are valid MX operands), CUDA tensors -> the Hopper
// FP8 kernels (cuda/gemm/gemm_tile128.cu). Nothing is written before validation passes. Also the
// configuration query of those kernels (cuda/gemm/sm90/sm90_config.hpp), answered in every build.
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/mxmoe.h"
#include "api_checks.hpp"
#include "common/moe_activation.hpp"
#include "cuda/gemm/sm90/sm90_config.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace {

using api::check_backend;

// Device path: the FP8 kernels read dense operands through TMA; `in_place` operands (a, b) are read
// where they lie, so they also need 16-byte aligned starts (the wgrad kernel stages groups instead).
template <typename Args>
[[maybe_unused]] void check_tma_operands(const Args& x, bool in_place) {
  const std::pair<const mxmoe_tensor*, const char*> dense[] = {
      {&x.a, "a"}, {&x.b, "b"}, {&x.a_scale, "a_scale"}, {&x.b_scale, "b_scale"}, {&x.offs, "offs"}, {&x.out, "out"}};
  for (const auto& [t, name] : dense) {
    if (!is_contiguous(*t)) fail(name, ": expected a contiguous tensor on ", device_str(t->device));
    const bool aligned16 = t == &x.out || (in_place && (t == &x.a || t == &x.b));
    if (aligned16 && reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
      fail(name, ": expected a 16-byte aligned data pointer on ", device_str(t->device), ", got ", t->data);
  }
}

// The tile128 wgrad's device operands: a, b are staged when they cannot be read in place, except in
// the in-place form, which needs them readable as they lie (16-byte aligned, whole 16-token runs).
[[maybe_unused]] void check_kgroups_operands(const GroupedMMKArgs& x, bool in_place) {
  check_tma_operands(x, in_place);
  const int64_t M = x.a.shape[1], K = x.b.shape[0];
  if (K % 16 != 0) fail("b: expected K (dim 0) to be a multiple of 16 on CUDA, got ", K);
  if (in_place && M % 16 != 0)
    fail("a: in place: expected the token count (dim 1) to be a multiple of 16 on CUDA, got ", M);
}

[[maybe_unused]] void check_int32_dims(std::initializer_list<int64_t> dims, const char* what) {
  for (int64_t d : dims)
    if (d > std::numeric_limits<int32_t>::max())
      fail_status(MXMOE_ERR_UNSUPPORTED, what, ": dimensions must be < 2^31 on CUDA, got ", d);
}

// Device path: the workspace view -> (pointer, bytes); at least `need` bytes on the operands'
// device, sharing no memory with any operand.
template <typename Args>
[[maybe_unused]] int64_t workspace_bytes(const mxmoe_tensor* ws, const Args& x, int64_t need, void** data) {
  if (ws == nullptr) fail("workspace: expected a device tensor of at least ", need, " bytes, got NULL");
  const mxmoe_tensor& w = require(ws, "workspace");
  check_device(w, "workspace", x.a.device);
  check_contiguous(w, "workspace");
  const int64_t bytes = numel(w) * dtype_size(w.dtype);
  if (bytes < need) fail("workspace: expected at least ", need, " bytes, got ", bytes);
  check_no_overlap(w, "workspace", x.out, "out");
  for (const mxmoe_tensor* in : {&x.a, &x.a_scale, &x.b, &x.b_scale, &x.offs})
    check_no_overlap(w, "workspace", *in, "an input");
  *data = w.data;
  return bytes;
}

using SizeFn = int64_t (*)(int64_t, int64_t, int64_t, int64_t, int32_t);

// The workspace-size entry points: 0 on the host, the CUDA kernels' size on a device, -1 with the
// message on bad input (C API convention for functions that return a value).
int64_t workspace_size(SizeFn cuda_size, int64_t m, int64_t n, int64_t k, int64_t g, int32_t device) {
  return api_value([&]() -> int64_t {
    if (m < 0 || n < 0 || k < 0 || g < 0)
      fail("workspace size: expected non-negative shapes, got m=", m, " n=", n, " k=", k, " g=", g);
    if (device < -1) fail("device: expected -1 (host) or a CUDA ordinal >= 0, got ", device);
    if (device < 0) return 0;
    check_backend(device, "device");  // no CUDA in this build: UNSUPPORTED, cuda_size is null
    return cuda_size(m, n, k, g, device);
  });
}

#if defined(MXMOE_WITH_CUDA)
#define CUDA_SIZE_FN(name) &cuda::name
#define CUDA_FUSED_FN(name) &cuda::name
#else
#define CUDA_SIZE_FN(name) static_cast<SizeFn>(nullptr)
#define CUDA_FUSED_FN(name) static_cast<FusedAvailableFn>(nullptr)
#endif

// The gather variants' routed-row index list: int32 (M,), M < 2^31.
const mxmoe_tensor& check_gather_index(const mxmoe_tensor* gather_) {
  const mxmoe_tensor& gather = require(gather_, "gather");
  check_dtype(gather, "gather", {MXMOE_DTYPE_I32});
  check_ndim(gather, "gather", {1});
  if (gather.shape[0] >= (int64_t{1} << 31)) fail("gather: expected fewer than 2^31 rows, got ", gather.shape[0]);
  return gather;
}

// The bf16 gather kernels' operands: a 2D bf16 tensor read in place, and the index list with its fanout
// into a's T rows (on a's device, contiguous, T * fanout < 2^31).
const mxmoe_tensor& check_bf16_rows(const mxmoe_tensor* t_, const char* name) {
  const mxmoe_tensor& t = require(t_, name);
  check_dtype(t, name, {MXMOE_DTYPE_BF16});
  check_ndim(t, name, {2});
  check_backend(t.device, name);
  check_contiguous(t, name);
  return t;
}

const mxmoe_tensor& check_bf16_gather_index(const mxmoe_tensor* gather_, int64_t fanout, const mxmoe_tensor& rows) {
  const mxmoe_tensor& gather = check_gather_index(gather_);
  check_device(gather, "gather", rows.device);
  check_contiguous(gather, "gather");
  const int64_t T = rows.shape[0];
  if (fanout < 1 || (T > 0 && fanout > ((int64_t{1} << 31) - 1) / T))
    fail("fanout: expected 1 <= fanout and T * fanout < 2^31 (T = ", T, "), got ", fanout);
  return gather;
}

// After check_grouped_mm: the index list on A's device, fanout in range, the operands read in place.
void check_gather_operands(const GroupedMMArgs& mm, const mxmoe_tensor& gather, int64_t fanout) {
  const int64_t T = mm.a.shape[0];
  check_device(gather, "gather", mm.a.device);
  check_contiguous(gather, "gather");
  if (fanout < 1 || (T > 0 && fanout > ((int64_t{1} << 31) - 1) / T))
    fail("fanout: expected 1 <= fanout and T * fanout < 2^31 (T = ", T, "), got ", fanout);
  check_contiguous(mm.a, "a");
  check_contiguous(mm.a_scale, "a_scale");
}

// A fused variant's activation (as mxmoe_swiglu); interleaved halves where the variant takes them.
void check_activation_args(int32_t layout, float alpha, float limit, float up_offset, bool interleaved_ok) {
  if (layout != MXMOE_SWIGLU_CONCAT && !(interleaved_ok && layout == MXMOE_SWIGLU_INTERLEAVED))
    fail("layout: expected MXMOE_SWIGLU_CONCAT (0)", interleaved_ok ? " or MXMOE_SWIGLU_INTERLEAVED (1)" : "",
         ", got ", layout);
  if (!std::isfinite(alpha)) fail("alpha: expected a finite value, got ", alpha);
  if (!(limit > 0.f)) fail("limit: expected a positive value (+inf: no clamp), got ", limit);
  if (!std::isfinite(up_offset)) fail("up_offset: expected a finite value, got ", up_offset);
}

// The tile128 fused gather variants' activation (concatenated halves; the SwiGLU variant also
// interleaved ones) and scale mode.
void check_swiglu_args(int32_t layout, float alpha, float limit, float up_offset, mxmoe_scale_mode mode,
                       bool interleaved_ok = false) {
  check_activation_args(layout, alpha, limit, up_offset, interleaved_ok);
  if (mode < MXMOE_SCALE_RCEIL || mode > MXMOE_SCALE_EVEN)
    fail("mode: expected RCEIL (0), FLOOR (1), CEIL (2) or EVEN (3), got ", static_cast<int>(mode));
}

using FusedAvailableFn = bool (*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int32_t, int32_t);

// The fused gather variants' _available (I a multiple of 128 with concatenated halves; with
// interleaved_ok also interleaved halves, I a multiple of 64): the host always, a device where the
// sm_90a kernel takes the shape.
int32_t fused_gather_available(FusedAvailableFn cuda_fn, int64_t m, int64_t i, int64_t k, int64_t g, int64_t t,
                               int64_t fanout, int32_t layout, int32_t device, bool interleaved_ok = false) {
  if (m < 0 || i <= 0 || k < 0 || g < 0 || t < 0 || fanout < 1 || device < -1) return 0;
  if (layout == MXMOE_SWIGLU_CONCAT ? i % 128 != 0 : !(interleaved_ok && layout == MXMOE_SWIGLU_INTERLEAVED && i % 64 == 0))
    return 0;
  if (device < 0) return 1;  // the CPU composition takes every call
  if (cuda_fn == nullptr) return 0;
  try {
    return cuda_fn(m, i, k, g, t, fanout, layout, device) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

// The host side of mxmoe_grouped_mm_tile128_gather_dswiglu: the composition it is defined by (the gather
// GEMM into dy, the quantize pass over the SWIGLU_BACKWARD source, the routing weights' partials), then
// the rows past the last group as the kernel writes them.
void gather_dswiglu_host(const GatherDSwigluArgs& x, const std::vector<uint16_t>& dy_buf) {
  GroupedMMGatherArgs gm;
  gm.mm = x.g.mm;
  gm.gather = x.g.gather;
  gm.fanout = x.g.fanout;
  cpu::grouped_mm_gather(gm);  // unweighted dY'
  const mxmoe_tensor& dy = x.g.mm.out;
  const int64_t M = dy.shape[0], I = dy.shape[1], C2 = 2 * I, nt = I / 128;
  const mxmoe_tensor rs = x.g.row_scale.t;
  mxmoe_fused_source src{};
  src.kind = MXMOE_SOURCE_SWIGLU_BACKWARD;
  src.a = &x.h;
  src.b = &dy;
  src.perm = &x.g.gather;
  src.row_scale = &rs;
  src.k = x.g.fanout;
  src.layout = MXMOE_SWIGLU_CONCAT;
  src.alpha = x.alpha;
  src.limit = x.limit;
  src.up_offset = x.up_offset;
  mxmoe_tensor q = x.dh_q, sc = x.dh_scale, qt = x.dh_qt, sct = x.dh_scale_t;
  mxmoe_fused_side row{}, col{};
  row.q = &q;
  row.scale = &sc;
  col.qt = &qt;
  col.scale = &sct;
  const mxmoe_fused_config cfg{128, 128, 0, x.mode};
  if (mxmoe_quantize_fused_source(&src, &x.g.mm.offs, cfg, &row, &col, nullptr) != MXMOE_OK)
    fail(mxmoe_last_error());
  // Rows past the last group: as if dY' were zero there.
  const Groups groups = groups_from_offsets(x.g.mm.offs, M);
  const int64_t end = groups.count() ? groups.end.back() : 0;
  auto* qb = static_cast<uint8_t*>(x.dh_q.data);
  auto* sb = static_cast<uint8_t*>(x.dh_scale.data);
  const uint8_t zero_scale = e8m0_from_amax_bits(0u, x.mode);
  for (int64_t r = end; r < M; ++r) {
    std::fill(qb + r * C2, qb + (r + 1) * C2, uint8_t{0});
    std::fill(sb + r * (C2 / 32), sb + (r + 1) * (C2 / 32), zero_scale);
  }
  // tw_part in the documented order.
  const SwigluParams p{MXMOE_SWIGLU_CONCAT, x.alpha, x.limit, x.up_offset};
  const auto* h = static_cast<const uint16_t*>(x.h.data);
  auto* tw = static_cast<float*>(x.tw_part.data);
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t t = 0; t < nt; ++t) {
      float s[4] = {0.f, 0.f, 0.f, 0.f};
      for (int q4 = 0; r < end && q4 < 4; ++q4)
        for (int j = 0; j < 16; ++j)
          for (int e = 0; e < 2; ++e) {
            const int64_t c = 128 * t + 8 * j + 2 * q4 + e;
            const float y = swiglu_value(bf16_to_f32(h[r * C2 + c]), bf16_to_f32(h[r * C2 + I + c]), p);
            s[q4] = add_rn(s[q4], mul_rn(bf16_to_f32(dy_buf[static_cast<size_t>(r * I + c)]), y));
          }
      tw[r * nt + t] = add_rn(add_rn(s[0], s[1]), add_rn(s[2], s[3]));
    }
  }
}

// The host side of mxmoe_grouped_mm_tile128_gather_swiglu: the composition it is defined by (the gather
// GEMM into h, then the quantize pass over the SWIGLU source).
void gather_swiglu_host(const GatherSwigluArgs& x) {
  GroupedMMGatherArgs gm;
  gm.mm = x.g.mm;
  gm.gather = x.g.gather;
  gm.fanout = x.g.fanout;
  cpu::grouped_mm_gather(gm);
  const mxmoe_tensor& h = x.g.mm.out;
  mxmoe_fused_source src{};
  src.kind = MXMOE_SOURCE_SWIGLU;
  src.a = &h;
  src.layout = x.layout;
  src.alpha = x.alpha;
  src.limit = x.limit;
  src.up_offset = x.up_offset;
  mxmoe_tensor q = x.q, sc = x.scale, qt = x.qt.t, sct = x.scale_t.t;
  mxmoe_fused_side row{}, col{};
  row.q = &q;
  row.scale = &sc;
  if (x.qt.present) {
    col.qt = &qt;
    col.scale = &sct;
  }
  const mxmoe_fused_config cfg{128, 128, 0, x.mode};
  if (mxmoe_quantize_fused_source(&src, &x.g.mm.offs, cfg, &row, x.qt.present ? &col : nullptr, nullptr) != MXMOE_OK)
    fail(mxmoe_last_error());
}

}  // namespace
}  // namespace mxmoe

using namespace mxmoe;

extern "C" {

int64_t mxmoe_grouped_mm_tile128_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g, int32_t device) {
  return workspace_size(CUDA_SIZE_FN(grouped_mm_tile128_workspace_size), m, n, k, g, device);
}

int64_t mxmoe_grouped_mm_tile128_kgroups_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g,
                                                        int32_t device) {
  return workspace_size(CUDA_SIZE_FN(grouped_mm_tile128_kgroups_workspace_size), m, n, k, g, device);
}

int64_t mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                                            const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                                            const mxmoe_tensor* offs_, const mxmoe_tensor* out_,
                                                            int32_t in_place) {
  return api_value([&]() -> int64_t {
    if (in_place != 0 && in_place != 1) fail("in_place: expected 0 or 1, got ", in_place);
    // The call's own checks (mxmoe_grouped_mm_tile128_kgroups), then the path these operands take.
    const GroupedMMKArgs args = api::check_grouped_mm_kgroups(a_, a_scale_, b_, b_scale_, offs_,
                                                              const_cast<mxmoe_tensor*>(out_), nullptr);
    if (args.a.device < 0) return 0;
#if defined(MXMOE_WITH_CUDA)
    const int64_t N = args.a.shape[0], M = args.a.shape[1], K = args.b.shape[0], G = args.offs.shape[0];
    check_kgroups_operands(args, in_place == 1);
    check_int32_dims({M, N, K, G, mxmoe_grouped_scale_capacity(M, G)}, "grouped_mm_tile128_kgroups");
    return cuda::grouped_mm_tile128_kgroups_workspace_for(args, in_place == 1);
#else
    fail_status(MXMOE_ERR_UNSUPPORTED, "a: a CUDA tensor, but this build has no CUDA kernels");
#endif
  });
}

mxmoe_status mxmoe_sm90_gemm_config(int32_t pass, int64_t m, int64_t n, int64_t k, int64_t g, mxmoe_dtype out_dtype,
                                    char* buf, size_t len) {
  MXMOE_API_BEGIN
  if (pass != MXMOE_GEMM_GROUPED_M && pass != MXMOE_GEMM_GROUPED_K)
    fail("pass: expected MXMOE_GEMM_GROUPED_M (0) or MXMOE_GEMM_GROUPED_K (1), got ", pass);
  if (m < 0 || n < 0 || k < 0 || g < 0)
    fail("sm90 gemm config: expected non-negative shapes, got m=", m, " n=", n, " k=", k, " g=", g);
  if (out_dtype != MXMOE_DTYPE_BF16 && out_dtype != MXMOE_DTYPE_F32)
    fail("out_dtype: expected bf16 or f32, got ", dtype_name(out_dtype));
  if (buf == nullptr) fail("buf: expected a buffer, got NULL");
  const auto p = pass == MXMOE_GEMM_GROUPED_M ? cuda::gemm::Sm90Pass::kGroupedM : cuda::gemm::Sm90Pass::kGroupedK;
  const std::string text = cuda::gemm::select_sm90_config(p, m, n, k, g, out_dtype == MXMOE_DTYPE_BF16).to_string();
  if (text.size() + 1 > len) fail("buf: ", len, " bytes cannot hold the ", text.size() + 1, "-byte config text");
  std::memcpy(buf, text.c_str(), text.size() + 1);
  MXMOE_API_END
}

mxmoe_status mxmoe_grouped_mm_tile128(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                      const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                      const mxmoe_tensor* offs_, const mxmoe_tensor* bias_,
                                      mxmoe_tensor* out_, const mxmoe_tensor* workspace_,
                                      void* stream) {
  MXMOE_API_BEGIN
  // The operands of any MX grouped GEMM (tile128 encodings are valid MX operands), then what the
  // FP8 kernels need on a device.
  const GroupedMMArgs args = api::check_grouped_mm(a_, a_scale_, b_, b_scale_, offs_, bias_, out_, stream);
  if (args.a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    const int64_t M = args.a.shape[0], K = args.a.shape[1], G = args.b.shape[0], N = args.b.shape[1];
    check_tma_operands(args, true);
    if (N % 16 != 0) fail("b: expected N (dim 1) to be a multiple of 16 on CUDA, got ", N);
    check_int32_dims({M, N, K, G}, "grouped_mm_tile128");
    void* ws = nullptr;
    const int64_t need = cuda::grouped_mm_tile128_workspace_size(M, N, K, G, args.a.device);
    const int64_t ws_bytes = workspace_bytes(workspace_, args, need, &ws);
    cuda::grouped_mm_tile128(args, ws, ws_bytes);
#else
    (void)workspace_;
#endif
  } else {
    cpu::grouped_mm(args);
  }
  MXMOE_API_END
}

namespace {
// mxmoe_grouped_mm_tile128_kgroups and its in-place form.
void tile128_kgroups(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_, const mxmoe_tensor* b_,
                     const mxmoe_tensor* b_scale_, const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                     const mxmoe_tensor* workspace_, void* stream, bool in_place) {
  const GroupedMMKArgs args = api::check_grouped_mm_kgroups(a_, a_scale_, b_, b_scale_, offs_, out_, stream);
  if (args.a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    const int64_t N = args.a.shape[0], M = args.a.shape[1], K = args.b.shape[0], G = args.offs.shape[0];
    check_kgroups_operands(args, in_place);
    check_int32_dims({M, N, K, G, mxmoe_grouped_scale_capacity(M, G)}, "grouped_mm_tile128_kgroups");
    void* ws = nullptr;
    // At least what the path these operands take needs (the run checks it again for the path it takes).
    const int64_t need = cuda::grouped_mm_tile128_kgroups_workspace_for(args, in_place);
    const int64_t ws_bytes = workspace_bytes(workspace_, args, need, &ws);
    cuda::grouped_mm_tile128_kgroups(args, ws, ws_bytes, in_place);
#else
    (void)workspace_, (void)in_place;
#endif
  } else {
    cpu::grouped_mm_kgroups(args);  // the host reads every group in place
  }
}
}  // namespace

mxmoe_status mxmoe_grouped_mm_tile128_kgroups(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                              const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                              const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                                              const mxmoe_tensor* workspace_, void* stream) {
  MXMOE_API_BEGIN
  tile128_kgroups(a_, a_scale_, b_, b_scale_, offs_, out_, workspace_, stream, false);
  MXMOE_API_END
}

mxmoe_status mxmoe_grouped_mm_tile128_kgroups_in_place(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                                       const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                                       const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                                                       const mxmoe_tensor* workspace_, void* stream) {
  MXMOE_API_BEGIN
  tile128_kgroups(a_, a_scale_, b_, b_scale_, offs_, out_, workspace_, stream, true);
  MXMOE_API_END
}

int32_t mxmoe_grouped_mm_tile128_gather_available(int64_t m, int64_t n, int64_t k, int64_t g, int64_t t,
                                                  int64_t fanout, int32_t device) {
  if (m < 0 || n < 0 || k < 0 || g < 0 || t < 0 || fanout < 1 || device < -1) return 0;
  if (device < 0) return 1;  // the CPU reference takes every call
#if defined(MXMOE_WITH_CUDA)
  try {
    return cuda::grouped_mm_tile128_gather_available(m, n, k, g, t, fanout, device) ? 1 : 0;
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

mxmoe_status mxmoe_grouped_mm_tile128_gather(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                             const mxmoe_tensor* gather_, int64_t fanout,
                                             const mxmoe_tensor* row_scale_, const mxmoe_tensor* b_,
                                             const mxmoe_tensor* b_scale_, const mxmoe_tensor* offs_,
                                             const mxmoe_tensor* bias_, mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& gather = check_gather_index(gather_);
  GroupedMMGatherArgs args;
  args.mm = api::check_grouped_mm(a_, a_scale_, b_, b_scale_, offs_, bias_, out_, stream, gather.shape[0]);
  const mxmoe_tensor& a = args.mm.a;
  const int64_t T = a.shape[0];
  check_gather_operands(args.mm, gather, fanout);
  check_no_overlap(args.mm.out, "out", gather, "gather");
  if (row_scale_ != nullptr) {
    const mxmoe_tensor& rs = require(row_scale_, "row_scale");
    check_dtype(rs, "row_scale", {MXMOE_DTYPE_F32});
    check_shape(rs, "row_scale", {T, fanout});
    check_device(rs, "row_scale", a.device);
    check_contiguous(rs, "row_scale");
    check_no_overlap(args.mm.out, "out", rs, "row_scale");
    args.row_scale.present = true;
    args.row_scale.t = rs;
  }
  args.gather = gather;
  args.fanout = fanout;
  if (a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_tile128_gather(args);
#endif
  } else {
    cpu::grouped_mm_gather(args);
  }
  MXMOE_API_END
}

int32_t mxmoe_grouped_mm_tile128_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t,
                                                          int64_t fanout, int32_t layout, int32_t device) {
  return fused_gather_available(CUDA_FUSED_FN(grouped_mm_tile128_gather_dswiglu_available), m, i, k, g, t, fanout,
                                layout, device);
}

mxmoe_status mxmoe_grouped_mm_tile128_gather_dswiglu(
    const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_, const mxmoe_tensor* gather_, int64_t fanout,
    const mxmoe_tensor* row_scale_, const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_, const mxmoe_tensor* offs_,
    const mxmoe_tensor* h_, int32_t layout, float alpha, float limit, float up_offset, mxmoe_scale_mode mode,
    mxmoe_tensor* dh_q_, mxmoe_tensor* dh_scale_, mxmoe_tensor* dh_qt_, mxmoe_tensor* dh_scale_t_,
    mxmoe_tensor* tw_part_, void* stream) {
  MXMOE_API_BEGIN
  GatherDSwigluArgs x;
  // The outputs first: dY' (M, I) bf16 is described on a device by dh_q's bytes (M x 2I e4m3: the same
  // byte count), which the kernel writes only as dh_q; the host composes through its own buffer.
  const mxmoe_tensor& gather = check_gather_index(gather_);
  const int64_t M = gather.shape[0];
  const mxmoe_tensor& b = require(b_, "b");
  check_ndim(b, "b", {3});
  const int64_t G = b.shape[0], I = b.shape[1];
  if (I % 128 != 0) fail("b: expected the intermediate width (dim 1) to be a multiple of 128, got ", I);
  check_swiglu_args(layout, alpha, limit, up_offset, mode);
  mxmoe_tensor& dh_q = const_cast<mxmoe_tensor&>(require(dh_q_, "dh_q"));
  check_dtype(dh_q, "dh_q", {MXMOE_DTYPE_E4M3});
  check_shape(dh_q, "dh_q", {M, 2 * I});
  check_contiguous(dh_q, "dh_q");
  const int32_t dev = dh_q.device;
  std::vector<uint16_t> host_dy;
  mxmoe_tensor dy = dh_q;
  dy.dtype = MXMOE_DTYPE_BF16;
  dy.shape[1] = I;
  dy.strides[0] = I;
  if (dev < 0) {
    host_dy.assign(static_cast<size_t>(M * I), 0);
    dy.data = host_dy.data();
  }
  x.g.mm = api::check_grouped_mm(a_, a_scale_, b_, b_scale_, offs_, nullptr, &dy, stream, M);
  const mxmoe_tensor& a = x.g.mm.a;
  const int64_t T = a.shape[0];
  check_device(dh_q, "dh_q", a.device);
  check_gather_operands(x.g.mm, gather, fanout);
  const mxmoe_tensor& rs = require(row_scale_, "row_scale");
  check_dtype(rs, "row_scale", {MXMOE_DTYPE_F32});
  check_shape(rs, "row_scale", {T, fanout});
  check_device(rs, "row_scale", a.device);
  check_contiguous(rs, "row_scale");
  const mxmoe_tensor& h = require(h_, "h");
  check_dtype(h, "h", {MXMOE_DTYPE_BF16});
  check_shape(h, "h", {M, 2 * I});
  check_device(h, "h", a.device);
  check_contiguous(h, "h");
  const int64_t n_r = mxmoe_grouped_scale_capacity(M, G);
  struct Out {
    mxmoe_tensor* t;
    const char* name;
    mxmoe_dtype dtype;
    std::vector<int64_t> shape;
  };
  const Out outs[] = {{dh_scale_, "dh_scale", MXMOE_DTYPE_E8M0, {M, 2 * I / 32}},
                      {dh_qt_, "dh_qt", MXMOE_DTYPE_E4M3, {2 * I, M}},
                      {dh_scale_t_, "dh_scale_t", MXMOE_DTYPE_E8M0, {2 * I, n_r}},
                      {tw_part_, "tw_part", MXMOE_DTYPE_F32, {M, I / 128}}};
  for (const Out& o : outs) {
    const mxmoe_tensor& t = require(o.t, o.name);
    check_dtype(t, o.name, {o.dtype});
    check_shape(t, o.name, o.shape);
    check_device(t, o.name, a.device);
    check_contiguous(t, o.name);
  }
  // No output overlaps an input or another output.
  const std::pair<const mxmoe_tensor*, const char*> written[] = {
      {dh_q_, "dh_q"}, {dh_scale_, "dh_scale"}, {dh_qt_, "dh_qt"}, {dh_scale_t_, "dh_scale_t"}, {tw_part_, "tw_part"}};
  const std::pair<const mxmoe_tensor*, const char*> read[] = {
      {&a, "a"}, {&x.g.mm.a_scale, "a_scale"}, {&gather, "gather"}, {&rs, "row_scale"}, {&x.g.mm.b, "b"},
      {&x.g.mm.b_scale, "b_scale"}, {&x.g.mm.offs, "offs"}, {&h, "h"}};
  for (size_t i = 0; i < 5; ++i) {
    for (const auto& [t, name] : read) check_no_overlap(*written[i].first, written[i].second, *t, name);
    for (size_t j = i + 1; j < 5; ++j)
      check_no_overlap(*written[i].first, written[i].second, *written[j].first, written[j].second);
  }
  x.g.gather = gather;
  x.g.fanout = fanout;
  x.g.row_scale.present = true;
  x.g.row_scale.t = rs;
  x.h = h;
  x.alpha = alpha;
  x.limit = limit;
  x.up_offset = up_offset;
  x.mode = mode;
  x.dh_q = dh_q;
  x.dh_scale = *dh_scale_;
  x.dh_qt = *dh_qt_;
  x.dh_scale_t = *dh_scale_t_;
  x.tw_part = *tw_part_;
  if (a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_tile128_gather_dswiglu(x);
#endif
  } else {
    gather_dswiglu_host(x, host_dy);
  }
  MXMOE_API_END
}

int32_t mxmoe_grouped_mm_tile128_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t,
                                                         int64_t fanout, int32_t layout, int32_t device) {
  return fused_gather_available(CUDA_FUSED_FN(grouped_mm_tile128_gather_swiglu_available), m, i, k, g, t, fanout,
                                layout, device, true);
}

mxmoe_status mxmoe_grouped_mm_tile128_gather_swiglu(
    const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_, const mxmoe_tensor* gather_, int64_t fanout,
    const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_, const mxmoe_tensor* offs_, const mxmoe_tensor* bias_,
    int32_t layout, float alpha, float limit, float up_offset, mxmoe_scale_mode mode, mxmoe_tensor* h_,
    mxmoe_tensor* act_q_, mxmoe_tensor* act_scale_, mxmoe_tensor* act_qt_, mxmoe_tensor* act_scale_t_,
    void* stream) {
  MXMOE_API_BEGIN
  GatherSwigluArgs x;
  const mxmoe_tensor& gather = check_gather_index(gather_);
  const int64_t M = gather.shape[0];
  const mxmoe_tensor& b = require(b_, "b");
  check_ndim(b, "b", {3});
  check_swiglu_args(layout, alpha, limit, up_offset, mode, true);
  const int64_t G = b.shape[0], N = b.shape[1], I = N / 2;
  if (layout == MXMOE_SWIGLU_CONCAT && N % 256 != 0)
    fail("b: expected the gate | up width (dim 1) to be a multiple of 256 (two halves of a multiple of 128), got ", N);
  if (layout == MXMOE_SWIGLU_INTERLEAVED && N % 128 != 0)
    fail("b: expected the interleaved gate / up width (dim 1) to be a multiple of 128, got ", N);
  const mxmoe_tensor& h = require(h_, "h");
  check_dtype(h, "h", {MXMOE_DTYPE_BF16});
  x.g.mm = api::check_grouped_mm(a_, a_scale_, b_, b_scale_, offs_, bias_, h_, stream, M);
  if (bias_ != nullptr && layout == MXMOE_SWIGLU_CONCAT && x.g.mm.a.device >= 0)
    fail("bias: the sm_90a kernel takes a bias with interleaved halves only (layout MXMOE_SWIGLU_INTERLEAVED); "
         "got concatenated halves with a bias on device ", x.g.mm.a.device);
  const mxmoe_tensor& a = x.g.mm.a;
  check_gather_operands(x.g.mm, gather, fanout);
  check_contiguous(h, "h");
  if ((act_qt_ == nullptr) != (act_scale_t_ == nullptr))
    fail("act_qt, act_scale_t: expected both or neither, got ", act_qt_ ? "act_qt only" : "act_scale_t only");
  const int64_t n_r = mxmoe_grouped_scale_capacity(M, G);
  struct Out {
    mxmoe_tensor* t;
    const char* name;
    mxmoe_dtype dtype;
    std::vector<int64_t> shape;
  };
  std::vector<Out> outs = {{act_q_, "act_q", MXMOE_DTYPE_E4M3, {M, I}},
                           {act_scale_, "act_scale", MXMOE_DTYPE_E8M0, {M, I / 32}}};
  if (act_qt_ != nullptr) {
    outs.push_back({act_qt_, "act_qt", MXMOE_DTYPE_E4M3, {I, M}});
    outs.push_back({act_scale_t_, "act_scale_t", MXMOE_DTYPE_E8M0, {I, n_r}});
  }
  for (const Out& o : outs) {
    const mxmoe_tensor& t = require(o.t, o.name);
    check_dtype(t, o.name, {o.dtype});
    check_shape(t, o.name, o.shape);
    check_device(t, o.name, a.device);
    check_contiguous(t, o.name);
  }
  // No output overlaps an input or another output.
  std::vector<std::pair<const mxmoe_tensor*, const char*>> written = {{h_, "h"}};
  for (const Out& o : outs) written.emplace_back(o.t, o.name);
  std::vector<std::pair<const mxmoe_tensor*, const char*>> read = {
      {&a, "a"}, {&x.g.mm.a_scale, "a_scale"}, {&gather, "gather"}, {&x.g.mm.b, "b"},
      {&x.g.mm.b_scale, "b_scale"}, {&x.g.mm.offs, "offs"}};
  if (x.g.mm.bias.present) read.emplace_back(&x.g.mm.bias.t, "bias");
  for (size_t i = 0; i < written.size(); ++i) {
    for (const auto& [t, name] : read) check_no_overlap(*written[i].first, written[i].second, *t, name);
    for (size_t j = i + 1; j < written.size(); ++j)
      check_no_overlap(*written[i].first, written[i].second, *written[j].first, written[j].second);
  }
  x.g.gather = gather;
  x.g.fanout = fanout;
  x.layout = layout;
  x.alpha = alpha;
  x.limit = limit;
  x.up_offset = up_offset;
  x.mode = mode;
  x.q = *act_q_;
  x.scale = *act_scale_;
  if (act_qt_ != nullptr) {
    x.qt = {true, *act_qt_};
    x.scale_t = {true, *act_scale_t_};
  }
  if (a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_tile128_gather_swiglu(x);
#endif
  } else {
    gather_swiglu_host(x);
  }
  MXMOE_API_END
}

int32_t mxmoe_grouped_mm_bf16_gather_available(int64_t m, int64_t n, int64_t k, int64_t g, int64_t t,
                                               int64_t fanout, int32_t b_kn, int32_t device) {
  if (m < 0 || n < 0 || k < 0 || g < 0 || t < 0 || fanout < 1 || (b_kn != 0 && b_kn != 1) || device < -1) return 0;
  if (device < 0) return 1;  // the host reference takes every call
#if defined(MXMOE_WITH_CUDA)
  try {
    return cuda::grouped_mm_bf16_gather_available(m, n, k, g, t, fanout, b_kn != 0, device) ? 1 : 0;
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

mxmoe_status mxmoe_grouped_mm_bf16_gather(const mxmoe_tensor* a_, const mxmoe_tensor* gather_, int64_t fanout,
                                          const mxmoe_tensor* b_, int32_t b_kn, const mxmoe_tensor* offs_,
                                          mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& a = check_bf16_rows(a_, "a");
  const mxmoe_tensor& gather = check_bf16_gather_index(gather_, fanout, a);
  const int64_t K = a.shape[1], M = gather.shape[0];
  if (b_kn != 0 && b_kn != 1) fail("b_kn: expected 0 (b is (G, N, K)) or 1 (b is (G, K, N)), got ", b_kn);
  const mxmoe_tensor& b = require(b_, "b");
  check_dtype(b, "b", {MXMOE_DTYPE_BF16});
  check_ndim(b, "b", {3});
  check_device(b, "b", a.device);
  check_contiguous(b, "b");
  const int64_t G = b.shape[0], N = b.shape[b_kn ? 2 : 1], bk = b.shape[b_kn ? 1 : 2];
  if (bk != K)
    fail("b: expected the contraction dim (", b_kn ? "dim 1, b_kn = 1" : "dim 2, b_kn = 0", ") ", K,
         " to match a, got ", bk);
  const mxmoe_tensor& offs = require(offs_, "offs");
  api::check_offs(offs, a.device);
  check_shape(offs, "offs", {G});
  const mxmoe_tensor& out = require(out_, "out");
  check_dtype(out, "out", {MXMOE_DTYPE_BF16});
  check_shape(out, "out", {M, N});
  check_device(out, "out", a.device);
  check_contiguous(out, "out");
  for (const auto& [t, name] : {std::pair<const mxmoe_tensor*, const char*>{&a, "a"}, {&gather, "gather"}, {&b, "b"},
                                {&offs, "offs"}})
    check_no_overlap(out, "out", *t, name);
  Bf16GatherMMArgs x;
  x.a = a;
  x.gather = gather;
  x.b = b;
  x.offs = offs;
  x.out = out;
  x.fanout = fanout;
  x.b_kn = b_kn != 0;
  x.stream = stream;
  if (a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_bf16_gather(x);
#endif
  } else {
    cpu::grouped_mm_bf16_gather(x);
  }
  MXMOE_API_END
}

int32_t mxmoe_grouped_mm_bf16_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t,
                                                      int64_t fanout, int32_t layout, int32_t device) {
  if (m < 0 || i < 0 || k < 0 || g < 0 || t < 0 || fanout < 1 || device < -1) return 0;
  if (layout != MXMOE_SWIGLU_CONCAT && layout != MXMOE_SWIGLU_INTERLEAVED) return 0;
  if (device < 0) return 1;  // the host reference takes every call
#if defined(MXMOE_WITH_CUDA)
  try {
    return cuda::grouped_mm_bf16_gather_swiglu_available(m, i, k, g, t, fanout, layout, device) ? 1 : 0;
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

mxmoe_status mxmoe_grouped_mm_bf16_gather_swiglu(const mxmoe_tensor* a_, const mxmoe_tensor* gather_, int64_t fanout,
                                                 const mxmoe_tensor* b_, const mxmoe_tensor* offs_,
                                                 const mxmoe_tensor* bias_, int32_t layout, float alpha, float limit,
                                                 float up_offset, mxmoe_tensor* h_, mxmoe_tensor* act_,
                                                 void* stream) {
  MXMOE_API_BEGIN
  check_activation_args(layout, alpha, limit, up_offset, true);
  const mxmoe_tensor& b = require(b_, "b");
  check_ndim(b, "b", {3});
  if (b.shape[1] % 2 != 0) fail("b: expected an even output width 2I (dim 1: gate | up), got ", b.shape[1]);
  const int64_t I = b.shape[1] / 2;
  const mxmoe_tensor& act = require(act_, "act");
  Bf16GatherSwigluArgs x;
  const mxmoe_tensor& a = check_bf16_rows(a_, "a");
  const mxmoe_tensor& gather = check_bf16_gather_index(gather_, fanout, a);
  const int64_t K = a.shape[1], M = gather.shape[0];
  check_dtype(b, "b", {MXMOE_DTYPE_BF16});
  check_device(b, "b", a.device);
  check_contiguous(b, "b");
  if (b.shape[2] != K) fail("b: expected the contraction dim (dim 2) ", K, " to match a, got ", b.shape[2]);
  const mxmoe_tensor& offs = require(offs_, "offs");
  api::check_offs(offs, a.device);
  check_shape(offs, "offs", {b.shape[0]});
  if (bias_ != nullptr) {
    const mxmoe_tensor& bias = require(bias_, "bias");
    check_dtype(bias, "bias", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
    check_shape(bias, "bias", {b.shape[0], 2 * I});
    check_device(bias, "bias", a.device);
    x.bias = {true, bias};
  }
  mxmoe_tensor& h = const_cast<mxmoe_tensor&>(require(h_, "h"));
  check_dtype(h, "h", {MXMOE_DTYPE_BF16});
  check_shape(h, "h", {M, 2 * I});
  check_device(h, "h", a.device);
  check_contiguous(h, "h");
  check_dtype(act, "act", {MXMOE_DTYPE_BF16});
  check_shape(act, "act", {M, I});
  check_device(act, "act", a.device);
  check_contiguous(act, "act");
  for (const auto& [t, name] : {std::pair<const mxmoe_tensor*, const char*>{&a, "a"}, {&gather, "gather"}, {&b, "b"},
                                {&offs, "offs"}, {x.bias.present ? &x.bias.t : &a, x.bias.present ? "bias" : "a"}}) {
    check_no_overlap(h, "h", *t, name);
    check_no_overlap(act, "act", *t, name);
  }
  check_no_overlap(h, "h", act, "act");
  x.g.a = a;
  x.g.gather = gather;
  x.g.b = b;
  x.g.offs = offs;
  x.g.out = h;
  x.g.fanout = fanout;
  x.g.b_kn = false;
  x.g.stream = stream;
  x.layout = layout;
  x.alpha = alpha;
  x.limit = limit;
  x.up_offset = up_offset;
  x.act = act;
  if (a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_bf16_gather_swiglu(x);
#endif
  } else {
    cpu::grouped_mm_bf16_gather_swiglu(x);
  }
  MXMOE_API_END
}

int32_t mxmoe_grouped_mm_bf16_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t,
                                                       int64_t fanout, int32_t layout, int32_t device) {
  if (m < 0 || i < 0 || k < 0 || g < 0 || t < 0 || fanout < 1 || device < -1) return 0;
  if (layout != MXMOE_SWIGLU_CONCAT && layout != MXMOE_SWIGLU_INTERLEAVED) return 0;
  if (device < 0) return 1;  // the host reference takes every call
#if defined(MXMOE_WITH_CUDA)
  try {
    return cuda::grouped_mm_bf16_gather_dswiglu_available(m, i, k, g, t, fanout, device) ? 1 : 0;
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

mxmoe_status mxmoe_grouped_mm_bf16_gather_dswiglu(const mxmoe_tensor* a_, const mxmoe_tensor* gather_,
                                                  int64_t fanout, const mxmoe_tensor* row_scale_,
                                                  const mxmoe_tensor* b_, const mxmoe_tensor* offs_,
                                                  const mxmoe_tensor* h_, int32_t layout, float alpha, float limit,
                                                  float up_offset, mxmoe_tensor* dh_, mxmoe_tensor* tw_part_,
                                                  mxmoe_tensor* act_, void* stream) {
  MXMOE_API_BEGIN
  check_activation_args(layout, alpha, limit, up_offset, true);
  const mxmoe_tensor& a = check_bf16_rows(a_, "a");
  const mxmoe_tensor& gather = check_bf16_gather_index(gather_, fanout, a);
  const int64_t T = a.shape[0], K = a.shape[1], M = gather.shape[0];
  const mxmoe_tensor& b = require(b_, "b");
  check_dtype(b, "b", {MXMOE_DTYPE_BF16});
  check_ndim(b, "b", {3});
  check_device(b, "b", a.device);
  check_contiguous(b, "b");
  if (b.shape[1] != K) fail("b: expected the contraction dim (dim 1) ", K, " to match a, got ", b.shape[1]);
  const int64_t G = b.shape[0], I = b.shape[2];
  const mxmoe_tensor& offs = require(offs_, "offs");
  api::check_offs(offs, a.device);
  check_shape(offs, "offs", {G});
  Bf16GatherDSwigluArgs x;
  if (row_scale_ != nullptr) {
    const mxmoe_tensor& rs = require(row_scale_, "row_scale");
    check_dtype(rs, "row_scale", {MXMOE_DTYPE_F32});
    check_shape(rs, "row_scale", {T, fanout});
    check_device(rs, "row_scale", a.device);
    check_contiguous(rs, "row_scale");
    x.row_scale = {true, rs};
  }
  const mxmoe_tensor& h = require(h_, "h");
  api::check_dense(h, "h", MXMOE_DTYPE_BF16, {M, 2 * I}, a.device);
  mxmoe_tensor& dh = const_cast<mxmoe_tensor&>(require(dh_, "dh"));
  api::check_dense(dh, "dh", MXMOE_DTYPE_BF16, {M, 2 * I}, a.device);
  mxmoe_tensor& tw = const_cast<mxmoe_tensor&>(require(tw_part_, "tw_part"));
  api::check_dense(tw, "tw_part", MXMOE_DTYPE_F32, {M, (I + 127) / 128}, a.device);
  if (act_ != nullptr) {
    api::check_dense(*act_, "act", MXMOE_DTYPE_BF16, {M, I}, a.device);
    x.act = {true, *act_};
  }
  // The outputs (act where given) share no memory with an input or with each other.
  const std::pair<const mxmoe_tensor*, const char*> read[] = {
      {&a, "a"}, {&gather, "gather"}, {&b, "b"}, {&offs, "offs"}, {&h, "h"},
      {x.row_scale.present ? &x.row_scale.t : &a, x.row_scale.present ? "row_scale" : "a"}};
  const std::pair<const mxmoe_tensor*, const char*> written[] = {
      {&dh, "dh"}, {&tw, "tw_part"}, {x.act.present ? &x.act.t : nullptr, "act"}};
  for (const auto& [t, name] : read)
    for (const auto& [w, wname] : written)
      if (w != nullptr) check_no_overlap(*w, wname, *t, name);
  check_no_overlap(dh, "dh", tw, "tw_part");
  if (x.act.present) {
    check_no_overlap(x.act.t, "act", dh, "dh");
    check_no_overlap(x.act.t, "act", tw, "tw_part");
  }
  x.g.a = a;
  x.g.gather = gather;
  x.g.b = b;
  x.g.offs = offs;
  x.g.out = dh;  // dY' (M, I): its shape only (never written)
  x.g.out.dtype = MXMOE_DTYPE_BF16;
  x.g.out.shape[1] = I;
  x.g.out.strides[0] = I;
  x.g.fanout = fanout;
  x.g.b_kn = true;
  x.g.stream = stream;
  x.h = h;
  x.layout = layout;
  x.alpha = alpha;
  x.limit = limit;
  x.up_offset = up_offset;
  x.dh = dh;
  x.tw_part = tw;
  if (a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_bf16_gather_dswiglu(x);
#endif
  } else {
    cpu::grouped_mm_bf16_gather_dswiglu(x);
  }
  MXMOE_API_END
}

int32_t mxmoe_grouped_mm_bf16_kgather_available(int64_t r, int64_t m, int64_t n, int64_t g, int64_t t,
                                                int64_t fanout, int32_t device) {
  if (r < 0 || m < 0 || n < 0 || g < 0 || t < 0 || fanout < 1 || device < -1) return 0;
  if (device < 0) return 1;  // the host reference takes every call
#if defined(MXMOE_WITH_CUDA)
  try {
    return cuda::grouped_mm_bf16_kgather_available(r, m, n, g, t, fanout, device) ? 1 : 0;
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

mxmoe_status mxmoe_grouped_mm_bf16_kgather(const mxmoe_tensor* a_, const mxmoe_tensor* b_, const mxmoe_tensor* gather_,
                                           int64_t fanout, int32_t gather_b, const mxmoe_tensor* offs_,
                                           mxmoe_tensor* out_, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& a = check_bf16_rows(a_, "a");
  const mxmoe_tensor& b = check_bf16_rows(b_, "b");
  check_device(b, "b", a.device);
  if (gather_b != 0 && gather_b != 1) fail("gather_b: expected 0 (gather reads a's rows) or 1 (b's), got ", gather_b);
  const mxmoe_tensor& gather = check_bf16_gather_index(gather_, fanout, gather_b ? b : a);
  const int64_t R = gather.shape[0];
  const mxmoe_tensor& plain = gather_b ? a : b;
  if (plain.shape[0] != R)
    fail(gather_b ? "a" : "b", ": expected ", R, " rows (one per routed row, gather's length), got ", plain.shape[0]);
  const mxmoe_tensor& offs = require(offs_, "offs");
  api::check_offs(offs, a.device);
  const int64_t G = offs.shape[0], M = a.shape[1], N = b.shape[1];
  const mxmoe_tensor& out = require(out_, "out");
  check_dtype(out, "out", {MXMOE_DTYPE_BF16});
  check_shape(out, "out", {G, M, N});
  check_device(out, "out", a.device);
  check_contiguous(out, "out");
  for (const auto& [t, name] : {std::pair<const mxmoe_tensor*, const char*>{&a, "a"}, {&b, "b"}, {&gather, "gather"},
                                {&offs, "offs"}})
    check_no_overlap(out, "out", *t, name);
  Bf16KGatherMMArgs x;
  x.a = a;
  x.b = b;
  x.gather = gather;
  x.offs = offs;
  x.out = out;
  x.fanout = fanout;
  x.gather_b = gather_b != 0;
  x.stream = stream;
  if (a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::grouped_mm_bf16_kgather(x);
#endif
  } else {
    cpu::grouped_mm_bf16_kgather(x);
  }
  MXMOE_API_END
}

}  // extern "C"
