/*
 * mxmoe C API, scale layouts: the blocked ("swizzled") layout of the E8M0 scales and its
 * conversions. Conventions in mxmoe/common.h.
 */
#ifndef MXMOE_SCALE_LAYOUT_H_
#define MXMOE_SCALE_LAYOUT_H_

#include "mxmoe/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Blocked ("swizzled") scale layout (docs/design/mx-format.md) ------------------------------------------ */
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

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_SCALE_LAYOUT_H_ */
