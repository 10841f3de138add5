// The sm_90a bf16 grouped GEMM with token groups along the reduction and one operand's rows read through
// an index (sm90_bf16_grouped_k_gather.cuh), behind plain types like sm90_grouped_m.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe {
namespace cuda {
namespace gemm {

// out (G, M, N) bf16: out[g] = sum over the routed rows r of group g (offs: group ends along the `rows`
// routed rows) of A_r^T B_r; the plain operand's row r is its row r, the gathered one's (B with gather_b,
// else A) row gather[r] / fanout of its t_rows rows (a negative index: a zero row). a, b bf16 with row
// strides lda, ldb in bytes.
struct GroupedKGatherRun {
  int64_t rows = 0, m = 0, n = 0;
  int groups = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const uint8_t* b = nullptr;
  int64_t ldb = 0;
  const int32_t* gather = nullptr;
  int64_t fanout = 1, t_rows = 0;
  bool gather_b = true;
  const int32_t* offs = nullptr;
  int64_t offs_s = 1;
  void* out = nullptr;
  int sm_count = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
};

// Whether the kernel takes a call of this shape on `device` (an sm_90 GPU; M and N multiples of 8; int32
// rows, indices and tile counts; 32-bit row offsets; the group table in shared memory). Launches nothing.
bool sm90_grouped_k_gather_bf16_takes(int64_t rows, int64_t m, int64_t n, int64_t groups, int64_t t_rows,
                                      int64_t fanout, int device);

// Launches on r.stream and returns true, or returns false having launched nothing where the call is not
// taken or a base is not 16-byte aligned. Throws on CUDA errors.
bool sm90_grouped_k_gather_bf16(const GroupedKGatherRun& r);

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
