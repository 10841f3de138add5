/*
 * mxmoe public C API.
 *
 * A torch-free interface to the core: every entry point takes plain tensor views, returns a status,
 * and on failure leaves a message retrievable with mxmoe_last_error() (thread-local). Nothing is
 * written to an output before validation passes. The numerics are those of shared MX_SPEC.md.
 *
 * Conventions
 *  - mxmoe_tensor describes a strided view; shapes and strides are in elements, up to 4 dims.
 *    device = -1 for host memory, >= 0 for a CUDA device ordinal. CUDA entry points launch on
 *    `stream` (a cudaStream_t, NULL = legacy default) and never synchronize the host.
 *  - Scale tensors hold one E8M0 byte per 32-element MX block along the quantized axis, also for the
 *    coarse (1x128, 128x128) encodings, where the coarse block's byte is repeated.
 *  - offs: int32 cumulative end rows of G token groups (offs[G-1] <= M; empty groups allowed). It may
 *    live on the device; kernels clamp it instead of trusting it. mxmoe_check_offsets() validates it.
 *  - Groups along the quantized axis ("grouped compact" scale layout): a block never crosses a
 *    group boundary, the last block of a group may be partial (missing rows count as zeros), and
 *    group g's blocks start at index sum_{h<g} ceil(size_h/32). The scale axis then has capacity
 *    mxmoe_grouped_scale_capacity(M, G) = ceil(M/32) + G; unused entries are written as 0.
 */
#ifndef MXMOE_MXMOE_H_
#define MXMOE_MXMOE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MXMOE_API __declspec(dllexport)
#else
#define MXMOE_API __attribute__((visibility("default")))
#endif

#define MXMOE_MAX_DIMS 4
#define MXMOE_BLOCK 32 /* elements per MX block */

typedef enum {
  MXMOE_OK = 0,
  MXMOE_ERR_INVALID_ARGUMENT = 1, /* bad shape, dtype, device, stride or value */
  MXMOE_ERR_UNSUPPORTED = 2,      /* valid request this build/device cannot serve */
  MXMOE_ERR_CUDA = 3,             /* a CUDA runtime call failed */
  MXMOE_ERR_INTERNAL = 4
} mxmoe_status;

typedef enum {
  MXMOE_DTYPE_BF16 = 0,
  MXMOE_DTYPE_F32 = 1,
  MXMOE_DTYPE_E4M3 = 2, /* float8_e4m3fn */
  MXMOE_DTYPE_E8M0 = 3, /* float8_e8m0fnu */
  MXMOE_DTYPE_I32 = 4,
  MXMOE_DTYPE_F64 = 5,
  MXMOE_DTYPE_I64 = 6, /* index tensors (mxmoe_moe_routing's topk_idx) */
  /* Not values to use: these give the enum the whole int32 range, so whatever a caller passes (an
     invalid value is rejected with a message) is a well-defined value of the type in C and C++. */
  MXMOE_DTYPE_INT32_MIN_ = -2147483647 - 1,
  MXMOE_DTYPE_INT32_MAX_ = 2147483647
} mxmoe_dtype;

typedef enum {
  MXMOE_SCALE_RCEIL = 0, /* training default, torchao/cuBLAS compatible */
  MXMOE_SCALE_FLOOR = 1,
  MXMOE_SCALE_CEIL = 2,
  MXMOE_SCALE_EVEN = 3,
  /* Not values to use: these give the enum the whole int32 range, so whatever a caller passes (an
     invalid value is rejected with a message) is a well-defined value of the type in C and C++. */
  MXMOE_SCALE_MODE_INT32_MIN_ = -2147483647 - 1,
  MXMOE_SCALE_MODE_INT32_MAX_ = 2147483647
} mxmoe_scale_mode;

typedef struct {
  void* data;
  mxmoe_dtype dtype;
  int32_t ndim;
  int64_t shape[MXMOE_MAX_DIMS];
  int64_t strides[MXMOE_MAX_DIMS]; /* in elements */
  int32_t device;                  /* -1 host, >= 0 CUDA ordinal */
} mxmoe_tensor;

