// Launch-configuration queries, cached. The runtime calls behind a persistent launch
// (cudaFuncSetAttribute for the dynamic shared-memory opt-in, the occupancy query, the SM count)
// cost several microseconds of host time each and were made on every launch; the answers depend
// only on (kernel, device, block size, shared memory), so they are asked once.
#pragma once

#include <cuda_runtime.h>

namespace mxmoe {
namespace cuda {

// Multiprocessors of `device` (cached).
int sm_count(int device);

// Compute capability major of `device` (cached).
int cc_major(int device);

// Resident blocks per SM of `kernel` at (threads, dynamic smem) on `device`, which must be the current
// device. Raises the kernel's dynamic shared-memory opt-in to `smem` first when needed. The opt-in is
// a per-kernel maximum, only ever raised: lowering it for a smaller launch would make a later, larger
// launch of the same kernel fail with 'invalid argument'.
int occupancy(const void* kernel, int device, int threads, int smem);
template <class Kernel>
int occupancy(Kernel* kernel, int device, int threads, int smem) {
  return occupancy(reinterpret_cast<const void*>(kernel), device, threads, smem);
}

}  // namespace cuda
}  // namespace mxmoe
