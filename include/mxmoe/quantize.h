/*
 * mxmoe C API, quantization: the scalar codecs, quantize / dequantize, fused quantization (one read
 * of x for every operand of a training step, also under a CUDA-graph condition and from a computed
 * input). Conventions in mxmoe/common.h.
 */
#ifndef MXMOE_QUANTIZE_H_
#define MXMOE_QUANTIZE_H_

#include "mxmoe/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Scalar codecs (host), exactly as docs/design/mx-format.md ------------------------------------------ */
MXMOE_API uint8_t mxmoe_e8m0_from_amax(float amax, mxmoe_scale_mode mode);
MXMOE_API float mxmoe_e8m0_to_float(uint8_t s);
MXMOE_API uint8_t mxmoe_e4m3_from_float(float y); /* RNE, saturating to +-448, NaN kept */
MXMOE_API float mxmoe_e4m3_to_float(uint8_t q);

/* ---- Quantize -----------------------------------------------------------------------------------
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

/* ---- Dequantize ---------------------------------------------------------------------------------
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

/* ==== Fused quantization =========================================================================
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
 *   scale_blocked the same scales in the blocked layout (docs/design/mx-format.md), written by the quantizer
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

/* ---- CUDA graphs (the weight cache under capture, mxmoe/weight_cache.py) ------------------------
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

/* ---- Fused quantization of a computed input (the fused MoE expert layer) ------------------------
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
 *                                 With row_scale (T, k) f32 and perm (R,) int32 (both or neither),
 *                                 dy row r is first multiplied by row_scale.flat[perm[r]] (perm
 *                                 clamped into [0, T*k) as for GATHER; a negative one: factor 0),
 *                                 one fp32 multiply of each bf16 dy value: the routing weights
 *                                 applied to an unweighted dgrad (the MoE layer's dA = w * dY').
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
  const mxmoe_tensor* perm;      /* GATHER (and SWIGLU_BACKWARD's row_scale): row -> flat entry t*k+j */
  const mxmoe_tensor* row_scale; /* GATHER, SWIGLU_BACKWARD, optional: (T, k) f32 */
  int64_t k;                     /* GATHER, SWIGLU_BACKWARD with row_scale: entries per token (top-k) */
  int32_t layout;                /* SWIGLU*: 0 concatenated [gate | up], 1 interleaved */
  float alpha, limit, up_offset; /* SWIGLU*: see mxmoe_swiglu */
} mxmoe_fused_source;
MXMOE_API mxmoe_status mxmoe_quantize_fused_source(const mxmoe_fused_source* src,
                                                   const mxmoe_tensor* offs, mxmoe_fused_config cfg,
                                                   const mxmoe_fused_side* row,
                                                   const mxmoe_fused_side* col, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_QUANTIZE_H_ */
