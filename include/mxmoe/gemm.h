/*
 * mxmoe C API, grouped GEMMs: MX grouped GEMMs (exact reference numerics), the token-group
 * utilities around them, and the Hopper FP8 grouped GEMMs of the tile128 recipe. Conventions in
 * mxmoe/common.h.
 */
#ifndef MXMOE_GEMM_H_
#define MXMOE_GEMM_H_

#include "mxmoe/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Grouped GEMMs on MX operands (fp32 accumulation) -------------------------------------------
 * Both operands are contracted along their last dim, scales along that dim (1 byte per 32).
 *
 * mxmoe_grouped_mm_mx: out[m, n] = sum_k A[m, k] * B[g(m), n, k]  (+ bias[g(m), n])
 *   A (M, K) e4m3 + a_scale (M, K/32); B (G, N, K) e4m3 + b_scale (G, N, K/32)
 *   offs (G,) groups of rows of A; rows past offs[G-1] are written as 0.
 *   forward: A = x, B = W.   dgrad: A = dY, B = W quantized along N, viewed (G, K, N).
 *   bias: optional (G, N) bf16/f32. out: (M, N) bf16 or f32.
 *
 * mxmoe_grouped_mm_mx_kgroups (wgrad): out[g, n, k] = sum_{m in group g} A[n, m] * B[k, m]
 *   A (N, M) e4m3 + a_scale (N, cap); B (K, M) e4m3 + b_scale (K, cap), grouped compact scale layout
 *   along M (cap = ceil(M/32) + G). out: (G, N, K) bf16 or f32; empty groups give zeros.
 */
MXMOE_API mxmoe_status mxmoe_grouped_mm_mx(const mxmoe_tensor* a, const mxmoe_tensor* a_scale,
                                           const mxmoe_tensor* b, const mxmoe_tensor* b_scale,
                                           const mxmoe_tensor* offs, const mxmoe_tensor* bias,
                                           mxmoe_tensor* out, void* stream);

MXMOE_API mxmoe_status mxmoe_grouped_mm_mx_kgroups(const mxmoe_tensor* a,
                                                   const mxmoe_tensor* a_scale,
                                                   const mxmoe_tensor* b,
                                                   const mxmoe_tensor* b_scale,
                                                   const mxmoe_tensor* offs, mxmoe_tensor* out,
                                                   void* stream);

/* Writes 0 into the rows of x (M, N) (bf16 or f32, contiguous) past the last group's end
 * (clamped offs, as everywhere), touching only those rows: outputs of GEMMs that leave rows outside
 * every group unwritten (e.g. torch._grouped_mm) get the core's "rows past offs[G-1] are 0". */
MXMOE_API mxmoe_status mxmoe_zero_rows_past_groups(mxmoe_tensor* x, const mxmoe_tensor* offs,
                                                   void* stream);

/* out[i] = min(m, max(0, offs[0..i])): the clamped group ends every kernel uses, as a tensor for
 * GEMMs that trust their offsets (torch._grouped_mm). offs and out: 1-D int32 (G), same device,
 * out contiguous. Reads offs on its device (no host sync). */
MXMOE_API mxmoe_status mxmoe_clamp_offsets(const mxmoe_tensor* offs, int64_t m, mxmoe_tensor* out,
                                           void* stream);

/* Checked mode for device-resident offsets: validates non-decreasing, >= 0 and <= m (syncs the
 * stream when offs is on a device). */
MXMOE_API mxmoe_status mxmoe_check_offsets(const mxmoe_tensor* offs, int64_t m, void* stream);

