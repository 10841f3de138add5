// torch.ops.mxmoe.*: one op per core entry point. Each allocates its outputs with torch (static
// upper-bound shapes, the same rules as the fakes in mxmoe/ops.py), lets the core validate every
// argument (one validator, include/mxmoe/mxmoe.h) and launches on torch's current stream. Nothing is
// written to a caller's tensor before validation passes; outputs of a failed call are dropped.
#include "ops_core.hpp"

#include <string>

namespace mxmoe {
namespace ops {

int32_t to_i32(int64_t v, const char* name, const char* op) {
  if (v < INT32_MIN || v > INT32_MAX)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT, std::string(name) + ": expected an int32 value, got " + std::to_string(v));
  return static_cast<int32_t>(v);
}

Launch::Launch(const Tensor& t) : device(device_code(t)), scope(device), stream(current_stream(device)) {}

namespace {
std::vector<int64_t> with_lead(const Tensor& x, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> s;
  if (x.dim() == 3) s.push_back(x.size(0));
  s.insert(s.end(), tail);
  return s;
}

int64_t blocked_bytes(mxmoe_blocked_kind kind, int64_t h, int64_t w, int64_t g, const char* op) {
  const int64_t n = mxmoe_blocked_size(kind, h, w, g);
  if (n < 0)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         "kind: expected WHOLE (0), GROUPS_M (1), GROUPS_K (2) or PER_EXPERT (3), got " + std::to_string(kind));
  return n;
}

}  // namespace

void require_dims(const Tensor& t, const char* name, int64_t lo, int64_t hi, const char* op) {
  if (t.dim() < lo || t.dim() > hi)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         std::string(name) + ": expected " + (lo == hi ? std::to_string(lo) : std::to_string(lo) + " or " + std::to_string(hi)) +
             " dims, got " + std::to_string(t.dim()));
}

// ---- quantize / dequantize -------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize(Tensor x, OptTensor offs, int64_t block_r, int64_t block_c,
                                                    int64_t mode, bool want_q, bool want_qt, bool want_scale_c,
                                                    bool want_scale_r) {
  const char* op = "quantize";
  require_dims(x, "x", 2, 3, op);
  Launch L(x);
  const int64_t r = x.size(-2), c = x.size(-1);
  const int64_t n_r = offs ? cdiv(r, kBlock) + offs->size(0) : r / kBlock;
  auto out = [&](bool want, std::vector<int64_t> shape, ScalarType dt) {
    return want ? empty(shape, dt, L.device) : none_output(dt, L.device);
  };
  Tensor q = out(want_q, with_lead(x, {r, c}), ScalarType::Float8_e4m3fn);
  Tensor qt = out(want_qt, with_lead(x, {c, r}), ScalarType::Float8_e4m3fn);
  Tensor sc = out(want_scale_c, with_lead(x, {r, c / kBlock}), ScalarType::Float8_e8m0fnu);
  Tensor sr = out(want_scale_r, with_lead(x, {c, n_r}), ScalarType::Float8_e8m0fnu);
  mxmoe_tensor xv = view(x, "x", op), qv{}, qtv{}, scv{}, srv{};
  if (want_q) qv = view(q, "q", op);
  if (want_qt) qtv = view(qt, "qt", op);
  if (want_scale_c) scv = view(sc, "scale_c", op);
  if (want_scale_r) srv = view(sr, "scale_r", op);
  OptView ov(offs, "offs", op);
  const mxmoe_quant_config cfg{to_i32(block_r, "block_r", op), to_i32(block_c, "block_c", op),
                               static_cast<mxmoe_scale_mode>(to_i32(mode, "mode", op))};
  check(mxmoe_quantize(&xv, ov.get(), cfg, want_q ? &qv : nullptr, want_qt ? &qtv : nullptr,
                       want_scale_c ? &scv : nullptr, want_scale_r ? &srv : nullptr, L.stream),
        op);
  return {q, qt, sc, sr};
}

Tensor dequantize_into(const Tensor& q, const Tensor& scale, int32_t axis, const OptTensor& offs, ScalarType out_dtype,
                       const Launch& L, const char* op) {
  Tensor out = empty(shape_of(q), out_dtype, L.device);
  mxmoe_tensor qv = view(q, "q", op), sv = view(scale, "scale", op), outv = view(out, "out", op);
  OptView ov(offs, "offs", op);
  check(mxmoe_dequantize(&qv, &sv, axis, ov.get(), &outv, L.stream), op);
  return out;
}

