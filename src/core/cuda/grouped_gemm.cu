// Placeholder until the CUDA grouped GEMMs land: every entry reports UNSUPPORTED.
#include "common/error.hpp"
#include "ops.hpp"
namespace mxmoe { namespace cuda {
void grouped_mm(const GroupedMMArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "grouped_mm: CUDA kernel not implemented yet"); }
void grouped_mm_kgroups(const GroupedMMKArgs&) { fail_status(MXMOE_ERR_UNSUPPORTED, "grouped_mm_kgroups: CUDA kernel not implemented yet"); }
}}
