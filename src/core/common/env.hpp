// The one reader of the environment: every MXMOE_* variable the core uses, parsed by type once per
// process (at the first call that needs one) and cached. An invalid value is an error naming the
// variable, the value and the allowed values; unset or empty means the default.
// docs/reference/env.md lists the variables.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

namespace mxmoe {
namespace env {

// MXMOE_GEMM_SM90: which sm90 tile128 GEMM runs (cuda/gemm/sm90/sm90_config.hpp).
enum class GemmSm90 : int8_t {
  kAuto,     // "auto": the measured choice per shape
  kCutlass,  // "cutlass"
  kOwn,      // "mxmoe": the own kernel where it takes the call, else CUTLASS
  kOwnOnly,  // "mxmoe-only": the own kernel, an error where it declines (tests)
};

// The parsed variables. Fields whose default depends on the call (the GEMM tile knobs) hold
// kUnset when the variable is not set.
struct Settings {
  static constexpr int kUnset = -1;
  int num_threads = kUnset;         // MXMOE_NUM_THREADS (> 0); unset: all hardware threads
  bool print_configs = false;       // MXMOE_PRINT_CONFIGS
  GemmSm90 gemm_sm90 = GemmSm90::kAuto;
  int gemm_block_n = kUnset;        // MXMOE_GEMM_BLOCK_N: 128, 160, 192
  int gemm_warp_producer = kUnset;  // MXMOE_GEMM_PRODUCER: 1 warp, 0 thread
  int gemm_extra_stage = kUnset;    // MXMOE_GEMM_EXTRA_STAGE: 1, 0
  int gemm_cluster = kUnset;        // MXMOE_GEMM_CLUSTER: 1, 2, 4 (K-grouped; M-grouped takes 4 as 2)
  bool tile128_raster_n = false;    // MXMOE_TILE128_RASTER: m (false), n
  int tile128_swizzle = 1;          // MXMOE_TILE128_SWIZZLE: 1, 2, 4, 8
  bool quant_tile128 = true;        // MXMOE_QUANT_TILE128
  bool quant_tma = true;            // MXMOE_QUANT_TMA
  int quant_stream = 1;             // MXMOE_QUANT_STREAM: 0 off, 1, 2 without pipelining
  int quant_order = 1;              // MXMOE_QUANT_ORDER: 0, 1
  int quant_warp = 1;               // MXMOE_QUANT_WARP: 0 never, 1 default route, 2-4 every eligible request
  bool quant_warp_pipe = true;      // MXMOE_QUANT_WARP_PIPE
  bool quant_slab = true;           // MXMOE_QUANT_SLAB
  int quant_stages = 0;             // MXMOE_QUANT_STAGES: 0 direct loads, 2, 3
  bool dequant_warp = true;         // MXMOE_DEQUANT_WARP
};

// name -> value (nullptr: unset).
using Lookup = std::function<const char*(const char* name)>;

// Parses every variable through `lookup`. Throws mxmoe::Error (MXMOE_ERR_INVALID_ARGUMENT) listing
// each invalid variable with its value and the allowed values.
Settings parse(const Lookup& lookup);

// The process environment, parsed at the first call and cached (the same Settings for every later
// call). Throws mxmoe::Error, on every call, when a variable is invalid.
const Settings& settings();

// Reads the environment again (tests and A/B measurements that change variables between calls in
// one process; C API mxmoe_reload_env). Not safe while other threads call into the library. Throws
// like settings() when a variable is invalid (and settings() keeps throwing until a reload succeeds).
void reload();

// One value: `value` (nullptr or "" = unset -> `unset`) must be one of `allowed`; returns it.
int parse_int(const char* name, const char* value, std::initializer_list<int> allowed, int unset);
// A positive integer (nullptr or "" -> `unset`).
int parse_positive(const char* name, const char* value, int unset);
// One of the `allowed` words; returns its index (nullptr or "" -> `unset`).
int parse_choice(const char* name, const char* value, std::initializer_list<const char*> allowed, int unset);

// MXMOE_PRINT_CONFIGS: writes "mxmoe config: <line>" to stderr the first time this process sees
// `line` (callers check settings().print_configs first).
void print_config_once(const std::string& line);

}  // namespace env
}  // namespace mxmoe
