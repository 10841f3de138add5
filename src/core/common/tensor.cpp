#include "common/tensor.hpp"

#include <algorithm>
#include <cstring>

#include "mxmoe/mx_format.hpp"

namespace mxmoe {

const char* dtype_name(mxmoe_dtype d) {
  switch (d) {
    case MXMOE_DTYPE_BF16: return "bfloat16";
    case MXMOE_DTYPE_F32: return "float32";
    case MXMOE_DTYPE_E4M3: return "float8_e4m3fn";
    case MXMOE_DTYPE_E8M0: return "float8_e8m0fnu";
    case MXMOE_DTYPE_I32: return "int32";
    case MXMOE_DTYPE_F64: return "float64";
    case MXMOE_DTYPE_I64: return "int64";
    default: break;  // invalid codes fall through to the caller's rejection
  }
  return "unknown dtype";
}

int64_t dtype_size(mxmoe_dtype d) {
  switch (d) {
    case MXMOE_DTYPE_BF16: return 2;
    case MXMOE_DTYPE_F32: return 4;
    case MXMOE_DTYPE_E4M3: return 1;
    case MXMOE_DTYPE_E8M0: return 1;
    case MXMOE_DTYPE_I32: return 4;
    case MXMOE_DTYPE_F64: return 8;
    case MXMOE_DTYPE_I64: return 8;
    default: break;  // invalid codes fall through to the caller's rejection
  }
  return 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    out += std::to_string(s[i]);
    if (i + 1 < s.size() || s.size() == 1) out += ", ";
  }
  if (s.size() == 1) out.resize(out.size() - 1);
  return out + ")";
}

std::string shape_str(const mxmoe_tensor& t) {
  return shape_str(std::vector<int64_t>(t.shape, t.shape + std::max(0, std::min(t.ndim, MXMOE_MAX_DIMS))));
}

std::string device_str(int32_t device) {
  return device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device);
}

int64_t numel(const mxmoe_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

bool is_contiguous(const mxmoe_tensor& t) {
  if (numel(t) == 0) return true;  // no element is addressed (torch reports arbitrary strides here)
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

const mxmoe_tensor& require(const mxmoe_tensor* t, const char* name) {
  if (t == nullptr) fail(name, ": expected a tensor, got NULL");
  if (t->ndim < 0 || t->ndim > MXMOE_MAX_DIMS)
    fail(name, ": expected 0..", MXMOE_MAX_DIMS, " dims, got ", t->ndim);
  if (dtype_size(t->dtype) == 0) fail(name, ": expected a known dtype code, got ", static_cast<int>(t->dtype));
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 0) fail(name, ": expected sizes >= 0, got ", t->shape[i], " at dim ", i);
    if (t->strides[i] < 0) fail(name, ": expected strides >= 0, got ", t->strides[i], " at dim ", i);
  }
  // Sizes whose products (element counts, byte spans, plans) cannot overflow int64 anywhere below:
  // each dim <= 2^40, the product of the non-zero dims and the span sum((size-1)*stride) <= 2^62.
  constexpr int64_t kMaxDim = int64_t(1) << 40, kMaxTotal = int64_t(1) << 62;
  int64_t count = 1, span = 0;
  for (int i = 0; i < t->ndim; ++i) {
    const int64_t n = t->shape[i], st = t->strides[i];
    if (n > kMaxDim) fail(name, ": expected sizes <= 2^40, got ", n, " at dim ", i);
    int64_t extent = 0;
    if (n > 0 && (__builtin_mul_overflow(count, n, &count) || count > kMaxTotal))
      fail(name, ": expected at most 2^62 elements, got shape ", shape_str(*t));
    if (n > 0 && (__builtin_mul_overflow(n - 1, st, &extent) || __builtin_add_overflow(span, extent, &span) ||
                  span > kMaxTotal))
      fail(name, ": expected a view spanning at most 2^62 elements, got shape ", shape_str(*t), " and strides ",
           shape_str(std::vector<int64_t>(t->strides, t->strides + t->ndim)));
  }
  if (t->data == nullptr && numel(*t) > 0)
    fail(name, ": expected a data pointer for shape ", shape_str(*t), ", got NULL");
  return *t;
}