/* Message of the last failed call on this thread ("" if none). */
MXMOE_API const char* mxmoe_last_error(void);
MXMOE_API const char* mxmoe_version(void);
/* 1 if the library was built with CUDA kernels. */
MXMOE_API int mxmoe_has_cuda(void);
/* 1 if the library has the Hopper tile128 FP8 grouped GEMMs (CUDA + CUTLASS at build time). */
MXMOE_API int mxmoe_has_tile128_gemm(void);

/* ---- Scalar codecs (host), exactly as MX_SPEC.md ------------------------------------------ */
MXMOE_API uint8_t mxmoe_e8m0_from_amax(float amax, mxmoe_scale_mode mode);
MXMOE_API float mxmoe_e8m0_to_float(uint8_t s);
MXMOE_API uint8_t mxmoe_e4m3_from_float(float y); /* RNE, saturating to +-448, NaN kept */
MXMOE_API float mxmoe_e4m3_to_float(uint8_t q);

/* ---- Quantize ----------------------------------------------------------------------------------
 * x: (R, C) or (G, R, C), bf16 or f32, any strides.
 * The scale block is block_r x block_c, one of:
 *   1x32, 1x128      blocks along C (rows independent)            -> scale_c
 *   32x1, 128x1      blocks along R (columns independent)          -> scale_r
 *   128x128          square tiles, both orientations available     -> scale_c and/or scale_r
 * Outputs (each may be NULL; at least one data and one scale output must be given):
 *   q       (.., R, C) e4m3, the quantized elements in x's orientation
 *   qt      (.., C, R) e4m3, the same elements transposed (wgrad / dgrad operand layout)
 *   scale_c (.., R, C/32) e8m0: the byte of the block holding each 32-run along C
 *   scale_r (.., C, nR) e8m0: the byte of the block holding each 32-run along R, stored with C
 *           leading so it pairs with qt; nR = R/32, or with offs the grouped capacity ceil(R/32)+G
 * offs (optional, 2D x only): int32 (G,) groups along R; blocks along R (32x1, 128x1, 128x128)
 *   never cross a group end; rows after offs[G-1] are then not part of any group: their q/qt
 *   entries (and for 128x128 their scale_c rows) are written as 0. Blocks along C only (1x32,
 *   1x128) ignore offs: rows are independent, every row is quantized.
 * Requirements: C % 32 == 0 when blocks run along C; R % 32 == 0 when scale_r is requested and
 *   offs is NULL. Coarse blocks at an edge are partial (cover what remains).
 */
typedef struct {
  int32_t block_r;
  int32_t block_c;
  mxmoe_scale_mode mode;
} mxmoe_quant_config;

MXMOE_API mxmoe_status mxmoe_quantize(const mxmoe_tensor* x, const mxmoe_tensor* offs,
                                      mxmoe_quant_config cfg, mxmoe_tensor* q, mxmoe_tensor* qt,
                                      mxmoe_tensor* scale_c, mxmoe_tensor* scale_r, void* stream);

/* ---- Dequantize --------------------------------------------------------------------------------
 * q: (R, C) or (G, R, C) e4m3. axis selects the scale orientation:
 *   axis = 1: scale (.., R, nC), blocks along C (nC = C/32, or with offs ceil(C/32)+G)
 *   axis = 0: scale (.., C, nR), blocks along R (nR = R/32, or with offs ceil(R/32)+G)
 * offs (optional, 2D only): groups along the blocked axis (grouped compact scale layout).
 * out: q's shape, bf16 or f32. Elements outside every group are written as 0.
 */
MXMOE_API mxmoe_status mxmoe_dequantize(const mxmoe_tensor* q, const mxmoe_tensor* scale,
                                        int32_t axis, const mxmoe_tensor* offs, mxmoe_tensor* out,
                                        void* stream);

