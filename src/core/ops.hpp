// Internal operation descriptors shared by the C API (validation, in api.cpp) and the backends
// (cpu/, cuda/). api.cpp validates once and normalizes every view to a fixed rank, so a backend
// receives only well-formed arguments and never re-checks them.
#pragma once

#include <cstdint>

#include "mxmoe/mxmoe.h"

namespace mxmoe {

// An optional view: `present` false means the caller passed NULL.
struct OptTensor {
  bool present = false;
  mxmoe_tensor t{};
};

// x (B, R, C); 2D inputs arrive with B = 1. Outputs normalized the same way:
//   q (B, R, C), qt (B, C, R), scale_c (B, R, C/32), scale_r (B, C, n_r).
// offs only with B == 1: groups along R. Blocks along R use grouped compact layout then.
struct QuantizeArgs {
  mxmoe_tensor x{};
  OptTensor offs;
  mxmoe_quant_config cfg{};
  OptTensor q, qt, scale_c, scale_r;
  int64_t n_r = 0;  // length of scale_r's last dim (R/32, or ceil(R/32) + G with offs)
  void* stream = nullptr;
};

// q (B, R, C) e4m3 -> out (B, R, C).
//   axis 1: scale (B, R, n), blocks along C;  axis 0: scale (B, C, n), blocks along R.
// offs only with B == 1: groups along the blocked axis (grouped compact layout, n = cap).
struct DequantizeArgs {
  mxmoe_tensor q{};
  mxmoe_tensor scale{};
  int32_t axis = 1;
  OptTensor offs;
  mxmoe_tensor out{};
  void* stream = nullptr;
};

// Blocked scale layouts. scale is (B, H, W) (B = 1 except PER_EXPERT); blocked is 1-D bytes.
// GROUPS_M: offs groups the H rows. GROUPS_K: offs (in tokens, m_tokens total) groups the W
// columns of the grouped compact layout.
struct BlockedArgs {
  mxmoe_tensor scale{};
  mxmoe_tensor blocked{};
  mxmoe_blocked_kind kind = MXMOE_BLOCKED_WHOLE;
  OptTensor offs;
  int64_t m_tokens = 0;  // GROUPS_K only
  void* stream = nullptr;
};

// out (M, N) = A (M, K) . B[g] (N, K)^T per row group (+ bias (G, N)).
struct GroupedMMArgs {
  mxmoe_tensor a{}, a_scale{}, b{}, b_scale{}, offs{};
  OptTensor bias;
  mxmoe_tensor out{};
  void* stream = nullptr;
};

// GroupedMMArgs on routed rows: out row r = A row gather[r] / fanout (a zero row for gather[r] < 0;
// indices clamped into [0, rows(A) * fanout)), scaled by row_scale[gather[r]] (fp32, before the bias)
// when given. mm.a / mm.a_scale are the per-token operand (T, K), mm.out is (M, N), M = len(gather).
struct GroupedMMGatherArgs {
  GroupedMMArgs mm;
  mxmoe_tensor gather{};
  int64_t fanout = 1;
  OptTensor row_scale;  // (T, fanout) f32
};

// mxmoe_grouped_mm_bf16_gather: out (M, N) bf16 = A[rows] (T, K) bf16 . B[g], B[g] (N, K) or, b_kn,
// (K, N); gather and fanout as GroupedMMGatherArgs; rows past the groups zero.
struct Bf16GatherMMArgs {
  mxmoe_tensor a{}, gather{}, b{}, offs{}, out{};
  int64_t fanout = 1;
  bool b_kn = false;
  void* stream = nullptr;
};

// mxmoe_grouped_mm_bf16_gather_dswiglu: g is the gather GEMM (b_kn, out describing dY' (M, I): its shape
// only); row_scale optional.
struct Bf16GatherDSwigluArgs {
  Bf16GatherMMArgs g;
  OptTensor row_scale;  // (T, fanout) f32
  mxmoe_tensor h{};     // (M, 2I) bf16
  int32_t layout = 0;   // MXMOE_SWIGLU_CONCAT or MXMOE_SWIGLU_INTERLEAVED
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  mxmoe_tensor dh{}, tw_part{};
  OptTensor act;  // (M, I) bf16: act(h), optional
};

// mxmoe_grouped_mm_bf16_gather_swiglu: g is the gather GEMM writing h (g.out, (M, 2I)); act (M, I).
struct Bf16GatherSwigluArgs {
  Bf16GatherMMArgs g;
  OptTensor bias;      // (G, 2I) bf16 or f32
  int32_t layout = 0;  // MXMOE_SWIGLU_CONCAT or MXMOE_SWIGLU_INTERLEAVED
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  mxmoe_tensor act{};
};

// mxmoe_grouped_mm_bf16_kgather: out (G, M, N) bf16, out[g] = sum over group g's routed rows r of
// A_r^T B_r; gather (R,) reads b's rows (gather_b) or a's, the other operand has R rows.
struct Bf16KGatherMMArgs {
  mxmoe_tensor a{}, b{}, gather{}, offs{}, out{};
  int64_t fanout = 1;
  bool gather_b = true;
  void* stream = nullptr;
};

// mxmoe_grouped_mm_tile128_gather_dswiglu: g.mm.out describes dY' (M, I) bf16 (on a device only its
// shape: its data is dh_q's bytes, never written), g.row_scale is present.
struct GatherDSwigluArgs {
  GroupedMMGatherArgs g;
  mxmoe_tensor h{};  // (M, 2I) bf16
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  mxmoe_scale_mode mode = MXMOE_SCALE_RCEIL;
  mxmoe_tensor dh_q{}, dh_scale{}, dh_qt{}, dh_scale_t{}, tw_part{};
};

// mxmoe_grouped_mm_tile128_gather_swiglu: g.mm.out is h (M, 2I) bf16 (+ g.mm.bias, b13; no row_scale),
// gate | up halves as layout says; act(h)'s rowwise operand q (M, I) + scale (M, I/32) and, when present,
// its columnwise operand qt (I, M) + scale_t (I, n_r).
struct GatherSwigluArgs {
  GroupedMMGatherArgs g;
  int layout = 0;  // MXMOE_SWIGLU_CONCAT or MXMOE_SWIGLU_INTERLEAVED
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  mxmoe_scale_mode mode = MXMOE_SCALE_RCEIL;
  mxmoe_tensor q{}, scale{};
  OptTensor qt, scale_t;
};

// out (G, N, K) = A (N, M)[:, group] . B (K, M)[:, group]^T; scales grouped compact along M.
struct GroupedMMKArgs {
  mxmoe_tensor a{}, a_scale{}, b{}, b_scale{}, offs{};
  mxmoe_tensor out{};
  void* stream = nullptr;
};

// Fused quantization (mxmoe_quantize_fused). x (B, R, C); every output normalized to 3D like
// QuantizeArgs (q, dq: (B, R, C); qt, dqt: (B, C, R); row scale (B, R, C/32); col scale (B, C, n_r));
// scale_blocked stays 1-D with its layout kind. A side is active when `active`; with tile128 both
// sides view one 128x128 quantization.
struct FusedSide {
  bool active = false;
  int32_t block = 0;  // 32 or 128 (128 with tile128)
  OptTensor q, qt, scale, scale_blocked, dq, dqt;
  mxmoe_blocked_kind blocked_kind = MXMOE_BLOCKED_WHOLE;
};

// A computed input (mxmoe_quantize_fused_source); kind 0: x is read from memory.
struct FusedSource {
  int kind = 0;             // mxmoe_source_kind
  mxmoe_tensor a{}, b{};    // GATHER: rows of a; SWIGLU: h = a; SWIGLU_BACKWARD: h = a, dy = b
  OptTensor perm, row_scale;
  int64_t k = 1;
  int32_t layout = 0;
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
};

struct FusedArgs {
  // With a source, x is only the logical (1, R, C) shape and dtype (data == nullptr).
  mxmoe_tensor x{};
  FusedSource src;
  OptTensor offs;
  mxmoe_scale_mode mode = MXMOE_SCALE_RCEIL;
  bool tile128 = false;
  FusedSide row, col;
  int64_t n_r = 0;  // length of the column side's scale last dim
  void* stream = nullptr;
};

namespace cpu {
void quantize_fused(const FusedArgs& args);  // composes quantize, dequantize, scales_to_blocked
}  // namespace cpu

namespace cpu {
void zero_rows_past_groups(const mxmoe_tensor& x, const mxmoe_tensor& offs);
void clamp_offsets(const mxmoe_tensor& offs, int64_t m, const mxmoe_tensor& out);
void quantize(const QuantizeArgs& args);
void dequantize(const DequantizeArgs& args);
void scales_to_blocked(const BlockedArgs& args);
void scales_from_blocked(const BlockedArgs& args);
void grouped_mm(const GroupedMMArgs& args);
void grouped_mm_kgroups(const GroupedMMKArgs& args);
void grouped_mm_gather(const GroupedMMGatherArgs& args);  // routed rows materialized, then grouped_mm
void grouped_mm_bf16_gather(const Bf16GatherMMArgs& args);  // fp32 sums in K order
void grouped_mm_bf16_kgather(const Bf16KGatherMMArgs& args);  // fp32 sums in row order
void grouped_mm_bf16_gather_dswiglu(const Bf16GatherDSwigluArgs& args);  // the gather GEMM, then the epilogue
void grouped_mm_bf16_gather_swiglu(const Bf16GatherSwigluArgs& args);    // the gather GEMM, then the SwiGLU
}  // namespace cpu

#if defined(MXMOE_WITH_CUDA)
namespace cuda {
void zero_rows_past_groups(const mxmoe_tensor& x, const mxmoe_tensor& offs, void* stream);
void clamp_offsets(const mxmoe_tensor& offs, int64_t m, const mxmoe_tensor& out, void* stream);
// tile128 recipe (coarse-block MX operands) on Hopper FP8 tensor cores (cuda/gemm/gemm_tile128.cu).
// Workspace: bytes of device memory the call needs (independent of offs and of the output dtype);
// throws UNSUPPORTED where the build or the device cannot run them.
int64_t grouped_mm_tile128_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g, int32_t device);
int64_t grouped_mm_tile128_kgroups_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g,
                                                  int32_t device);