/* ==== Hopper FP8 grouped GEMMs for the tile128 recipe ============================================
 * The recipe mxfp8_rceil_tile128 (docs/design/mx-format.md, coarse-block MX encodings): activations and
 * gradients in 1x128 blocks along each GEMM's reduction dim, weights in 128x128 tiles; scale
 * tensors still hold one E8M0 byte per 32-element run (the coarse block's byte repeated). The GEMMs
 * run on Hopper's FP8 tensor cores (CUTLASS SM90 blockwise-scaled grouped GEMM): e4m3 x e4m3
 * products, each 128-long partial of the reduction scaled by the two operands' block scales and
 * accumulated in fp32. The GPU reads the first byte of each coarse block (pass coarse-encoded
 * scales; the CPU backend is the exact reference, cpu grouped_mm, which reads every byte).
 *
 * mxmoe_grouped_mm_tile128: out (M, N) = A (M, K) . B[g] (N, K)^T per row group (+ bias[g]),
 *   arguments as mxmoe_grouped_mm_mx. A e4m3 (M, K) + a_scale (M, K/32) constant over each 1x128
 *   block along K (the last block of a row partial); B e4m3 (G, N, K) + b_scale (G, N, K/32)
 *   constant over each 128x128 tile (edge tiles partial). forward: A = x, B = W. dgrad: A = dY
 *   (M, N_model) in 1x128 blocks along N_model, B = the transposed weight copy qt (G, K_model,
 *   N_model) with its scale_r. bias: optional (G, N) bf16/f32. out: (M, N) bf16 or f32; rows past
 *   offs[G-1] are written 0. K % 32 == 0.
 * mxmoe_grouped_mm_tile128_kgroups (wgrad): out[g] (N, K) = A[:, group g] . B[:, group g]^T,
 *   A = dY^T (N, M) e4m3 + a_scale (N, cap), B = x^T (K, M) e4m3 + b_scale (K, cap), grouped compact
 *   scale layout along M (cap = ceil(M/32) + G): 1x128 blocks along tokens that start at each
 *   group's first token, the last block of a group partial (no padding of groups is ever needed).
 *   out: (G, N, K) bf16 or f32 (autograd views it as (G, K, N) by a transpose); empty groups give 0.
 *
 * Device requirements (CUDA tensors): a Hopper GPU (compute capability 9.0) and a build with CUTLASS,
 * else MXMOE_ERR_UNSUPPORTED; contiguous A, B, scales, offs and out; 16-byte aligned A, B and out
 * data; forward/dgrad N % 16 == 0; wgrad K % 16 == 0; M, N, K < 2^31. Host tensors run the exact
 * CPU reference (workspace may then be NULL).
 *
 * workspace: device scratch of at least the *_workspace_size(...) bytes for the same (m, n, k, g)
 *   and device (any 1-byte or wider dtype, contiguous, on the operands' device; its contents need
 *   not be initialized and are garbage afterwards). The sizes depend only on the shapes, never on
 *   offs, so callers allocate it up front (e.g. torch.empty) without a host sync:
 *     forward/dgrad: about 4 * (M * K/128 + G * N) bytes of fp32 scales plus descriptors;
 *     wgrad: fp32 scales plus a staging copy of both operands, (N + K) * (M + 16 G + 32) bytes:
 *       TMA needs every group's first token column 16-byte aligned; groups starting elsewhere (or
 *       all groups when M % 16 != 0) are copied there first, one extra read and write of those
 *       groups' columns of A and B. Token groups at multiples of 16 rows are read in place.
 * Size queries: m, n, k, g as the call's shapes (forward/dgrad: A (m, k), out (m, n), g experts;
 * wgrad: m tokens, out (g, n, k)); device = the CUDA ordinal (-1: host, returns 0). They return -1
 * on error (message in mxmoe_last_error(); UNSUPPORTED cases included).
 * mxmoe_grouped_mm_tile128_kgroups_workspace_size_for: the wgrad's workspace for these operands (the
 *   call's arguments without workspace and stream, checked as the call checks them; offs' values are
 *   not read) and in_place (0: mxmoe_grouped_mm_tile128_kgroups, 1: its _in_place form): the bytes of
 *   the path they take, at most the shape-only size. The sm_90a K-grouped kernel (16-byte aligned
 *   operands, the shapes its configuration takes) needs only its fp32 scales, about
 *   4 (N + K) (M / 128 + G) bytes; the staging copies are for the CUTLASS path, and in place it has none.
 * mxmoe_grouped_mm_tile128_kgroups_in_place: the wgrad for a caller whose every group starts at a
 *   multiple of 16 tokens (the MoE layer's routing, padded per expert): nothing is staged, so its
 *   workspace holds no copies of the operands. M must be a multiple of 16 and a, b 16-byte aligned
 *   (else INVALID_ARGUMENT). offs stays on the device, so a group that starts elsewhere is found
 *   there: where CUTLASS runs, its output out[g] is written as NaN, never a wrong finite value (the
 *   sm_90a K-grouped kernel reads such groups correctly). On the host, the same as the staged call.
 * Calls launch on `stream`, never synchronize the host and allocate nothing: CUDA-graph safe.
 */
