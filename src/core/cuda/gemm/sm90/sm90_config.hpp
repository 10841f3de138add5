// The configuration of one sm90 tile128 GEMM launch: which kernel (the own sm_90a kernels of this
// folder or CUTLASS's) and its tile, stages, producer, cluster and scheduler, chosen on the host from
// the call's shape (group sizes are on the device: only M, N, K, G are used) with the environment's
// overrides applied in one place. Pure C++ (sm90_config.cpp), built with or without CUDA, so the
// choice can be queried (C API mxmoe_sm90_gemm_config) and tested anywhere.
#pragma once

#include <cstdint>
#include <string>

#include "common/env.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {

// The two call kinds of the tile128 GEMMs. Shapes as in the C API: M-grouped out (m, n) = a (m, k) .
// b[g] (n, k)^T (forward: the model's shapes; dgrad: n and k swapped); K-grouped out[g] (n, k) over
// the m tokens of group g.
enum class Sm90Pass : uint8_t { kGroupedM, kGroupedK };
enum class Sm90Impl : uint8_t { kOwn, kCutlass };

struct Sm90GemmConfig {
  // The call.
  Sm90Pass pass = Sm90Pass::kGroupedM;
  int64_t m = 0, n = 0, k = 0, groups = 0;
  bool out_bf16 = true;
  // The choice.
  Sm90Impl impl = Sm90Impl::kOwn;
  bool own_only = false;      // MXMOE_GEMM_SM90=mxmoe-only: an error where the own kernel declines
  bool declined = false;      // the own kernel declined this call (alignment, shared memory): CUTLASS ran it
  int block_n = 128;          // CTA tile N (tile M and K are 128 in every kernel)
  int stages = 0;             // pipeline stages of the own kernels (0: CUTLASS's automatic count)
  bool lean = false;          // own M-grouped: the lean layout's extra stage (one fewer where the group
                              // table does not fit beside it; the launcher then updates `stages`)
  bool warp_producer = false; // TMA issue by a whole warp (else one thread)
  int cluster = 1;            // CTAs per cluster (TMA multicast of shared B tiles at 2)
  bool raster_n = false;      // CUTLASS scheduler: tile order along N (else M)
  int swizzle = 1;            // CUTLASS scheduler: max swizzle

  // Switches the config to the CUTLASS kernel (its 128x128x128 tile, 1x2 cluster, automatic stages).
  void use_cutlass();
  // "gemm sm90 pass=... m=... -> impl=... ..." (one line; MXMOE_PRINT_CONFIGS prints it).
  std::string to_string() const;
};

// Stages of the own M-grouped kernel at tile width block_n: as many as fit ~210 KB beside the
// epilogue's staged output boxes, at most 6 (the lean layout adds one where the group table fits).
constexpr int grouped_m_stages(int block_n, int out_bytes) {
  const int stage = (128 + block_n) * 128;
  const int epi = 2 * 64 * block_n * out_bytes;
  const int n = (210 * 1024 - epi) / stage;
  return n > 6 ? 6 : n;
}

// Stages of the own K-grouped kernel: as many as fit ~210 KB beside the epilogue buffer, with each
// stage's scale slots (kGroupedKScaleFloats: GroupedK::kScaleFloats, asserted by its launcher).
constexpr int kGroupedKScaleFloats = 128 + 4 * 36;
constexpr int grouped_k_stages(int out_bytes) {
  const int stage = 2 * 128 * 128 + kGroupedKScaleFloats * 4;
  const int epi = 2 * 64 * 128 * out_bytes;
  const int n = (210 * 1024 - epi) / stage;
  return n > 6 ? 6 : n;
}

// The configuration of a call under the given settings (env::settings(): the process environment).
// Throws mxmoe::Error when an environment variable is invalid.
Sm90GemmConfig select_sm90_config(Sm90Pass pass, int64_t m, int64_t n, int64_t k, int64_t groups, bool out_bf16,
                                  const env::Settings& env);
Sm90GemmConfig select_sm90_config(Sm90Pass pass, int64_t m, int64_t n, int64_t k, int64_t groups, bool out_bf16);

// MXMOE_PRINT_CONFIGS=1: prints the config of a launch (each distinct line once per process).
void note_config(const Sm90GemmConfig& c);

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