// The bytes grouped_mm_tile128_kgroups needs for these operands: the path they take (the own kernel's
// prepared scales, or CUTLASS's staging as the shape-only size; in_place: without staging), at most
// that size.
int64_t grouped_mm_tile128_kgroups_workspace_for(const GroupedMMKArgs& args, bool in_place);
void grouped_mm_tile128(const GroupedMMArgs& args, void* workspace, int64_t workspace_bytes);
// in_place: never stage; a group off a 16-token boundary gets a NaN output (the caller vouches that
// every group starts at a multiple of 16: the MoE layer's aligned routing).
void grouped_mm_tile128_kgroups(const GroupedMMKArgs& args, void* workspace, int64_t workspace_bytes,
                                bool in_place = false);
// The gather variant of the sm_90a kernel (no CUTLASS path): whether it takes a call of this shape on
// `device`, and the call (UNSUPPORTED where it does not take it).
bool grouped_mm_tile128_gather_available(int64_t m, int64_t n, int64_t k, int64_t g, int64_t a_rows,
                                         int64_t fanout, int32_t device);
void grouped_mm_tile128_gather(const GroupedMMGatherArgs& args);
bool grouped_mm_tile128_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t a_rows,
                                                 int64_t fanout, int32_t layout, int32_t device);
void grouped_mm_tile128_gather_dswiglu(const GatherDSwigluArgs& args);
bool grouped_mm_tile128_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t a_rows,
                                                int64_t fanout, int32_t layout, int32_t device);
