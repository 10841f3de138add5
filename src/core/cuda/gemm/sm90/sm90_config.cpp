// The sm90 tile128 GEMM configuration (sm90_config.hpp): the heuristics, each with the measurement
// behind it (docs/design/gemm-sm90.md "Kernel choice"), and the environment's overrides.
#include "cuda/gemm/sm90/sm90_config.hpp"

#include <sstream>

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

using env::GemmSm90;
using env::Settings;

// Own kernel or CUTLASS's by default (MXMOE_GEMM_SM90 unset or "auto"). The kernels themselves
// decline calls they cannot take (unaligned operands, shapes past int32, group tables too large for
// shared memory), which then run on CUTLASS.
//   M-grouped: the own kernel on every shape. Same-process A/B: 0.98-1.05x CUTLASS on the seeds and
//     Llama-4-Scout shapes, 1.04-1.21x on DeepSeek-V3's, 0.98-1.15x on the jagged ones, 1.17-1.50x on
//     the fine-grained and Qwen3-30B-A3B ones.
//   K-grouped (wgrad): the own kernel where its output rows are short, K <= 1024: 1.07-1.17x CUTLASS
//     there (fine-grained gate_up / down, Qwen3-30B-A3B's down, unaligned group starts too), and at
//     K <= 2048 where groups average < 4096 tokens, on 2-CTA clusters (below): Qwen3-30B-A3B's gate_up
//     as the MoE layer hands it over, H100, same run: 16K tokens (~1K a group) 1402-1415 us own vs
//     1521 CUTLASS; 4K tokens (~256 a group) 518-520 own vs 749-756. CUTLASS elsewhere (own 0.76-0.94x
//     on the seeds, Llama-4-Scout, DeepSeek-V3 at few long groups).
bool prefer_own(Sm90Pass pass, int64_t m, int64_t k, int64_t groups) {
  if (pass == Sm90Pass::kGroupedM || k <= 1024) return true;
  const int64_t avg = groups > 0 ? m / groups : 0;
  return k <= 2048 && avg < 4096;
}

// M-grouped tile width: 128. The wider tiles (fewer L2 -> SM bytes per FLOP, one accumulator set
// instead of the overlapped two) measured slower on every benchmark shape (BlockN 160: 0.87-0.94x of
// 128 on the large shapes, 0.84-0.89x on the fine-grained ones; 192: 0.83-0.96x): forced only.
int grouped_m_block_n(const Settings& s) { return s.gemm_block_n != Settings::kUnset ? s.gemm_block_n : 128; }

// M-grouped at BlockN 128, K >= 4096 (32+ k-blocks a tile, where the producer's issue rate sets the
// pace): the warp producer and the lean layout's extra stage (6 stages for bf16 output, 5 for fp32,
// where the group table fits: G <= ~240-370). On the seeds, Llama-4-Scout, DeepSeek-V3 forward and
// jagged dgrad shapes the pair measured 1.07-1.14x the single-thread producer on 15 of 16 rows (one
// 0.97x). At K <= 2048 it measured 0.98-1.04x (the warp producer alone 0.97-1.01x): thread producer.
bool long_k(int64_t k) { return k >= 4096; }

// M-grouped CTAs per cluster: 2 (pairs share B tiles through TMA multicast) at K >= 4096, where the
// multicast saves 3-7%; 1 below, where the pairs' lockstep costs more than it saves (up to 20% at K 768).
int grouped_m_cluster(const Settings& s, int64_t k) {
  return s.gemm_cluster != Settings::kUnset ? std::min(s.gemm_cluster, 2) : (k >= 4096 ? 2 : 1);
}

// K-grouped CTAs per cluster: 2 (pairs of m-tiles share B boxes). The kernel waits on L2 -> SM bytes
// (ncu, Qwen3-30B-A3B's routed gate_up, H100: L2 79% busy at cluster 1, 74% at 2), and the pairs'
// B halves pay at every group size measured: H100, same run, cluster 1 / 2: 16K tokens gate_up 1750 /
// 1410 us, down 860 / 700; 4K tokens 583 / 519, 343 / 274. 1 where the m-tiles (ceil(N / 128)) are
// few and odd, so a ghost re-runs a tile in every block column (a third of the work at 3). 2 x 2
// (MXMOE_GEMM_CLUSTER=4) relieves the L2 (45% busy) but fits 30 clusters (120 SMs) and measured
// slower: 16K gate_up 1445-1474 us, down 747-757; 4K 542, 283.
int grouped_k_cluster(const Settings& s, int64_t n, int64_t groups) {
  if (s.gemm_cluster != Settings::kUnset) return s.gemm_cluster;
  const int64_t mt = n / 128 + (n % 128 != 0);  // any n the size query takes, INT64_MAX too
  return groups > 0 && (mt % 2 == 0 || mt >= 8) ? 2 : 1;
}

