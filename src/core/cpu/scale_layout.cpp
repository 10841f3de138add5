// Blocked ("swizzled") scale layouts on the CPU, exactly the formula of docs/design/mx-format.md:
//   S[i][j] -> ((i/128) * (Wp/4) + j/4) * 512 + (i%32) * 16 + ((i%128)/32) * 4 + j%4
// Every layout kind is a list of independent sub-matrices ("segments"), each blocked as a WHOLE
// matrix at its own byte offset. Segments are laid out back to back from byte 0, so after them
// only a tail of the buffer is left to zero-fill. Work is split over 128-row bands of segments,
// each band being a contiguous (Wp * 128)-byte run of the blocked buffer.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/tensor.hpp"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cpu {
namespace {

// One (rows x cols) sub-matrix of the scale tensor and where its blocked image starts.
struct Segment {
  int64_t src;     // element offset of (0, 0) in the scale tensor
  int64_t rs, cs;  // scale tensor strides (elements)
  int64_t rows, cols;
  int64_t dst;     // byte offset in the blocked buffer
  int64_t bands() const { return cdiv(rows, 128); }
  int64_t band_bytes() const { return round_up(cols, 4) * 128; }
  int64_t bytes() const { return bands() * band_bytes(); }
};

struct Plan {
  std::vector<Segment> segs;
  int64_t covered = 0;  // bytes [0, covered) of the blocked buffer belong to segments
};

Plan make_plan(const BlockedArgs& a) {
  const mxmoe_tensor& s = a.scale;  // (B, H, W)
  const int64_t B = s.shape[0], H = s.shape[1], W = s.shape[2];
  Plan p;
  int64_t dst = 0;
  auto add = [&](int64_t src, int64_t rows, int64_t cols) {
    Segment seg{src, s.strides[1], s.strides[2], rows, cols, dst};
    dst += seg.bytes();
    if (rows > 0 && cols > 0) p.segs.push_back(seg);
  };
  switch (a.kind) {
    case MXMOE_BLOCKED_WHOLE:
    case MXMOE_BLOCKED_PER_EXPERT:
      for (int64_t b = 0; b < B; ++b) add(b * s.strides[0], H, W);
      break;
    case MXMOE_BLOCKED_GROUPS_M: {
      // Group g's rows start at row sum_{h<g} ceil(size_h/128)*128 of the buffer: the bands of
      // consecutive groups simply follow each other.
      const Groups g = groups_from_offsets(a.offs.t, H);
      for (int64_t i = 0; i < g.count(); ++i) add(g.start[i] * s.strides[1], g.end[i] - g.start[i], W);
      break;
    }
    case MXMOE_BLOCKED_GROUPS_K: {
      // Group g's compact columns [block_start, +ceil(size/32)) blocked as a whole (H, cols_g)
      // matrix at start_col_g * Hp, start_col_g = sum_{h<g} ceil(cols_h/4)*4.
      const Groups g = groups_from_offsets(a.offs.t, a.m_tokens);
      for (int64_t i = 0; i < g.count(); ++i)
        add(g.block_start[i] * s.strides[2], H, cdiv(g.end[i] - g.start[i], kBlock));
      break;
    }
    default: break;  // invalid codes fall through to the caller's rejection
  }
  p.covered = dst;
  return p;
}

// Calls fn(segment, band) for every 128-row band of every segment, in parallel.
template <typename Fn>
void for_each_band(const Plan& p, Fn fn) {
  std::vector<std::pair<int32_t, int64_t>> work;  // (segment, band)
  int64_t bytes = 0;
  for (size_t i = 0; i < p.segs.size(); ++i) {
    for (int64_t b = 0; b < p.segs[i].bands(); ++b) work.emplace_back(static_cast<int32_t>(i), b);
    bytes += p.segs[i].bytes();
  }
  if (work.empty()) return;
  // About 256 KiB per chunk: a thread costs more than moving a few KiB.
  const int64_t avg = std::max<int64_t>(1, bytes / static_cast<int64_t>(work.size()));
  parallel_for(static_cast<int64_t>(work.size()), std::max<int64_t>(1, (256 << 10) / avg),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t w = lo; w < hi; ++w) fn(p.segs[work[w].first], work[w].second);
               });
}

// Visits the bytes of one band in blocked order: fn(dst byte, row, col, inside?) with (row, col)
// local to the segment; padding positions have inside == false.
template <typename Fn>
inline void visit_band(const Segment& s, int64_t band, Fn fn) {
  const int64_t tiles = round_up(s.cols, 4) / 4;
  int64_t d = s.dst + band * s.band_bytes();
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t q = 0; q < 4; ++q) {
        const int64_t i = band * 128 + q * 32 + r;
        for (int64_t c = 0; c < 4; ++c, ++d) {
          const int64_t j = t * 4 + c;
          fn(d, i, j, i < s.rows && j < s.cols);
        }
      }
}

}  // namespace

void scales_to_blocked(const BlockedArgs& a) {
  const Plan p = make_plan(a);
  const uint8_t* src = static_cast<const uint8_t*>(a.scale.data);
  uint8_t* dst = static_cast<uint8_t*>(a.blocked.data);
  for_each_band(p, [&](const Segment& s, int64_t band) {
    visit_band(s, band, [&](int64_t d, int64_t i, int64_t j, bool inside) {
      dst[d] = inside ? src[s.src + i * s.rs + j * s.cs] : 0;
    });
  });
  // Bytes past the last segment (the static upper bound's slack) are padding too.
  const int64_t size = a.blocked.shape[0];
  if (size > p.covered) std::memset(dst + p.covered, 0, static_cast<size_t>(size - p.covered));
}

void scales_from_blocked(const BlockedArgs& a) {
  const mxmoe_tensor& s = a.scale;
  uint8_t* dst = static_cast<uint8_t*>(s.data);
  // Entries no group covers (rows past the last group, unused compact columns) read as 0: clear
  // the (contiguous, validated) scale tensor first when the kind has such entries.
  if ((a.kind == MXMOE_BLOCKED_GROUPS_M || a.kind == MXMOE_BLOCKED_GROUPS_K) && numel(s) > 0)
    std::memset(dst, 0, static_cast<size_t>(numel(s)));
  const Plan p = make_plan(a);
  const uint8_t* src = static_cast<const uint8_t*>(a.blocked.data);
  for_each_band(p, [&](const Segment& seg, int64_t band) {
    visit_band(seg, band, [&](int64_t d, int64_t i, int64_t j, bool inside) {
      if (inside) dst[seg.src + i * seg.rs + j * seg.cs] = src[d];
    });
  });
}

}  // namespace cpu
}  // namespace mxmoe
