// mxmoe_quantize_fused on the CPU: pins its semantics against the separate public entry points
// (mxmoe_quantize, mxmoe_dequantize, mxmoe_scales_to_blocked) and the scalar codecs: rowwise,
// columnwise (token groups, partial last blocks, rows past the last group), 128x128 tiles viewed
// both ways, 2D and 3D, bf16 and f32 inputs and round-trip outputs, every mode; plus validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"

using mxtest::Buffer;

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int64_t> batched(int64_t B, bool three_d, std::vector<int64_t> tail) {
  if (three_d) tail.insert(tail.begin(), B);
  return tail;
}

// What one side asks for.
struct Want {
  bool q = false, qt = false, scale = false, blocked = false, dq = false, dqt = false;
  mxmoe_dtype dq_dtype = MXMOE_DTYPE_BF16, dqt_dtype = MXMOE_DTYPE_BF16;
  static Want all(mxmoe_dtype dq = MXMOE_DTYPE_BF16, mxmoe_dtype dqt = MXMOE_DTYPE_F32) {
    Want w;
    w.q = w.qt = w.scale = w.blocked = w.dq = w.dqt = true;
    w.dq_dtype = dq;
    w.dqt_dtype = dqt;
    return w;
  }
};

struct Problem {
  int64_t B = 1, R = 0, C = 0;
  bool three_d = false;
  std::vector<int32_t> offs;  // empty with has_offs false: no groups
  bool has_offs = false;
  int64_t G() const { return has_offs ? static_cast<int64_t>(offs.size()) : 0; }
  int64_t n_r() const { return has_offs ? cdiv(R, 32) + G() : R / 32; }
};

mxmoe_blocked_kind blocked_kind(const Problem& p, bool row) {
  if (p.three_d) return MXMOE_BLOCKED_PER_EXPERT;
  if (p.has_offs) return row ? MXMOE_BLOCKED_GROUPS_M : MXMOE_BLOCKED_GROUPS_K;
  return MXMOE_BLOCKED_WHOLE;
}

int64_t blocked_bytes(const Problem& p, bool row) {
  const mxmoe_blocked_kind k = blocked_kind(p, row);
  switch (k) {
    case MXMOE_BLOCKED_PER_EXPERT:
      return row ? mxmoe_blocked_size(k, p.R, p.C / 32, p.B) : mxmoe_blocked_size(k, p.C, p.R / 32, p.B);
    case MXMOE_BLOCKED_GROUPS_M: return mxmoe_blocked_size(k, p.R, p.C / 32, p.G());
    case MXMOE_BLOCKED_GROUPS_K: return mxmoe_blocked_size(k, p.C, p.R, p.G());
    default: return row ? mxmoe_blocked_size(k, p.R, p.C / 32, 0) : mxmoe_blocked_size(k, p.C, p.R / 32, 0);
  }
}

// Output buffers of one side, poisoned.
struct SideBufs {
  Want want;
  Buffer q, qt, scale, blocked, dq, dqt;
  mxmoe_tensor vq{}, vqt{}, vscale{}, vblocked{}, vdq{}, vdqt{};
  mxmoe_fused_side side{};

