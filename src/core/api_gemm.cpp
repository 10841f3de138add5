// C API of the tile128 grouped GEMMs (include/mxmoe/mxmoe.h, "Hopper FP8 grouped GEMMs"):
// validation once, then dispatch: host tensors -> the exact CPU reference (cpu::grouped_mm,
// cpu::grouped_mm_kgroups; coarse-block operands are valid MX operands), CUDA tensors -> the Hopper
// FP8 kernels (cuda/gemm/gemm_tile128.cu). Nothing is written before validation passes. Also the
// configuration query of those kernels (cuda/gemm/sm90/sm90_config.hpp), answered in every build.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/mxmoe.h"
#include "api_checks.hpp"
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
  try {
    clear_last_error();
    if (m < 0 || n < 0 || k < 0 || g < 0)
      fail("workspace size: expected non-negative shapes, got m=", m, " n=", n, " k=", k, " g=", g);
    if (device < -1) fail("device: expected -1 (host) or a CUDA ordinal >= 0, got ", device);
    if (device < 0) return 0;
    check_backend(device, "device");  // no CUDA in this build: UNSUPPORTED, cuda_size is null
    return cuda_size(m, n, k, g, device);
  } catch (const Error& e) {
    set_last_error(e.what());
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
  }
  return -1;
}

#if defined(MXMOE_WITH_CUDA)
#define CUDA_SIZE_FN(name) &cuda::name
#else
#define CUDA_SIZE_FN(name) static_cast<SizeFn>(nullptr)
#endif

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

mxmoe_status mxmoe_grouped_mm_tile128_kgroups(const mxmoe_tensor* a_, const mxmoe_tensor* a_scale_,
                                              const mxmoe_tensor* b_, const mxmoe_tensor* b_scale_,
                                              const mxmoe_tensor* offs_, mxmoe_tensor* out_,
                                              const mxmoe_tensor* workspace_, void* stream) {
  MXMOE_API_BEGIN
  const GroupedMMKArgs args = api::check_grouped_mm_kgroups(a_, a_scale_, b_, b_scale_, offs_, out_, stream);
  if (args.a.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    const int64_t N = args.a.shape[0], M = args.a.shape[1], K = args.b.shape[0], G = args.offs.shape[0];
    check_tma_operands(args, false);  // groups are staged when A/B cannot be read in place
    if (K % 16 != 0) fail("b: expected K (dim 0) to be a multiple of 16 on CUDA, got ", K);
    check_int32_dims({M, N, K, G, mxmoe_grouped_scale_capacity(M, G)}, "grouped_mm_tile128_kgroups");
    void* ws = nullptr;
    const int64_t need = cuda::grouped_mm_tile128_kgroups_workspace_size(M, N, K, G, args.a.device);
    const int64_t ws_bytes = workspace_bytes(workspace_, args, need, &ws);
    cuda::grouped_mm_tile128_kgroups(args, ws, ws_bytes);
#else
    (void)workspace_;
#endif
  } else {
    cpu::grouped_mm_kgroups(args);
  }
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
  const mxmoe_tensor& gather = require(gather_, "gather");
  check_dtype(gather, "gather", {MXMOE_DTYPE_I32});
  check_ndim(gather, "gather", {1});
  const int64_t M = gather.shape[0];
  if (M >= (int64_t{1} << 31)) fail("gather: expected fewer than 2^31 rows, got ", M);
  GroupedMMGatherArgs args;
  args.mm = api::check_grouped_mm(a_, a_scale_, b_, b_scale_, offs_, bias_, out_, stream, M);
  const mxmoe_tensor& a = args.mm.a;
  const int64_t T = a.shape[0];
  check_device(gather, "gather", a.device);
  check_contiguous(gather, "gather");
  if (fanout < 1 || (T > 0 && fanout > ((int64_t{1} << 31) - 1) / T))
    fail("fanout: expected 1 <= fanout and T * fanout < 2^31 (T = ", T, "), got ", fanout);
  check_contiguous(a, "a");
  check_contiguous(args.mm.a_scale, "a_scale");
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

}  // extern "C"
