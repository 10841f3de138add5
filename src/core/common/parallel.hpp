// A minimal parallel-for over an index range on std::thread: the CPU reference uses every core
// without pulling an OpenMP runtime into processes (like PyTorch) that bring their own.
#pragma once

#include <cstdint>
#include <functional>

namespace mxmoe {

// Calls body(begin, end) on disjoint chunks covering [0, n), on up to hardware_concurrency()
// threads (MXMOE_NUM_THREADS overrides). Exceptions from a chunk are rethrown on the caller.
// grain: minimum items per chunk, so tiny loops stay on the calling thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

int num_threads();

}  // namespace mxmoe