void check_dtype(const mxmoe_tensor& t, const char* name, std::initializer_list<mxmoe_dtype> ok) {
  for (auto d : ok)
    if (t.dtype == d) return;
  std::string want;
  for (auto d : ok) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
  fail(name, ": expected dtype ", want, ", got ", dtype_name(t.dtype));
}

void check_ndim(const mxmoe_tensor& t, const char* name, std::initializer_list<int> ok) {
  for (int n : ok)
    if (t.ndim == n) return;
  std::string want;
  for (int n : ok) want += (want.empty() ? "" : " or ") + std::to_string(n);
  fail(name, ": expected ", want, " dims, got ", t.ndim, " with shape ", shape_str(t));
}

void check_shape(const mxmoe_tensor& t, const char* name, const std::vector<int64_t>& expected) {
  bool same = static_cast<int>(expected.size()) == t.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = expected[i] == t.shape[i];
  if (!same) fail(name, ": expected shape ", shape_str(expected), ", got ", shape_str(t));
}

void check_device(const mxmoe_tensor& t, const char* name, int32_t device) {
  if (t.device != device)
    fail(name, ": expected device ", device_str(device), ", got ", device_str(t.device));
}

void check_contiguous(const mxmoe_tensor& t, const char* name) {
  if (!is_contiguous(t)) {
    std::vector<int64_t> strides(t.strides, t.strides + t.ndim);
    fail(name, ": expected a contiguous tensor of shape ", shape_str(t), ", got strides ", shape_str(strides));
  }
}

namespace {
// Byte range [lo, hi) spanned by a view.
void span(const mxmoe_tensor& t, uintptr_t& lo, uintptr_t& hi) {
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.strides[i];
  lo = reinterpret_cast<uintptr_t>(t.data);
  hi = lo + static_cast<uintptr_t>((last + 1) * dtype_size(t.dtype));
}
}  // namespace

void check_no_overlap(const mxmoe_tensor& a, const char* an, const mxmoe_tensor& b, const char* bn) {
  if (numel(a) == 0 || numel(b) == 0 || a.device != b.device) return;
  uintptr_t alo, ahi, blo, bhi;
  span(a, alo, ahi);
  span(b, blo, bhi);
  if (alo < bhi && blo < ahi) fail(an, " and ", bn, ": expected separate memory, got overlapping views");
}

float load_f32(const mxmoe_tensor& t, int64_t offset) {
  if (t.dtype == MXMOE_DTYPE_BF16) return bf16_to_f32(*at<const uint16_t>(t, offset));
  return *at<const float>(t, offset);
}

void store_f32(const mxmoe_tensor& t, int64_t offset, float v) {
  if (t.dtype == MXMOE_DTYPE_BF16)
    *at<uint16_t>(t, offset) = f32_to_bf16(v);
  else
    *at<float>(t, offset) = v;
}

Groups groups_from_offsets(const mxmoe_tensor& offs, int64_t m) {
  Groups g;
  const int64_t n = offs.shape[0];
  g.start.resize(n);
  g.end.resize(n);
  g.block_start.resize(n);
  int64_t prev = 0, blocks = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t o = *at<const int32_t>(offs, i * offs.strides[0]);
    const int64_t e = std::min<int64_t>(m, std::max<int64_t>(prev, o));
    g.start[i] = prev;
    g.end[i] = e;
    g.block_start[i] = blocks;
    blocks += cdiv(e - prev, kBlock);
    prev = e;
  }
  return g;
}

void check_offsets_host(const mxmoe_tensor& offs, int64_t m) {
  int64_t prev = 0;
  for (int64_t i = 0; i < offs.shape[0]; ++i) {
    const int64_t o = *at<const int32_t>(offs, i * offs.strides[0]);
    if (o < prev)
      fail("offs: expected non-decreasing group ends >= 0, got offs[", i, "] = ", o,
           " after ", prev);
    if (o > m) fail("offs: expected group ends <= ", m, " rows, got offs[", i, "] = ", o);
    prev = o;
  }
}

}  // namespace mxmoe