// K-grouped producer: one thread; the warp producer is forced only. It measured 0.95-1.04x the
// thread producer on every wgrad shape (the wgrad waits on its own wgmmas and the helpers' scales).

}  // namespace

void Sm90GemmConfig::use_cutlass() {
  impl = Sm90Impl::kCutlass;
  block_n = 128;
  stages = 0;
  lean = false;
  warp_producer = false;
  cluster = 2;  // cutlass/gemm_sm90_tile128_impl.cuh: ClusterShape 1x2x1
}

Sm90GemmConfig select_sm90_config(Sm90Pass pass, int64_t m, int64_t n, int64_t k, int64_t groups, bool out_bf16,
                                  const env::Settings& s) {
  Sm90GemmConfig c;
  c.pass = pass;
  c.m = m;
  c.n = n;
  c.k = k;
  c.groups = groups;
  c.out_bf16 = out_bf16;
  c.raster_n = s.tile128_raster_n;
  c.swizzle = s.tile128_swizzle;
  c.own_only = s.gemm_sm90 == GemmSm90::kOwnOnly;
  const bool own = s.gemm_sm90 == GemmSm90::kOwn || s.gemm_sm90 == GemmSm90::kOwnOnly ||
                   (s.gemm_sm90 == GemmSm90::kAuto && prefer_own(pass, m, k, groups));
  if (!own) {
    c.use_cutlass();
    return c;
  }
  c.impl = Sm90Impl::kOwn;
  const int out_bytes = out_bf16 ? 2 : 4;
  if (pass == Sm90Pass::kGroupedM) {
    c.block_n = grouped_m_block_n(s);
    c.cluster = grouped_m_cluster(s, k);
    if (c.block_n == 128) {  // the warp producer and the lean layout exist at BlockN 128 only
      c.warp_producer = s.gemm_warp_producer != Settings::kUnset ? s.gemm_warp_producer == 1 : long_k(k);
      c.lean = s.gemm_extra_stage != Settings::kUnset ? s.gemm_extra_stage == 1 : long_k(k);
    }
    c.stages = grouped_m_stages(c.block_n, out_bytes) + (c.lean ? 1 : 0);
  } else {
    c.block_n = 128;
    c.cluster = grouped_k_cluster(s, n, groups);
    c.warp_producer = s.gemm_warp_producer == 1;
    c.stages = grouped_k_stages(out_bytes);
  }
  return c;
}

Sm90GemmConfig select_sm90_config(Sm90Pass pass, int64_t m, int64_t n, int64_t k, int64_t groups, bool out_bf16) {
  return select_sm90_config(pass, m, n, k, groups, out_bf16, env::settings());
}

std::string Sm90GemmConfig::to_string() const {
  std::ostringstream os;
  os << "gemm sm90 pass=" << (pass == Sm90Pass::kGroupedM ? "fwd/dgrad" : "wgrad") << " m=" << m << " n=" << n
     << " k=" << k << " g=" << groups << " out=" << (out_bf16 ? "bf16" : "f32") << " -> impl=";
  if (impl == Sm90Impl::kCutlass) {
    os << "cutlass" << (declined ? " (own kernel declined)" : "") << " block_n=" << block_n
       << " stages=auto cluster=" << cluster << " raster=" << (raster_n ? 'n' : 'm') << " swizzle=" << swizzle;
  } else {
    os << "own block_n=" << block_n << " stages=" << stages << (lean ? " lean" : "")
       << " producer=" << (warp_producer ? "warp" : "thread") << " cluster=" << cluster
       << " fallback=" << (own_only ? "error" : "cutlass");
  }
  return os.str();
}

void note_config(const Sm90GemmConfig& c) {
  if (env::settings().print_configs) env::print_config_once(c.to_string());
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
