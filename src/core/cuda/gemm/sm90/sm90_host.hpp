// Host helpers shared by the launchers of the sm_90a GEMM kernels of this folder: TMA descriptors
// of K-major byte operands and the per-kernel dynamic shared-memory opt-in.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe {
namespace cuda {
namespace gemm {

// 2D byte tensor (outer rows of `inner` bytes, row stride `ld` bytes), boxes of box_outer rows x
// 128 bytes, 128-byte swizzle (the wgmma K-major layout), zeros outside the tensor.
CUtensorMap kmajor_map(const void* base, uint64_t inner, uint64_t outer, uint64_t ld, uint32_t box_outer);

// 2D bf16 (bf16 true) or f32 output (rows x cols, dense), TMA-store boxes of 64 rows x box_bytes
// (128 or 64) with the swizzle of that width (the kernels stage their epilogue in that layout).
CUtensorMap output_map(void* base, bool bf16, uint64_t rows, uint64_t cols, uint32_t box_bytes);

// 3D bf16 output (g, rows, cols), dense, TMA-store boxes of 1 x 64 rows x 128 bytes with 128-byte
// swizzle: a box's rows past `rows` and columns past `cols` are clipped (not written).
CUtensorMap output_map_3d_bf16(void* base, uint64_t g, uint64_t rows, uint64_t cols);

// Sets the kernel's dynamic shared-memory limit (the opt-in maximum less its static shared memory)
// once per device and kernel; returns that limit.
int sm90_prepare_smem(const void* kernel, int device);

// Clusters of the kernel under launch config `cfg` (its block size, dynamic shared memory and cluster
// attribute; its grid one cluster) that can be resident at once on the current device `device`
// (cudaOccupancyMaxActiveClusters), asked once per (kernel, device, shared memory).
int sm90_max_clusters(const void* kernel, int device, const cudaLaunchConfig_t& cfg);

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
