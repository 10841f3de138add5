#include "ops.hpp"
#include "common/error.hpp"
namespace mxmoe { namespace cpu {
void grouped_mm(const GroupedMMArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "not implemented yet"); }
void grouped_mm_kgroups(const GroupedMMKArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "not implemented yet"); }
}}
