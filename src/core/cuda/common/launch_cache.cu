#include "launch_cache.cuh"

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "common/error.hpp"

namespace mxmoe {
namespace cuda {
namespace {
std::mutex g_mutex;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": ", cudaGetErrorString(e));
}

// A device attribute, asked once per (attribute, device).
int cached_attribute(cudaDeviceAttr attr, int device, const char* what) {
  static std::map<std::pair<int, int>, int> values;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto key = std::make_pair(static_cast<int>(attr), device);
  auto it = values.find(key);
  if (it != values.end()) return it->second;
  int v = 0;
  check(cudaDeviceGetAttribute(&v, attr, device), what);
  values[key] = v;
  return v;
}

}  // namespace

int sm_count(int device) {
  return cached_attribute(cudaDevAttrMultiProcessorCount, device, "cudaDeviceGetAttribute(SM count)");
}

int cc_major(int device) {
  return cached_attribute(cudaDevAttrComputeCapabilityMajor, device, "cudaDeviceGetAttribute(cc major)");
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
