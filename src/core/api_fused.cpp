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

namespace mxmoe {
namespace {

// The body of both entry points. x: the input (plain call) or the logical (R, C) shape and dtype of
// a computed input (src.kind != 0, x.data == nullptr); inputs: the tensors read, for the overlap
// checks.
void fused_body(const mxmoe_tensor& x, const FusedSource& src, const std::vector<Named>& inputs,
                const mxmoe_tensor* offs_, mxmoe_fused_config cfg, const mxmoe_fused_side* row,
                const mxmoe_fused_side* col, void* stream) {
  check_dtype(x, "x", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32});
  check_ndim(x, "x", {2, 3});
  // x's device code was checked by the entry point (api::check_backend: -1, or an ordinal with CUDA).
  if (src.kind == 0 && x.device >= 0 && !is_contiguous(x))
    fail("x: expected a contiguous tensor on ", device_str(x.device));
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
  a.src = src;
  if (offs_ != nullptr) {
    a.offs.present = true;
    a.offs.t = *offs_;
  }
  a.mode = cfg.mode;
  a.tile128 = tile;
  a.stream = stream;
  a.n_r = offs_ != nullptr ? cdiv(R, kBlock) + G : R / kBlock;

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
    for (const Named& in : inputs) check_no_overlap(*outs[i].t, outs[i].name.c_str(), *in.t, in.name.c_str());
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
}

void check_source_tensor(const mxmoe_tensor& t, const char* name, std::initializer_list<mxmoe_dtype> dtypes,
                         int32_t device) {
  check_dtype(t, name, dtypes);
  check_device(t, name, device);
  check_contiguous(t, name);
}

}  // namespace
}  // namespace mxmoe

using namespace mxmoe;

extern "C" mxmoe_status mxmoe_quantize_fused(const mxmoe_tensor* x_, const mxmoe_tensor* offs_,
                                             mxmoe_fused_config cfg, const mxmoe_fused_side* row,
                                             const mxmoe_fused_side* col, void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& x = require(x_, "x");
  api::check_backend(x.device, "x");  // -1 or an ordinal (any other code was taken for the host)
  fused_body(x, FusedSource{}, {{x_, "x"}}, offs_, cfg, row, col, stream);
  MXMOE_API_END
}

