// The CUDA quantize routing (quantize_route.hpp): first match wins, the defaults chosen by same-run
// A/B measurements (docs/design/quantize.md).
#include "cuda/quantize/quantize_route.hpp"

#include <sstream>

namespace mxmoe {
namespace cuda {
namespace quant {
namespace {

// The tile128 recipe's passes (tile128_bf16.cu): bf16 x (or a bf16 computed input), 16-byte aligned
// rows of C % 8 == 0 elements, a group table that fits, compact scales only; rowwise 1x128 codes
// and/or columnwise 128x1 transposed codes, or the 128x128 tile quantization (codes in either
// orientation, both scale layouts). MXMOE_QUANT_TILE128=0 keeps them on the general kernels.
bool tile128_takes(const QuantizeRequest& r, const env::Settings& s) {
  if (!s.quant_tile128 || !r.bf16 || !r.x_vec || (r.grouped && !r.table)) return false;
  if (!r.row_on && !r.col_on) return false;
  auto plain = [](const RouteSide& sd) { return !sd.blocked && !sd.dq && !sd.dqt && (!sd.q || sd.q_align >= 8); };
  if ((r.row_on && !plain(r.row)) || (r.col_on && !plain(r.col))) return false;
  if (r.tile) {
    if (r.src_kind != 0) return false;           // weights are tensors; a computed input stays on the tile kernel
    if (r.col_on && r.col.q) return false;       // codes in x's orientation come from the row side only
    if (r.row_on && r.col_on && r.row.qt && r.col.qt) return false;
    return true;
  }
  if (r.row_on && (r.row_block != 128 || r.row.qt)) return false;
  if (r.col_on && (r.col_block != 128 || r.col.q)) return false;
  return true;
}

// The weights' 128x128 request (no groups) where TMA can move it: rows of x, q (C bytes) and qt (R
// bytes) at 16-byte strides, codes 16-byte aligned (sm90_bf16_quantize_128x128.cu; on Hopper only,
// checked at launch). MXMOE_QUANT_TMA=0 keeps it on the tile128 pass kernel.
bool weights_tma_takes(const QuantizeRequest& r, const env::Settings& s) {
  if (!s.quant_tma || !r.tile || r.grouped || r.C % 16 != 0) return false;
  const bool q = r.row_on && r.row.q, qt = (r.row_on && r.row.qt) || (r.col_on && r.col.qt);
  if (q && r.row.q_align < 16) return false;
  if (qt && (r.R % 16 != 0 || (r.row_on && r.row.qt ? r.row.qt_align : r.col.qt_align) < 16)) return false;
  return true;
}

// Rowwise only, outputs in x's orientation, aligned: the streaming kernel (MXMOE_QUANT_STREAM=0: off).
bool rows_take(const QuantizeRequest& r, const env::Settings& s) {
  const RouteSide& rs = r.row;
  return s.quant_stream != 0 && r.row_on && !r.col_on && !r.tile && r.row_block > 0 && !rs.qt && !rs.dqt &&
         !rs.blocked && r.x_vec && (r.row_block == 32 || r.C % 128 == 0) && (!rs.q || rs.q_align >= 8) &&
         (!rs.dq || rs.dq_align >= 16);
}

// 32x1 columnwise (optionally with 1x32 rowwise in x's orientation), bf16 in, compact scales: the
// warp-tile kernel; transposed outputs may have any alignment (handled on the device). By default
// only requests whose column side is round trips in x's orientation (the sm90 exact recipe's dY
// pass), where it beat the slab kernel on every shape; codes and transposed outputs stay on the slab
// kernel (equal or better there, 2x better with jagged groups). MXMOE_QUANT_WARP=2|3|4 sends every
// eligible request here, 0 none.
bool warp_takes(const QuantizeRequest& r, const env::Settings& s) {
  auto side_ok = [](const RouteSide& sd, bool row_side) {
    if (sd.blocked || sd.dq_f32 || sd.dqt_f32) return false;
    if (row_side && (sd.qt || sd.dqt)) return false;
    return (!sd.q || sd.q_align >= 4) && (!sd.dq || sd.dq_align >= 8);
  };
  const bool by_default = !r.col.q && !r.col.qt && !r.col.dqt;
  return s.quant_warp != 0 && (s.quant_warp >= 2 || by_default) && r.bf16 && r.x_align8 && r.C % 8 == 0 && !r.tile &&
         r.col_on && r.col_block == 32 && side_ok(r.col, false) &&
         (!r.row_on || (r.row_block == 32 && r.C % 32 == 0 && side_ok(r.row, true))) && (!r.grouped || r.table);
}

// Blocks of at most 32 rows (no 128x1, no 128x128) and a group table that fits: 32-row slabs.
bool slab_takes(const QuantizeRequest& r, const env::Settings& s) {
  return s.quant_slab && !r.tile && r.col_block != 128 && (!r.grouped || r.table);
}

}  // namespace

QuantizeRoute select_quantize_route(const QuantizeRequest& r, const env::Settings& s) {
  QuantizeRoute route;
  route.order = s.quant_order;
  // The tile kernel: direct register loads by default (measured faster than its cp.async pipeline);
  // MXMOE_QUANT_STAGES=2|3 selects the pipeline. Computed inputs: direct loads only.
  route.stages = r.src_kind != 0 ? 0 : s.quant_stages;
  if (r.src_kind != 0) {
    // Computed inputs: the tile128 pass kernel where it takes the request, else the tile kernel
    // (every blocking, both sides, one pass).
    route.kernel = tile128_takes(r, s) ? QuantKernel::kTile128 : QuantKernel::kTile;
    return route;
  }
  if (rows_take(r, s)) {
    route.kernel = QuantKernel::kRows;
    route.rows_pipelined = s.quant_stream != 2;
  } else if (tile128_takes(r, s)) {
    route.kernel = QuantKernel::kTile128;
    route.tma = weights_tma_takes(r, s);
  } else if (warp_takes(r, s)) {
    route.kernel = QuantKernel::kWarp;
    // The cp.async ring by default (MXMOE_QUANT_WARP_PIPE=0: direct loads). Register budget: 2 CTAs
    // per SM (3 measured equal, 4 spills and is slower); MXMOE_QUANT_WARP=3|4 pick those without the ring.
    route.warp_pipe = s.quant_warp_pipe;
    route.warp_budget = !route.warp_pipe && (s.quant_warp == 3 || s.quant_warp == 4) ? s.quant_warp : 2;
  } else if (slab_takes(r, s)) {
    route.kernel = QuantKernel::kSlab;
  } else {
    route.kernel = QuantKernel::kTile;
  }
  return route;
}

QuantizeRoute select_quantize_route(const QuantizeRequest& r) { return select_quantize_route(r, env::settings()); }

std::string QuantizeRoute::to_string(const QuantizeRequest& r) const {
  std::ostringstream os;
  static const char* const kSources[] = {"tensor", "gather", "swiglu", "swiglu_backward"};
  os << "quantize x=" << (r.bf16 ? "bf16" : "f32") << " B=" << r.B << " R=" << r.R << " C=" << r.C
     << " g=" << (r.grouped ? r.groups : 0) << " src="
     << (r.src_kind >= 0 && r.src_kind < 4 ? kSources[r.src_kind] : "?");
  auto side = [&](const char* name, const RouteSide& sd, const std::string& block) {
    os << " " << name << "=" << block << ":";
    const char* sep = "";
    for (const auto& [on, out] : {std::pair<bool, const char*>{sd.q, "q"}, {sd.qt, "qt"}, {sd.scale, "scale"},
                                  {sd.blocked, "blocked"}, {sd.dq, "dq"}, {sd.dqt, "dqt"}})
      if (on) {
        os << sep << out;
        sep = ",";
      }
  };
  if (r.row_on) side("row", r.row, r.tile ? "128x128" : "1x" + std::to_string(r.row_block));
  if (r.col_on) side("col", r.col, r.tile ? "128x128" : std::to_string(r.col_block) + "x1");
  os << " -> kernel=";
  switch (kernel) {
    case QuantKernel::kRows:
      os << "rows pipelined=" << rows_pipelined;
      break;
    case QuantKernel::kTile128:
      os << "tile128" << (tma ? " tma" : "");
      break;
    case QuantKernel::kWarp:
      os << "warp pipe=" << warp_pipe << " budget=" << warp_budget;
      break;
    case QuantKernel::kSlab:
      os << "slab";
      break;
    case QuantKernel::kTile:
      os << "tile stages=" << stages << " order=" << order;
      break;
  }
  return os.str();
}

void note_route(const QuantizeRequest& r, const QuantizeRoute& route) {
  if (env::settings().print_configs) env::print_config_once(route.to_string(r));
}

}  // namespace quant
}  // namespace cuda
}  // namespace mxmoe