/* Scale axis capacity for M rows in G groups: ceil(M/32) + G. */
MXMOE_API int64_t mxmoe_grouped_scale_capacity(int64_t m, int64_t g);

/* ---- Blocked ("swizzled") scale layout (MX_SPEC.md) ------------------------------------------ */
typedef enum {
  MXMOE_BLOCKED_WHOLE = 0,      /* scale (H, W) -> (ceil(H/128)*128 * ceil(W/4)*4) bytes */
  MXMOE_BLOCKED_GROUPS_M = 1,   /* scale (M, W), groups of rows (offs): (M + 128*G) rows */
  MXMOE_BLOCKED_GROUPS_K = 2,   /* scale (R, cap) in grouped compact layout along columns, offs in
                                   tokens: columns ceil(M/32) + 4*G ... see mxmoe_blocked_size */
  MXMOE_BLOCKED_PER_EXPERT = 3, /* scale (G, R, C): (G, ceil(R/128)*128 * ceil(C/4)*4) */
  /* Not values to use: these give the enum the whole int32 range, so whatever a caller passes (an
     invalid value is rejected with a message) is a well-defined value of the type in C and C++. */
  MXMOE_BLOCKED_KIND_INT32_MIN_ = -2147483647 - 1,
  MXMOE_BLOCKED_KIND_INT32_MAX_ = 2147483647
} mxmoe_blocked_kind;

/* Bytes of the blocked buffer (static upper bound, no device->host sync needed).
 * For GROUPS_M: h = M (rows), w = scale columns, g = groups.
 * For GROUPS_K: h = R (scale rows), w = M (tokens), g = groups.
 * For WHOLE: h, w the scale shape; g ignored. For PER_EXPERT: g experts of (h, w). */
MXMOE_API int64_t mxmoe_blocked_size(mxmoe_blocked_kind kind, int64_t h, int64_t w, int64_t g);

/* scale -> blocked (1-D e8m0 buffer of mxmoe_blocked_size bytes; padding bytes are zero). */
MXMOE_API mxmoe_status mxmoe_scales_to_blocked(const mxmoe_tensor* scale, mxmoe_blocked_kind kind,
                                               const mxmoe_tensor* offs, mxmoe_tensor* blocked,
                                               void* stream);
/* blocked -> scale (the inverse; scale is the output, its shape says what to read). */
MXMOE_API mxmoe_status mxmoe_scales_from_blocked(const mxmoe_tensor* blocked,
                                                 mxmoe_blocked_kind kind, const mxmoe_tensor* offs,
                                                 mxmoe_tensor* scale, void* stream);

/* ---- Grouped GEMMs on MX operands (fp32 accumulation) ----------------------------------------
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

/* ==== Fused quantization (issue 4) ==============================================================
 * One read of x serves every MX operand a training step needs from it:
 *   - a rowwise side: blocks of 1 x row_block along C (row_block 32 or 128), every row quantized
 *     (offs, when given, only selects the grouped blocked layout of its scales);
 *   - a columnwise side: blocks of col_block x 1 along R (32 or 128), per token group with offs
 *     (grouped compact scale layout, partial last block; rows past offs[G-1] are zeros);
 *   - or, with tile128, one quantization in 128x128 tiles (tiles start at group starts with offs,
 *     as mxmoe_quantize) that both sides view: the rowwise side through scale_c, the columnwise
 *     side through scale_r.
 * For each side, any subset of outputs (NULL = not wanted, at least one per side given):
 *   q             (.., R, C) e4m3, x's orientation
 *   qt            (.., C, R) e4m3, transposed
 *   scale         rowwise: (.., R, C/32); columnwise: (.., C, nR) with nR = R/32, or with offs the
 *                 grouped capacity ceil(R/32) + G (unused entries 0); e8m0
 *   scale_blocked the same scales in the blocked layout (MX_SPEC.md), written by the quantizer
 *                 itself (no rearrange pass), 1-D e8m0 of mxmoe_blocked_size() bytes, padding 0.
 *                 Kind: 3D x -> PER_EXPERT; with offs: rowwise GROUPS_M (h = R, w = C/32),
 *                 columnwise GROUPS_K (h = C, w = R tokens); else WHOLE.
 *   dq            (.., R, C) bf16 or f32: the MX round trip, dequantize(q, scale) (exact in bf16
 *                 down to 2^-133): the exact recipe's GEMM operand on Hopper
 *   dqt           (.., C, R) bf16 or f32: dq transposed
 * Elements outside every group (columnwise side or tile128 with offs) are 0 in q, qt, dq, dqt.
 * Requirements: C % 32 == 0 for the rowwise side and for tile128; without offs, R % 32 == 0 for
 * the columnwise side. offs: 2D x only. x bf16 or f32 (contiguous on a device). The bytes equal
 * mxmoe_quantize, mxmoe_dequantize and mxmoe_scales_to_blocked composed (the CPU backend composes
 * them; CUDA does it in one pass over x, on `stream`, without host syncs).
 */
