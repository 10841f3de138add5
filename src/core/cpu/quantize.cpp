#include "ops.hpp"
#include "common/error.hpp"
namespace mxmoe { namespace cpu {
void quantize(const QuantizeArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: not implemented yet"); }
void dequantize(const DequantizeArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "dequantize: not implemented yet"); }
}}
