// Rows outside every token group (mxmoe_zero_rows_past_groups) and the clamped group ends
// (mxmoe_clamp_offsets).
#include <cstring>

#include "common/tensor.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cpu {

void zero_rows_past_groups(const mxmoe_tensor& x, const mxmoe_tensor& offs) {
  const int64_t m = x.shape[0], row_bytes = x.shape[1] * dtype_size(x.dtype);
  const Groups groups = groups_from_offsets(offs, m);
  const int64_t end = groups.count() ? groups.end.back() : 0;
  if (end < m && row_bytes > 0) std::memset(static_cast<char*>(x.data) + end * row_bytes, 0, (m - end) * row_bytes);
}

void clamp_offsets(const mxmoe_tensor& offs, int64_t m, const mxmoe_tensor& out) {
  const Groups groups = groups_from_offsets(offs, m);
  auto* o = static_cast<int32_t*>(out.data);
  for (int64_t i = 0; i < groups.count(); ++i) o[i] = static_cast<int32_t>(groups.end[i]);
}

}  // namespace cpu
}  // namespace mxmoe