Tensor dequantize(Tensor q, Tensor scale, int64_t axis, OptTensor offs, ScalarType out_dtype) {
  const char* op = "dequantize";
  Launch L(q);
  return dequantize_into(q, scale, to_i32(axis, "axis", op), offs, out_dtype, L, op);
}

// ---- blocked scale layout ---------------------------------------------------------------------------

Tensor scales_to_blocked(Tensor scale, int64_t kind_, OptTensor offs) {
  const char* op = "scales_to_blocked";
  const auto kind = static_cast<mxmoe_blocked_kind>(to_i32(kind_, "kind", op));
  const int64_t g = offs ? offs->size(0) : 0;
  int64_t bytes = 0;
  if (kind == MXMOE_BLOCKED_PER_EXPERT) {
    require_dims(scale, "scale", 3, 3, op);
    bytes = blocked_bytes(kind, scale.size(1), scale.size(2), scale.size(0), op);
  } else {
    require_dims(scale, "scale", 2, 2, op);
    // GROUPS_K: scale (R, ceil(M/32) + G); the bound is computed from the columns as the core does.
    bytes = kind == MXMOE_BLOCKED_GROUPS_K ? round_up(scale.size(0), 128) * (scale.size(1) - g + 4 * g)
                                           : blocked_bytes(kind, scale.size(0), scale.size(1), g, op);
  }
  if (bytes < 0) bytes = 0;  // the core rejects the scale shape below
  Launch L(scale);
  Tensor out = empty({bytes}, ScalarType::Float8_e8m0fnu, L.device);
  mxmoe_tensor sv = view(scale, "scale", op), bv = view(out, "blocked", op);
  OptView ov(offs, "offs", op);
  check(mxmoe_scales_to_blocked(&sv, kind, ov.get(), &bv, L.stream), op);
  return out;
}

Tensor scales_from_blocked(Tensor blocked, int64_t kind, OptTensor offs, std::vector<int64_t> scale_shape) {
  const char* op = "scales_from_blocked";
  if (scale_shape.size() > MXMOE_MAX_DIMS)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT, "scale_shape: expected at most 4 dims, got " + std::to_string(scale_shape.size()));
  for (int64_t d : scale_shape)
    if (d < 0) fail(op, MXMOE_ERR_INVALID_ARGUMENT, "scale_shape: expected sizes >= 0, got " + std::to_string(d));
  Launch L(blocked);
  Tensor out = empty(scale_shape, ScalarType::Float8_e8m0fnu, L.device);
  mxmoe_tensor bv = view(blocked, "blocked", op), sv = view(out, "scale", op);
  OptView ov(offs, "offs", op);
  check(mxmoe_scales_from_blocked(&bv, static_cast<mxmoe_blocked_kind>(to_i32(kind, "kind", op)), ov.get(), &sv,
                                  L.stream),
        op);
  return out;
}

// ---- grouped GEMMs ----------------------------------------------------------------------------------

namespace {
// Output shapes from possibly malformed operands: the core rejects those with a message.
int64_t dim_or0(const Tensor& t, int64_t d) { return t.dim() > d ? t.size(d) : 0; }
}  // namespace

Tensor grouped_mm_mx(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, OptTensor bias,
                     ScalarType out_dtype) {
  const char* op = "grouped_mm_mx";
  Launch L(a);
  Tensor out = empty({dim_or0(a, 0), dim_or0(b, 1)}, out_dtype, L.device);
  mxmoe_tensor av = view(a, "a", op), asv = view(a_scale, "a_scale", op), bv = view(b, "b", op),
               bsv = view(b_scale, "b_scale", op), ov = view(offs, "offs", op), outv = view(out, "out", op);
  OptView biasv(bias, "bias", op);
  check(mxmoe_grouped_mm_mx(&av, &asv, &bv, &bsv, &ov, biasv.get(), &outv, L.stream), op);
  return out;
}