typedef struct {
  mxmoe_tensor* q;
  mxmoe_tensor* qt;
  mxmoe_tensor* scale;
  mxmoe_tensor* scale_blocked;
  mxmoe_tensor* dq;
  mxmoe_tensor* dqt;
} mxmoe_fused_side;

typedef struct {
  int32_t row_block; /* rowwise side: 32 or 128 (used when `row` is given) */
  int32_t col_block; /* columnwise side: 32 or 128 (used when `col` is given) */
  int32_t tile128;   /* nonzero: 128x128 tiles; row_block/col_block must then be 128 (or 0) */
  mxmoe_scale_mode mode;
} mxmoe_fused_config;

/* row, col: the sides wanted (NULL = side not wanted; at least one). */
MXMOE_API mxmoe_status mxmoe_quantize_fused(const mxmoe_tensor* x, const mxmoe_tensor* offs,
                                            mxmoe_fused_config cfg, const mxmoe_fused_side* row,
                                            const mxmoe_fused_side* col, void* stream);

/* ---- CUDA graphs (the weight cache under capture, mxmoe/weight_cache.py) ---------------------
 * mxmoe_capture_id: *id = the id of the stream capture that `stream` (a cudaStream_t; NULL = the
 * legacy default stream) is recording (cudaStreamGetCaptureInfo), 0 when it is not capturing, and 0
 * in a build without CUDA.
 * mxmoe_quantize_fused_if: mxmoe_quantize_fused (same arguments, same checks) recorded on a
 * capturing `stream` under a conditional graph node on `flag`, one int32 in device memory of x's
 * device: each replay of the graph runs the quantization only when *flag != 0, and then sets *flag
 * to 0. So a replay recomputes the outputs only when the caller has set the flag since (the outputs
 * keep their values otherwise). CUDA tensors only; MXMOE_ERR_UNSUPPORTED when `stream` is not
 * capturing or the build has no CUDA. */
MXMOE_API mxmoe_status mxmoe_capture_id(void* stream, uint64_t* id);
MXMOE_API mxmoe_status mxmoe_quantize_fused_if(const mxmoe_tensor* flag, const mxmoe_tensor* x,
                                               const mxmoe_tensor* offs, mxmoe_fused_config cfg,
                                               const mxmoe_fused_side* row, const mxmoe_fused_side* col,
                                               void* stream);

