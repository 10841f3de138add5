// Which CUDA quantize kernel serves a request, and its settings: one function over the request's
// shape, blockings, outputs and alignments, with the environment's overrides applied in one place
// (docs/design/quantize.md "Kernel choice"). Pure C++ (quantize_route.cpp), built with or without
// CUDA so the routing can be tested anywhere; quantize.cu fills the request and launches the route.
#pragma once

#include <cstdint>
#include <string>

#include "common/env.hpp"

namespace mxmoe {
namespace cuda {
namespace quant {

// One side (rowwise or columnwise) of a request: which outputs it writes, their dtypes and the
// alignment of their base pointers (bytes, up to 16; 16 for an absent output).
struct RouteSide {
  bool q = false, qt = false, scale = false, blocked = false, dq = false, dqt = false;
  bool dq_f32 = false, dqt_f32 = false;
  int q_align = 16, qt_align = 16, dq_align = 16;
};

struct QuantizeRequest {
  int64_t B = 1, R = 0, C = 0;  // x as (B, R, C)
  bool bf16 = true;             // x bf16 (else f32)
  bool x_align8 = false;        // x 8-byte aligned
  bool x_vec = false;           // x 16-byte aligned, rows whole 16-byte vectors
  int src_kind = 0;             // 0: x is a tensor; else a computed input (MXMOE_SOURCE_*)
  bool row_on = false, col_on = false;
  int row_block = 0, col_block = 0;  // 1 x row_block, col_block x 1 (0 with tile)
  bool tile = false;                 // one 128x128 quantization for both sides
  bool grouped = false;              // token groups along R
  int64_t groups = 0;
  bool table = false;                // the group table fits in shared memory
  RouteSide row, col;
};

enum class QuantKernel : uint8_t {
  kRows,     // quant_rows.cu: rowwise-only streaming
  kTile128,  // tile128_bf16.cu: the tile128 recipe's passes
  kWarp,     // quant_warp.cu: columnwise 32x1 (+ rowwise 1x32) warp tiles
  kSlab,     // quant_slab.cu: 32-row slabs
  kTile,     // quant_tile.cu: every request
};

struct QuantizeRoute {
  QuantKernel kernel = QuantKernel::kTile;
  bool rows_pipelined = true;  // kRows: cp.async prefetch
  bool warp_pipe = true;       // kWarp: the cp.async ring (else direct loads)
  int warp_budget = 2;         // kWarp without the ring: CTAs per SM of the register budget (2, 3, 4)
  int stages = 0;              // kTile: 0 direct register loads, 2 or 3 cp.async stages (3 -> 2 where it does not fit)
  int order = 1;               // kTile: 0 row-major tiles, 1 8x8 super-tiles
  bool tma = false;            // kTile128, 128x128 weights: the TMA kernel on Hopper (else the pass kernel)

  // "quantize x=... -> kernel=..." (one line; MXMOE_PRINT_CONFIGS prints it).
  std::string to_string(const QuantizeRequest& r) const;
};

// The route of a request under the given settings (env::settings(): the process environment). Throws
// mxmoe::Error when an environment variable is invalid.
QuantizeRoute select_quantize_route(const QuantizeRequest& r, const env::Settings& env);
QuantizeRoute select_quantize_route(const QuantizeRequest& r);

// MXMOE_PRINT_CONFIGS=1: prints the route of a launch (each distinct line once per process).
void note_route(const QuantizeRequest& r, const QuantizeRoute& route);

}  // namespace quant
}  // namespace cuda
}  // namespace mxmoe