MXMOE_API int64_t mxmoe_grouped_mm_tile128_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g,
                                                          int32_t device);
MXMOE_API int64_t mxmoe_grouped_mm_tile128_kgroups_workspace_size(int64_t m, int64_t n, int64_t k,
                                                                  int64_t g, int32_t device);
MXMOE_API int64_t mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(const mxmoe_tensor* a,
                                                                      const mxmoe_tensor* a_scale,
                                                                      const mxmoe_tensor* b,
                                                                      const mxmoe_tensor* b_scale,
                                                                      const mxmoe_tensor* offs,
                                                                      const mxmoe_tensor* out,
                                                                      int32_t in_place);

MXMOE_API mxmoe_status mxmoe_grouped_mm_tile128(const mxmoe_tensor* a, const mxmoe_tensor* a_scale,
                                                const mxmoe_tensor* b, const mxmoe_tensor* b_scale,
                                                const mxmoe_tensor* offs, const mxmoe_tensor* bias,
                                                mxmoe_tensor* out, const mxmoe_tensor* workspace,
                                                void* stream);

MXMOE_API mxmoe_status mxmoe_grouped_mm_tile128_kgroups(const mxmoe_tensor* a,
                                                        const mxmoe_tensor* a_scale,
                                                        const mxmoe_tensor* b,
                                                        const mxmoe_tensor* b_scale,
                                                        const mxmoe_tensor* offs, mxmoe_tensor* out,
                                                        const mxmoe_tensor* workspace, void* stream);
MXMOE_API mxmoe_status mxmoe_grouped_mm_tile128_kgroups_in_place(const mxmoe_tensor* a,
                                                                 const mxmoe_tensor* a_scale,
                                                                 const mxmoe_tensor* b,
                                                                 const mxmoe_tensor* b_scale,
                                                                 const mxmoe_tensor* offs, mxmoe_tensor* out,
                                                                 const mxmoe_tensor* workspace, void* stream);

/* The configuration a tile128 call of this shape gets on Hopper (kernel, tile, stages, producer,
 * cluster, scheduler; the environment's overrides applied), as the one-line text that
 * MXMOE_PRINT_CONFIGS=1 prints per launch, e.g.
 *   "gemm sm90 pass=fwd/dgrad m=16640 n=8192 k=5120 g=4 out=bf16 -> impl=own block_n=128 stages=6
 *    lean producer=warp cluster=2 fallback=cutlass"
 * pass: MXMOE_GEMM_GROUPED_M (mxmoe_grouped_mm_tile128: forward, dgrad) or MXMOE_GEMM_GROUPED_K
 * (mxmoe_grouped_mm_tile128_kgroups: wgrad); m, n, k, g as the workspace size queries; out_dtype
 * BF16 or F32. Pure host logic: answers in every build, with or without a GPU. The own kernel is
 * assumed to take the call (it declines unaligned operands, which then run on CUTLASS; the launch's
 * printed line says so). buf receives the NUL-terminated text (MXMOE_CONFIG_TEXT_MAX bytes always
 * suffice; a smaller buf that cannot hold it is an error). */
typedef enum { MXMOE_GEMM_GROUPED_M = 0, MXMOE_GEMM_GROUPED_K = 1 } mxmoe_gemm_pass;
#define MXMOE_CONFIG_TEXT_MAX 512
MXMOE_API mxmoe_status mxmoe_sm90_gemm_config(int32_t pass, int64_t m, int64_t n, int64_t k, int64_t g,
                                              mxmoe_dtype out_dtype, char* buf, size_t len);