/* ---- Fused quantization of a computed input (the fused MoE expert layer, issue 11) ----------
 * mxmoe_quantize_fused where the (R, C) input x is never in memory: each element is computed from
 * `src` as the quantizer reads it, so no intermediate copy is written:
 *   MXMOE_SOURCE_GATHER           x[r, :] = a[perm[r] / k, :], times row_scale.flat[perm[r]] when
 *                                 given (fp32 product rounded once to a's dtype, RNE).
 *                                 a (T, C) bf16|f32; perm (R,) int32, values clamped into [0, T*k)
 *                                 except negative ones: a row of zeros (padding rows of routed
 *                                 groups); row_scale optional (T, k) f32. The MoE dispatch (x ->
 *                                 expert order) and, with the routing weights, the combine's
 *                                 transpose for dY.
 *   MXMOE_SOURCE_SWIGLU           x = swiglu(a), a = h (R, 2C) bf16 (layout/alpha/limit/up_offset as
 *                                 mxmoe_swiglu), each value rounded once to bf16.
 *   MXMOE_SOURCE_SWIGLU_BACKWARD  x = dh = swiglu_backward(dy = b (R, C/2), h = a (R, C)) bf16.
 * The bytes equal those of materializing x (mxmoe_moe_gather / mxmoe_swiglu / mxmoe_swiglu_backward)
 * and calling mxmoe_quantize_fused on it, which is what the CPU backend does. CUDA (one pass, on
 * `stream`): C % 8 == 0 (C % 16 == 0 for the concatenated SWIGLU_BACKWARD), a, b and perm
 * contiguous and 16-byte aligned, else MXMOE_ERR_UNSUPPORTED. x's dtype is a's; outputs, offs and
 * cfg as mxmoe_quantize_fused (2D only).
 */
typedef enum {
  MXMOE_SOURCE_GATHER = 1,
  MXMOE_SOURCE_SWIGLU = 2,
  MXMOE_SOURCE_SWIGLU_BACKWARD = 3,
  MXMOE_SOURCE_KIND_INT32_MIN_ = -2147483647 - 1,
  MXMOE_SOURCE_KIND_INT32_MAX_ = 2147483647
} mxmoe_source_kind;
typedef struct {
  mxmoe_source_kind kind;
  const mxmoe_tensor* a;         /* GATHER: rows to gather; SWIGLU*: h */
  const mxmoe_tensor* b;         /* SWIGLU_BACKWARD: dy; else NULL */
  const mxmoe_tensor* perm;      /* GATHER: sorted position -> flat entry t*k+j */
  const mxmoe_tensor* row_scale; /* GATHER, optional: (T, k) f32 */
  int64_t k;                     /* GATHER: entries per row of a (top-k) */
  int32_t layout;                /* SWIGLU*: 0 concatenated [gate | up], 1 interleaved */
  float alpha, limit, up_offset; /* SWIGLU*: see mxmoe_swiglu */
} mxmoe_fused_source;
MXMOE_API mxmoe_status mxmoe_quantize_fused_source(const mxmoe_fused_source* src,
                                                   const mxmoe_tensor* offs, mxmoe_fused_config cfg,
                                                   const mxmoe_fused_side* row,
                                                   const mxmoe_fused_side* col, void* stream);

/* ==== Hopper FP8 grouped GEMMs for the tile128 recipe (issue 5) =================================
 * The recipe mxfp8_rceil_tile128 (MX_SPEC.md, coarse-block MX encodings): activations and
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
 * Calls launch on `stream`, never synchronize the host and allocate nothing: CUDA-graph safe.
 */
MXMOE_API int64_t mxmoe_grouped_mm_tile128_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g,
                                                          int32_t device);
MXMOE_API int64_t mxmoe_grouped_mm_tile128_kgroups_workspace_size(int64_t m, int64_t n, int64_t k,
                                                                  int64_t g, int32_t device);

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

