// Plain tensor views (mxmoe_tensor) on the C++ side: names, sizes, validation with messages that
// name the argument and give expected vs actual values.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/int_math.hpp"
#include "mxmoe/mxmoe.h"

namespace mxmoe {

const char* dtype_name(mxmoe_dtype d);
int64_t dtype_size(mxmoe_dtype d);
std::string shape_str(const mxmoe_tensor& t);
std::string shape_str(const std::vector<int64_t>& s);
int64_t numel(const mxmoe_tensor& t);
bool is_contiguous(const mxmoe_tensor& t);
std::string device_str(int32_t device);

// Validation. Each throws mxmoe::Error(INVALID_ARGUMENT) with "<name>: expected ..., got ...".
const mxmoe_tensor& require(const mxmoe_tensor* t, const char* name);  // non-null, sane view
void check_dtype(const mxmoe_tensor& t, const char* name, std::initializer_list<mxmoe_dtype> ok);
void check_ndim(const mxmoe_tensor& t, const char* name, std::initializer_list<int> ok);
void check_shape(const mxmoe_tensor& t, const char* name, const std::vector<int64_t>& expected);
void check_device(const mxmoe_tensor& t, const char* name, int32_t device);
void check_contiguous(const mxmoe_tensor& t, const char* name);
// Two outputs (or an output and an input) must not share memory.
void check_no_overlap(const mxmoe_tensor& a, const char* an, const mxmoe_tensor& b, const char* bn);

// Typed element pointer at a multi-index offset (in elements).
template <typename T>
inline T* at(const mxmoe_tensor& t, int64_t offset) {
  return static_cast<T*>(t.data) + offset;
}

// Load element as fp32 from a bf16 or f32 view at an element offset.
float load_f32(const mxmoe_tensor& t, int64_t offset);
// Store fp32 into a bf16 (RNE) or f32 view at an element offset.
void store_f32(const mxmoe_tensor& t, int64_t offset, float v);

// Token groups from offs (int32, host memory): the clamping rule every backend shares, so bad
// offsets can never cause an out-of-bounds access: end_g = min(m, max(0, offs[0..g])),
// start_g = end_{g-1}. Decreasing offsets give empty groups; offsets past m are cut at m.
struct Groups {
  std::vector<int64_t> start, end;
  // Index of each group's first 32-block in the grouped compact scale layout.
  std::vector<int64_t> block_start;
  int64_t count() const { return static_cast<int64_t>(start.size()); }
};
Groups groups_from_offsets(const mxmoe_tensor& offs, int64_t m);
// Validates offs (1-D int32, host) and raises with the first offending index (checked mode).
void check_offsets_host(const mxmoe_tensor& offs, int64_t m);

}  // namespace mxmoe