/* mxmoe_grouped_mm_tile128_gather: the forward / dgrad GEMM on routed rows of a per-token operand
 * (the MoE layer's dispatch inside the GEMM: no routed copy of A exists).
 *   out (M, N) = A[rows] . B[g] (N, K)^T per row group (+ bias[g]), GEMM row r reading row
 *   gather[r] / fanout of A (T, K) e4m3 + a_scale (T, K/32) (tile128 1x128 rows, contiguous);
 *   gather (M,) int32 contiguous: indices clamped into [0, T * fanout), a negative one gives a zero
 *   row (padding); row_scale optional (T, fanout) f32: out row r = row_scale.flat[index] *
 *   (A B^T)[r] (+ bias) in fp32, rounded once (0 for a zero row). b, b_scale, offs, bias as
 *   mxmoe_grouped_mm_tile128; out (M, N) bf16 on a device (bf16 or f32 on the host). On the host the
 *   routed rows are materialized and the CPU reference runs; on a device only the sm_90a kernel runs
 *   it (no workspace), UNSUPPORTED elsewhere.
 * mxmoe_grouped_mm_tile128_gather_available: 1 when that call (M routed rows, N, K, G groups, T rows
 *   of A, fanout) runs on `device` (-1: the host, always), else 0.
 */
MXMOE_API int32_t mxmoe_grouped_mm_tile128_gather_available(int64_t m, int64_t n, int64_t k, int64_t g,
                                                            int64_t t, int64_t fanout, int32_t device);
MXMOE_API mxmoe_status mxmoe_grouped_mm_tile128_gather(const mxmoe_tensor* a,
                                                       const mxmoe_tensor* a_scale,
                                                       const mxmoe_tensor* gather, int64_t fanout,
                                                       const mxmoe_tensor* row_scale,
                                                       const mxmoe_tensor* b,
                                                       const mxmoe_tensor* b_scale,
                                                       const mxmoe_tensor* offs,
                                                       const mxmoe_tensor* bias, mxmoe_tensor* out,
                                                       void* stream);

/* mxmoe_grouped_mm_tile128_gather_dswiglu: the MoE layer's down-projection dgrad with the SwiGLU
 * backward in its epilogue (weights applied after the experts). The gather GEMM's
 *   dY' (M, I) = A[rows] . B[g] (I, K)^T   (mxmoe_grouped_mm_tile128_gather: A (T, K) e4m3 + a_scale,
 *                                           gather (M,), fanout, b (G, I, K), b_scale, offs; no bias)
 * rounded to bf16 is not stored; from it and the pre-activation h (M, 2I) bf16 (gate | up,
 * layout MXMOE_SWIGLU_CONCAT; alpha, limit, up_offset as mxmoe_swiglu) come
 *   dh_q (M, 2I) e4m3, dh_scale (M, 2I/32) e8m0, dh_qt (2I, M) e4m3, dh_scale_t (2I, ceil(M/32) + G)
 *     e8m0: the bytes of mxmoe_quantize_fused_source on the SWIGLU_BACKWARD source (a = h, b = dY',
 *     perm = gather, row_scale (T, fanout) f32 required, k = fanout) with offs, row and column blocks
 *     of 128, `mode`: the rowwise 1x128 and the per-group columnwise 128x1 operands of
 *     dH = act'(h, row_scale * dY'); except that rows past the last group are written as if dY' were
 *     zero there (zero codes, the all-zero block's scale);
 *   tw_part (M, I/128) f32: tw_part[r, t] = sum over columns c of tile t (128 t .. 128 t + 127) of
 *     dY'[r, c] * swiglu(h[r])[c], in a fixed order: lane q of 4 sums columns 128 t + 8 j + 2 q + e
 *     (j < 16, e < 2) in that order from +0, then (s0 + s1) + (s2 + s3); 0 past the last group. The
 *     routing weights' gradient is <dY'[r], swiglu(h[r])> = the sum over t.
 * I a multiple of 128. On the host the CPU backend composes the gather GEMM, the quantize pass and the
 * sums; on a device only the sm_90a kernel runs it (UNSUPPORTED elsewhere: ..._available says).
 */
