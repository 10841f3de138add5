/*
 * mxmoe public C API.
 *
 * A torch-free interface to the core: every entry point takes plain tensor views, returns a status,
 * and on failure leaves a message retrievable with mxmoe_last_error() (thread-local). Nothing is
 * written to an output before validation passes. The numerics are those of docs/design/mx-format.md.
 *
 * This header includes the whole API, one header per family:
 *   mxmoe/common.h        status, dtypes, scale modes, the tensor view, conventions, library queries
 *   mxmoe/quantize.h      scalar codecs, quantize, dequantize, fused quantization
 *   mxmoe/scale_layout.h  blocked ("swizzled") scale layout
 *   mxmoe/gemm.h          grouped GEMMs (MX reference, tile128 FP8 on Hopper), token-group utilities
 *   mxmoe/moe.h           routing, gather, combine, group sums, SwiGLU
 */
#ifndef MXMOE_MXMOE_H_
#define MXMOE_MXMOE_H_

#include "mxmoe/common.h"
#include "mxmoe/gemm.h"
#include "mxmoe/moe.h"
#include "mxmoe/quantize.h"
#include "mxmoe/scale_layout.h"

#endif /* MXMOE_MXMOE_H_ */
