#include "tensor_bridge.hpp"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>

namespace mxmoe {
namespace ops {

void fail(const char* op, mxmoe_status status, const std::string& message) {
  const char* kind = status == MXMOE_ERR_INVALID_ARGUMENT ? "invalid argument"
                     : status == MXMOE_ERR_UNSUPPORTED    ? "unsupported"
                     : status == MXMOE_ERR_CUDA           ? "cuda error"
                                                          : "internal error";
  throw std::runtime_error(std::string("mxmoe.") + op + " (" + kind + "): " + message);
}

namespace {

struct DtypeEntry {
  ScalarType torch;
  mxmoe_dtype core;
  const char* name;
};
constexpr std::array<DtypeEntry, 7> kDtypes{{
    {ScalarType::BFloat16, MXMOE_DTYPE_BF16, "bfloat16"},
    {ScalarType::Float, MXMOE_DTYPE_F32, "float32"},
    {ScalarType::Float8_e4m3fn, MXMOE_DTYPE_E4M3, "float8_e4m3fn"},
    {ScalarType::Float8_e8m0fnu, MXMOE_DTYPE_E8M0, "float8_e8m0fnu"},
    {ScalarType::Int, MXMOE_DTYPE_I32, "int32"},
    {ScalarType::Double, MXMOE_DTYPE_F64, "float64"},
    {ScalarType::Long, MXMOE_DTYPE_I64, "int64"},
}};

std::string allowed_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

int32_t cuda_type() {
  static const int32_t t = aoti_torch_device_type_cuda();
  return t;
}
int32_t cpu_type() {
  static const int32_t t = aoti_torch_device_type_cpu();
  return t;
}

}  // namespace

int32_t device_code(const Tensor& t) {
  int32_t type = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &type));
  if (type == cpu_type()) return -1;
  if (type == cuda_type()) return t.get_device_index();
  return -2;  // rejected by view()
}

mxmoe_tensor view(const Tensor& t, const char* name, const char* op) {
  mxmoe_tensor v{};
  const ScalarType st = t.scalar_type();
  bool known = false;
  for (const auto& d : kDtypes) {
    if (d.torch == st) {
      v.dtype = d.core;
      known = true;
    }
  }
  if (!known)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         std::string(name) + ": expected dtype one of " + allowed_dtypes() + ", got " +
             std::string(torch::headeronly::toString(st)));
  const int64_t ndim = t.dim();
  if (ndim > MXMOE_MAX_DIMS)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT,
         std::string(name) + ": expected at most " + std::to_string(MXMOE_MAX_DIMS) + " dims, got " +
             std::to_string(ndim));
  v.device = device_code(t);
  if (v.device < -1)
    fail(op, MXMOE_ERR_INVALID_ARGUMENT, std::string(name) + ": expected a cpu or cuda tensor");
  v.ndim = static_cast<int32_t>(ndim);
  v.data = t.numel() == 0 ? nullptr : t.data_ptr();
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  // torch reports arbitrary strides for empty tensors; give the row-major ones (no element is
  // ever addressed, and the core's contiguity checks then hold).
  int64_t run = 1;
  const bool empty_tensor = t.numel() == 0;
  for (int64_t i = ndim - 1; i >= 0; --i) {
    v.shape[i] = sizes[i];
    v.strides[i] = empty_tensor ? run : strides[i];
    run *= sizes[i];
  }
  return v;
}

Tensor empty(const std::vector<int64_t>& shape, ScalarType dtype, int32_t device) {
  std::vector<int64_t> strides(shape.size());
  int64_t run = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = run;
    run *= shape[i] > 0 ? shape[i] : 1;
  }
  AtenTensorHandle h = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(shape.size()), shape.data(), strides.data(),
                                                  static_cast<int32_t>(dtype), device < 0 ? cpu_type() : cuda_type(),
                                                  device < 0 ? 0 : device, &h));
  return Tensor(h);
}

namespace {
// aoti_torch_get_current_cuda_stream lives in libtorch_cuda, which a CPU build of torch does not
// have: look it up in the already-loaded library on first use instead of linking it, so that one
// binary serves CPU and CUDA builds of torch (a CUDA tensor implies a CUDA torch).
using GetStreamFn = AOTITorchError (*)(int32_t, void**);
GetStreamFn cuda_stream_getter() {
  static GetStreamFn fn = [] {
    void* sym = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    if (sym == nullptr) {
      if (void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD)) sym = dlsym(lib, "aoti_torch_get_current_cuda_stream");
    }
    return reinterpret_cast<GetStreamFn>(sym);
  }();
  return fn;
}
}  // namespace

void* current_stream(int32_t device) {
  if (device < 0) return nullptr;
  GetStreamFn fn = cuda_stream_getter();
  if (fn == nullptr)
    fail("current_stream", MXMOE_ERR_UNSUPPORTED,
         "a CUDA tensor, but this torch has no libtorch_cuda (aoti_torch_get_current_cuda_stream not found)");
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(fn(device, &stream));
  return stream;
}

DeviceScope::DeviceScope(int32_t device) {
  if (device >= 0 && torch::stable::accelerator::getCurrentDeviceIndex() != device) guard_.emplace(device);
}

Tensor dense(const Tensor& x) { return x.is_contiguous() ? x : torch::stable::contiguous(x); }

std::vector<int64_t> shape_of(const Tensor& t) {
  const auto s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}

}  // namespace ops
}  // namespace mxmoe
