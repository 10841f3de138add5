#include "launch_cache.cuh"

#include <map>
#include <mutex>
#include <tuple>

#include "common/error.hpp"

namespace mxmoe {
namespace cuda {
namespace {
std::mutex g_mutex;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": ", cudaGetErrorString(e));
}
}  // namespace

int sm_count(int device) {
  static std::map<int, int> counts;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = counts.find(device);
  if (it != counts.end()) return it->second;
  int n = 0;
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute(SM count)");
  counts[device] = n;
  return n;
}

int cc_major(int device) {
  static std::map<int, int> majors;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = majors.find(device);
  if (it != majors.end()) return it->second;
  int v = 0;
  check(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute(cc major)");
  majors[device] = v;
  return v;
}

int occupancy(const void* kernel, int device, int threads, int smem) {
  static std::map<std::tuple<const void*, int, int, int>, int> blocks_cache;
  static std::map<std::pair<const void*, int>, int> opt_in;  // the largest opt-in set per kernel/device
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto key = std::make_tuple(kernel, device, threads, smem);
  auto it = blocks_cache.find(key);
  if (it != blocks_cache.end()) return it->second;
  int& raised = opt_in[{kernel, device}];
  if (smem > raised) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "cudaFuncSetAttribute");
    raised = smem;
  }
  int blocks = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, static_cast<size_t>(smem)),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  blocks_cache[key] = blocks;
  return blocks;
}

}  // namespace cuda
}  // namespace mxmoe