Tensor grouped_mm_mx_kgroups(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, ScalarType out_dtype) {
  const char* op = "grouped_mm_mx_kgroups";
  Launch L(a);
  Tensor out = empty({dim_or0(offs, 0), dim_or0(a, 0), dim_or0(b, 0)}, out_dtype, L.device);
  mxmoe_tensor av = view(a, "a", op), asv = view(a_scale, "a_scale", op), bv = view(b, "b", op),
               bsv = view(b_scale, "b_scale", op), ov = view(offs, "offs", op), outv = view(out, "out", op);
  check(mxmoe_grouped_mm_mx_kgroups(&av, &asv, &bv, &bsv, &ov, &outv, L.stream), op);
  return out;
}

namespace {
// A GEMM's device scratch of a size query's answer (-1: the query's message); sizes never depend on
// offs' values (no host sync).
Tensor tile128_workspace(int64_t bytes, int32_t device, const char* op) {
  if (bytes < 0) fail(op, MXMOE_ERR_UNSUPPORTED, mxmoe_last_error());
  return empty({cdiv(bytes, 4)}, ScalarType::Int, device);
}
}  // namespace

void tile128_mm_into(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                     const Tensor& offs, const OptTensor& bias, Tensor& out, const Launch& L, const char* op) {
  Tensor ws = tile128_workspace(mxmoe_grouped_mm_tile128_workspace_size(dim_or0(a, 0), dim_or0(b, 1), dim_or0(a, 1),
                                                                        dim_or0(b, 0), L.device),
                                L.device, op);
  mxmoe_tensor av = view(a, "a", op), asv = view(a_scale, "a_scale", op), bv = view(b, "b", op),
               bsv = view(b_scale, "b_scale", op), ov = view(offs, "offs", op), outv = view(out, "out", op),
               wsv = view(ws, "workspace", op);
  OptView biasv(bias, "bias", op);
  check(mxmoe_grouped_mm_tile128(&av, &asv, &bv, &bsv, &ov, biasv.get(), &outv, &wsv, L.stream), op);
}

void tile128_gather_mm_into(const Tensor& a, const Tensor& a_scale, const Tensor& perm, int64_t k,
                            const OptTensor& row_scale, const Tensor& b, const Tensor& b_scale, const Tensor& offs,
                            const OptTensor& bias, Tensor& out, const Launch& L, const char* op) {
  mxmoe_tensor av = view(a, "a", op), asv = view(a_scale, "a_scale", op), pv = view(perm, "perm", op),
               bv = view(b, "b", op), bsv = view(b_scale, "b_scale", op), ov = view(offs, "offs", op),
               outv = view(out, "out", op);
  OptView rsv(row_scale, "row_scale", op), biasv(bias, "bias", op);
  check(mxmoe_grouped_mm_tile128_gather(&av, &asv, &pv, k, rsv.get(), &bv, &bsv, &ov, biasv.get(), &outv, L.stream),
        op);
}

void tile128_mm_kgroups_into(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                             const Tensor& offs, Tensor& out, const Launch& L, const char* op, bool in_place) {
  mxmoe_tensor av = view(a, "a", op), asv = view(a_scale, "a_scale", op), bv = view(b, "b", op),
               bsv = view(b_scale, "b_scale", op), ov = view(offs, "offs", op), outv = view(out, "out", op);
  // Sized for the path these operands take: the own kernel's scales, not CUTLASS's staging copies.
  Tensor ws = tile128_workspace(
      mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(&av, &asv, &bv, &bsv, &ov, &outv, in_place ? 1 : 0),
      L.device, op);
  mxmoe_tensor wsv = view(ws, "workspace", op);
  check(in_place ? mxmoe_grouped_mm_tile128_kgroups_in_place(&av, &asv, &bv, &bsv, &ov, &outv, &wsv, L.stream)
                 : mxmoe_grouped_mm_tile128_kgroups(&av, &asv, &bv, &bsv, &ov, &outv, &wsv, L.stream),
        op);
}

Tensor grouped_mm_tile128(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs, OptTensor bias,
                          ScalarType out_dtype) {
  Launch L(a);
  Tensor out = empty({dim_or0(a, 0), dim_or0(b, 1)}, out_dtype, L.device);
  tile128_mm_into(a, a_scale, b, b_scale, offs, bias, out, L, "grouped_mm_tile128");
  return out;
}

Tensor grouped_mm_tile128_kgroups(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor offs,
                                  ScalarType out_dtype) {
  Launch L(a);
  Tensor out = empty({dim_or0(offs, 0), dim_or0(a, 0), dim_or0(b, 0)}, out_dtype, L.device);
  tile128_mm_kgroups_into(a, a_scale, b, b_scale, offs, out, L, "grouped_mm_tile128_kgroups");
  return out;
}

