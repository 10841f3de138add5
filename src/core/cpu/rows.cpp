// Zeroing the rows outside every token group (see mxmoe_zero_rows_past_groups).
#include <cstring>

#include "common/tensor.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cpu {

void zero_rows_past_groups(const mxmoe_tensor& x, const mxmoe_tensor& offs) {
  const int64_t m = x.shape[0], row_bytes = x.shape[1] * dtype_size(x.dtype);
  const Groups groups = groups_from_offsets(offs, m);
  const int64_t end = groups.count() ? groups.end.back() : 0;
  if (end < m) std::memset(static_cast<char*>(x.data) + end * row_bytes, 0, (m - end) * row_bytes);
}

}  // namespace cpu
}  // namespace mxmoe
