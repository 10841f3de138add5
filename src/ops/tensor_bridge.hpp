// The bridge between torch's stable-ABI tensors and the core's C API: tensor views, output
// allocation, the current CUDA stream and errors. Everything an op body needs, so that each op in
// ops_*.cpp reads as "allocate, call the core, return".
#pragma once

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace mxmoe {
namespace ops {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;

// A failed core call or a bad argument: throws std::runtime_error (torch shows RuntimeError) with
// "mxmoe.<op> (<kind>): <message>", kind one of "invalid argument", "unsupported", "cuda error",
// "internal error". mxmoe/ops.py turns the first two into ValueError / NotImplementedError.
[[noreturn]] void fail(const char* op, mxmoe_status status, const std::string& message);
inline void check(mxmoe_status status, const char* op) {
  if (status != MXMOE_OK) fail(op, status, mxmoe_last_error());
}

// The core's view of a tensor (no copy). Rejects dtypes the core has no code for, more than
// MXMOE_MAX_DIMS dims and devices other than cpu/cuda, naming the argument.
mxmoe_tensor view(const Tensor& t, const char* name, const char* op);

// Optional inputs/outputs: a view that is NULL when the tensor is absent.
class OptView {
 public:
  OptView(const OptTensor& t, const char* name, const char* op) {
    if (t.has_value()) {
      v_ = view(*t, name, op);
      p_ = &v_;
    }
  }
  mxmoe_tensor* get() { return p_; }

 private:
  mxmoe_tensor v_{};
  mxmoe_tensor* p_ = nullptr;
};

// Device of a tensor as the core encodes it: -1 host, else the CUDA ordinal.
int32_t device_code(const Tensor& t);

// A new contiguous tensor on `device` (-1 host, >= 0 CUDA) through torch's allocator (caching
// allocator on CUDA, so graphs and memory stats see it).
Tensor empty(const std::vector<int64_t>& shape, ScalarType dtype, int32_t device);
inline Tensor empty(std::initializer_list<int64_t> shape, ScalarType dtype, int32_t device) {
  return empty(std::vector<int64_t>(shape), dtype, device);
}
// An empty (0,) tensor: the placeholder for an output that was not asked for.
inline Tensor none_output(ScalarType dtype, int32_t device) { return empty({0}, dtype, device); }

// torch's current stream on `device` as a cudaStream_t (nullptr on the host).
void* current_stream(int32_t device);

// Makes `device` current for the scope of an op (no-op on the host or when it already is).
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device);

 private:
  std::optional<torch::stable::accelerator::DeviceGuard> guard_;
};

// x itself when contiguous, else a contiguous copy (the core's CUDA kernels take dense operands).
Tensor dense(const Tensor& x);

// Shape rules shared with the fakes in mxmoe/ops.py (the C API's static upper bounds).
constexpr int64_t kBlock = MXMOE_BLOCK;
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return cdiv(a, b) * b; }
std::vector<int64_t> shape_of(const Tensor& t);

}  // namespace ops
}  // namespace mxmoe