  void make(const Problem& p, bool row, const Want& w, uint8_t poison) {
    want = w;
    const int64_t R = p.R, C = p.C;
    if (w.q) q = Buffer(batched(p.B, p.three_d, {R, C}), MXMOE_DTYPE_E4M3, poison);
    if (w.qt) qt = Buffer(batched(p.B, p.three_d, {C, R}), MXMOE_DTYPE_E4M3, poison);
    if (w.scale)
      scale = Buffer(batched(p.B, p.three_d, row ? std::vector<int64_t>{R, C / 32} : std::vector<int64_t>{C, p.n_r()}),
                     MXMOE_DTYPE_E8M0, poison);
    if (w.blocked) blocked = Buffer({blocked_bytes(p, row)}, MXMOE_DTYPE_E8M0, poison);
    if (w.dq) dq = Buffer(batched(p.B, p.three_d, {R, C}), w.dq_dtype, poison);
    if (w.dqt) dqt = Buffer(batched(p.B, p.three_d, {C, R}), w.dqt_dtype, poison);
    bind();
  }
  void bind() {
    side = mxmoe_fused_side{};
    if (want.q) { vq = q.view(); side.q = &vq; }
    if (want.qt) { vqt = qt.view(); side.qt = &vqt; }
    if (want.scale) { vscale = scale.view(); side.scale = &vscale; }
    if (want.blocked) { vblocked = blocked.view(); side.scale_blocked = &vblocked; }
    if (want.dq) { vdq = dq.view(); side.dq = &vdq; }
    if (want.dqt) { vdqt = dqt.view(); side.dqt = &vdqt; }
  }
};

Buffer transpose(const Buffer& src, int64_t B, int64_t R, int64_t C, bool three_d) {
  Buffer dst(batched(B, three_d, {C, R}), src.dtype);
  const size_t es = mxtest::elem_size(src.dtype);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(&dst.bytes[((b * C + c) * R + r) * es], &src.bytes[((b * R + r) * C + c) * es], es);
  return dst;
}

void expect_bytes_eq(const Buffer& got, const Buffer& want, const std::string& what) {
  ASSERT_EQ(got.bytes.size(), want.bytes.size()) << what;
  for (size_t i = 0; i < got.bytes.size(); ++i)
    ASSERT_EQ(got.bytes[i], want.bytes[i]) << what << ": byte " << i << " of " << got.bytes.size();
}

