// Integer helpers shared by the host code and the kernels (one definition for the CPU backend, the
// API checks and the CUDA launchers).
#pragma once

#include <cstdint>

#include "mxmoe/mx_format.hpp"  // MXMOE_HD

namespace mxmoe {

// ceil(a / b) for a >= 0, b > 0.
MXMOE_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// a rounded up to a multiple of b (a >= 0, b > 0).
MXMOE_HD int64_t round_up(int64_t a, int64_t b) { return cdiv(a, b) * b; }

}  // namespace mxmoe
