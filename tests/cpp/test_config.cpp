// The host-side choices: the environment reader (common/env.hpp), the sm90 tile128 GEMM configs
// (cuda/gemm/sm90/sm90_config.hpp) and the CUDA quantize routes (cuda/quantize/quantize_route.hpp),
// called directly (compiled into this binary, see CMakeLists.txt), plus their C API
// (mxmoe_sm90_gemm_config, mxmoe_reload_env). No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "common/env.hpp"
#include "common/error.hpp"
#include "cuda/gemm/sm90/sm90_config.hpp"
#include "cuda/quantize/quantize_route.hpp"
#include "mxmoe/mxmoe.h"

namespace {

using mxmoe::env::GemmSm90;
using mxmoe::env::Settings;
namespace env = mxmoe::env;
namespace gemm = mxmoe::cuda::gemm;
namespace quant = mxmoe::cuda::quant;

Settings parse_map(const std::map<std::string, std::string>& vars) {
  return env::parse([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The message of the mxmoe::Error that parsing `vars` throws ("" if none).
std::string parse_error(const std::map<std::string, std::string>& vars) {
  try {
    parse_map(vars);
  } catch (const mxmoe::Error& e) {
    EXPECT_EQ(e.status(), MXMOE_ERR_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Sets (or unsets, value nullptr) one variable for a scope, restoring it afterwards; the caller
// re-reads (env::reload here, mxmoe_reload_env in the library).
struct ScopedVar {
  std::string name, saved;
  bool had;
  ScopedVar(const char* n, const char* value) : name(n) {
    const char* old = std::getenv(n);
    had = old != nullptr;
    if (had) saved = old;
    if (value) setenv(n, value, 1); else unsetenv(n);
  }
  ~ScopedVar() {
    if (had) setenv(name.c_str(), saved.c_str(), 1); else unsetenv(name.c_str());
  }
};

// ---- the environment reader -------------------------------------------------------------------------

TEST(EnvParse, UnsetOrEmptyGivesTheDefaults) {
  const Settings d;
  for (const Settings& s : {parse_map({}), parse_map({{"MXMOE_GEMM_CLUSTER", ""}, {"MXMOE_QUANT_TILE128", ""},
                                                      {"MXMOE_GEMM_SM90", ""}, {"MXMOE_NUM_THREADS", ""}})}) {
    EXPECT_EQ(s.num_threads, Settings::kUnset);
    EXPECT_FALSE(s.print_configs);
    EXPECT_EQ(s.gemm_sm90, GemmSm90::kAuto);
    EXPECT_EQ(s.gemm_block_n, Settings::kUnset);
    EXPECT_EQ(s.gemm_warp_producer, Settings::kUnset);
    EXPECT_EQ(s.gemm_extra_stage, Settings::kUnset);
    EXPECT_EQ(s.gemm_cluster, Settings::kUnset);
    EXPECT_FALSE(s.tile128_raster_n);
    EXPECT_EQ(s.tile128_swizzle, 1);
    EXPECT_TRUE(s.quant_tile128);
    EXPECT_TRUE(s.quant_tma);
    EXPECT_EQ(s.quant_stream, 1);
    EXPECT_EQ(s.quant_order, 1);
    EXPECT_EQ(s.quant_warp, 1);
    EXPECT_TRUE(s.quant_warp_pipe);
    EXPECT_TRUE(s.quant_slab);
    EXPECT_EQ(s.quant_stages, 0);
    EXPECT_TRUE(s.dequant_warp);
    EXPECT_EQ(d.quant_stages, s.quant_stages);
  }
}

TEST(EnvParse, ValidValues) {
  const Settings s = parse_map({{"MXMOE_NUM_THREADS", "3"},        {"MXMOE_PRINT_CONFIGS", "1"},
                                {"MXMOE_GEMM_SM90", "mxmoe-only"}, {"MXMOE_GEMM_BLOCK_N", "160"},
                                {"MXMOE_GEMM_PRODUCER", "warp"},   {"MXMOE_GEMM_EXTRA_STAGE", "0"},
                                {"MXMOE_GEMM_CLUSTER", "2"},       {"MXMOE_TILE128_RASTER", "n"},
                                {"MXMOE_TILE128_SWIZZLE", "8"},    {"MXMOE_QUANT_TILE128", "0"},
                                {"MXMOE_QUANT_STREAM", "2"},       {"MXMOE_QUANT_TMA", "0"},       {"MXMOE_QUANT_ORDER", "0"},
                                {"MXMOE_QUANT_WARP", "4"},         {"MXMOE_QUANT_WARP_PIPE", "0"},
                                {"MXMOE_QUANT_SLAB", "0"},         {"MXMOE_QUANT_STAGES", "3"},
                                {"MXMOE_DEQUANT_WARP", "0"}});
  EXPECT_EQ(s.num_threads, 3);
  EXPECT_TRUE(s.print_configs);
  EXPECT_EQ(s.gemm_sm90, GemmSm90::kOwnOnly);
  EXPECT_EQ(s.gemm_block_n, 160);
  EXPECT_EQ(s.gemm_warp_producer, 1);
  EXPECT_EQ(s.gemm_extra_stage, 0);
  EXPECT_EQ(s.gemm_cluster, 2);
  EXPECT_TRUE(s.tile128_raster_n);
  EXPECT_EQ(s.tile128_swizzle, 8);
  EXPECT_FALSE(s.quant_tile128);
  EXPECT_FALSE(s.quant_tma);
  EXPECT_EQ(s.quant_stream, 2);
  EXPECT_EQ(s.quant_order, 0);
  EXPECT_EQ(s.quant_warp, 4);
  EXPECT_FALSE(s.quant_warp_pipe);
  EXPECT_FALSE(s.quant_slab);
  EXPECT_EQ(s.quant_stages, 3);
  EXPECT_FALSE(s.dequant_warp);
  EXPECT_EQ(parse_map({{"MXMOE_GEMM_SM90", "cutlass"}}).gemm_sm90, GemmSm90::kCutlass);
  EXPECT_EQ(parse_map({{"MXMOE_GEMM_SM90", "mxmoe"}}).gemm_sm90, GemmSm90::kOwn);
  EXPECT_EQ(parse_map({{"MXMOE_GEMM_SM90", "auto"}}).gemm_sm90, GemmSm90::kAuto);
  EXPECT_EQ(parse_map({{"MXMOE_GEMM_PRODUCER", "thread"}}).gemm_warp_producer, 0);
  EXPECT_EQ(parse_map({{"MXMOE_NUM_THREADS", "2147483647"}}).num_threads, 2147483647);
}

TEST(EnvParse, InvalidValuesAreErrorsNamingTheVariable) {
  std::string e = parse_error({{"MXMOE_GEMM_CLUSTER", "3"}});
  EXPECT_TRUE(contains(e, "MXMOE_GEMM_CLUSTER=\"3\"")) << e;
  EXPECT_TRUE(contains(e, "one of 1, 2, 4")) << e;
  e = parse_error({{"MXMOE_GEMM_SM90", "fast"}});
  EXPECT_TRUE(contains(e, "MXMOE_GEMM_SM90=\"fast\"")) << e;
  EXPECT_TRUE(contains(e, "one of auto, cutlass, mxmoe, mxmoe-only")) << e;
  for (const char* bad : {"0", "-2", "abc", "4x", " 4", "99999999999"}) {
    e = parse_error({{"MXMOE_NUM_THREADS", bad}});
    EXPECT_TRUE(contains(e, "MXMOE_NUM_THREADS=\"" + std::string(bad) + "\"")) << e;
    EXPECT_TRUE(contains(e, "a positive integer")) << e;
  }
  for (const auto& [name, bad] : std::map<std::string, std::string>{{"MXMOE_GEMM_BLOCK_N", "256"},
                                                                    {"MXMOE_GEMM_PRODUCER", "Warp"},
                                                                    {"MXMOE_GEMM_EXTRA_STAGE", "yes"},
                                                                    {"MXMOE_TILE128_RASTER", "nm"},
                                                                    {"MXMOE_TILE128_SWIZZLE", "3"},
                                                                    {"MXMOE_QUANT_TILE128", "2"},
                                                                    {"MXMOE_QUANT_STREAM", "3"},
                                                                    {"MXMOE_QUANT_ORDER", "2"},
                                                                    {"MXMOE_QUANT_WARP", "5"},
                                                                    {"MXMOE_QUANT_WARP_PIPE", "on"},
                                                                    {"MXMOE_QUANT_SLAB", "-1"},
                                                                    {"MXMOE_QUANT_STAGES", "1"},
                                                                    {"MXMOE_DEQUANT_WARP", "true"},
                                                                    {"MXMOE_PRINT_CONFIGS", "yes"}}) {
    e = parse_error({{name, bad}});
    EXPECT_TRUE(contains(e, name + "=\"" + bad + "\" is invalid: expected")) << name << ": " << e;
  }
  // Every invalid variable is named in the one message.
  e = parse_error({{"MXMOE_GEMM_CLUSTER", "8"}, {"MXMOE_QUANT_WARP", "9"}, {"MXMOE_GEMM_BLOCK_N", "128"}});
  EXPECT_TRUE(contains(e, "MXMOE_GEMM_CLUSTER=\"8\"") && contains(e, "MXMOE_QUANT_WARP=\"9\"")) << e;
  EXPECT_FALSE(contains(e, "MXMOE_GEMM_BLOCK_N")) << e;
}

TEST(EnvParse, OneValueHelpers) {
  EXPECT_EQ(env::parse_int("X", nullptr, {1, 2}, -7), -7);
  EXPECT_EQ(env::parse_int("X", "", {1, 2}, -7), -7);
  EXPECT_EQ(env::parse_int("X", "2", {1, 2}, -7), 2);
  EXPECT_THROW(env::parse_int("X", "+2", {1, 2}, -7), mxmoe::Error);
  EXPECT_THROW(env::parse_int("X", "2 ", {1, 2}, -7), mxmoe::Error);
  EXPECT_EQ(env::parse_choice("X", "b", {"a", "b"}, -1), 1);
  EXPECT_THROW(env::parse_choice("X", "B", {"a", "b"}, -1), mxmoe::Error);
  EXPECT_EQ(env::parse_positive("X", "12", 0), 12);
  EXPECT_THROW(env::parse_positive("X", "-", 0), mxmoe::Error);
}

// The process environment is read once; reload() re-reads it; an invalid value fails every read
// until a reload succeeds.
TEST(EnvProcess, ReadOnceThenReload) {
  {
    ScopedVar v("MXMOE_GEMM_BLOCK_N", "160");
    env::reload();
    EXPECT_EQ(env::settings().gemm_block_n, 160);
    setenv("MXMOE_GEMM_BLOCK_N", "192", 1);
    EXPECT_EQ(env::settings().gemm_block_n, 160);  // cached
    env::reload();
    EXPECT_EQ(env::settings().gemm_block_n, 192);
    setenv("MXMOE_GEMM_BLOCK_N", "100", 1);
    EXPECT_THROW(env::reload(), mxmoe::Error);
    try {
      env::settings();
      ADD_FAILURE() << "settings() did not throw";
    } catch (const mxmoe::Error& e) {
      EXPECT_TRUE(contains(e.what(), "MXMOE_GEMM_BLOCK_N=\"100\"")) << e.what();
    }
    unsetenv("MXMOE_GEMM_BLOCK_N");
    env::reload();
    EXPECT_EQ(env::settings().gemm_block_n, Settings::kUnset);
  }
  env::reload();
}

// ---- sm90 tile128 GEMM configs ---------------------------------------------------------------------

using gemm::Sm90Impl;
using gemm::Sm90Pass;

gemm::Sm90GemmConfig fwd(int64_t m, int64_t n, int64_t k, int64_t g, bool bf16 = true, const Settings& s = {}) {
  return gemm::select_sm90_config(Sm90Pass::kGroupedM, m, n, k, g, bf16, s);
}
gemm::Sm90GemmConfig wgrad(int64_t m, int64_t n, int64_t k, int64_t g, bool bf16 = true, const Settings& s = {}) {
  return gemm::select_sm90_config(Sm90Pass::kGroupedK, m, n, k, g, bf16, s);
}

// The stage counts the launchers instantiate (as many as fit ~210 KB of shared memory, at most 6).
TEST(Sm90Config, StageCounts) {
  EXPECT_EQ(gemm::grouped_m_stages(128, 2), 5);
  EXPECT_EQ(gemm::grouped_m_stages(128, 4), 4);
  EXPECT_EQ(gemm::grouped_m_stages(160, 2), 4);
  EXPECT_EQ(gemm::grouped_m_stages(160, 4), 3);
  EXPECT_EQ(gemm::grouped_m_stages(192, 2), 4);
  EXPECT_EQ(gemm::grouped_m_stages(192, 4), 2);
  EXPECT_EQ(gemm::grouped_k_stages(2), 5);
  EXPECT_EQ(gemm::grouped_k_stages(4), 4);
}

// M-grouped (forward, dgrad): the own kernel on every shape; K >= 4096: the warp producer, the lean
// layout's extra stage and CTA pairs; below: one thread, the usual stages, single CTAs.
TEST(Sm90Config, GroupedMByK) {
  for (int64_t k : {768, 1024, 2048, 4064}) {
    for (bool bf16 : {true, false}) {
      const auto c = fwd(131072, 2048, k, 128, bf16);
      EXPECT_EQ(c.impl, Sm90Impl::kOwn) << k;
      EXPECT_EQ(c.block_n, 128);
      EXPECT_FALSE(c.warp_producer) << k;
      EXPECT_FALSE(c.lean) << k;
      EXPECT_EQ(c.cluster, 1) << k;
      EXPECT_EQ(c.stages, bf16 ? 5 : 4) << k;
      EXPECT_FALSE(c.own_only);
    }
  }
  for (int64_t k : {4096, 5120, 7168}) {
    for (bool bf16 : {true, false}) {
      const auto c = fwd(16640, 8192, k, 4, bf16);
      EXPECT_EQ(c.impl, Sm90Impl::kOwn) << k;
      EXPECT_TRUE(c.warp_producer) << k;
      EXPECT_TRUE(c.lean) << k;
      EXPECT_EQ(c.cluster, 2) << k;
      EXPECT_EQ(c.stages, bf16 ? 6 : 5) << k;
    }
  }
}

TEST(Sm90Config, GroupedMOverrides) {
  Settings s;
  s.gemm_block_n = 160;
  s.gemm_warp_producer = 1;  // no warp producer or lean layout at BlockN 160 / 192
  s.gemm_extra_stage = 1;
  auto c = fwd(16640, 8192, 5120, 4, true, s);
  EXPECT_EQ(c.block_n, 160);
  EXPECT_FALSE(c.warp_producer);
  EXPECT_FALSE(c.lean);
  EXPECT_EQ(c.stages, 4);
  EXPECT_EQ(c.cluster, 2);
  s.gemm_block_n = 192;
  c = fwd(16640, 8192, 5120, 4, false, s);
  EXPECT_EQ(c.stages, 2);
  s = Settings{};
  s.gemm_cluster = 1;
  s.gemm_warp_producer = 0;
  EXPECT_EQ(fwd(16640, 8192, 5120, 4, true, s).cluster, 1);
  EXPECT_FALSE(fwd(16640, 8192, 5120, 4, true, s).warp_producer);
  EXPECT_TRUE(fwd(16640, 8192, 5120, 4, true, s).lean);
  s = Settings{};
  s.gemm_extra_stage = 0;
  c = fwd(16640, 8192, 5120, 4, true, s);
  EXPECT_FALSE(c.lean);
  EXPECT_EQ(c.stages, 5);
  EXPECT_TRUE(c.warp_producer);
  s = Settings{};
  s.gemm_cluster = 2;
  s.gemm_extra_stage = 1;
  s.gemm_warp_producer = 1;
  c = fwd(32768, 1024, 768, 16, true, s);
  EXPECT_EQ(c.cluster, 2);
  EXPECT_TRUE(c.lean && c.warp_producer);
  EXPECT_EQ(c.stages, 6);
}

TEST(Sm90Config, KernelFamilyChoice) {
  Settings s;
  s.gemm_sm90 = GemmSm90::kCutlass;
  for (const auto& c : {fwd(16640, 8192, 5120, 4, true, s), wgrad(32768, 1536, 1024, 16, true, s)}) {
    EXPECT_EQ(c.impl, Sm90Impl::kCutlass);
    EXPECT_EQ(c.cluster, 2);
    EXPECT_EQ(c.stages, 0);
    EXPECT_EQ(c.block_n, 128);
  }
  s.gemm_sm90 = GemmSm90::kOwnOnly;
  auto c = wgrad(16384, 4096, 2048, 8, true, s);
  EXPECT_EQ(c.impl, Sm90Impl::kOwn);
  EXPECT_TRUE(c.own_only);
  s.gemm_sm90 = GemmSm90::kOwn;
  c = wgrad(16384, 4096, 2048, 8, true, s);
  EXPECT_EQ(c.impl, Sm90Impl::kOwn);
  EXPECT_FALSE(c.own_only);
  s = Settings{};
  s.tile128_raster_n = true;
  s.tile128_swizzle = 4;
  c = fwd(16640, 8192, 5120, 4, true, s);
  EXPECT_TRUE(c.raster_n);
  EXPECT_EQ(c.swizzle, 4);
}

// K-grouped (wgrad): the own kernel at K <= 1024, and at K <= 2048 where groups average < 4096 tokens,
// CUTLASS otherwise; CTA pairs unless the m-tiles are few and odd; the thread producer unless forced.
TEST(Sm90Config, GroupedKByShape) {
  for (int64_t k : {768, 1024}) {
    const auto c = wgrad(131072, 2048, k, 256);  // 512 tokens a group
    EXPECT_EQ(c.impl, Sm90Impl::kOwn) << k;
    EXPECT_EQ(c.cluster, 2);
    EXPECT_FALSE(c.warp_producer);
    EXPECT_EQ(c.stages, 5);
  }
  for (int64_t k : {1056, 2048, 5120, 7168}) EXPECT_EQ(wgrad(16640, 8192, k, 4).impl, Sm90Impl::kCutlass) << k;
  EXPECT_EQ(wgrad(131072, 1536, 2048, 128).impl, Sm90Impl::kOwn);      // 1024 tokens a group (Qwen3-30B-A3B)
  EXPECT_EQ(wgrad(32768, 1536, 2048, 128).impl, Sm90Impl::kOwn);       // 256 (Qwen3-30B-A3B at 4K tokens)
  EXPECT_EQ(wgrad(131072, 1536, 2048, 33).impl, Sm90Impl::kOwn);       // 3971
  EXPECT_EQ(wgrad(131072, 1536, 2048, 32).impl, Sm90Impl::kCutlass);   // 4096
  EXPECT_EQ(wgrad(131072, 1536, 2056, 128).impl, Sm90Impl::kCutlass);  // K past 2048
  EXPECT_EQ(wgrad(131072, 2048, 768, 16).cluster, 2);   // 8192 tokens a group
  EXPECT_EQ(wgrad(131072, 2048, 768, 128).cluster, 2);  // 1024
  EXPECT_EQ(wgrad(32768, 2048, 768, 129).cluster, 2);  // 254
  EXPECT_EQ(wgrad(131072, 384, 768, 128).cluster, 1);   // 3 m-tiles
  EXPECT_EQ(wgrad(131072, 1152, 768, 128).cluster, 2);  // 9
  EXPECT_EQ(wgrad(131072, 2048, 768, 0).cluster, 1);
  EXPECT_EQ(wgrad(131072, INT64_MAX, 768, 128).cluster, 2);  // the query takes any shape (no overflow)
  EXPECT_EQ(wgrad(32768, 1024, 768, 16, false).stages, 4);
  Settings s;
  s.gemm_warp_producer = 1;
  s.gemm_cluster = 2;
  s.gemm_extra_stage = 1;  // M-grouped only
  s.gemm_block_n = 192;    // M-grouped only
  const auto c = wgrad(32768, 1024, 768, 16, true, s);
  EXPECT_TRUE(c.warp_producer);
  EXPECT_EQ(c.cluster, 2);
  EXPECT_FALSE(c.lean);
  EXPECT_EQ(c.block_n, 128);
  EXPECT_EQ(c.stages, 5);
}

TEST(Sm90Config, ToString) {
  EXPECT_EQ(fwd(16640, 8192, 5120, 4).to_string(),
            "gemm sm90 pass=fwd/dgrad m=16640 n=8192 k=5120 g=4 out=bf16 -> impl=own block_n=128 stages=6 lean "
            "producer=warp cluster=2 fallback=cutlass");
  EXPECT_EQ(fwd(32768, 1024, 768, 16, false).to_string(),
            "gemm sm90 pass=fwd/dgrad m=32768 n=1024 k=768 g=16 out=f32 -> impl=own block_n=128 stages=4 "
            "producer=thread cluster=1 fallback=cutlass");
  EXPECT_EQ(wgrad(16384, 4096, 2048, 2, false).to_string(),
            "gemm sm90 pass=wgrad m=16384 n=4096 k=2048 g=2 out=f32 -> impl=cutlass block_n=128 stages=auto "
            "cluster=2 raster=m swizzle=1");
  Settings s;
  s.gemm_sm90 = GemmSm90::kOwnOnly;
  EXPECT_EQ(wgrad(131072, 2048, 768, 256, true, s).to_string(),
            "gemm sm90 pass=wgrad m=131072 n=2048 k=768 g=256 out=bf16 -> impl=own block_n=128 stages=5 "
            "producer=thread cluster=2 fallback=error");
  auto c = fwd(300, 160, 224, 1);
  c.use_cutlass();
  c.declined = true;
  EXPECT_EQ(c.to_string(),
            "gemm sm90 pass=fwd/dgrad m=300 n=160 k=224 g=1 out=bf16 -> impl=cutlass (own kernel declined) "
            "block_n=128 stages=auto cluster=2 raster=m swizzle=1");
}

// The C API answers with the same text, under the process environment.
TEST(Sm90Config, CApi) {
  char buf[MXMOE_CONFIG_TEXT_MAX];
  ASSERT_EQ(mxmoe_sm90_gemm_config(MXMOE_GEMM_GROUPED_M, 16640, 8192, 5120, 4, MXMOE_DTYPE_BF16, buf, sizeof buf),
            MXMOE_OK)
      << mxmoe_last_error();
  env::reload();
  EXPECT_EQ(std::string(buf), gemm::select_sm90_config(Sm90Pass::kGroupedM, 16640, 8192, 5120, 4, true).to_string());
  ASSERT_EQ(mxmoe_sm90_gemm_config(MXMOE_GEMM_GROUPED_K, 32768, 1536, 1024, 16, MXMOE_DTYPE_F32, buf, sizeof buf),
            MXMOE_OK)
      << mxmoe_last_error();
  EXPECT_EQ(std::string(buf), gemm::select_sm90_config(Sm90Pass::kGroupedK, 32768, 1536, 1024, 16, false).to_string());
  const std::string want = buf;
  EXPECT_EQ(mxmoe_sm90_gemm_config(MXMOE_GEMM_GROUPED_K, 32768, 1536, 1024, 16, MXMOE_DTYPE_F32, buf, want.size()),
            MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(mxmoe_last_error(), "cannot hold")) << mxmoe_last_error();
  EXPECT_EQ(mxmoe_sm90_gemm_config(MXMOE_GEMM_GROUPED_K, 32768, 1536, 1024, 16, MXMOE_DTYPE_F32, buf, want.size() + 1),
            MXMOE_OK);
  EXPECT_EQ(std::string(buf), want);
  EXPECT_EQ(mxmoe_sm90_gemm_config(2, 1, 1, 1, 1, MXMOE_DTYPE_BF16, buf, sizeof buf), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mxmoe_sm90_gemm_config(0, -1, 1, 1, 1, MXMOE_DTYPE_BF16, buf, sizeof buf), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mxmoe_sm90_gemm_config(0, 1, 1, 1, 1, MXMOE_DTYPE_E4M3, buf, sizeof buf), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mxmoe_sm90_gemm_config(0, 1, 1, 1, 1, MXMOE_DTYPE_BF16, nullptr, 64), MXMOE_ERR_INVALID_ARGUMENT);
}

// The library reads the environment once; mxmoe_reload_env re-reads it, and an invalid value is an
// error of every call that reads it until a reload succeeds.
TEST(Sm90Config, CApiEnvironment) {
  char buf[MXMOE_CONFIG_TEXT_MAX];
  {
    ScopedVar v("MXMOE_GEMM_SM90", "cutlass");
    ASSERT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(mxmoe_sm90_gemm_config(0, 32768, 1024, 768, 16, MXMOE_DTYPE_BF16, buf, sizeof buf), MXMOE_OK);
    EXPECT_TRUE(contains(buf, "impl=cutlass")) << buf;
    setenv("MXMOE_GEMM_SM90", "auto", 1);  // not read until the reload
    ASSERT_EQ(mxmoe_sm90_gemm_config(0, 32768, 1024, 768, 16, MXMOE_DTYPE_BF16, buf, sizeof buf), MXMOE_OK);
    EXPECT_TRUE(contains(buf, "impl=cutlass")) << buf;
    ASSERT_EQ(mxmoe_reload_env(), MXMOE_OK);
    ASSERT_EQ(mxmoe_sm90_gemm_config(0, 32768, 1024, 768, 16, MXMOE_DTYPE_BF16, buf, sizeof buf), MXMOE_OK);
    EXPECT_TRUE(contains(buf, "impl=own")) << buf;
    ScopedVar w("MXMOE_QUANT_WARP", "9");
    EXPECT_EQ(mxmoe_reload_env(), MXMOE_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(mxmoe_last_error(), "MXMOE_QUANT_WARP=\"9\"")) << mxmoe_last_error();
    EXPECT_EQ(mxmoe_sm90_gemm_config(0, 32768, 1024, 768, 16, MXMOE_DTYPE_BF16, buf, sizeof buf),
              MXMOE_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(mxmoe_last_error(), "MXMOE_QUANT_WARP")) << mxmoe_last_error();
  }
  EXPECT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
}

// ---- CUDA quantize routes -------------------------------------------------------------------------

using quant::QuantKernel;

// A bf16 (R, C) request with every pointer 16-byte aligned.
quant::QuantizeRequest request(int64_t R, int64_t C) {
  quant::QuantizeRequest r;
  r.R = R;
  r.C = C;
  r.x_align8 = r.x_vec = true;
  return r;
}

quant::QuantizeRoute route(const quant::QuantizeRequest& r, const Settings& s = {}) {
  return quant::select_quantize_route(r, s);
}

TEST(QuantizeRoute, Rowwise) {
  auto r = request(4096, 7168);
  r.row_on = true;
  r.row_block = 32;
  r.row.q = r.row.scale = true;
  EXPECT_EQ(route(r).kernel, QuantKernel::kRows);
  EXPECT_TRUE(route(r).rows_pipelined);
  Settings s;
  s.quant_stream = 2;
  EXPECT_EQ(route(r, s).kernel, QuantKernel::kRows);
  EXPECT_FALSE(route(r, s).rows_pipelined);
  s.quant_stream = 0;
  EXPECT_EQ(route(r, s).kernel, QuantKernel::kSlab);
  r.row.q_align = 4;  // codes not 8-byte aligned
  EXPECT_EQ(route(r).kernel, QuantKernel::kSlab);
  r.row.q_align = 16;
  r.row_block = 128;  // the tile128 recipe's activation pass: still the streaming kernel (x's orientation)
  EXPECT_EQ(route(r).kernel, QuantKernel::kRows);
  r.row.qt = true;  // transposed codes: the tile128 pass kernel takes 1x128 with codes in x's orientation only
  EXPECT_EQ(route(r).kernel, QuantKernel::kSlab);
}

TEST(QuantizeRoute, Columnwise) {
  auto r = request(16384, 2048);
  r.col_on = true;
  r.col_block = 128;  // the tile128 recipe's 128x1 pass: transposed codes
  r.col.qt = r.col.scale = true;
  EXPECT_EQ(route(r).kernel, QuantKernel::kTile128);
  Settings off;
  off.quant_tile128 = false;
  EXPECT_EQ(route(r, off).kernel, QuantKernel::kTile);
  r.bf16 = false;
  EXPECT_EQ(route(r).kernel, QuantKernel::kTile);
  off.quant_stages = 3;
  EXPECT_EQ(route(r, off).stages, 3);
  r.bf16 = true;
  r.col_block = 32;  // 32x1 transposed codes: the slab kernel by default, the warp-tile one when forced
  EXPECT_EQ(route(r).kernel, QuantKernel::kSlab);
  Settings warp;
  warp.quant_warp = 2;
  EXPECT_EQ(route(r, warp).kernel, QuantKernel::kWarp);
  warp.quant_warp = 0;
  EXPECT_EQ(route(r, warp).kernel, QuantKernel::kSlab);
  r.col.qt = false;  // round trips only (the exact recipe's dY pass): the warp-tile kernel by default
  r.col.dq = true;
  r.row_on = true;
  r.row_block = 32;
  r.row.q = r.row.scale = true;
  auto w = route(r);
  EXPECT_EQ(w.kernel, QuantKernel::kWarp);
  EXPECT_TRUE(w.warp_pipe);
  EXPECT_EQ(w.warp_budget, 2);
  Settings direct;
  direct.quant_warp_pipe = false;
  direct.quant_warp = 3;
  w = route(r, direct);
  EXPECT_FALSE(w.warp_pipe);
  EXPECT_EQ(w.warp_budget, 3);
  r.col.dq_f32 = true;  // f32 round trips: not the warp-tile kernel
  EXPECT_EQ(route(r).kernel, QuantKernel::kSlab);
  r.col.dq_f32 = false;
  r.grouped = true;
  r.groups = 600;  // too many groups for the shared table: the tile kernel
  r.table = false;
  EXPECT_EQ(route(r).kernel, QuantKernel::kTile);
}

TEST(QuantizeRoute, TilesAndComputedInputs) {
  auto r = request(2048, 7168);
  r.tile = r.row_on = r.col_on = true;
  r.row.q = r.row.qt = r.row.scale = r.col.scale = true;
  EXPECT_EQ(route(r).kernel, QuantKernel::kTile128);
  Settings s;
  s.quant_stages = 2;
  s.quant_order = 0;
  r.src_kind = MXMOE_SOURCE_SWIGLU;  // a computed input with 128x128 blocks: the tile kernel, direct loads
  auto t = route(r, s);
  EXPECT_EQ(t.kernel, QuantKernel::kTile);
  EXPECT_EQ(t.stages, 0);
  EXPECT_EQ(t.order, 0);
  r = request(2048, 7168);
  r.src_kind = MXMOE_SOURCE_GATHER;  // the dispatch's 1x128 pass: the tile128 pass kernel
  r.row_on = true;
  r.row_block = 128;
  r.row.q = r.row.scale = true;
  EXPECT_EQ(route(r).kernel, QuantKernel::kTile128);
  r.row_block = 32;  // computed inputs never take the streaming kernel
  EXPECT_EQ(route(r).kernel, QuantKernel::kTile);
}

// The weights' 128x128 request: the TMA kernel where its strides and pointers allow TMA (rows of x, q
// and qt at 16-byte multiples, codes 16-byte aligned), no groups; MXMOE_QUANT_TMA=0 turns it off.
TEST(QuantizeRoute, WeightsTma) {
  auto r = request(1536, 2048);
  r.B = 128;
  r.tile = r.row_on = r.col_on = true;
  r.row.q = r.row.scale = r.col.qt = r.col.scale = true;  // the weight cache's request
  auto t = route(r);
  EXPECT_EQ(t.kernel, QuantKernel::kTile128);
  EXPECT_TRUE(t.tma);
  EXPECT_EQ(t.to_string(r), "quantize x=bf16 B=128 R=1536 C=2048 g=0 src=tensor row=128x128:q,scale "
                            "col=128x128:qt,scale -> kernel=tile128 tma");
  Settings off;
  off.quant_tma = false;
  EXPECT_FALSE(route(r, off).tma);
  EXPECT_EQ(route(r, off).kernel, QuantKernel::kTile128);
  r.R = 1544;  // qt rows of R bytes: not a 16-byte multiple
  EXPECT_FALSE(route(r).tma);
  r.col.qt = false;  // no transposed codes: R does not matter
  EXPECT_TRUE(route(r).tma);
  r.C = 2056;  // q rows of C bytes
  EXPECT_FALSE(route(r).tma);
  r.C = 2048;
  r.row.q_align = 8;
  EXPECT_FALSE(route(r).tma);
  r.row.q_align = 16;
  r.col.qt = true;
  r.R = 1536;
  r.col.qt_align = 4;
  EXPECT_FALSE(route(r).tma);
  r.col.qt_align = 16;
  r.grouped = r.table = true;  // token groups: the pass kernel
  r.groups = 8;
  EXPECT_FALSE(route(r).tma);
  r.grouped = false;
  r.tile = false;  // activations
  r.row_block = r.col_block = 128;
  r.col.q = false;
  EXPECT_FALSE(route(r).tma);
}

TEST(QuantizeRoute, ToString) {
  auto r = request(16384, 2048);
  r.col_on = true;
  r.col_block = 32;
  r.col.dq = true;
  r.row_on = true;
  r.row_block = 32;
  r.row.q = r.row.scale = true;
  r.grouped = r.table = true;
  r.groups = 8;
  EXPECT_EQ(route(r).to_string(r),
            "quantize x=bf16 B=1 R=16384 C=2048 g=8 src=tensor row=1x32:q,scale col=32x1:dq -> kernel=warp pipe=1 "
            "budget=2");
  r.bf16 = false;
  EXPECT_EQ(route(r).to_string(r),
            "quantize x=f32 B=1 R=16384 C=2048 g=8 src=tensor row=1x32:q,scale col=32x1:dq -> kernel=slab");
}

}  // namespace
