#include "ops.hpp"
#include "common/error.hpp"
namespace mxmoe { namespace cpu {
void scales_to_blocked(const BlockedArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "not implemented yet"); }
void scales_from_blocked(const BlockedArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "not implemented yet"); }
}}