void grouped_mm_tile128_gather_swiglu(const GatherSwigluArgs& args);
// The bf16 gather GEMM (cuda/gemm/gemm_bf16_gather.cu; the sm_90a kernel only).
bool grouped_mm_bf16_gather_available(int64_t m, int64_t n, int64_t k, int64_t g, int64_t a_rows, int64_t fanout,
                                      bool b_kn, int32_t device);
void grouped_mm_bf16_gather(const Bf16GatherMMArgs& args);
bool grouped_mm_bf16_kgather_available(int64_t r, int64_t m, int64_t n, int64_t g, int64_t t, int64_t fanout,
                                       int32_t device);
void grouped_mm_bf16_kgather(const Bf16KGatherMMArgs& args);
bool grouped_mm_bf16_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t, int64_t fanout,
                                              int32_t device);
void grouped_mm_bf16_gather_dswiglu(const Bf16GatherDSwigluArgs& args);
bool grouped_mm_bf16_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t, int64_t fanout,
                                             int32_t layout, int32_t device);
void grouped_mm_bf16_gather_swiglu(const Bf16GatherSwigluArgs& args);

void quantize(const QuantizeArgs& args);
void dequantize(const DequantizeArgs& args);
void scales_to_blocked(const BlockedArgs& args);
void scales_from_blocked(const BlockedArgs& args);
void grouped_mm(const GroupedMMArgs& args);
void grouped_mm_kgroups(const GroupedMMKArgs& args);
void check_offsets(const mxmoe_tensor& offs, int64_t m, void* stream);
void quantize_fused(const FusedArgs& args);

