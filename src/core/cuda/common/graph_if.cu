// Stream-capture helpers for the weight cache under CUDA graphs (mxmoe_capture_id,
// mxmoe_quantize_fused_if; ops.hpp says what they do). The conditional node is CUDA 12.4's IF node:
// a one-thread kernel before it sets the node's condition from the flag each replay, and the last
// node of its body clears the flag.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "common/error.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw Error(MXMOE_ERR_CUDA, std::string("CUDA graph capture: ") + call + " failed: " + cudaGetErrorString(e));
}

__global__ void set_condition_kernel(cudaGraphConditionalHandle handle, const int32_t* flag) {
  cudaGraphSetConditional(handle, *flag != 0 ? 1u : 0u);
}

__global__ void clear_flag_kernel(int32_t* flag) { *flag = 0; }

// One non-blocking side stream per device for capturing bodies (created once, never destroyed:
// captured graphs do not reference it after capture).
cudaStream_t side_stream(int32_t device) {
  static std::mutex mu;
  static cudaStream_t streams[64] = {};
  if (device < 0 || device >= 64) throw Error(MXMOE_ERR_UNSUPPORTED, "CUDA graph capture: device index above 63");
  std::lock_guard<std::mutex> lock(mu);
  if (streams[device] == nullptr) check(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return streams[device];
}

}  // namespace

uint64_t capture_id(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  check(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &id), "cudaStreamGetCaptureInfo");
  return status == cudaStreamCaptureStatusActive ? static_cast<uint64_t>(id) : 0;
}

IfCapture::IfCapture(void* stream, int32_t* flag, int32_t device) : main_(stream), flag_(flag) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  check(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph), "cudaStreamGetCaptureInfo");
  if (status != cudaStreamCaptureStatusActive)
    throw Error(MXMOE_ERR_UNSUPPORTED, "stream: expected a stream that is capturing a CUDA graph, got one that is not");
  cudaGraphConditionalHandle handle;
  check(cudaGraphConditionalHandleCreate(&handle, graph, 0, 0), "cudaGraphConditionalHandleCreate");
  set_condition_kernel<<<1, 1, 0, s>>>(handle, flag);
  check(cudaGetLastError(), "set_condition_kernel launch");
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t ndeps = 0;
  check(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, &edges, &ndeps), "cudaStreamGetCaptureInfo");
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  check(cudaGraphAddNode(&node, graph, deps, edges, ndeps, &params), "cudaGraphAddNode (conditional)");
  node_ = node;
  cudaStream_t side = side_stream(device);
  check(cudaStreamBeginCaptureToGraph(side, params.conditional.phGraph_out[0], nullptr, nullptr, 0,
                                      cudaStreamCaptureModeRelaxed),
        "cudaStreamBeginCaptureToGraph");
  side_ = side;
  open_ = true;
}

void IfCapture::close(bool clear_flag) {
  if (!open_) return;
  open_ = false;
  cudaStream_t side = static_cast<cudaStream_t>(side_);
  if (clear_flag) clear_flag_kernel<<<1, 1, 0, side>>>(flag_);
  const cudaError_t launched = clear_flag ? cudaGetLastError() : cudaSuccess;
  cudaGraph_t body = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(side, &body);
  cudaGraphNode_t node = static_cast<cudaGraphNode_t>(node_);
  const cudaError_t joined = cudaStreamUpdateCaptureDependencies(static_cast<cudaStream_t>(main_), &node, nullptr, 1,
                                                                 cudaStreamSetCaptureDependencies);
  check(launched, "clear_flag_kernel launch");
  check(ended, "cudaStreamEndCapture (conditional body)");
  check(joined, "cudaStreamUpdateCaptureDependencies");
}

void IfCapture::finish() { close(true); }

IfCapture::~IfCapture() {
  try {
    close(false);
  } catch (...) {  // an error is already on its way (finish() was not reached)
  }
}

}  // namespace cuda
}  // namespace mxmoe