extern "C" mxmoe_status mxmoe_quantize_fused_source(const mxmoe_fused_source* src_, const mxmoe_tensor* offs_,
                                                    mxmoe_fused_config cfg, const mxmoe_fused_side* row,
                                                    const mxmoe_fused_side* col, void* stream) {
  MXMOE_API_BEGIN
  if (src_ == nullptr) fail("src: expected a source, got NULL");
  const mxmoe_fused_source& s = *src_;
  const mxmoe_tensor& a = require(s.a, "src.a");
  api::check_backend(a.device, "src.a");
  check_ndim(a, "src.a", {2});
  FusedSource src;
  src.kind = static_cast<int>(s.kind);
  src.a = a;
  std::vector<Named> inputs{{s.a, "src.a"}};
  mxmoe_tensor x = a;  // the logical input: a's dtype and device, its own shape
  x.data = nullptr;
  x.ndim = 2;
  const int64_t rows = a.shape[0], cols = a.shape[1];
  if (s.kind == MXMOE_SOURCE_GATHER) {
    check_source_tensor(a, "src.a", {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}, a.device);
    const mxmoe_tensor& perm = require(s.perm, "src.perm");
    check_source_tensor(perm, "src.perm", {MXMOE_DTYPE_I32}, a.device);
    check_ndim(perm, "src.perm", {1});
    if (s.k < 1 || s.k > (int64_t{1} << 20)) fail("src.k: expected 1 <= k <= 2^20, got ", s.k);
    if (rows > (int64_t{1} << 40) / s.k) fail("src.a: expected at most 2^40 / k rows, got ", rows);
    if (perm.shape[0] >= (int64_t{1} << 31)) fail("src.perm: expected fewer than 2^31 rows, got ", shape_str(perm));
    src.perm.present = true;
    src.perm.t = perm;
    src.k = s.k;
    inputs.push_back({s.perm, "src.perm"});
    if (s.row_scale != nullptr) {
      const mxmoe_tensor& rs = require(s.row_scale, "src.row_scale");
      check_source_tensor(rs, "src.row_scale", {MXMOE_DTYPE_F32}, a.device);
      check_shape(rs, "src.row_scale", {rows, s.k});
      src.row_scale.present = true;
      src.row_scale.t = rs;
      inputs.push_back({s.row_scale, "src.row_scale"});
    }
    if (s.b != nullptr) fail("src.b: expected NULL for GATHER");
    x.shape[0] = perm.shape[0];
    x.shape[1] = cols;
  } else if (s.kind == MXMOE_SOURCE_SWIGLU || s.kind == MXMOE_SOURCE_SWIGLU_BACKWARD) {
    check_source_tensor(a, "src.a", {MXMOE_DTYPE_BF16}, a.device);
    if (s.layout != 0 && s.layout != 1)
      fail("src.layout: expected 0 (concatenated) or 1 (interleaved), got ", s.layout);
    if (cols % 2 != 0) fail("src.a: expected an even last dim (gate and up), got ", shape_str(a));
    if (!(s.alpha == s.alpha) || !(s.limit == s.limit) || !(s.up_offset == s.up_offset))
      fail("src.alpha, src.limit, src.up_offset: expected numbers, got NaN");
    if (s.kind == MXMOE_SOURCE_SWIGLU && (s.perm != nullptr || s.row_scale != nullptr))
      fail("src.perm, src.row_scale: expected NULL for SWIGLU");
    if (s.kind == MXMOE_SOURCE_SWIGLU_BACKWARD && (s.perm == nullptr) != (s.row_scale == nullptr))
      fail("src.perm, src.row_scale: expected both or neither for SWIGLU_BACKWARD, got ",
           s.perm ? "perm without row_scale" : "row_scale without perm");
    if (s.kind == MXMOE_SOURCE_SWIGLU_BACKWARD && s.row_scale != nullptr) {
      const mxmoe_tensor& rs = require(s.row_scale, "src.row_scale");
      check_source_tensor(rs, "src.row_scale", {MXMOE_DTYPE_F32}, a.device);
      check_ndim(rs, "src.row_scale", {2});
      if (s.k < 1 || rs.shape[1] != s.k) fail("src.k: expected >= 1 and row_scale's dim 1, got k = ", s.k, ", row_scale ", shape_str(rs));
      if (rs.shape[0] * s.k >= (int64_t{1} << 31)) fail("src.row_scale: expected fewer than 2^31 entries, got ", shape_str(rs));
      const mxmoe_tensor& perm = require(s.perm, "src.perm");
      check_source_tensor(perm, "src.perm", {MXMOE_DTYPE_I32}, a.device);
      check_shape(perm, "src.perm", {rows});
      src.perm.present = true;
      src.perm.t = perm;
      src.row_scale.present = true;
      src.row_scale.t = rs;
      src.k = s.k;
      inputs.push_back({s.perm, "src.perm"});
      inputs.push_back({s.row_scale, "src.row_scale"});
    }
    src.layout = s.layout;
    src.alpha = s.alpha;
    src.limit = s.limit;
    src.up_offset = s.up_offset;
    x.shape[0] = rows;
    x.shape[1] = s.kind == MXMOE_SOURCE_SWIGLU ? cols / 2 : cols;
    if (s.kind == MXMOE_SOURCE_SWIGLU_BACKWARD) {
      const mxmoe_tensor& b = require(s.b, "src.b");
      check_source_tensor(b, "src.b", {MXMOE_DTYPE_BF16}, a.device);
      check_shape(b, "src.b", {rows, cols / 2});
      src.b = b;
      inputs.push_back({s.b, "src.b"});
    } else if (s.b != nullptr) {
      fail("src.b: expected NULL for SWIGLU");
    }
  } else {
    fail("src.kind: expected GATHER (1), SWIGLU (2) or SWIGLU_BACKWARD (3), got ", static_cast<int>(s.kind));
  }
  x.strides[1] = 1;
  x.strides[0] = x.shape[1];
  fused_body(x, src, inputs, offs_, cfg, row, col, stream);
  MXMOE_API_END
}

extern "C" mxmoe_status mxmoe_capture_id(void* stream, uint64_t* id) {
  MXMOE_API_BEGIN
  if (id == nullptr) fail("id: expected a pointer, got NULL");
  *id = 0;
#if defined(MXMOE_WITH_CUDA)
  *id = cuda::capture_id(stream);
#else
  (void)stream;
#endif
  MXMOE_API_END
}

extern "C" mxmoe_status mxmoe_quantize_fused_if(const mxmoe_tensor* flag_, const mxmoe_tensor* x_,
                                                const mxmoe_tensor* offs_, mxmoe_fused_config cfg,
                                                const mxmoe_fused_side* row, const mxmoe_fused_side* col,
                                                void* stream) {
  MXMOE_API_BEGIN
  const mxmoe_tensor& x = require(x_, "x");
  const mxmoe_tensor& flag = require(flag_, "flag");
  check_dtype(flag, "flag", {MXMOE_DTYPE_I32});
  if (numel(flag) != 1) fail("flag: expected one element, got ", shape_str(flag));
  api::check_backend(x.device, "x");
  if (x.device < 0) throw Error(MXMOE_ERR_UNSUPPORTED, "x: expected a CUDA tensor (a conditional graph node), got a CPU tensor");
  check_device(flag, "flag", x.device);
#if defined(MXMOE_WITH_CUDA)
  cuda::IfCapture node(stream, static_cast<int32_t*>(flag.data), x.device);
  fused_body(x, FusedSource{}, {{x_, "x"}, {flag_, "flag"}}, offs_, cfg, row, col, node.body());
  node.finish();
#else
  (void)offs_, (void)cfg, (void)row, (void)col, (void)stream;
  throw Error(MXMOE_ERR_UNSUPPORTED, "mxmoe_quantize_fused_if: this build has no CUDA");
#endif
  MXMOE_API_END
}
