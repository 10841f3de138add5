// Tile shapes of the sm_90a grouped GEMMs, chosen per problem on the host (no device data: group
// sizes are on the device, so the m-tile count is estimated from M and G).
#pragma once

#include <cstdint>
#include <cstdlib>

namespace mxmoe {
namespace cuda {
namespace gemm {

// BlockN of the M-grouped kernel: 128 or 192. Cost model: waves of tiles over the SMs times the
// tile's work, a 192-wide tile doing 3% less work per unit time than a 128-wide one (measured at v3,
// docs/perf/gemm.md: 13% fewer bytes per FLOP, but its two 96-register accumulator sets leave no
// room for the overlapped promotion). Each group wastes ~half an m-tile.
// MXMOE_GEMM_BLOCK_N=128|160|192 forces one (measurements).
inline int grouped_m_block_n(int64_t m, int64_t n, int groups, int sm_count) {
  if (const char* e = std::getenv("MXMOE_GEMM_BLOCK_N")) {
    const int v = std::atoi(e);
    if (v == 128 || v == 160 || v == 192) return v;
  }
  const int64_t m_tiles = (m + 127) / 128 + groups / 2;
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  auto cost = [&](int64_t bn, double speed) {
    const int64_t tiles = m_tiles * ((n + bn - 1) / bn);
    const int64_t waves = (tiles + sms - 1) / sms;
    return static_cast<double>(waves) * static_cast<double>(bn) / speed;
  };
  return cost(192, 0.97) < cost(128, 1.0) ? 192 : 128;
}

// CTAs per cluster of the M-grouped kernel: 2 (pairs share B tiles through TMA multicast) at
// K >= 4096, where the multicast saves 3-7%; 1 below, where the pairs' lockstep costs more than it
// saves (up to 20% at K 768; measured at ab170b6, docs/perf/gemm.md). MXMOE_GEMM_CLUSTER=1|2 forces.
inline int grouped_m_cluster(int64_t k) {
  if (const char* e = std::getenv("MXMOE_GEMM_CLUSTER")) {
    const int v = std::atoi(e);
    if (v == 1 || v == 2) return v;
  }
  return k >= 4096 ? 2 : 1;
}

// The default choice between the own kernel and CUTLASS's (MXMOE_GEMM_SM90 unset or "auto"): the
// own kernel where it measured ahead at v5 (8eb5a37, docs/perf/gemm.md): fine-grained experts (K <=
// 1024, N <= 1536: 1.09-1.33x the CUTLASS kernel) and every shape with M >= 64K rows (Qwen3-30B,
// DeepSeek-V3, Llama-4-Scout: 0.99-1.08x); CUTLASS for the smaller-M shapes with wide N and K (seeds
// and jagged at M 16K: the own kernel 0.93-1.00x there).
inline bool grouped_m_prefer_own(int64_t m, int64_t n, int64_t k) {
  return (k <= 1024 && n <= 1536) || m >= 65536;
}

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

// The default choice for the wgrad (MXMOE_GEMM_SM90 unset or "auto"): CUTLASS's kernel. The own
// K-grouped kernel (sm90_fp8_grouped_k_1x128_1x128.cuh, "mxmoe" / "mxmoe-only") measured at v1c
// (docs/perf/gemm.md, "wgrad v1"): 1.01-1.08x CUTLASS on the fine-grained shapes with 128-aligned
// groups, 0.69-0.95x on the large ones, 0.37-0.48x where group starts are not 16-aligned (jagged,
// Qwen3-30B: the shared-memory patch of every box); group alignment is known only on the device, so
// no host rule can pick it safely yet.
inline bool grouped_k_prefer_own(int64_t m, int64_t n, int64_t k, int groups) {
  (void)m;
  (void)n;
  (void)k;
  (void)groups;
  return false;
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