// The expected outputs of one side through the separate entry points.
void check_side(const Problem& p, Buffer& x, Buffer* offs, mxmoe_scale_mode mode, bool tile, int block, bool row,
                const SideBufs& got) {
  const std::string side = row ? "row " : "col ";
  mxmoe_tensor xv = x.view(), ov{};
  if (offs) ov = offs->view();
  Buffer q(batched(p.B, p.three_d, {p.R, p.C}), MXMOE_DTYPE_E4M3);
  Buffer sc(batched(p.B, p.three_d, {p.R, p.C / 32}), MXMOE_DTYPE_E8M0);
  Buffer sr(batched(p.B, p.three_d, {p.C, p.n_r()}), MXMOE_DTYPE_E8M0);
  mxmoe_tensor qv = q.view(), scv = sc.view(), srv = sr.view();
  mxmoe_quant_config cfg;
  cfg.mode = mode;
  if (tile) {
    cfg.block_r = cfg.block_c = 128;
  } else if (row) {
    cfg.block_r = 1;
    cfg.block_c = block;
  } else {
    cfg.block_r = block;
    cfg.block_c = 1;
  }
  const bool use_offs = offs != nullptr && !(row && !tile);  // rowwise blocks ignore token groups
  ASSERT_EQ(mxmoe_quantize(&xv, use_offs ? &ov : nullptr, cfg, &qv, nullptr, row ? &scv : nullptr,
                           row ? nullptr : &srv, nullptr),
            MXMOE_OK)
      << mxmoe_last_error();
  Buffer& scale = row ? sc : sr;
  mxmoe_tensor sv = scale.view();
  if (got.want.q) expect_bytes_eq(got.q, q, side + "q");
  if (got.want.qt) expect_bytes_eq(got.qt, transpose(q, p.B, p.R, p.C, p.three_d), side + "qt");
  if (got.want.scale) expect_bytes_eq(got.scale, scale, side + "scale");
  if (got.want.blocked) {
    Buffer blk({blocked_bytes(p, row)}, MXMOE_DTYPE_E8M0, 0x5A);
    mxmoe_tensor bv = blk.view();
    const mxmoe_blocked_kind kind = blocked_kind(p, row);
    const bool grouped = kind == MXMOE_BLOCKED_GROUPS_M || kind == MXMOE_BLOCKED_GROUPS_K;
    ASSERT_EQ(mxmoe_scales_to_blocked(&sv, kind, grouped ? &ov : nullptr, &bv, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    expect_bytes_eq(got.blocked, blk, side + "blocked");
  }
  for (int k = 0; k < 2; ++k) {
    const bool is_dq = k == 0;
    if (is_dq ? !got.want.dq : !got.want.dqt) continue;
    Buffer dq(batched(p.B, p.three_d, {p.R, p.C}), is_dq ? got.want.dq_dtype : got.want.dqt_dtype);
    mxmoe_tensor dv = dq.view();
    ASSERT_EQ(mxmoe_dequantize(&qv, &sv, row ? 1 : 0, (!row && offs) ? &ov : nullptr, &dv, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    if (is_dq) expect_bytes_eq(got.dq, dq, side + "dq");
    else expect_bytes_eq(got.dqt, transpose(dq, p.B, p.R, p.C, p.three_d), side + "dqt");
  }
}

struct Case {
  Problem p;
  bool tile;
  int row_block, col_block;  // 0: side not given
  mxmoe_dtype in;
  mxmoe_scale_mode mode;
};

void run_case(Case c, uint32_t seed) {
  Problem& p = c.p;
  SCOPED_TRACE("R=" + std::to_string(p.R) + " C=" + std::to_string(p.C) + " B=" + std::to_string(p.B) +
               " G=" + std::to_string(p.G()) + " tile=" + std::to_string(c.tile) + " row=" +
               std::to_string(c.row_block) + " col=" + std::to_string(c.col_block) + " mode=" +
               std::to_string(c.mode) + (c.in == MXMOE_DTYPE_BF16 ? " bf16" : " f32"));
  Buffer x = mxtest::random_input(batched(p.B, p.three_d, {p.R, p.C}), c.in, seed);
  Buffer offs = mxtest::offsets(p.offs);
  mxmoe_tensor xv = x.view(), ov = offs.view();
  SideBufs row, col;
  if (c.row_block) row.make(p, true, Want::all(MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32), 0xA5);
  if (c.col_block) col.make(p, false, Want::all(MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16), 0xA5);
  mxmoe_fused_config cfg{c.row_block, c.col_block, c.tile ? 1 : 0, c.mode};
  ASSERT_EQ(mxmoe_quantize_fused(&xv, p.has_offs ? &ov : nullptr, cfg, c.row_block ? &row.side : nullptr,
                                 c.col_block ? &col.side : nullptr, nullptr),
            MXMOE_OK)
      << mxmoe_last_error();
  if (c.row_block) check_side(p, x, p.has_offs ? &offs : nullptr, c.mode, c.tile, c.row_block, true, row);
  if (c.col_block) check_side(p, x, p.has_offs ? &offs : nullptr, c.mode, c.tile, c.col_block, false, col);
}

Problem two_d(int64_t R, int64_t C, std::vector<int32_t> offs = {}, bool has_offs = false) {
  Problem p;
  p.R = R;
  p.C = C;
  p.offs = std::move(offs);
  p.has_offs = has_offs;
  return p;
}

Problem three_d(int64_t B, int64_t R, int64_t C) {
  Problem p;
  p.B = B;
  p.R = R;
  p.C = C;
  p.three_d = true;
  return p;
}

}  // namespace

TEST(Fused, RowAndColumnSidesMatchSeparateCalls) {
  uint32_t seed = 1;
  const mxmoe_scale_mode modes[] = {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR, MXMOE_SCALE_CEIL, MXMOE_SCALE_EVEN};
  for (mxmoe_dtype in : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
    for (mxmoe_scale_mode mode : modes) {
      // Jagged groups: empty, partial last blocks, rows past the last group.
      const Problem grouped = two_d(300, 96, {0, 45, 45, 130, 290}, true);
      for (int rb : {32, 128})
        for (int cb : {32, 128}) {
          run_case({two_d(128, 160), false, rb, cb, in, mode}, seed++);
          run_case({grouped, false, rb, cb, in, mode}, seed++);
        }
      run_case({three_d(3, 64, 96), false, 32, 32, in, mode}, seed++);
      run_case({two_d(64, 256), false, 128, 0, in, mode}, seed++);
      run_case({grouped, false, 0, 32, in, mode}, seed++);
    }
  }
}

TEST(Fused, Tile128BothViews) {
  uint32_t seed = 100;
  for (mxmoe_dtype in : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
    for (mxmoe_scale_mode mode : {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR}) {
      run_case({two_d(256, 160), true, 128, 128, in, mode}, seed++);
      run_case({three_d(2, 160, 288), true, 128, 128, in, mode}, seed++);
      run_case({two_d(300, 128, {100, 100, 250}, true), true, 128, 128, in, mode}, seed++);
      run_case({two_d(130, 96), true, 128, 0, in, mode}, seed++);  // rowwise view only: partial edge tile
    }
  }
}

TEST(Fused, RoundTripIsExactDequantization) {
  // dq = e4m3(q) * 2^(s - 127) element by element, from the scalar codecs.
  Problem p = two_d(64, 64);
  Buffer x = mxtest::random_input({64, 64}, MXMOE_DTYPE_F32, 7);
  mxmoe_tensor xv = x.view();
  SideBufs row;
  Want w;
  w.q = w.scale = w.dq = true;
  w.dq_dtype = MXMOE_DTYPE_F32;
  row.make(p, true, w, 0xA5);
  mxmoe_fused_config cfg{32, 0, 0, MXMOE_SCALE_RCEIL};
  ASSERT_EQ(mxmoe_quantize_fused(&xv, nullptr, cfg, &row.side, nullptr, nullptr), MXMOE_OK) << mxmoe_last_error();
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 64; ++c) {
      const float want = mxmoe_e4m3_to_float(row.q.u8(r * 64 + c)) * mxmoe_e8m0_to_float(row.scale.u8(r * 2 + c / 32));
      ASSERT_EQ(mxtest::bits_of(row.dq.data<float>()[r * 64 + c]), mxtest::bits_of(want)) << r << "," << c;
    }
}

TEST(Fused, RowsPastLastGroupAreZero) {
  Problem p = two_d(100, 64, {10, 40}, true);
  Buffer x = mxtest::random_input({100, 64}, MXMOE_DTYPE_BF16, 9);
  Buffer offs = mxtest::offsets(p.offs);
  mxmoe_tensor xv = x.view(), ov = offs.view();
  SideBufs col;
  col.make(p, false, Want::all(), 0xA5);
  mxmoe_fused_config cfg{0, 32, 0, MXMOE_SCALE_RCEIL};
  ASSERT_EQ(mxmoe_quantize_fused(&xv, &ov, cfg, nullptr, &col.side, nullptr), MXMOE_OK) << mxmoe_last_error();
  for (int64_t r = 40; r < 100; ++r)
    for (int64_t c = 0; c < 64; ++c) {
      ASSERT_EQ(col.q.u8(r * 64 + c), 0);
      ASSERT_EQ(col.qt.u8(c * 100 + r), 0);
      ASSERT_EQ(col.dq.data<uint16_t>()[r * 64 + c], 0);
    }
  // Grouped capacity ceil(100/32) + 2 = 6; groups use ceil(10/32) + ceil(30/32) = 2 entries.
  for (int64_t c = 0; c < 64; ++c)
    for (int64_t i = 2; i < 6; ++i) ASSERT_EQ(col.scale.u8(c * 6 + i), 0);
}

TEST(Fused, Validation) {
  Buffer x = mxtest::random_input({64, 96}, MXMOE_DTYPE_BF16, 3);
  mxmoe_tensor xv = x.view();
  Problem p = two_d(64, 96);
  SideBufs row, col;
  row.make(p, true, Want::all(), 0);
  col.make(p, false, Want::all(), 0);
  mxmoe_fused_config cfg{32, 32, 0, MXMOE_SCALE_RCEIL};
  EXPECT_EQ(mxmoe_quantize_fused(&xv, nullptr, cfg, nullptr, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("at least one side"), std::string::npos) << mxmoe_last_error();
  mxmoe_fused_config bad{64, 32, 0, MXMOE_SCALE_RCEIL};
  EXPECT_EQ(mxmoe_quantize_fused(&xv, nullptr, bad, &row.side, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("cfg.row_block"), std::string::npos) << mxmoe_last_error();
  mxmoe_fused_config bad_tile{32, 0, 1, MXMOE_SCALE_RCEIL};
  EXPECT_EQ(mxmoe_quantize_fused(&xv, nullptr, bad_tile, &row.side, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  mxmoe_fused_side empty{};
  EXPECT_EQ(mxmoe_quantize_fused(&xv, nullptr, cfg, &empty, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  // A device code that is neither -1 nor an ordinal (the fuzzer found it taken for the host).
  mxmoe_tensor xbad = xv;
  xbad.device = -1675879396;
  EXPECT_EQ(mxmoe_quantize_fused(&xbad, nullptr, cfg, &row.side, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("x: expected device -1"), std::string::npos) << mxmoe_last_error();
  mxmoe_fused_source bad_src{MXMOE_SOURCE_SWIGLU, &xbad, nullptr, nullptr, nullptr, 1, 0, 1.f, INFINITY, 0.f};
  EXPECT_EQ(mxmoe_quantize_fused_source(&bad_src, nullptr, cfg, &row.side, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("src.a: expected device -1"), std::string::npos) << mxmoe_last_error();
  // Wrong shape of one output names it.
  Buffer wrong({96, 64}, MXMOE_DTYPE_E4M3);
  mxmoe_tensor wv = wrong.view();
  mxmoe_fused_side s = row.side;
  s.q = &wv;
  EXPECT_EQ(mxmoe_quantize_fused(&xv, nullptr, cfg, &s, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("row.q"), std::string::npos) << mxmoe_last_error();
  // Overlapping outputs.
  s = row.side;
  s.qt = nullptr;
  mxmoe_fused_side s2 = col.side;
  s2.q = row.side.q;
  EXPECT_EQ(mxmoe_quantize_fused(&xv, nullptr, cfg, &s, &s2, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  // R % 32 without offs for the columnwise side.
  Buffer x2 = mxtest::random_input({40, 96}, MXMOE_DTYPE_BF16, 3);
  mxmoe_tensor x2v = x2.view();
  Buffer dq2({40, 96}, MXMOE_DTYPE_BF16);
  mxmoe_tensor dq2v = dq2.view();
  mxmoe_fused_side only_dq{};
  only_dq.dq = &dq2v;
  EXPECT_EQ(mxmoe_quantize_fused(&x2v, nullptr, cfg, nullptr, &only_dq, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  // ... but fine with groups.
  Buffer offs = mxtest::offsets({17, 40});
  mxmoe_tensor ov = offs.view();
  EXPECT_EQ(mxmoe_quantize_fused(&x2v, &ov, cfg, nullptr, &only_dq, nullptr), MXMOE_OK) << mxmoe_last_error();
  // Nothing written when validation fails.
  Buffer x3 = mxtest::random_input({64, 96}, MXMOE_DTYPE_BF16, 4);
  mxmoe_tensor x3v = x3.view();
  SideBufs r3;
  r3.make(p, true, Want::all(), 0xEE);
  mxmoe_fused_config bad_mode{32, 0, 0, static_cast<mxmoe_scale_mode>(9)};
  EXPECT_EQ(mxmoe_quantize_fused(&x3v, nullptr, bad_mode, &r3.side, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  for (uint8_t b : r3.q.bytes) ASSERT_EQ(b, 0xEE);
}
