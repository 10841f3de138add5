// Zeroing the rows outside every token group on the device: the end row comes from offs on the
// device (clamped like groups_from_offsets), so the work is proportional to the tail, not to x.
#include <cuda_runtime.h>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

__global__ void zero_tail_kernel(uint4* x, int64_t m, int64_t row_vecs, const int32_t* offs, int64_t g, int64_t os) {
  // Clamped end of the last group: min(m, max(0, offs[0..g-1])).
  int64_t end = 0;
  for (int64_t i = 0; i < g; ++i) end = max(end, static_cast<int64_t>(offs[i * os]));
  end = min(end, m);
  const int64_t total = (m - end) * row_vecs;
  uint4* tail = x + end * row_vecs;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    tail[i] = make_uint4(0, 0, 0, 0);
}

__global__ void zero_tail_bytes_kernel(char* x, int64_t m, int64_t row_bytes, const int32_t* offs, int64_t g, int64_t os) {
  int64_t end = 0;
  for (int64_t i = 0; i < g; ++i) end = max(end, static_cast<int64_t>(offs[i * os]));
  end = min(end, m);
  const int64_t total = (m - end) * row_bytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    x[end * row_bytes + i] = 0;
}

// One warp: a prefix max over the group ends, 32 at a time (G is at most a few hundred).
__global__ void clamp_offsets_kernel(const int32_t* offs, int64_t g, int64_t os, int64_t m, int32_t* out) {
  const int lane = threadIdx.x;
  int64_t carry = 0;
  for (int64_t base = 0; base < g; base += 32) {
    const int64_t i = base + lane;
    int64_t v = i < g ? max(static_cast<int64_t>(offs[i * os]), int64_t(0)) : 0;
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t o = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d) v = max(v, o);
    }
    v = max(v, carry);
    if (i < g) out[i] = static_cast<int32_t>(min(v, m));
    carry = __shfl_sync(0xffffffffu, v, 31);
  }
}

}  // namespace

void clamp_offsets(const mxmoe_tensor& offs, int64_t m, const mxmoe_tensor& out, void* stream) {
  const int64_t g = offs.shape[0];
  if (g == 0) return;
  clamp_offsets_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const int32_t*>(offs.data), g, offs.strides[0], m, static_cast<int32_t*>(out.data));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail_status(MXMOE_ERR_CUDA, "clamp_offsets: ", cudaGetErrorString(err));
}

void zero_rows_past_groups(const mxmoe_tensor& x, const mxmoe_tensor& offs, void* stream) {
  const int64_t m = x.shape[0], row_bytes = x.shape[1] * dtype_size(x.dtype);
  if (m == 0 || row_bytes == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const auto* o = static_cast<const int32_t*>(offs.data);
  const bool vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  // A fixed grid: the tail length is only known on the device; grid-stride loops cover any tail.
  if (vec)
    zero_tail_kernel<<<264, 256, 0, s>>>(static_cast<uint4*>(x.data), m, row_bytes / 16, o, offs.shape[0], offs.strides[0]);
  else
    zero_tail_bytes_kernel<<<264, 256, 0, s>>>(static_cast<char*>(x.data), m, row_bytes, o, offs.shape[0], offs.strides[0]);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail_status(MXMOE_ERR_CUDA, "zero_rows_past_groups: ", cudaGetErrorString(err));
}

}  // namespace cuda
}  // namespace mxmoe
