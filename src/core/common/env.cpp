// The environment reader (env.hpp): the only getenv of the core.
#include "common/env.hpp"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "common/error.hpp"

namespace mxmoe {
namespace env {
namespace {

bool is_unset(const char* value) { return value == nullptr || *value == '\0'; }

[[noreturn]] void invalid(const char* name, const char* value, const std::string& expected) {
  fail("environment variable ", name, "=\"", value, "\" is invalid: expected ", expected, " (or unset)");
}

template <typename T>
std::string one_of(std::initializer_list<T> allowed) {
  std::string s = "one of ";
  bool first = true;
  for (const T& a : allowed) {
    s += cat(first ? "" : ", ", a);
    first = false;
  }
  return s;
}

// A decimal integer with nothing around it, in [lo, hi]; false otherwise.
bool to_int(const char* value, long lo, long hi, long* out) {
  const char* p = value;
  if (*p == '-') ++p;
  if (*p == '\0') return false;
  for (const char* q = p; *q; ++q)
    if (*q < '0' || *q > '9') return false;
  errno = 0;
  const long v = std::strtol(value, nullptr, 10);
  if (errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

int parse_int(const char* name, const char* value, std::initializer_list<int> allowed, int unset) {
  if (is_unset(value)) return unset;
  long v = 0;
  if (to_int(value, INT_MIN, INT_MAX, &v))
    for (int a : allowed)
      if (a == v) return a;
  invalid(name, value, one_of(allowed));
}

int parse_positive(const char* name, const char* value, int unset) {
  if (is_unset(value)) return unset;
  long v = 0;
  if (!to_int(value, 1, INT_MAX, &v)) invalid(name, value, "a positive integer");
  return static_cast<int>(v);
}

int parse_choice(const char* name, const char* value, std::initializer_list<const char*> allowed, int unset) {
  if (is_unset(value)) return unset;
  int i = 0;
  for (const char* a : allowed) {
    if (std::strcmp(a, value) == 0) return i;
    ++i;
  }
  invalid(name, value, one_of(allowed));
}

Settings parse(const Lookup& get) {
  Settings s;
  const int unset = Settings::kUnset;
  std::string errors;
  // Every variable is parsed, so one message names all the invalid ones.
  auto var = [&](const char* name, const auto& read) {
    try {
      read(name, get(name));
    } catch (const Error& e) {
      errors += (errors.empty() ? "" : "; ") + std::string(e.what());
    }
  };
  var("MXMOE_NUM_THREADS", [&](const char* n, const char* v) { s.num_threads = parse_positive(n, v, unset); });
  var("MXMOE_PRINT_CONFIGS", [&](const char* n, const char* v) { s.print_configs = parse_int(n, v, {0, 1}, 0) == 1; });
  var("MXMOE_GEMM_SM90", [&](const char* n, const char* v) {
    s.gemm_sm90 = static_cast<GemmSm90>(parse_choice(n, v, {"auto", "cutlass", "mxmoe", "mxmoe-only"}, 0));
  });
  var("MXMOE_GEMM_BLOCK_N", [&](const char* n, const char* v) { s.gemm_block_n = parse_int(n, v, {128, 160, 192}, unset); });
  var("MXMOE_GEMM_PRODUCER", [&](const char* n, const char* v) {
    s.gemm_warp_producer = parse_choice(n, v, {"thread", "warp"}, unset);
  });
  var("MXMOE_GEMM_EXTRA_STAGE", [&](const char* n, const char* v) { s.gemm_extra_stage = parse_int(n, v, {0, 1}, unset); });
  var("MXMOE_GEMM_CLUSTER", [&](const char* n, const char* v) { s.gemm_cluster = parse_int(n, v, {1, 2, 4}, unset); });
  var("MXMOE_TILE128_RASTER", [&](const char* n, const char* v) { s.tile128_raster_n = parse_choice(n, v, {"m", "n"}, 0) == 1; });
  var("MXMOE_TILE128_SWIZZLE", [&](const char* n, const char* v) { s.tile128_swizzle = parse_int(n, v, {1, 2, 4, 8}, 1); });
  var("MXMOE_QUANT_TILE128", [&](const char* n, const char* v) { s.quant_tile128 = parse_int(n, v, {0, 1}, 1) == 1; });
  var("MXMOE_QUANT_TMA", [&](const char* n, const char* v) { s.quant_tma = parse_int(n, v, {0, 1}, 1) == 1; });
  var("MXMOE_QUANT_STREAM", [&](const char* n, const char* v) { s.quant_stream = parse_int(n, v, {0, 1, 2}, 1); });
  var("MXMOE_QUANT_ORDER", [&](const char* n, const char* v) { s.quant_order = parse_int(n, v, {0, 1}, 1); });
  var("MXMOE_QUANT_WARP", [&](const char* n, const char* v) { s.quant_warp = parse_int(n, v, {0, 1, 2, 3, 4}, 1); });
  var("MXMOE_QUANT_WARP_PIPE", [&](const char* n, const char* v) { s.quant_warp_pipe = parse_int(n, v, {0, 1}, 1) == 1; });
  var("MXMOE_QUANT_SLAB", [&](const char* n, const char* v) { s.quant_slab = parse_int(n, v, {0, 1}, 1) == 1; });
  var("MXMOE_QUANT_STAGES", [&](const char* n, const char* v) { s.quant_stages = parse_int(n, v, {0, 2, 3}, 0); });
  var("MXMOE_DEQUANT_WARP", [&](const char* n, const char* v) { s.dequant_warp = parse_int(n, v, {0, 1}, 1) == 1; });
  if (!errors.empty()) fail(errors);
  return s;
}

namespace {

// The process's parsed environment (or the message of its invalid variables). Never destroyed, so
// calls from other statics' destructors still find it.
struct Cache {
  std::mutex mu;
  std::atomic<bool> ready{false};
  Settings values;
  std::string error;
};

Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

void load(Cache& c) {  // c.mu held
  try {
    c.values = parse([](const char* name) -> const char* { return std::getenv(name); });
    c.error.clear();
  } catch (const Error& e) {
    c.values = Settings{};
    c.error = e.what();
  }
  c.ready.store(true, std::memory_order_release);
}

}  // namespace

const Settings& settings() {
  Cache& c = cache();
  if (!c.ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.ready.load(std::memory_order_relaxed)) load(c);
  }
  if (!c.error.empty()) throw Error(MXMOE_ERR_INVALID_ARGUMENT, c.error);
  return c.values;
}

void reload() {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    load(c);
  }
  settings();  // throws if invalid
}

void print_config_once(const std::string& line) {
  static std::mutex* mu = new std::mutex;
  static auto* seen = new std::unordered_set<std::string>;
  std::lock_guard<std::mutex> lock(*mu);
  if (!seen->insert(line).second) return;
  std::fprintf(stderr, "mxmoe config: %s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace env
}  // namespace mxmoe
