// TMA tensor maps: the driver's cuTensorMapEncodeTiled, found once through the runtime (the library
// links the static runtime, not libcuda), for every kernel family that loads or stores by TMA.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mxmoe {
namespace cuda {

// A tiled tensor map of `rank` dims (dims[0] innermost, strides[i] the byte stride of dims[i + 1]),
// boxes of box[...] elements, zeros read outside the tensor and nothing written there. Raises
// MXMOE_ERR_CUDA naming `what` where the driver lacks the entry point or rejects the map.
CUtensorMap tiled_map(const char* what, CUtensorMapDataType dtype, uint32_t rank, const void* base, const uint64_t* dims,
                      const uint64_t* strides, const uint32_t* box, CUtensorMapSwizzle swizzle,
                      CUtensorMapL2promotion promotion);

}  // namespace cuda
}  // namespace mxmoe
