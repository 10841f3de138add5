// Placeholder until the CUDA quantization kernels land: every entry reports UNSUPPORTED.
#include "common/error.hpp"
#include "ops.hpp"
namespace mxmoe { namespace cuda {
void quantize(const QuantizeArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: CUDA kernel not implemented yet"); }
void dequantize(const DequantizeArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "dequantize: CUDA kernel not implemented yet"); }
void scales_to_blocked(const BlockedArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "scales_to_blocked: CUDA kernel not implemented yet"); }
void scales_from_blocked(const BlockedArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "scales_from_blocked: CUDA kernel not implemented yet"); }
void check_offsets(const mxmoe_tensor&, int64_t, void*) { fail_status(MXMOE_ERR_UNSUPPORTED, "check_offsets: CUDA kernel not implemented yet"); }
}}
