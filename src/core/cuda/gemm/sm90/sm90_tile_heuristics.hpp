// Tile shapes of the sm_90a grouped GEMMs, chosen per problem on the host (no device data: group
// sizes are on the device, so the m-tile count is estimated from M and G).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace mxmoe {
namespace cuda {
namespace gemm {

// BlockN of the M-grouped kernel: 128. The wider tiles (fewer L2 -> SM bytes per FLOP, one
// accumulator set instead of the overlapped two) measured slower on every benchmark shape at v6
// (docs/design/gemm-sm90.md: BlockN 160 0.87-0.94x of 128 on the large shapes,
// 0.84-0.89x on the fine-grained ones; 192 0.83-0.96x), so they are used only when forced:
// MXMOE_GEMM_BLOCK_N=128|160|192 (measurements).
inline int grouped_m_block_n() {
  if (const char* e = std::getenv("MXMOE_GEMM_BLOCK_N")) {
    const int v = std::atoi(e);
    if (v == 128 || v == 160 || v == 192) return v;
  }
  return 128;
}

// The warp producer and one more stage at BlockN 128 (sm90_fp8_grouped_m_1x128_128x128.cuh
// kWarpProducer, kLean: 6 stages for bf16 output, 5 for fp32, G <= ~240-370) where the call's K is >= 4096
// (32+ k-blocks a tile, where the producer's issue rate sets the pace): on the seeds, Llama-4-Scout,
// DeepSeek-V3 forward and jagged dgrad shapes the pair measured 1.07-1.14x the single-thread producer
// on 15 of 16 rows (one 0.97x; docs/design/gemm-sm90.md "Kernel choice"). At K <= 2048 it measured
// 0.98-1.04x (the warp producer alone 0.97-1.01x) and the thread producer stays. MXMOE_GEMM_PRODUCER=
// warp|thread and MXMOE_GEMM_EXTRA_STAGE=1|0 force (measurements).
inline bool grouped_m_long_k(int64_t k) { return k >= 4096; }

// An on / off switch from the environment: 1 when `var` is `on`, 0 when it is `off`, -1 otherwise
// (unset or another value: the heuristic decides).
inline int env_switch(const char* var, const char* on, const char* off) {
  const char* e = std::getenv(var);
  if (!e) return -1;
  if (std::strcmp(e, on) == 0) return 1;
  return std::strcmp(e, off) == 0 ? 0 : -1;
}

inline bool grouped_m_extra_stage(int64_t k) {
  const int forced = env_switch("MXMOE_GEMM_EXTRA_STAGE", "1", "0");
  return forced >= 0 ? forced == 1 : grouped_m_long_k(k);
}

inline bool grouped_m_warp_producer(int64_t k) {
  const int forced = env_switch("MXMOE_GEMM_PRODUCER", "warp", "thread");
  return forced >= 0 ? forced == 1 : grouped_m_long_k(k);
}

// CTAs per cluster of the M-grouped kernel: 2 (pairs share B tiles through TMA multicast) at
// K >= 4096, where the multicast saves 3-7%; 1 below, where the pairs' lockstep costs more than it
// saves (up to 20% at K 768; measured, docs/design/gemm-sm90.md). MXMOE_GEMM_CLUSTER=1|2 forces.
inline int grouped_m_cluster(int64_t k) {
  if (const char* e = std::getenv("MXMOE_GEMM_CLUSTER")) {
    const int v = std::atoi(e);
    if (v == 1 || v == 2) return v;
  }
  return k >= 4096 ? 2 : 1;
}

// The default choice between the own kernel and CUTLASS's (MXMOE_GEMM_SM90 unset or "auto"): the own
// kernel on every shape. At v7c (docs/design/gemm-sm90.md, same process as CUTLASS) it measured
// 0.98-1.05x CUTLASS's on the seeds and Llama-4-Scout shapes, 1.04-1.21x on DeepSeek-V3's, 0.98-1.15x on
// the jagged ones, 1.17-1.50x on the fine-grained and Qwen3-30B-A3B ones. (The kernel itself declines
// calls it cannot take -- unaligned operands, shapes past int32 -- which then go to CUTLASS.)
inline bool grouped_m_prefer_own(int64_t /*m*/, int64_t /*n*/, int64_t /*k*/) { return true; }

// CTAs per cluster of the K-grouped (wgrad) kernel: 2 (pairs share B boxes through TMA multicast)
// when the groups average >= 4096 tokens (32 k-blocks per tile, where the forward kernel's pairs pay
// off), 1 below. MXMOE_GEMM_CLUSTER=1|2 forces (as for the M-grouped kernel).
inline int grouped_k_cluster(int64_t m, int groups) {
  if (const char* e = std::getenv("MXMOE_GEMM_CLUSTER")) {
    const int v = std::atoi(e);
    if (v == 1 || v == 2) return v;
  }
  return groups > 0 && m / groups >= 4096 ? 2 : 1;
}

// The default choice for the wgrad (MXMOE_GEMM_SM90 unset or "auto"): the own K-grouped kernel
// (sm90_fp8_grouped_k_1x128_1x128.cuh) where its output rows are short, K <= 1024: it measured
// 1.07-1.17x CUTLASS's there at v3 (docs/design/gemm-sm90.md: fine-grained gate_up /
// down, Qwen3-30B-A3B's down, with unaligned group starts too); CUTLASS elsewhere (own 0.76-0.94x on
// the seeds, Llama-4-Scout, DeepSeek-V3, jagged and Qwen3-30B gate_up shapes). The kernel itself
// declines calls it cannot take (M % 16 != 0, unaligned operands), which then go to CUTLASS.
inline bool grouped_k_prefer_own(int64_t k) { return k <= 1024; }

// The warp producer in the K-grouped kernel (the forward kernel's v7d technique): forced only,
// MXMOE_GEMM_PRODUCER=warp. It measured 0.95-1.04x the thread producer on every wgrad shape (measured;
// docs/design/gemm-sm90.md: the wgrad waits on its own wgmmas and on the helpers' scales).
inline bool grouped_k_warp_producer() { return env_switch("MXMOE_GEMM_PRODUCER", "warp", "thread") == 1; }

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