/* ==== MoE kernels: routing, dispatch (gather), combine, SwiGLU (issue 11) ========================
 * The data movement and elementwise steps of the fused expert layer around the grouped GEMMs.
 * T tokens, k experts per token (top-k), E experts, N = T*k rows in expert order. Index tensors are
 * int32 and contiguous; every kernel clamps device-resident indices instead of trusting them (never
 * out of bounds). All outputs are contiguous and written whole (no caller initialization needed).
 * Every call is deterministic (fixed reduction orders, no float atomics) and on CUDA launches on
 * `stream` without host syncs or allocations (CUDA-graph safe). Empty inputs (T = 0, H = 0, k = 0)
 * are valid: outputs with elements are still written (zeros where nothing is summed). NaN stays
 * visible and is written as the canonical NaN (0x7FC00000, bf16 0x7FC0) wherever a value is computed
 * or converted (host and device arithmetic propagate different payloads); same-dtype gathers without
 * row_scale copy the bits.
 *
 * mxmoe_moe_routing: the expert-order permutation of the (T, k) router choices.
 *   topk_idx (T, k) int32 or int64: expert ids; ids outside [0, E) (negative too) are DROPPED.
 *   Entries are sorted stably by (key, flat index t*k+j), key = id for a kept entry, E for a dropped
 *   one. Outputs (int32, on topk_idx's device):
 *     offs (E,)   cumulative END rows: expert e owns sorted rows [offs[e-1], offs[e]); offs[E-1] is
 *                 the number of kept entries; the dropped ones occupy [offs[E-1], N) in flat order
 *     perm (N,)   perm[p] = flat index t*k+j of the entry at sorted position p
 *     inv (T, k)  inv[t, j] = sorted position of entry (t, j) (dropped entries included)
 *   1 <= num_experts <= 2^20, N < 2^31. workspace: CUDA scratch of at least
 *   mxmoe_moe_routing_workspace_size(N, E, device) bytes on topk_idx's device (any dtype, contiguous,
 *   uninitialized, garbage afterwards; NULL allowed when the size is 0, e.g. on the host). The size
 *   depends only on (N, E, device): 256 + 3 * round_up(4 N, 256) + CUB radix sort temp storage for N
 *   32-bit keys of ceil(log2(E+1)) bits. It returns -1 on error (message in mxmoe_last_error()).
 *
 * mxmoe_moe_gather: out[r, :] = x[perm[r] / k, :]   (times row_scale.flat[perm[r]] when given)
 *   x (T, H) bf16|f32; perm (R,) int32 (R = T*k, or more for padded routing), values clamped into
 *   [0, T*k) except negative ones, which give a row of zeros (padding rows); row_scale optional
 *   (T, k) f32|bf16; out (R, H) bf16|f32. The product is one fp32 multiply, rounded once (RNE) to
 *   out's dtype; without row_scale the values are converted (exact copy for equal dtypes).
 *
 * mxmoe_moe_combine: out[t, :] = sum_{j = 0..k-1, in this order} w[t, j] * y[inv[t, j], :]
 *   y (N, H) bf16|f32 (N >= 1 when T*k > 0); inv (T, k) int32, values clamped into [0, N); weights
 *   optional (T, k) f32|bf16; out (T, H) bf16|f32. fp32 accumulator from +0: acc = fl(acc + fl(w*y))
 *   (two roundings, never an FMA), without weights acc = fl(acc + y); rounded once to out's dtype.
 *   Forward combine and, without weights, the backward of the dispatch (dX = sum of the k rows).
 *
 * mxmoe_moe_combine_weight_grad: dw[t, j] = sum_h dout[t, h] * y[inv[t, j], h] in fp32
 *   dout (T, H), y (N, H) bf16|f32; inv (T, k) int32 clamped into [0, N); dw (T, k) f32. Fixed
 *   order: element h goes to lane (h/8) % 32, each lane sums its products in increasing h
 *   (fl(acc + fl(d*y))), the 32 lanes are added in the tree v[l] += v[l + off], off = 16, 8, 4, 2, 1.
 *
 * mxmoe_moe_group_sum: out[g, c] = sum of x[r, c] over the rows r of group g (bias gradients)
 *   x (M, C) bf16|f32; offs (G,) int32 cumulative group ends, clamped as everywhere (rows past
 *   offs[G-1] ignored, empty groups give 0); out (G, C) f32. Fixed order: row r of a group starting
 *   at s goes to lane (r - s) % 16, each lane sums in increasing r, the 16 lanes are added in the tree
 *   v[i] += v[i + off], off = 8, 4, 2, 1.
 *
 * mxmoe_swiglu: y = gc * sigmoid(alpha * gc) * (uc + up_offset),
 *   gc = min(g, limit), uc = clamp(u, -limit, limit), sigmoid(z) = 1 / (1 + exp(-z)), in fp32.
 *   h (N, 2I) bf16|f32 holds gate g and up u: layout MXMOE_SWIGLU_CONCAT: [g | u] halves along the
 *   last dim (gate_up_proj + .chunk(2, -1): Qwen3-MoE, Mixtral, OLMoE, DeepSeek); layout
 *   MXMOE_SWIGLU_INTERLEAVED: g = h[..., 0::2], u = h[..., 1::2] (gpt-oss). y (N, I), h's dtype,
 *   each element rounded once (RNE). Standard SwiGLU: alpha 1, limit +inf, up_offset 0 (silu(g) * u);
 *   gpt-oss: alpha 1.702, limit 7, up_offset 1. Requirements: limit >= 0 (not NaN), alpha and
 *   up_offset finite. NaN inputs stay NaN.
 * mxmoe_swiglu_backward: dh (N, 2I) in h's layout and dtype from dy (N, I) bf16|f32 and h:
 *   dg = dy * (uc + up_offset) * (s + alpha*gc*s*(1-s)) with s = sigmoid(alpha*gc), 0 where g > limit;
 *   du = dy * gc * s, 0 where |u| > limit (the clamps pass the gradient at their bounds, as torch.clamp,
 *   and keep NaN visible).
 *   Every operation is a separately rounded fp32 operation (no FMA contraction), identical on CPU
 *   and CUDA except expf (host libm vs CUDA expf, which can differ by an fp32 ulp): the CPU and CUDA
 *   results may then differ (rarely) by one ulp of a bf16 output (a few ulps of an f32 one); dg also
 *   where s + alpha*gc*s*(1-s) cancels towards 0, by a tiny absolute amount (~1e-7 |dy (uc+up_offset)|).
 */