// Stream capture (cuda/common/graph_if.cu). capture_id: the id of the capture `stream` records, 0 if none.
// IfCapture records work under a conditional graph node on a device int32 flag: the constructor
// adds "set the node's condition from *flag" and the IF node to `stream`'s capture and starts
// capturing the node's body on a side stream (body()); finish() adds "*flag = 0" to the body and
// makes the IF node the capture's next dependency. Throws mxmoe::Error (UNSUPPORTED when `stream`
// is not capturing). Destroyed without finish() (an error while recording the body), it still
// closes the body and joins the capture, so the caller's capture stays consistent.
uint64_t capture_id(void* stream);
class IfCapture {
 public:
  IfCapture(void* stream, int32_t* flag, int32_t device);
  ~IfCapture();
  IfCapture(const IfCapture&) = delete;
  IfCapture& operator=(const IfCapture&) = delete;
  void* body() const { return side_; }
  void finish();

 private:
  void close(bool clear_flag);
  void* main_ = nullptr;
  void* side_ = nullptr;
  void* node_ = nullptr;
  int32_t* flag_ = nullptr;
  bool open_ = false;
};
}  // namespace cuda
#endif

// ---- MoE kernel family (api_moe.cpp validates; cpu/moe.cpp, cuda/moe/moe.cu) -------------------
// Views as the C API validated them: index tensors int32 (topk_idx int32 or int64), everything
// contiguous and on one device.
struct MoeRoutingArgs {
  mxmoe_tensor topk_idx{};  // (T, k)
  int64_t num_experts = 0;
  mxmoe_tensor offs{}, perm{}, inv{};  // (E,), (T*k,), (T, k)
  void* workspace = nullptr;           // CUDA scratch (moe_routing_workspace_size bytes)
  int64_t workspace_bytes = 0;
  void* stream = nullptr;
};

struct MoeGatherArgs {
  mxmoe_tensor x{}, perm{};  // (T, H), (T*k,)
  int64_t k = 1;
  OptTensor row_scale;  // (T, k)
  mxmoe_tensor out{};   // (T*k, H)
  void* stream = nullptr;
};

struct MoeCombineArgs {
  mxmoe_tensor y{}, inv{};  // (N, H), (T, k)
  OptTensor weights;        // (T, k)
  mxmoe_tensor out{};       // (T, H)
  void* stream = nullptr;
};

struct MoeWeightGradArgs {
  mxmoe_tensor dout{}, y{}, inv{};  // (T, H), (N, H), (T, k)
  mxmoe_tensor dw{};                // (T, k) f32
  void* stream = nullptr;
};

// dw[t, j] = <dy[inv[t, j]], swiglu(h[inv[t, j]])> (mxmoe_moe_swiglu_weight_grad).
struct MoeSwigluWeightGradArgs {
  mxmoe_tensor dy{}, h{}, inv{};  // (N, I) bf16|f32, (N, 2I) bf16, (T, k)
  mxmoe_tensor dw{};              // (T, k) f32
  int32_t layout = 0;
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  void* stream = nullptr;
};

struct MoeGroupSumArgs {
  mxmoe_tensor x{}, offs{};  // (M, C), (G,)
  mxmoe_tensor out{};        // (G, C) f32
  void* stream = nullptr;
};

// Forward: out = y (N, I) from h (N, 2I). Backward (dy present): out = dh (N, 2I) from dy (N, I), h.
struct SwigluArgs {
  mxmoe_tensor h{};
  OptTensor dy;
  mxmoe_tensor out{};
  int32_t layout = 0;
  float alpha = 1.f, limit = 0.f, up_offset = 0.f;
  void* stream = nullptr;
};

namespace cpu {
void moe_routing(const MoeRoutingArgs& args);
void moe_gather(const MoeGatherArgs& args);
void moe_combine(const MoeCombineArgs& args);
void moe_combine_weight_grad(const MoeWeightGradArgs& args);
void moe_swiglu_weight_grad(const MoeSwigluWeightGradArgs& args);
void moe_group_sum(const MoeGroupSumArgs& args);
void swiglu(const SwigluArgs& args);
}  // namespace cpu

#if defined(MXMOE_WITH_CUDA)
namespace cuda {
int64_t moe_routing_workspace_size(int64_t n, int64_t num_experts, int32_t device);
void moe_routing(const MoeRoutingArgs& args);
void moe_gather(const MoeGatherArgs& args);
void moe_combine(const MoeCombineArgs& args);
void moe_combine_weight_grad(const MoeWeightGradArgs& args);
void moe_swiglu_weight_grad(const MoeSwigluWeightGradArgs& args);
void moe_group_sum(const MoeGroupSumArgs& args);
void swiglu(const SwigluArgs& args);
}  // namespace cuda
#endif

}  // namespace mxmoe