MXMOE_API int32_t mxmoe_grouped_mm_tile128_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g,
                                                                    int64_t t, int64_t fanout, int32_t layout,
                                                                    int32_t device);
MXMOE_API mxmoe_status mxmoe_grouped_mm_tile128_gather_dswiglu(
    const mxmoe_tensor* a, const mxmoe_tensor* a_scale, const mxmoe_tensor* gather, int64_t fanout,
    const mxmoe_tensor* row_scale, const mxmoe_tensor* b, const mxmoe_tensor* b_scale, const mxmoe_tensor* offs,
    const mxmoe_tensor* h, int32_t layout, float alpha, float limit, float up_offset, mxmoe_scale_mode mode,
    mxmoe_tensor* dh_q, mxmoe_tensor* dh_scale, mxmoe_tensor* dh_qt, mxmoe_tensor* dh_scale_t, mxmoe_tensor* tw_part,
    void* stream);

/* mxmoe_grouped_mm_tile128_gather_swiglu: the MoE layer's up projection with the SwiGLU in its
 * epilogue. The gather GEMM's
 *   h (M, 2I) bf16 = A[rows] . B[g] (2I, K)^T (+ bias[g])   (mxmoe_grouped_mm_tile128_gather: A (T, K)
 *                                                e4m3 + a_scale, gather (M,), fanout, b (G, 2I, K),
 *                                                b_scale, offs, bias optional (G, 2I) bf16 or f32, added
 *                                                in fp32 before h's one rounding; no row_scale)
 * is stored (gate and up halves as layout says: MXMOE_SWIGLU_CONCAT or MXMOE_SWIGLU_INTERLEAVED), and
 * act(h) = swiglu(gate, up) (M, I) (alpha, limit, up_offset as mxmoe_swiglu) is written as
 *   act_q (M, I) e4m3, act_scale (M, I/32) e8m0 and, when act_qt is given, act_qt (I, M) e4m3,
 *   act_scale_t (I, ceil(M/32) + G) e8m0: the bytes of mxmoe_quantize_fused_source on the SWIGLU source
 *   (a = h) with offs, row and column blocks of 128, `mode`: the rowwise 1x128 operand (the down
 *   projection's A) and the per-group columnwise 128x1 operand (its wgrad). act_qt and act_scale_t are
 *   both given or both NULL.
 * I a multiple of 128 (concatenated halves) or of 64 (interleaved: gpt-oss's 2880). On the host the CPU
 * backend composes the gather GEMM and the quantize pass; on a device only the sm_90a kernel runs it
 * (UNSUPPORTED elsewhere: ..._available says), which takes a bias with interleaved halves only (gpt-oss's
 * b13; INVALID_ARGUMENT for concatenated halves with a bias on a device).
 */
MXMOE_API int32_t mxmoe_grouped_mm_tile128_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g,
                                                                   int64_t t, int64_t fanout, int32_t layout,
                                                                   int32_t device);
MXMOE_API mxmoe_status mxmoe_grouped_mm_tile128_gather_swiglu(
    const mxmoe_tensor* a, const mxmoe_tensor* a_scale, const mxmoe_tensor* gather, int64_t fanout,
    const mxmoe_tensor* b, const mxmoe_tensor* b_scale, const mxmoe_tensor* offs, const mxmoe_tensor* bias,
    int32_t layout, float alpha,
    float limit, float up_offset, mxmoe_scale_mode mode, mxmoe_tensor* h, mxmoe_tensor* act_q,
    mxmoe_tensor* act_scale, mxmoe_tensor* act_qt, mxmoe_tensor* act_scale_t, void* stream);