typedef enum {
  MXMOE_SWIGLU_CONCAT = 0,
  MXMOE_SWIGLU_INTERLEAVED = 1
} mxmoe_swiglu_layout;

MXMOE_API int64_t mxmoe_moe_routing_workspace_size(int64_t n, int64_t num_experts, int32_t device);

MXMOE_API mxmoe_status mxmoe_moe_routing(const mxmoe_tensor* topk_idx, int64_t num_experts,
                                         mxmoe_tensor* offs, mxmoe_tensor* perm, mxmoe_tensor* inv,
                                         const mxmoe_tensor* workspace, void* stream);

MXMOE_API mxmoe_status mxmoe_moe_gather(const mxmoe_tensor* x, const mxmoe_tensor* perm, int64_t k,
                                        const mxmoe_tensor* row_scale, mxmoe_tensor* out,
                                        void* stream);

MXMOE_API mxmoe_status mxmoe_moe_combine(const mxmoe_tensor* y, const mxmoe_tensor* inv,
                                         const mxmoe_tensor* weights, mxmoe_tensor* out,
                                         void* stream);

MXMOE_API mxmoe_status mxmoe_moe_combine_weight_grad(const mxmoe_tensor* dout, const mxmoe_tensor* y,
                                                     const mxmoe_tensor* inv, mxmoe_tensor* dw,
                                                     void* stream);

MXMOE_API mxmoe_status mxmoe_moe_group_sum(const mxmoe_tensor* x, const mxmoe_tensor* offs,
                                           mxmoe_tensor* out, void* stream);

MXMOE_API mxmoe_status mxmoe_swiglu(const mxmoe_tensor* h, int32_t layout, float alpha, float limit,
                                    float up_offset, mxmoe_tensor* y, void* stream);

MXMOE_API mxmoe_status mxmoe_swiglu_backward(const mxmoe_tensor* dy, const mxmoe_tensor* h,
                                             int32_t layout, float alpha, float limit,
                                             float up_offset, mxmoe_tensor* dh, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_MXMOE_H_ */
