// C API of the fused quantization (mxmoe_quantize_fused): validation (messages name the argument
// and give expected vs actual), normalization to 3D views, dispatch by device. Nothing is written
// before validation passes.
#include <vector>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/mxmoe.h"
#include "api_checks.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace {

struct Named {
  const mxmoe_tensor* t;
  std::string name;
};

enum class Kind { kE4M3, kE8M0, kFloat };

void check_out(const mxmoe_tensor& t, const std::string& name, Kind kind, const std::vector<int64_t>& shape,
               int32_t device) {
  if (kind == Kind::kE4M3) check_dtype(t, name.c_str(), {MXMOE_DTYPE_E4M3});
  else if (kind == Kind::kE8M0) check_dtype(t, name.c_str(), {MXMOE_DTYPE_E8M0});
  else check_dtype(t, name.c_str(), {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_shape(t, name.c_str(), shape);
  check_device(t, name.c_str(), device);
  check_contiguous(t, name.c_str());
}

}  // namespace
}  // namespace mxmoe

using namespace mxmoe;

extern "C" mxmoe_status mxmoe_quantize_fused(const mxmoe_tensor* x_, const mxmoe_tensor* offs_,
                                             mxmoe_fused_config cfg, const mxmoe_fused_side* row,
                                             const mxmoe_fused_side* col, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& x = require(x_, "x");
  check_dtype(x, "x", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_ndim(x, "x", {2, 3});
#if !defined(MXMOE_WITH_CUDA)
  if (x.device >= 0)
    fail_status(MXMOE_ERR_UNSUPPORTED, "x: tensors on ", device_str(x.device),
                " need a build with CUDA; this libmxmoe was built without it");
#endif
  if (x.device >= 0 && !is_contiguous(x)) fail("x: expected a contiguous tensor on ", device_str(x.device));
  if (cfg.mode < MXMOE_SCALE_RCEIL || cfg.mode > MXMOE_SCALE_EVEN)
    fail("cfg.mode: expected RCEIL (0), FLOOR (1), CEIL (2) or EVEN (3), got ", static_cast<int>(cfg.mode));
  if (row == nullptr && col == nullptr) fail("row, col: expected at least one side, got none");
  const bool tile = cfg.tile128 != 0;
  if (row != nullptr) {
    if (tile ? !(cfg.row_block == 0 || cfg.row_block == 128) : !(cfg.row_block == 32 || cfg.row_block == 128))
      fail("cfg.row_block: expected ", tile ? "0 or 128 with tile128" : "32 or 128", ", got ", cfg.row_block);
  }
  if (col != nullptr) {
    if (tile ? !(cfg.col_block == 0 || cfg.col_block == 128) : !(cfg.col_block == 32 || cfg.col_block == 128))
      fail("cfg.col_block: expected ", tile ? "0 or 128 with tile128" : "32 or 128", ", got ", cfg.col_block);
  }
  const int64_t R = x.shape[x.ndim - 2], C = x.shape[x.ndim - 1];
  const int64_t B = x.ndim == 3 ? x.shape[0] : 1;
  int64_t G = 0;
  if (offs_ != nullptr) {
    const mxmoe_tensor& offs = require(offs_, "offs");
    api::check_offs(offs, x.device);
    if (x.ndim != 2) fail("offs: token groups need a 2D x, got x with shape ", shape_str(x));
    G = offs.shape[0];
  }
  if ((row != nullptr || tile) && C % kBlock != 0)
    fail("x: expected the last dim to be a multiple of 32 (rowwise blocks / 128x128 tiles), got ", C);
  if (col != nullptr && offs_ == nullptr && R % kBlock != 0)
    fail("x: expected dim -2 to be a multiple of 32 for the columnwise side without offs, got ", R);

  FusedArgs a;
  a.x = api::as_3d(x);
  if (offs_ != nullptr) {
    a.offs.present = true;
    a.offs.t = *offs_;
  }
  a.mode = cfg.mode;
  a.tile128 = tile;
  a.stream = stream;
  a.n_r = offs_ != nullptr ? ceil_div(R, kBlock) + G : R / kBlock;

  std::vector<Named> outs;
  auto side = [&](const mxmoe_fused_side* s, bool is_row, FusedSide& d) {
    if (s == nullptr) return;
    const std::string pre = is_row ? "row." : "col.";
    if (!s->q && !s->qt && !s->scale && !s->scale_blocked && !s->dq && !s->dqt)
      fail(pre, "*: expected at least one output on a given side, got none");
    d.active = true;
    d.block = tile ? 128 : (is_row ? cfg.row_block : cfg.col_block);
    if (x.ndim == 3) d.blocked_kind = MXMOE_BLOCKED_PER_EXPERT;
    else if (offs_ != nullptr) d.blocked_kind = is_row ? MXMOE_BLOCKED_GROUPS_M : MXMOE_BLOCKED_GROUPS_K;
    else d.blocked_kind = MXMOE_BLOCKED_WHOLE;
    const int64_t sh = is_row ? R : C, sw = is_row ? C / kBlock : a.n_r;  // plain scale (.., sh, sw)
    int64_t bsize;
    if (d.blocked_kind == MXMOE_BLOCKED_PER_EXPERT) bsize = mxmoe_blocked_size(d.blocked_kind, sh, sw, B);
    else if (d.blocked_kind == MXMOE_BLOCKED_GROUPS_M) bsize = mxmoe_blocked_size(d.blocked_kind, R, C / kBlock, G);
    else if (d.blocked_kind == MXMOE_BLOCKED_GROUPS_K) bsize = mxmoe_blocked_size(d.blocked_kind, C, R, G);
    else bsize = mxmoe_blocked_size(d.blocked_kind, sh, sw, 0);
    struct Spec {
      mxmoe_tensor* t;
      const char* name;
      Kind kind;
      std::vector<int64_t> shape;
      OptTensor* dst;
      bool flat;
    } specs[] = {
        {s->q, "q", Kind::kE4M3, api::batched(x, {R, C}), &d.q, false},
        {s->qt, "qt", Kind::kE4M3, api::batched(x, {C, R}), &d.qt, false},
        {s->scale, "scale", Kind::kE8M0, api::batched(x, {sh, sw}), &d.scale, false},
        {s->scale_blocked, "scale_blocked", Kind::kE8M0, {bsize}, &d.scale_blocked, true},
        {s->dq, "dq", Kind::kFloat, api::batched(x, {R, C}), &d.dq, false},
        {s->dqt, "dqt", Kind::kFloat, api::batched(x, {C, R}), &d.dqt, false},
    };
    for (auto& sp : specs) {
      if (sp.t == nullptr) continue;
      const std::string name = pre + sp.name;
      const mxmoe_tensor& t = require(sp.t, name.c_str());
      check_out(t, name, sp.kind, sp.shape, x.device);
      sp.dst->present = true;
      sp.dst->t = sp.flat ? t : api::as_3d(t);
      outs.push_back({sp.t, name});
    }
  };
  side(row, true, a.row);
  side(col, false, a.col);
  for (size_t i = 0; i < outs.size(); ++i) {
    check_no_overlap(*outs[i].t, outs[i].name.c_str(), x, "x");
    if (offs_ != nullptr) check_no_overlap(*outs[i].t, outs[i].name.c_str(), *offs_, "offs");
    for (size_t j = 0; j < i; ++j)
      check_no_overlap(*outs[i].t, outs[i].name.c_str(), *outs[j].t, outs[j].name.c_str());
  }
  if (x.device >= 0) {
#if defined(MXMOE_WITH_CUDA)
    cuda::quantize_fused(a);
#endif
  } else {
    cpu::quantize_fused(a);
  }
  MXMOE_API_END
}