/* mxmoe_grouped_mm_bf16_gather: the bf16 MoE layer's GEMM on routed rows of a per-token operand
 * (no routed copy of A exists):
 *   out (M, N) bf16 = A[rows] . B[g] per row group, fp32 accumulation rounded once, GEMM row r reading
 *   row gather[r] / fanout of A (T, K) bf16 (contiguous); gather (M,) int32 contiguous, indices
 *   clamped into [0, T * fanout), a negative one gives a zero row (padding); B[g] (N, K) with b_kn 0
 *   (out = A B[g]^T: the up projection's w13 (E, 2I, H)) or (K, N) with b_kn 1 (out = A B[g]: the
 *   down projection's dgrad reading w2 (E, H, I) as it lies), bf16, contiguous; offs (G) int32 group
 *   ends (clamped as mxmoe_grouped_mm_tile128); rows past the last group are written as zeros. On the
 *   host a reference computes each sum in fp32 in K order; on a device only the sm_90a kernel runs it
 *   (no workspace; its fp32 sums in the tensor cores' order), UNSUPPORTED elsewhere.
 * mxmoe_grouped_mm_bf16_gather_available: 1 when that call (M routed rows, N, K, G groups, T rows of
 *   A, fanout, b_kn) runs on `device` (-1: the host, always), else 0. The kernel takes K a multiple of
 *   8 (K-major B) or of 64 (b_kn 1, with G K < 2^31) and N a multiple of 8 (K-major B) or of 64 (b_kn 1).
 */
MXMOE_API int32_t mxmoe_grouped_mm_bf16_gather_available(int64_t m, int64_t n, int64_t k, int64_t g, int64_t t,
                                                         int64_t fanout, int32_t b_kn, int32_t device);
MXMOE_API mxmoe_status mxmoe_grouped_mm_bf16_gather(const mxmoe_tensor* a, const mxmoe_tensor* gather,
                                                    int64_t fanout, const mxmoe_tensor* b, int32_t b_kn,
                                                    const mxmoe_tensor* offs, mxmoe_tensor* out, void* stream);

/* mxmoe_grouped_mm_bf16_gather_swiglu: the bf16 MoE layer's up projection with the SwiGLU in its
 * epilogue. The bf16 gather GEMM's
 *   h (M, 2I) bf16 = A[rows] . B[g]^T   (mxmoe_grouped_mm_bf16_gather with b_kn 0: a (T, K) bf16,
 *                                         gather (M,), fanout, b (G, 2I, K) bf16, offs)
 * with bias (optional (G, 2I) bf16 or f32) added in fp32 to the bf16 result and rounded again (the bits
 * of the GEMM, then a bias add), is stored (layout MXMOE_SWIGLU_CONCAT: gate | up halves, I a multiple
 * of 64 on a device; MXMOE_SWIGLU_INTERLEAVED: gpt-oss) and act (M, I) bf16 = mxmoe_swiglu of it
 * (alpha, limit, up_offset as mxmoe_swiglu); rows past the last group are zero in both. On the host a
 * reference composes the two; on a device only the sm_90a kernel runs it (UNSUPPORTED elsewhere:
 * ..._available says).
 */
MXMOE_API int32_t mxmoe_grouped_mm_bf16_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g,
                                                                int64_t t, int64_t fanout, int32_t layout,
                                                                int32_t device);
MXMOE_API mxmoe_status mxmoe_grouped_mm_bf16_gather_swiglu(const mxmoe_tensor* a, const mxmoe_tensor* gather,
                                                           int64_t fanout, const mxmoe_tensor* b,
                                                           const mxmoe_tensor* offs, const mxmoe_tensor* bias,
                                                           int32_t layout, float alpha, float limit,
                                                           float up_offset, mxmoe_tensor* h, mxmoe_tensor* act,
                                                           void* stream);

