/*
 * mxmoe C API: the types every family shares (status, dtypes, scale modes, the tensor view) and the
 * library queries. mxmoe/mxmoe.h includes every family header.
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
#ifndef MXMOE_COMMON_H_
#define MXMOE_COMMON_H_

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

/* The MXMOE_* environment variables (docs/reference/env.md) are read once per process, at the first
 * call that needs one. This reads them again, for tests and A/B measurements that change them
 * between calls in one process; it must not run concurrently with other calls into the library.
 * MXMOE_ERR_INVALID_ARGUMENT names every invalid variable (calls that read them fail the same way
 * until a reload succeeds). */
MXMOE_API mxmoe_status mxmoe_reload_env(void);

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_COMMON_H_ */