// ---- group bookkeeping ------------------------------------------------------------------------------

void check_offsets(Tensor offs, int64_t m) {
  const char* op = "check_offsets";
  Launch L(offs);
  mxmoe_tensor ov = view(offs, "offs", op);
  check(mxmoe_check_offsets(&ov, m, L.stream), op);
}

void zero_rows_into(const Tensor& x, const Tensor& offs, const Launch& L, const char* op) {
  mxmoe_tensor xv = view(x, "x", op), ov = view(offs, "offs", op);
  check(mxmoe_zero_rows_past_groups(&xv, &ov, L.stream), op);
}

void zero_rows_past_groups(Tensor x, Tensor offs) {
  Launch L(x);
  zero_rows_into(x, offs, L, "zero_rows_past_groups");
}

Tensor clamp_offsets_into(const Tensor& offs, int64_t m, const Launch& L, const char* op) {
  Tensor out = empty({dim_or0(offs, 0)}, ScalarType::Int, device_code(offs));
  mxmoe_tensor ov = view(offs, "offs", op), outv = view(out, "out", op);
  check(mxmoe_clamp_offsets(&ov, m, &outv, L.stream), op);
  return out;
}

Tensor clamp_offsets(Tensor offs, int64_t m) {
  Launch L(offs);
  return clamp_offsets_into(offs, m, L, "clamp_offsets");
}

// ---- torch._grouped_mm behind an op boundary --------------------------------------------------------

Tensor aten_grouped_mm(const Tensor& a, const Tensor& b, const Tensor& offs) {
  std::array<StableIValue, 5> stack{torch::stable::detail::from(a), torch::stable::detail::from(b),
                                    torch::stable::detail::from(std::optional<Tensor>(offs)),
                                    torch::stable::detail::from(std::optional<Tensor>()),
                                    torch::stable::detail::from(std::optional<ScalarType>())};
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("aten::_grouped_mm", "", stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// 2D x 3D: rows past offs[-1] zeroed (torch leaves them unwritten); 2D x 2D: (G, M, N). offs must be
// valid (callers clamp it); the emulated backend uses it for fp32 on the CPU, which torch's own
// fake kernel would refuse under torch.compile.
Tensor dense_grouped_mm(Tensor a, Tensor b, Tensor offs) {
  const char* op = "_dense_grouped_mm";
  Tensor out = aten_grouped_mm(a, b, offs);
  if (b.dim() == 3 && offs.numel() > 0) {
    Launch L(out);
    zero_rows_into(out, offs, L, op);
  }
  return out;
}

// ---- stream capture ---------------------------------------------------------------------------------

int64_t capture_id(int64_t device) {
  const char* op = "capture_id";
  if (device < 0) fail(op, MXMOE_ERR_INVALID_ARGUMENT, "device: expected a CUDA device index >= 0, got " + std::to_string(device));
  uint64_t id = 0;
  check(mxmoe_capture_id(current_stream(to_i32(device, "device", op)), &id), op);
  return static_cast<int64_t>(id & 0x7fffffffffffffffULL);
}

// ---- build facts ------------------------------------------------------------------------------------

std::string build_info() {
  std::string s = "version=" MXMOE_VERSION_STRING;
  s += ";cuda=" + std::to_string(mxmoe_has_cuda());
  s += ";cuda_archs=" MXMOE_CUDA_ARCHS_STRING;
  s += ";tile128_gemm=" + std::to_string(mxmoe_has_tile128_gemm());
  s += ";torch_abi=stable;torch_target=2.11;torch_built_with=" MXMOE_TORCH_BUILT_WITH;
  return s;
}

std::string sm90_gemm_config(int64_t kind, int64_t m, int64_t n, int64_t k, int64_t groups, bool out_bf16) {
  const char* op = "sm90_gemm_config";
  char text[MXMOE_CONFIG_TEXT_MAX];
  check(mxmoe_sm90_gemm_config(to_i32(kind, "kind", op), m, n, k, groups, out_bf16 ? MXMOE_DTYPE_BF16 : MXMOE_DTYPE_F32,
                               text, sizeof text),
        op);
  return text;
}

}  // namespace ops
}  // namespace mxmoe