/* mxmoe_grouped_mm_bf16_gather_dswiglu: the bf16 MoE layer's down-projection dgrad with the SwiGLU
 * backward in its epilogue. The bf16 gather GEMM's
 *   dY' (M, I) = A[rows] . B[g]   (mxmoe_grouped_mm_bf16_gather with b_kn 1: a (T, K) bf16, gather (M,),
 *                                  fanout, b (G, K, I) bf16 read as it lies, offs)
 * rounded to bf16 is not stored; from it, the pre-activation h (M, 2I) bf16 (layout MXMOE_SWIGLU_CONCAT
 * or MXMOE_SWIGLU_INTERLEAVED; alpha, limit, up_offset as mxmoe_swiglu) and the routing weight w of each row
 * (row_scale (T, fanout) f32 at the row's index, 0 for a padding row; without row_scale 1) come
 *   dh (M, 2I) bf16 = mxmoe_swiglu_backward of bf16(w * bf16(dY')) (one fp32 multiply rounded once) and h;
 *   tw_part (M, ceil(I/128)) f32: tw_part[r, t] = sum over columns c of tile t (128 t .. 128 t + 127, < I)
 *     of bf16(dY')[r, c] * swiglu(h[r])[c] (fp32), in a fixed order: lane q of 4 sums columns
 *     128 t + 8 j + 2 q + e (j < 16, e < 2) in that order from +0, then (s0 + s1) + (s2 + s3);
 *   act (M, I) bf16, optional (NULL: not written): swiglu(h) as mxmoe_swiglu writes it (the bf16 layer's
 *     dW2 operand, so that nothing reads h again for it).
 * Rows past the last group are zero in all three. K and I multiples of 64. On the host a reference composes
 * the gather GEMM and the same arithmetic; on a device only the sm_90a kernel runs it (UNSUPPORTED
 * elsewhere: ..._available says).
 */
MXMOE_API int32_t mxmoe_grouped_mm_bf16_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g,
                                                                 int64_t t, int64_t fanout, int32_t layout,
                                                                 int32_t device);
MXMOE_API mxmoe_status mxmoe_grouped_mm_bf16_gather_dswiglu(
    const mxmoe_tensor* a, const mxmoe_tensor* gather, int64_t fanout, const mxmoe_tensor* row_scale,
    const mxmoe_tensor* b, const mxmoe_tensor* offs, const mxmoe_tensor* h, int32_t layout, float alpha, float limit,
    float up_offset, mxmoe_tensor* dh, mxmoe_tensor* tw_part, mxmoe_tensor* act, void* stream);

/* mxmoe_grouped_mm_bf16_kgather: the bf16 MoE layer's wgrad on routed rows, groups along the reduction
 * (no routed copy of the gathered operand exists):
 *   out (G, M, N) bf16, out[g] = sum over the routed rows r of group g of A_r^T B_r (fp32 accumulation
 *   rounded once), groups the routed rows 0 .. R of offs (G) int32 (clamped as mxmoe_grouped_mm_tile128);
 *   gather (R,) int32 contiguous; with gather_b 1, A_r is row r of a (R, M) and B_r row gather[r] / fanout
 *   of b (T, N) (the up projection's dW13 = dH^T dispatch(x)); with gather_b 0, A_r is row
 *   gather[r] / fanout of a (T, M) and B_r row r of b (R, N) (the down projection's dW2 =
 *   dispatch(dout)^T (w act(h))); indices clamped into [0, T * fanout), a negative one a zero row. a, b
 *   bf16 contiguous. A group without rows gets zeros. On the host a reference sums each output in fp32 in
 *   row order; on a device only the sm_90a kernel runs it (its sums in the tensor cores' order),
 *   UNSUPPORTED elsewhere.
 * mxmoe_grouped_mm_bf16_kgather_available: 1 when that call (R routed rows, M, N, G groups, T rows of the
 *   gathered operand, fanout) runs on `device` (-1: the host, always), else 0. The kernel takes M and N
 *   multiples of 8.
 */
MXMOE_API int32_t mxmoe_grouped_mm_bf16_kgather_available(int64_t r, int64_t m, int64_t n, int64_t g, int64_t t,
                                                          int64_t fanout, int32_t device);
MXMOE_API mxmoe_status mxmoe_grouped_mm_bf16_kgather(const mxmoe_tensor* a, const mxmoe_tensor* b,
                                                     const mxmoe_tensor* gather, int64_t fanout, int32_t gather_b,
                                                     const mxmoe_tensor* offs, mxmoe_tensor* out, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_GEMM_H_ */
