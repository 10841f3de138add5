// Coverage-guided fuzz harness (libFuzzer) of the whole public C API, include/mxmoe/mxmoe.h, on
// the host (device -1; other device codes must be refused by a build without CUDA).
//
// Input layout: byte 0 picks the entry point; the rest feeds a FuzzedDataProvider that draws the
// problem dims, dtypes, optional tensors, config values, offsets contents and, per call, a
// "chaos" level that breaks one or more arguments (dtype / ndim / shape / stride / device / NULL /
// overlap). Every view the harness hands over describes real memory: each tensor gets its own
// allocation of exactly the bytes its shape and strides span (negative strides included: the data
// pointer then sits inside the allocation), or lies inside another tensor's allocation (overlap
// mode, only where it fits). So any access outside a view is an ASan report inside the library.
//
// Checks per call (a violated one is __builtin_trap(), which libFuzzer reports as a crash):
//   - the status is one of the mxmoe_status values;
//   - non-OK: mxmoe_last_error() is a non-empty string, and every byte of every buffer (outputs,
//     inputs, workspace) is as it was before the call (outputs are pre-filled with a pattern);
//   - OK: nothing was written outside the outputs' spans (inputs are const), no output span
//     overlaps an input span (the API promises to refuse that), and no tensor that the API
//     validates was on a device (this build has no CUDA), or had an invalid dtype code, ndim or
//     a negative size;
//   - mxmoe_check_offsets on a well-formed host view: OK exactly when the offsets are valid.
// Values on OK are not checked (the unit tests do), NaN/Inf in outputs are fine.
//
// Environment: MXMOE_FUZZ_SKIP=comma list of input classes to leave out, to look past a known
// finding (huge: zero-element views with huge dims; bigint: huge integers to the size/capacity
// functions and check_offsets' m; null0: NULL data on zero-element views; stream: non-NULL
// garbage streams); MXMOE_FUZZ_VERBOSE=1 prints every call (for minimizing a reproducer);
// MXMOE_FUZZ_ONLY=<op> fuzzes one entry point (the op numbers of LLVMFuzzerTestOneInput).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace {

// ---- knobs -------------------------------------------------------------------------------------

struct Knobs {
  bool huge = true, bigint = true, null0 = true, stream = true;
  bool verbose = false;
  int only = -1;  // fuzz one entry point (the op index of LLVMFuzzerTestOneInput), -1: all
};
Knobs g_knobs;

const char* g_op = "?";

[[noreturn]] void violation(const char* what, const std::string& detail) {
  std::fprintf(stderr, "\n==mxmoe_fuzz== CHECK FAILED in %s: %s\n  %s\n  mxmoe_last_error(): \"%s\"\n", g_op, what,
               detail.c_str(), mxmoe_last_error());
  std::fflush(stderr);
  __builtin_trap();
}
#define FUZZ_CHECK(cond, what, detail) \
  do {                                 \
    if (!(cond)) violation(what, detail); \
  } while (0)

// ---- saturating int64 arithmetic (huge dims must not overflow in the harness itself) ------------

using i128 = __int128;
constexpr int64_t kI64Max = INT64_MAX, kI64Min = INT64_MIN;
int64_t sat(i128 v) { return v > kI64Max ? kI64Max : v < kI64Min ? kI64Min : static_cast<int64_t>(v); }
int64_t smul(int64_t a, int64_t b) { return sat(static_cast<i128>(a) * b); }
int64_t sadd(int64_t a, int64_t b) { return sat(static_cast<i128>(a) + b); }
int64_t sceil(int64_t a, int64_t b) { return a >= 0 ? sat((static_cast<i128>(a) + b - 1) / b) : a / b; }
int64_t sround(int64_t a, int64_t b) { return smul(sceil(a, b), b); }

int64_t esize(mxmoe_dtype d) {
  switch (d) {
    case MXMOE_DTYPE_BF16: return 2;
    case MXMOE_DTYPE_F32: return 4;
    case MXMOE_DTYPE_E4M3: return 1;
    case MXMOE_DTYPE_E8M0: return 1;
    case MXMOE_DTYPE_I32: return 4;
    case MXMOE_DTYPE_F64: return 8;
    case MXMOE_DTYPE_I64: return 8;
    default: return 0;
  }
}
bool valid_dtype(mxmoe_dtype d) { return esize(d) != 0; }

// ---- limits ------------------------------------------------------------------------------------

constexpr int64_t kMaxBytes = int64_t{4} << 20;  // one allocation
constexpr int64_t kMaxElems = 64 * 1024;         // intended tensor size (non-huge dims)
constexpr int64_t kMaxMacs = int64_t{1} << 19;   // GEMM work per call (512K multiply-adds)

// ---- the arguments of one call -------------------------------------------------------------------

enum class Role {
  kIn,       // const input: never written
  kOut,      // output (or in/out): written only on OK, only inside its span
  kScratch,  // workspace: may be written on OK, not on error; not validated on the host
  kIgnored,  // an input the entry point documents as unused here (never validated, never written)
};

struct Arg {
  const char* name = "";
  Role role = Role::kIn;
  bool strided_ok = false;  // the API accepts any non-negative strides for it
  bool given = true;        // non-NULL pointer passed
  mxmoe_tensor t{};
  // materialization requests
  bool null_data = false;
  bool alias = false;
  uint32_t alias_pick = 0;
  // offsets contents (int32 1-D views): group ends for m rows
  bool is_offs = false;
  int64_t offs_m = 0;
  // index contents (int32 / int64 views): mostly in [0, index_hi), some just outside, some any value
  bool is_index = false;
  int64_t index_hi = 0;
  // result
  int alloc = -1;
};

struct Alloc {
  std::unique_ptr<uint8_t[]> p;
  int64_t n = 0;
  std::vector<uint8_t> snap;
  const char* owner = "";
};

void set_shape(mxmoe_tensor& t, const std::vector<int64_t>& shape) {
  t.ndim = static_cast<int32_t>(shape.size());
  for (int i = 0; i < MXMOE_MAX_DIMS; ++i) {
    t.shape[i] = 1;
    t.strides[i] = 1;
  }
  // Row-major strides as the API's contiguity sees them: the product of the later sizes, 0 past a
  // size-0 dim (torch would give max(size, 1) there, which the API calls non-contiguous).
  int64_t st = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[static_cast<size_t>(i)];
    t.strides[i] = st;
    st = smul(st, std::max<int64_t>(shape[static_cast<size_t>(i)], 0));
  }
}

// Contiguous strides for the first nd dims of t (dim `skip` counted as size 1).
void contiguous_strides(mxmoe_tensor& t, int nd, int skip = -1) {
  int64_t st = 1;
  for (int i = nd - 1; i >= 0; --i) {
    t.strides[i] = st;
    st = smul(st, i == skip ? 1 : std::max<int64_t>(t.shape[i], 0));
  }
}

int used_dims(const mxmoe_tensor& t) { return std::max(0, std::min<int>(t.ndim, MXMOE_MAX_DIMS)); }

// Memory a view describes, in elements relative to data: [lo, hi]; empty when a size is <= 0.
struct Foot {
  bool empty = true;
  int64_t lo = 0, hi = 0, es = 1, bytes = 0;
  bool fits = true;
};
Foot footprint(const mxmoe_tensor& t) {
  Foot f;
  const int nd = used_dims(t);
  f.es = valid_dtype(t.dtype) ? esize(t.dtype) : 8;  // unknown dtype: room for the widest
  for (int i = 0; i < nd; ++i)
    if (t.shape[i] <= 0) return f;
  i128 lo = 0, hi = 0;
  const i128 cap = static_cast<i128>(1) << 100;
  for (int i = 0; i < nd; ++i) {
    i128 e = static_cast<i128>(t.shape[i] - 1) * t.strides[i];
    e = std::max(-cap, std::min(cap, e));
    if (e < 0) lo += e;
    else hi += e;
  }
  const i128 bytes = (hi - lo + 1) * f.es;
  f.empty = false;
  f.fits = bytes <= kMaxBytes;
  if (f.fits) {
    f.lo = static_cast<int64_t>(lo);
    f.hi = static_cast<int64_t>(hi);
    f.bytes = static_cast<int64_t>(bytes);
  }
  return f;
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

class Call {
 public:
  explicit Call(FuzzedDataProvider& fdp) : fdp_(fdp) {
    rng_ = fdp_.ConsumeIntegral<uint64_t>();
    chaos_ = fdp_.ConsumeIntegral<uint8_t>();
    fill_mode_ = fdp_.ConsumeIntegralInRange<int>(0, 3);
    sentinel_ = fdp_.ConsumeIntegral<uint8_t>();
  }

  FuzzedDataProvider& fdp() { return fdp_; }
  uint64_t rnd() { return splitmix(rng_); }
  int pick(int lo, int hi) { return fdp_.ConsumeIntegralInRange<int>(lo, hi); }
  bool coin() { return fdp_.ConsumeBool(); }

  // A problem dimension: mostly multiples of 32 (what most entry points need), sometimes anything
  // up to ~300, empty, or (class "huge") a value no allocation could hold, for zero-element views.
  int64_t dim() {
    switch (pick(0, 9)) {
      case 0: case 1: case 2: return 32 * fdp_.ConsumeIntegralInRange<int64_t>(1, 8);
      case 3: return fdp_.ConsumeIntegralInRange<int64_t>(1, 300);
      case 4: return 128 * fdp_.ConsumeIntegralInRange<int64_t>(1, 3);
      case 5: return fdp_.ConsumeIntegralInRange<int64_t>(1, 8);
      case 6: return 16 * fdp_.ConsumeIntegralInRange<int64_t>(1, 16);
      case 7: return 0;
      case 8: return fdp_.ConsumeIntegralInRange<int64_t>(0, 300);
      default: return g_knobs.huge ? huge() : 32;
    }
  }
  int64_t huge() {
    static const int64_t kEdge[] = {kI64Max,         kI64Max - 1,          kI64Max - 31,         kI64Max / 32,
                                    kI64Max / 128,   int64_t{1} << 62,     int64_t{1} << 40,     INT32_MAX,
                                    int64_t{INT32_MAX} + 1, int64_t{INT32_MAX} * 32, int64_t{1} << 31, 1000000};
    if (coin()) return kEdge[pick(0, static_cast<int>(sizeof(kEdge) / sizeof(kEdge[0])) - 1)];
    return int64_t{1} << pick(16, 62);
  }
  int64_t groups() {
    switch (pick(0, 5)) {
      case 0: case 1: case 2: return fdp_.ConsumeIntegralInRange<int64_t>(1, 4);
      case 3: return fdp_.ConsumeIntegralInRange<int64_t>(1, 16);
      case 4: return 0;
      default: return fdp_.ConsumeIntegralInRange<int64_t>(1, 64);
    }
  }
  int64_t small_batch() { return pick(0, 7) == 0 ? 0 : pick(1, 3); }
  void* stream() {
    if (!g_knobs.stream || pick(0, 15) != 0) return nullptr;
    return reinterpret_cast<void*>(static_cast<uintptr_t>(0xdead0000u) | static_cast<uintptr_t>(pick(0, 255) << 4));
  }

  // Halve the largest non-zero dims until the product fits (multiples of 32 stay multiples of 32
  // where they can). Dims in a product with a zero are left alone: that tensor is empty.
  static void cap(std::vector<int64_t*> dims, int64_t limit) {
    for (int iter = 0; iter < 256; ++iter) {
      int64_t prod = 1;
      for (auto* d : dims) prod = smul(prod, std::max<int64_t>(*d, 0));
      if (prod <= limit) return;
      int64_t* big = dims[0];
      for (auto* d : dims)
        if (*d > *big) big = d;
      const bool m32 = *big % 32 == 0;
      *big /= 2;
      if (m32 && *big >= 32) *big -= *big % 32;
    }
  }

  Arg& add(const char* name, Role role, mxmoe_dtype dtype, const std::vector<int64_t>& shape, bool strided_ok,
           bool given = true) {
    args_.emplace_back();
    Arg& a = args_.back();
    a.name = name;
    a.role = role;
    a.strided_ok = strided_ok;
    a.given = given;
    a.t.dtype = dtype;
    a.t.device = -1;
    set_shape(a.t, shape);
    return a;
  }
  Arg& add_offs(const char* name, int64_t groups, int64_t m, bool given = true) {
    Arg& a = add(name, Role::kIn, MXMOE_DTYPE_I32, {groups}, true, given);
    a.is_offs = true;
    a.offs_m = m;
    return a;
  }
  Arg& add_index(const char* name, mxmoe_dtype dtype, const std::vector<int64_t>& shape, int64_t hi,
                 bool given = true) {
    Arg& a = add(name, Role::kIn, dtype, shape, false, given);
    a.is_index = true;
    a.index_hi = hi;
    return a;
  }
  static mxmoe_tensor* ptr(Arg& a) { return a.given ? &a.t : nullptr; }

  // Breaks arguments (chaos) and gives strided inputs their valid layout variants. Returns false
  // when the call cannot be backed by real memory (then it is skipped).
  bool prepare() {
    std::vector<Arg*> all;
    for (auto& a : args_) all.push_back(&a);
    for (Arg* a : all) {
      if (!a->given) continue;
      if (a->strided_ok) benign_layout(*a);
      else unit_dim_strides(*a);
    }
    if (chaos_ >= 128 && !all.empty()) {
      if (chaos_ < 224) {
        mutate(*all[static_cast<size_t>(pick(0, static_cast<int>(all.size()) - 1))]);
      } else {
        for (Arg* a : all)
          if (pick(0, 3) == 0) mutate(*a);
      }
    }
    for (Arg* a : all)
      if (!materialize(*a)) return false;
    for (Arg* a : all) fill_offs(*a);
    for (Arg* a : all) fill_index(*a);
    for (auto& al : allocs_) al->snap.assign(al->p.get(), al->p.get() + al->n);
    return true;
  }

  void verbose_dump(const char* extra = "") const {
    if (!g_knobs.verbose) return;
    std::fprintf(stderr, "[mxmoe_fuzz] %s %s\n", g_op, extra);
    for (const auto& a : args_) {
      if (!a.given) {
        std::fprintf(stderr, "  %-16s NULL\n", a.name);
        continue;
      }
      std::fprintf(stderr, "  %-16s dtype %d ndim %d shape [", a.name, static_cast<int>(a.t.dtype), a.t.ndim);
      for (int i = 0; i < used_dims(a.t); ++i) std::fprintf(stderr, "%s%" PRId64, i ? ", " : "", a.t.shape[i]);
      std::fprintf(stderr, "] strides [");
      for (int i = 0; i < used_dims(a.t); ++i) std::fprintf(stderr, "%s%" PRId64, i ? ", " : "", a.t.strides[i]);
      std::fprintf(stderr, "] device %d data %p alloc %d\n", a.t.device, a.t.data, a.alloc);
      if (a.is_offs && a.t.data && a.t.dtype == MXMOE_DTYPE_I32 && a.t.ndim == 1 && a.t.shape[0] > 0 &&
          a.t.shape[0] <= 64) {
        std::fprintf(stderr, "    offs (m=%" PRId64 "):", a.offs_m);
        for (int64_t i = 0; i < a.t.shape[0]; ++i)
          std::fprintf(stderr, " %d", static_cast<const int32_t*>(a.t.data)[i * a.t.strides[0]]);
        std::fprintf(stderr, "\n");
      }
    }
  }

  // The checks after a status-returning entry point.
  void check(mxmoe_status st) {
    const int s = static_cast<int>(st);
    if (g_knobs.verbose) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "-> status %d", s);
      verbose_dump(buf);
      std::fprintf(stderr, "  message: %s\n", mxmoe_last_error());
    }
    FUZZ_CHECK(s >= MXMOE_OK && s <= MXMOE_ERR_INTERNAL, "status is not an mxmoe_status value", std::to_string(s));
    FUZZ_CHECK(s != MXMOE_ERR_INTERNAL, "MXMOE_ERR_INTERNAL on the host (an exception escaped validation)",
               "status 4");
    if (st != MXMOE_OK) {
      const char* e = mxmoe_last_error();
      FUZZ_CHECK(e != nullptr && e[0] != '\0', "non-OK status with an empty mxmoe_last_error()",
                 "status " + std::to_string(s));
      for (auto& al : allocs_) {
        if (al->n == 0 || std::memcmp(al->p.get(), al->snap.data(), static_cast<size_t>(al->n)) == 0) continue;
        int64_t first = 0;
        while (al->p[first] == al->snap[first]) ++first;
        violation("a buffer was written by a call that failed",
                  std::string("buffer of '") + al->owner + "' (" + std::to_string(al->n) + " bytes) changed at byte " +
                      std::to_string(first) + "; status " + std::to_string(s));
      }
      return;
    }
    // OK: every tensor the API validates was a sane host view.
    for (const auto& a : args_) {
      if (!a.given || a.role == Role::kScratch || a.role == Role::kIgnored) continue;
      const std::string n = std::string("'") + a.name + "'";
      if (!mxmoe_has_cuda())
        FUZZ_CHECK(a.t.device == -1, "OK with a tensor on a device in a build without CUDA",
                   n + " device " + std::to_string(a.t.device));
      else
        FUZZ_CHECK(a.t.device >= -1, "OK with an invalid device code", n + " device " + std::to_string(a.t.device));
      FUZZ_CHECK(valid_dtype(a.t.dtype), "OK with an invalid dtype code",
                 n + " dtype " + std::to_string(static_cast<int>(a.t.dtype)));
      FUZZ_CHECK(a.t.ndim >= 0 && a.t.ndim <= MXMOE_MAX_DIMS, "OK with ndim out of range",
                 n + " ndim " + std::to_string(a.t.ndim));
      for (int i = 0; i < used_dims(a.t); ++i)
        FUZZ_CHECK(a.t.shape[i] >= 0, "OK with a negative size", n + " dim " + std::to_string(i));
    }
    // Writable bytes: the outputs' spans (and the workspace).
    std::vector<std::vector<uint8_t>> writable(allocs_.size());
    struct Span {
      int alloc;
      int64_t lo, hi;  // byte offsets in the allocation, [lo, hi)
      const Arg* arg;
    };
    std::vector<Span> outs, ins;
    for (const auto& a : args_) {
      if (!a.given || a.alloc < 0 || a.t.data == nullptr) continue;
      const Foot f = footprint(a.t);
      if (f.empty) continue;
      const Alloc& al = *allocs_[static_cast<size_t>(a.alloc)];
      const int64_t base = static_cast<const uint8_t*>(a.t.data) - al.p.get();
      Span sp{a.alloc, base + f.lo * f.es, base + (f.hi + 1) * f.es, &a};
      if (a.role == Role::kOut || a.role == Role::kScratch) {
        auto& w = writable[static_cast<size_t>(a.alloc)];
        if (w.empty()) w.assign(static_cast<size_t>(al.n), 0);
        std::fill(w.begin() + sp.lo, w.begin() + sp.hi, 1);
        if (a.role == Role::kOut) outs.push_back(sp);
      } else if (a.role == Role::kIn) {
        ins.push_back(sp);
      }
    }
    for (size_t k = 0; k < allocs_.size(); ++k) {
      const Alloc& al = *allocs_[k];
      if (al.n == 0 || std::memcmp(al.p.get(), al.snap.data(), static_cast<size_t>(al.n)) == 0) continue;
      for (int64_t i = 0; i < al.n; ++i)
        if (al.p[i] != al.snap[i] && (writable[k].empty() || !writable[k][static_cast<size_t>(i)]))
          violation("OK call wrote outside its outputs (into an input or between views)",
                    std::string("buffer of '") + al.owner + "' changed at byte " + std::to_string(i));
    }
    for (const auto& o : outs)
      for (const auto& in : ins)
        if (o.alloc == in.alloc && o.lo < in.hi && in.lo < o.hi)
          violation("OK with an output overlapping an input",
                    std::string("'") + o.arg->name + "' overlaps '" + in.arg->name + "'");
  }

  const std::deque<Arg>& args() const { return args_; }

 private:
  // Valid layouts for inputs that accept any strides: transposed, padded, broadcast (stride 0),
  // huge stride on a size-1 dim. Same shape, so the call stays valid.
  void benign_layout(Arg& a) {
    const int nd = used_dims(a.t);
    if (nd == 0) return;
    switch (pick(0, 9)) {
      case 5: layout_transposed(a.t); break;
      case 6: layout_padded(a.t, pick(1, 40)); break;
      case 7: layout_zero_stride(a.t, pick(0, nd - 1)); break;
      case 8: layout_huge_stride_on_unit(a.t); break;
      case 9: layout_padded(a.t, pick(1, 4) * 16); break;
      default: break;  // contiguous
    }
  }
  // Views that must be contiguous may still have any stride on a size-1 dim (the API's contiguity
  // ignores those, as torch does): 0, 7 or huge there, now and then.
  void unit_dim_strides(Arg& a) {
    if (pick(0, 7) != 0) return;
    for (int i = 0; i < used_dims(a.t); ++i)
      if (a.t.shape[i] == 1) {
        static const int64_t kOdd[] = {0, 7, int64_t{1} << 40, kI64Max};
        a.t.strides[i] = kOdd[pick(0, 3)];
      }
  }
  static void layout_transposed(mxmoe_tensor& t) {
    const int nd = used_dims(t);
    if (nd < 2) {
      if (nd == 1) t.strides[0] = 2;  // every other element
      return;
    }
    // the last two dims stored column-major
    const int r = nd - 2, c = nd - 1;
    t.strides[r] = 1;
    t.strides[c] = std::max<int64_t>(t.shape[r], 1);
    int64_t st = smul(t.strides[c], std::max<int64_t>(t.shape[c], 1));
    for (int i = r - 1; i >= 0; --i) {
      t.strides[i] = st;
      st = smul(st, std::max<int64_t>(t.shape[i], 1));
    }
  }
  static void layout_padded(mxmoe_tensor& t, int64_t pad) {
    const int nd = used_dims(t);
    if (nd == 0) return;
    if (nd == 1) {
      t.strides[0] = 1 + pad;
      return;
    }
    int64_t st = sadd(std::max<int64_t>(t.shape[nd - 1], 1), pad);
    t.strides[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; --i) {
      t.strides[i] = st;
      st = smul(st, std::max<int64_t>(t.shape[i], 1));
    }
  }
  static void layout_zero_stride(mxmoe_tensor& t, int d) {
    contiguous_strides(t, used_dims(t), d);
    t.strides[d] = 0;
  }
  void layout_huge_stride_on_unit(mxmoe_tensor& t) {
    for (int i = 0; i < used_dims(t); ++i)
      if (t.shape[i] == 1) {
        t.strides[i] = pick(0, 1) ? kI64Max : (int64_t{1} << pick(20, 61));
        return;
      }
  }

  void mutate(Arg& a) {
    mxmoe_tensor& t = a.t;
    const int nd = std::max(1, used_dims(t));
    const int d = pick(0, nd - 1);
    switch (pick(0, 17)) {
      case 0: t.dtype = static_cast<mxmoe_dtype>(pick(0, 5)); break;
      case 1: {
        static const int32_t kBad[] = {-1, 7, 8, 255, INT32_MIN, INT32_MAX};
        t.dtype = static_cast<mxmoe_dtype>(coin() ? kBad[pick(0, 5)] : fdp_.ConsumeIntegral<int32_t>());
        break;
      }
      case 2: {
        static const int32_t kNd[] = {-1, 0, 1, 2, 3, 4, 5, 8, INT32_MIN, INT32_MAX};
        t.ndim = coin() ? kNd[pick(0, 9)] : fdp_.ConsumeIntegral<int32_t>();
        break;
      }
      case 3: case 4: {  // one size changed, strides re-derived (contiguous)
        int64_t& s = t.shape[d];
        switch (pick(0, 10)) {
          case 0: s = sadd(s, 1); break;
          case 1: s = sadd(s, -1); break;  // saturating: s may be INT64_MIN here (case 8)
          case 2: s = 0; break;
          case 3: s = smul(s, 2); break;
          case 4: s = s / 2; break;
          case 5: s = 1; break;
          case 6: s = pick(0, 300); break;
          case 7: s = -1; break;
          case 8: s = kI64Min; break;
          case 9: s = g_knobs.huge ? huge() : 33; break;
          default: s = sadd(s, 32); break;
        }
        contiguous_strides(t, used_dims(t));
        break;
      }
      case 5:  // negative stride (saturating: -INT64_MIN does not exist)
        t.strides[d] = t.strides[d] == 0 ? -1 : (t.strides[d] == kI64Min ? kI64Max : -t.strides[d]);
        break;
      case 6: layout_zero_stride(t, d); break;                                   // overlapping elements
      case 7: layout_transposed(t); break;
      case 8: layout_padded(t, pick(1, 64)); break;
      case 9: t.strides[d] = coin() ? kI64Max : (int64_t{1} << pick(16, 62)); break;  // huge stride
      case 10: {
        static const int32_t kDev[] = {0, 1, 7, -2, -3, INT32_MIN, INT32_MAX};
        t.device = coin() ? kDev[pick(0, 6)] : fdp_.ConsumeIntegral<int32_t>();
        break;
      }
      case 11: a.given = !a.given; break;  // NULL tensor, or an absent optional given
      case 12: a.null_data = true; break;
      case 13:
        a.alias = true;
        a.alias_pick = fdp_.ConsumeIntegral<uint32_t>();
        break;
      case 14: {  // leading unit dim added / leading dim dropped
        std::vector<int64_t> s(t.shape, t.shape + used_dims(t));
        if (coin() || s.empty()) s.insert(s.begin(), 1);
        else s.erase(s.begin());
        if (s.size() <= MXMOE_MAX_DIMS) set_shape(t, s);
        break;
      }
      case 15: {  // last two sizes swapped
        const int n = used_dims(t);
        if (n >= 2) std::swap(t.shape[n - 1], t.shape[n - 2]);
        contiguous_strides(t, n);
        break;
      }
      case 16: t.strides[d] = pick(-4, 300); break;
      default:  // two things at once
        mutate(a);
        mutate(a);
        break;
    }
  }

  int new_alloc(int64_t bytes, const char* owner) {
    auto al = std::make_unique<Alloc>();
    al->p.reset(new uint8_t[static_cast<size_t>(bytes)]);
    al->n = bytes;
    al->owner = owner;
    allocs_.push_back(std::move(al));
    return static_cast<int>(allocs_.size()) - 1;
  }

  void fill_input(Alloc& al, mxmoe_dtype dt) {
    uint8_t* p = al.p.get();
    const int64_t n = al.n;
    if (dt == MXMOE_DTYPE_F32 || dt == MXMOE_DTYPE_BF16) {
      const bool bf = dt == MXMOE_DTYPE_BF16;
      const int64_t es = bf ? 2 : 4;
      for (int64_t i = 0; i + es <= n; i += es) {
        uint32_t u;
        const uint64_t r = rnd();
        switch (fill_mode_) {
          case 0: {  // moderate normals: exponent within 2^-24 .. 2^24
            const uint32_t e = 127 - 24 + static_cast<uint32_t>(r % 49);
            u = (static_cast<uint32_t>(r >> 8) & 0x807FFFFFu) | (e << 23);
            break;
          }
          case 1: u = static_cast<uint32_t>(r); break;  // any bits: NaN, Inf, subnormals
          case 2: {
            static const uint32_t kSpecial[] = {0x7FC00000u, 0xFF800000u, 0x7F800000u, 0x00000000u, 0x80000000u,
                                                0x7F7FFFFFu, 0x00000001u, 0x43E00000u, 0x43E80000u, 0x3C800000u,
                                                0x00400000u, 0xFFFFFFFFu};
            u = (r & 7) == 0 ? kSpecial[(r >> 3) % 12] : ((static_cast<uint32_t>(r >> 8) & 0x807FFFFFu) | (120u << 23));
            break;
          }
          default: u = 0; break;
        }
        if (bf) {
          const uint16_t h = static_cast<uint16_t>(u >> 16);
          std::memcpy(p + i, &h, 2);
        } else {
          std::memcpy(p + i, &u, 4);
        }
      }
      for (int64_t i = n - n % es; i < n; ++i) p[i] = static_cast<uint8_t>(rnd());
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t r = rnd();
      // scale bytes near unit scale (127) most of the time, any byte (0 and NaN 255 included) else
      p[i] = dt == MXMOE_DTYPE_E8M0 && fill_mode_ != 1 && (r & 3) != 0 ? static_cast<uint8_t>(112 + (r >> 8) % 32)
                                                                       : static_cast<uint8_t>(r >> 16);
    }
  }

  bool materialize(Arg& a) {
    if (!a.given) return true;
    Foot f = footprint(a.t);
    if (!f.fits) {
      // The view could not be backed by memory: fall back to contiguous strides, else skip.
      contiguous_strides(a.t, used_dims(a.t));
      f = footprint(a.t);
      if (!f.fits) return false;
    }
    const bool zero = f.empty;
    if (a.null_data && (!zero || g_knobs.null0)) {
      a.t.data = nullptr;
      return true;
    }
    // Overlap: inside an existing allocation where the whole view fits.
    if (a.alias && !allocs_.empty()) {
      const int k = static_cast<int>(a.alias_pick % allocs_.size());
      Alloc& al = *allocs_[static_cast<size_t>(k)];
      if (f.bytes <= al.n) {
        const int64_t slots = (al.n - f.bytes) / f.es + 1;
        const int64_t off = static_cast<int64_t>((a.alias_pick / 7) % static_cast<uint64_t>(slots)) * f.es;
        a.t.data = al.p.get() + off + (-f.lo) * f.es;
        a.alloc = k;
        return true;
      }
    }
    a.alloc = new_alloc(f.bytes, a.name);
    Alloc& al = *allocs_.back();
    if (a.role == Role::kIn || a.role == Role::kIgnored) {
      fill_input(al, a.t.dtype);
    } else {
      for (int64_t i = 0; i < al.n; ++i) al.p[i] = static_cast<uint8_t>(sentinel_ + i * 167 + (i >> 8));
    }
    a.t.data = al.p.get() + (-f.lo) * f.es;
    return true;
  }

  // Offsets contents: valid cumulative ends, random, non-monotonic, negative, > m, int32 extremes.
  void fill_offs(Arg& a) {
    if (!a.is_offs || !a.given || a.t.data == nullptr || a.alloc < 0) return;
    if (a.t.dtype != MXMOE_DTYPE_I32 || a.t.ndim != 1 || a.t.shape[0] <= 0 || a.t.shape[0] > 4096) return;
    const int64_t G = a.t.shape[0];
    const int64_t m = std::min<int64_t>(std::max<int64_t>(a.offs_m, 0), INT32_MAX);
    std::vector<int64_t> v(static_cast<size_t>(G));
    const int mode = pick(0, 7);
    auto in = [&](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
      return lo + static_cast<int64_t>(rnd() % static_cast<uint64_t>(hi - lo + 1));
    };
    for (int64_t i = 0; i < G; ++i) {
      switch (mode) {
        case 0: case 1: case 2: v[i] = in(0, m); break;
        case 3: v[i] = in(-3, m + 40); break;
        case 4: v[i] = static_cast<int32_t>(rnd()); break;
        case 5: v[i] = (rnd() & 1) ? m : 0; break;
        case 6: v[i] = (rnd() % 4 == 0) ? (static_cast<int64_t>(rnd() & 1) ? INT32_MIN : INT32_MAX) : in(0, m); break;
        default: v[i] = in(0, m); break;
      }
    }
    if (mode <= 2 || mode == 6 || mode == 7) std::sort(v.begin(), v.end());
    if (mode == 0) v.back() = m;                                          // groups cover all rows
    if (mode == 7 && G >= 2) std::swap(v[static_cast<size_t>(in(0, G - 2))], v.back());  // one decrease
    int32_t* p = static_cast<int32_t*>(a.t.data);
    for (int64_t i = 0; i < G; ++i) {
      const int32_t x = static_cast<int32_t>(std::max<int64_t>(INT32_MIN, std::min<int64_t>(INT32_MAX, v[i])));
      std::memcpy(p + i * a.t.strides[0], &x, 4);
    }
  }

  void fill_index(Arg& a) {
    if (!a.is_index || !a.given || a.t.data == nullptr || a.alloc < 0) return;
    const bool i64 = a.t.dtype == MXMOE_DTYPE_I64;
    if ((!i64 && a.t.dtype != MXMOE_DTYPE_I32) || a.t.ndim < 1 || a.t.ndim > 2) return;
    const int64_t rows = a.t.shape[0], cols = a.t.ndim == 2 ? a.t.shape[1] : 1;
    if (rows <= 0 || cols <= 0) return;
    const int mode = pick(0, 7);  // 0-4 in range, 5 in range or just outside, 6 any value, 7 all the same
    const int64_t hi = std::max<int64_t>(a.index_hi, 1);
    const int64_t same = static_cast<int64_t>(rnd() % static_cast<uint64_t>(hi));
    // A view with a zero stride revisits its memory: fill the memory once, as a flat run of its
    // elements, instead of every logical element (a huge broadcast dim took forever: a timeout).
    const Foot f = footprint(a.t);
    const int64_t distinct = f.bytes / f.es;
    const bool flat = rows > distinct / cols;
    const int64_t n_rows = flat ? distinct : rows, n_cols = flat ? 1 : cols;
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t c = 0; c < n_cols; ++c) {
        const uint64_t x = rnd();
        int64_t v = static_cast<int64_t>(x % static_cast<uint64_t>(hi));
        // Just outside [0, hi): below 0, or at hi and past it (hi itself when hi + d would overflow).
        const int64_t d = static_cast<int64_t>((x >> 43) % 3);
        if (mode == 5 && (x >> 40) % 4 == 0)
          v = (x >> 42) & 1 ? -1 - d : (hi <= std::numeric_limits<int64_t>::max() - d ? hi + d : hi);
        if (mode == 6) v = i64 ? static_cast<int64_t>(x) : static_cast<int32_t>(x);
        if (mode == 7) v = same;
        uint8_t* base = static_cast<uint8_t*>(a.t.data);
        const int64_t off = flat ? f.lo + r : r * a.t.strides[0] + (a.t.ndim == 2 ? c * a.t.strides[1] : 0);
        if (i64) {
          std::memcpy(base + off * 8, &v, 8);
        } else {
          const int32_t w = static_cast<int32_t>(v);
          std::memcpy(base + off * 4, &w, 4);
        }
      }
  }

  FuzzedDataProvider& fdp_;
  uint64_t rng_;
  uint8_t chaos_;
  int fill_mode_;
  uint8_t sentinel_;
  std::deque<Arg> args_;
  std::vector<std::unique_ptr<Alloc>> allocs_;
};

mxmoe_dtype float_dtype(Call& c) { return c.coin() ? MXMOE_DTYPE_F32 : MXMOE_DTYPE_BF16; }

mxmoe_scale_mode scale_mode(Call& c) {
  const int m = c.pick(0, 8);
  if (m < 4) return static_cast<mxmoe_scale_mode>(m);
  if (m < 8) return MXMOE_SCALE_RCEIL;
  return static_cast<mxmoe_scale_mode>(c.fdp().ConsumeIntegral<int32_t>());
}

std::vector<int64_t> batched(bool three, int64_t b, std::vector<int64_t> tail) {
  if (three) tail.insert(tail.begin(), b);
  return tail;
}

// ---- entry points --------------------------------------------------------------------------------

void op_codecs(FuzzedDataProvider& fdp) {
  g_op = "scalar codecs";
  FUZZ_CHECK(mxmoe_version() != nullptr && mxmoe_version()[0] != '\0', "mxmoe_version() empty", "");
  const int hc = mxmoe_has_cuda();
  FUZZ_CHECK(hc == 0 || hc == 1, "mxmoe_has_cuda() not 0/1", std::to_string(hc));
  const int ht = mxmoe_has_tile128_gemm();
  FUZZ_CHECK(ht == 0 || ht == hc, "mxmoe_has_tile128_gemm() not 0 or has_cuda()", std::to_string(ht));
  FUZZ_CHECK(mxmoe_last_error() != nullptr, "mxmoe_last_error() NULL", "");
  for (int i = 0; i < 16 && fdp.remaining_bytes() > 0; ++i) {
    const uint32_t bits = fdp.ConsumeIntegral<uint32_t>();
    const float f = f32_of(bits);
    const int32_t mode = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<int32_t>(0, 3) : fdp.ConsumeIntegral<int32_t>();
    const uint8_t s = mxmoe_e8m0_from_amax(f, static_cast<mxmoe_scale_mode>(mode));
    (void)mxmoe_e8m0_to_float(s);
    (void)mxmoe_e8m0_to_float(static_cast<uint8_t>(bits));
    const uint8_t q = mxmoe_e4m3_from_float(f);
    (void)mxmoe_e4m3_to_float(q);
    (void)mxmoe_e4m3_to_float(static_cast<uint8_t>(bits >> 8));
  }
}

int64_t big_or_small(FuzzedDataProvider& fdp, Call& c) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: case 1: return fdp.ConsumeIntegralInRange<int64_t>(0, 4096);
    case 2: return fdp.ConsumeIntegralInRange<int64_t>(-64, 64);
    case 3: return g_knobs.bigint ? fdp.ConsumeIntegral<int64_t>() : 7;
    case 4: return g_knobs.bigint ? c.huge() : 300;
    default: return g_knobs.bigint ? -c.huge() : -1;
  }
}

void op_sizes(FuzzedDataProvider& fdp, int which) {
  Call c(fdp);
  const int64_t m = big_or_small(fdp, c), n = big_or_small(fdp, c), k = big_or_small(fdp, c),
                g = big_or_small(fdp, c);
  if (g_knobs.verbose)
    std::fprintf(stderr, "[mxmoe_fuzz] sizes(%d): m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " g=%" PRId64 "\n", which, m,
                 n, k, g);
  if (which == 0) {
    g_op = "mxmoe_grouped_scale_capacity";
    const int64_t cap = mxmoe_grouped_scale_capacity(m, g);
    if (m >= 0 && m <= (int64_t{1} << 40) && g >= 0 && g <= (int64_t{1} << 40))
      FUZZ_CHECK(cap == (m + 31) / 32 + g, "capacity is not ceil(m/32) + g",
                 std::to_string(m) + ", " + std::to_string(g) + " -> " + std::to_string(cap));
    return;
  }
  if (which == 1) {
    g_op = "mxmoe_blocked_size";
    const int32_t kind = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<int32_t>(0, 3) : fdp.ConsumeIntegral<int32_t>();
    if (g_knobs.verbose) std::fprintf(stderr, "  blocked_size(kind=%d, h=m, w=n, g)\n", kind);
    (void)mxmoe_blocked_size(static_cast<mxmoe_blocked_kind>(kind), m, n, g);
    return;
  }
  static const int32_t kDev[] = {-1, -1, -1, 0, 1, 3, -2, INT32_MIN, INT32_MAX};
  const int32_t dev = fdp.ConsumeBool() ? kDev[fdp.ConsumeIntegralInRange<int>(0, 8)] : fdp.ConsumeIntegral<int32_t>();
  int64_t r;
  if (which == 2) {
    g_op = "mxmoe_grouped_mm_tile128_workspace_size";
    r = mxmoe_grouped_mm_tile128_workspace_size(m, n, k, g, dev);
  } else {
    g_op = "mxmoe_grouped_mm_tile128_kgroups_workspace_size";
    r = mxmoe_grouped_mm_tile128_kgroups_workspace_size(m, n, k, g, dev);
  }
  const std::string args = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                           " g=" + std::to_string(g) + " device=" + std::to_string(dev) + " -> " + std::to_string(r);
  FUZZ_CHECK(r >= -1, "workspace size below -1", args);
  if (r == -1) FUZZ_CHECK(mxmoe_last_error()[0] != '\0', "workspace size -1 with an empty message", args);
  if (!mxmoe_has_cuda() && dev >= 0) FUZZ_CHECK(r == -1, "workspace size for a device in a build without CUDA", args);
  if (m < 0 || n < 0 || k < 0 || g < 0) FUZZ_CHECK(r == -1, "workspace size for negative shapes", args);
  // The configuration query of the same shapes (pure host logic, answered in every build): text only
  // on success, NUL-terminated within len.
  g_op = "mxmoe_sm90_gemm_config";
  const auto out = static_cast<mxmoe_dtype>(fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<int32_t>(-1, 7) : MXMOE_DTYPE_BF16);
  char text[MXMOE_CONFIG_TEXT_MAX];
  std::memset(text, 0x5A, sizeof text);
  const size_t len = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<size_t>(0, sizeof text) : sizeof text;
  const mxmoe_status st = mxmoe_sm90_gemm_config(which - 2, m, n, k, g, out, text, len);
  const std::string cargs = args + " out_dtype=" + std::to_string(out) + " len=" + std::to_string(len);
  FUZZ_CHECK(st == MXMOE_OK || st == MXMOE_ERR_INVALID_ARGUMENT, "config query: unexpected status", cargs);
  if (st == MXMOE_OK) {
    FUZZ_CHECK(std::memchr(text, 0, len) != nullptr && std::strncmp(text, "gemm sm90 pass=", 15) == 0,
               "config query: no NUL-terminated config text", cargs);
    for (size_t i = std::strlen(text) + 1; i < sizeof text; ++i)
      FUZZ_CHECK(text[i] == 0x5A, "config query wrote past its text", cargs);
  } else {
    FUZZ_CHECK(mxmoe_last_error()[0] != '\0', "config query failed with an empty message", cargs);
    for (char ch : text) FUZZ_CHECK(ch == 0x5A, "config query wrote into buf on error", cargs);
  }
  if (m < 0 || n < 0 || k < 0 || g < 0) FUZZ_CHECK(st != MXMOE_OK, "config query for negative shapes", cargs);
}

void op_quantize(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_quantize";
  Call c(fdp);
  const bool three = c.pick(0, 3) == 3;
  int64_t B = three ? c.small_batch() : 1, R = c.dim(), C = c.dim();
  const bool with_offs = three ? c.pick(0, 7) == 0 : c.coin();
  const int64_t G = with_offs ? c.groups() : 0;
  static const int32_t kBlocks[5][2] = {{1, 32}, {1, 128}, {32, 1}, {128, 1}, {128, 128}};
  mxmoe_quant_config cfg{};
  const int bi = c.pick(0, 5);
  if (bi < 5) {
    cfg.block_r = kBlocks[bi][0];
    cfg.block_c = kBlocks[bi][1];
  } else {
    static const int32_t kAny[] = {0, 1, 16, 32, 64, 128, 256, -1, -32, INT32_MIN, INT32_MAX};
    cfg.block_r = kAny[c.pick(0, 10)];
    cfg.block_c = kAny[c.pick(0, 10)];
  }
  cfg.mode = scale_mode(c);
  Call::cap({&B, &R, &C}, kMaxElems);
  const bool along_c = cfg.block_c > 1, along_r = cfg.block_r > 1;
  const int64_t n_r = with_offs ? sadd(sceil(R, 32), G) : R / 32;
  bool want_q = c.coin(), want_qt = c.coin();
  if (!want_q && !want_qt) want_q = true;
  bool want_sc = along_c, want_sr = along_r;
  if (along_c && along_r) {  // 128x128: scale_c and/or scale_r
    const int w = c.pick(0, 2);
    want_sc = w != 1;
    want_sr = w != 0;
  }
  Arg& x = c.add("x", Role::kIn, float_dtype(c), batched(three, B, {R, C}), true);
  Arg& offs = c.add_offs("offs", G, R, with_offs);
  Arg& q = c.add("q", Role::kOut, MXMOE_DTYPE_E4M3, batched(three, B, {R, C}), false, want_q);
  Arg& qt = c.add("qt", Role::kOut, MXMOE_DTYPE_E4M3, batched(three, B, {C, R}), false, want_qt);
  Arg& sc = c.add("scale_c", Role::kOut, MXMOE_DTYPE_E8M0, batched(three, B, {R, C / 32}), false, want_sc);
  Arg& sr = c.add("scale_r", Role::kOut, MXMOE_DTYPE_E8M0, batched(three, B, {C, n_r}), false, want_sr);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_quantize(Call::ptr(x), Call::ptr(offs), cfg, Call::ptr(q), Call::ptr(qt), Call::ptr(sc),
                         Call::ptr(sr), stream));
}

void op_dequantize(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_dequantize";
  Call c(fdp);
  const bool three = c.pick(0, 3) == 3;
  int64_t B = three ? c.small_batch() : 1, R = c.dim(), C = c.dim();
  const int ax = c.pick(0, 8);
  const int32_t axis = ax < 4 ? 1 : ax < 8 ? 0 : c.fdp().ConsumeIntegral<int32_t>();
  const bool with_offs = three ? c.pick(0, 7) == 0 : c.coin();
  const int64_t G = with_offs ? c.groups() : 0;
  Call::cap({&B, &R, &C}, kMaxElems);
  const int64_t len = axis == 0 ? R : C;
  const int64_t n = with_offs ? sadd(sceil(len, 32), G) : len / 32;
  Arg& q = c.add("q", Role::kIn, MXMOE_DTYPE_E4M3, batched(three, B, {R, C}), true);
  Arg& scale = c.add("scale", Role::kIn, MXMOE_DTYPE_E8M0, batched(three, B, {axis == 0 ? C : R, n}), true);
  Arg& offs = c.add_offs("offs", G, len, with_offs);
  Arg& out = c.add("out", Role::kOut, float_dtype(c), batched(three, B, {R, C}), false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_dequantize(Call::ptr(q), Call::ptr(scale), axis, Call::ptr(offs), Call::ptr(out), stream));
}

void op_blocked(FuzzedDataProvider& fdp, bool to) {
  g_op = to ? "mxmoe_scales_to_blocked" : "mxmoe_scales_from_blocked";
  Call c(fdp);
  const int ki = c.pick(0, 4);
  const int32_t kind = ki < 4 ? ki : c.fdp().ConsumeIntegral<int32_t>();
  int64_t H = c.dim(), W = c.dim(), E = c.small_batch(), M = c.dim();
  const int64_t G = c.groups();
  std::vector<int64_t> sshape;
  int64_t size = 0, offs_m = H;
  switch (kind) {
    case MXMOE_BLOCKED_WHOLE:
      Call::cap({&H, &W}, kMaxElems);
      sshape = {H, W};
      size = smul(sround(H, 128), sround(W, 4));
      break;
    case MXMOE_BLOCKED_GROUPS_M:
      Call::cap({&H, &W}, kMaxElems);
      sshape = {H, W};
      size = smul(sadd(H, smul(128, G)), sround(W, 4));
      break;
    case MXMOE_BLOCKED_GROUPS_K: {
      Call::cap({&H, &M}, kMaxElems);
      const int64_t cap = sadd(sceil(M, 32), G);
      sshape = {H, cap};
      size = smul(sround(H, 128), sadd(sceil(M, 32), smul(4, G)));
      offs_m = M;
      break;
    }
    case MXMOE_BLOCKED_PER_EXPERT:
      Call::cap({&E, &H, &W}, kMaxElems);
      sshape = {E, H, W};
      size = smul(E, smul(sround(H, 128), sround(W, 4)));
      break;
    default:
      Call::cap({&H, &W}, kMaxElems);
      sshape = {H, W};
      size = smul(sround(H, 128), sround(W, 4));
      break;
  }
  if (size > kMaxBytes) size = c.coin() ? 4096 : 0;  // a view of that size cannot be made: a wrong one
  const bool grouped = kind == MXMOE_BLOCKED_GROUPS_M || kind == MXMOE_BLOCKED_GROUPS_K;
  const bool with_offs = grouped ? c.pick(0, 15) != 0 : c.pick(0, 3) == 0;
  Arg& scale = c.add("scale", to ? Role::kIn : Role::kOut, MXMOE_DTYPE_E8M0, sshape, false);
  Arg& offs = c.add_offs("offs", G, offs_m, with_offs);
  if (!grouped) offs.role = Role::kIgnored;  // documented as unused for WHOLE / PER_EXPERT
  Arg& blocked = c.add("blocked", to ? Role::kOut : Role::kIn, MXMOE_DTYPE_E8M0, {size}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  const auto k = static_cast<mxmoe_blocked_kind>(kind);
  if (to)
    c.check(mxmoe_scales_to_blocked(Call::ptr(scale), k, Call::ptr(offs), Call::ptr(blocked), stream));
  else
    c.check(mxmoe_scales_from_blocked(Call::ptr(blocked), k, Call::ptr(offs), Call::ptr(scale), stream));
}

void op_gemm(FuzzedDataProvider& fdp, bool tile128) {
  g_op = tile128 ? "mxmoe_grouped_mm_tile128" : "mxmoe_grouped_mm_mx";
  Call c(fdp);
  int64_t M = c.dim(), K = c.dim(), N = c.dim(), G = c.groups();
  if (G > 32) G = 32;
  // work: M*N*K plus one dequantized B (N*K) per group
  int64_t GK = G + 1;
  Call::cap({&M, &N, &K}, kMaxMacs);
  Call::cap({&GK, &N, &K}, kMaxMacs);
  G = std::min(G, GK);
  const bool with_bias = c.coin();
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_E4M3, {M, K}, true);
  Arg& as = c.add("a_scale", Role::kIn, MXMOE_DTYPE_E8M0, {M, K / 32}, true);
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_E4M3, {G, N, K}, true);
  Arg& bs = c.add("b_scale", Role::kIn, MXMOE_DTYPE_E8M0, {G, N, K / 32}, true);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& bias = c.add("bias", Role::kIn, float_dtype(c), {G, N}, true, with_bias);
  Arg& out = c.add("out", Role::kOut, float_dtype(c), {M, N}, false);
  Arg* ws = nullptr;
  if (tile128) {
    ws = &c.add("workspace", Role::kScratch, MXMOE_DTYPE_E8M0, {static_cast<int64_t>(c.pick(0, 4096))}, false,
                c.coin());
  }
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  if (tile128)
    c.check(mxmoe_grouped_mm_tile128(Call::ptr(a), Call::ptr(as), Call::ptr(b), Call::ptr(bs), Call::ptr(offs),
                                     Call::ptr(bias), Call::ptr(out), Call::ptr(*ws), stream));
  else
    c.check(mxmoe_grouped_mm_mx(Call::ptr(a), Call::ptr(as), Call::ptr(b), Call::ptr(bs), Call::ptr(offs),
                                Call::ptr(bias), Call::ptr(out), stream));
}

void op_gemm_kgroups(FuzzedDataProvider& fdp, bool tile128) {
  g_op = tile128 ? "mxmoe_grouped_mm_tile128_kgroups" : "mxmoe_grouped_mm_mx_kgroups";
  Call c(fdp);
  int64_t N = c.dim(), M = c.dim(), K = c.dim(), G = c.groups();
  Call::cap({&N, &M, &K}, kMaxMacs);
  int64_t GNK = G;
  Call::cap({&GNK, &N, &K}, kMaxElems);
  G = std::min(G, GNK);
  const int64_t cap = sadd(sceil(M, 32), G);
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_E4M3, {N, M}, true);
  Arg& as = c.add("a_scale", Role::kIn, MXMOE_DTYPE_E8M0, {N, cap}, true);
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_E4M3, {K, M}, true);
  Arg& bs = c.add("b_scale", Role::kIn, MXMOE_DTYPE_E8M0, {K, cap}, true);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& out = c.add("out", Role::kOut, float_dtype(c), {G, N, K}, false);
  Arg* ws = nullptr;
  bool in_place = false;
  if (tile128) {
    ws = &c.add("workspace", Role::kScratch, MXMOE_DTYPE_E8M0, {static_cast<int64_t>(c.pick(0, 4096))}, false,
                c.coin());
    in_place = c.coin();
  }
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  if (tile128) {
    // The workspace query for these operands reads the call's arguments (no workspace, no stream):
    // a size, 0 for host operands, or -1 with a message; it writes nothing (the call's checks follow).
    g_op = "mxmoe_grouped_mm_tile128_kgroups_workspace_size_for";
    const int32_t ip = in_place ? 1 : c.coin() ? 0 : static_cast<int32_t>(c.pick(0, 4)) - 1;
    const int64_t need = mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(
        Call::ptr(a), Call::ptr(as), Call::ptr(b), Call::ptr(bs), Call::ptr(offs), Call::ptr(out), ip);
    FUZZ_CHECK(need >= -1, "workspace size below -1", std::to_string(need));
    if (need == -1) FUZZ_CHECK(mxmoe_last_error()[0] != '\0', "workspace size -1 with an empty message", "");
    if (ip != 0 && ip != 1) FUZZ_CHECK(need == -1, "workspace size for in_place not 0 or 1", std::to_string(ip));
    g_op = in_place ? "mxmoe_grouped_mm_tile128_kgroups_in_place" : "mxmoe_grouped_mm_tile128_kgroups";
  }
  if (in_place)
    c.check(mxmoe_grouped_mm_tile128_kgroups_in_place(Call::ptr(a), Call::ptr(as), Call::ptr(b), Call::ptr(bs),
                                                      Call::ptr(offs), Call::ptr(out), Call::ptr(*ws), stream));
  else if (tile128)
    c.check(mxmoe_grouped_mm_tile128_kgroups(Call::ptr(a), Call::ptr(as), Call::ptr(b), Call::ptr(bs),
                                             Call::ptr(offs), Call::ptr(out), Call::ptr(*ws), stream));
  else
    c.check(mxmoe_grouped_mm_mx_kgroups(Call::ptr(a), Call::ptr(as), Call::ptr(b), Call::ptr(bs), Call::ptr(offs),
                                        Call::ptr(out), stream));
}

void op_zero_rows(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_zero_rows_past_groups";
  Call c(fdp);
  int64_t M = c.dim(), N = c.dim();
  const int64_t G = c.groups();
  Call::cap({&M, &N}, kMaxElems);
  Arg& x = c.add("x", Role::kOut, float_dtype(c), {M, N}, false);  // in/out
  Arg& offs = c.add_offs("offs", G, M);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_zero_rows_past_groups(Call::ptr(x), Call::ptr(offs), stream));
}

void op_check_offsets(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_check_offsets";
  Call c(fdp);
  const int64_t G = c.groups();
  int64_t m = c.dim();
  const int mm = c.pick(0, 7);
  if (mm == 6) m = -static_cast<int64_t>(c.pick(1, 40));
  if (mm == 7 && g_knobs.bigint) m = c.fdp().ConsumeIntegral<int64_t>();
  Arg& offs = c.add_offs("offs", G, m);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  const mxmoe_status st = mxmoe_check_offsets(Call::ptr(offs), m, stream);
  c.check(st);
  // A well-formed host view: OK exactly when the offsets are non-decreasing, >= 0 and <= m.
  const mxmoe_tensor& t = offs.t;
  if (offs.given && t.device == -1 && t.dtype == MXMOE_DTYPE_I32 && t.ndim == 1 && t.shape[0] >= 0 &&
      t.strides[0] >= 0 && (t.data != nullptr || t.shape[0] == 0)) {
    bool valid = true;
    int64_t prev = 0;
    for (int64_t i = 0; i < t.shape[0]; ++i) {
      int32_t v;
      std::memcpy(&v, static_cast<const int32_t*>(t.data) + i * t.strides[0], 4);
      if (v < prev || v > m) valid = false;
      prev = v;
    }
    FUZZ_CHECK(valid == (st == MXMOE_OK), valid ? "valid offsets rejected" : "invalid offsets accepted",
               "G " + std::to_string(t.shape[0]) + ", m " + std::to_string(m));
  }
}

void op_clamp_offsets(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_clamp_offsets";
  Call c(fdp);
  const int64_t G = c.groups();
  int64_t m = c.dim();
  const int mm = c.pick(0, 7);
  if (mm == 6) m = -static_cast<int64_t>(c.pick(1, 40));
  if (mm == 7 && g_knobs.bigint) m = c.fdp().ConsumeIntegral<int64_t>();
  Arg& offs = c.add_offs("offs", G, m);
  Arg& out = c.add("out", Role::kOut, MXMOE_DTYPE_I32, {G}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  const mxmoe_status st = mxmoe_clamp_offsets(Call::ptr(offs), m, Call::ptr(out), stream);
  c.check(st);
  if (st != MXMOE_OK) return;
  // out[i] = min(m, max(0, offs[0..i])), as documented.
  const mxmoe_tensor &o = offs.t, &r = out.t;
  int64_t run = 0;
  for (int64_t i = 0; i < o.shape[0]; ++i) {
    int32_t v, got;
    std::memcpy(&v, static_cast<const int32_t*>(o.data) + i * o.strides[0], 4);
    std::memcpy(&got, static_cast<const int32_t*>(r.data) + i * r.strides[0], 4);
    run = std::max<int64_t>(run, v);
    const int64_t want = std::min<int64_t>(m, run);
    FUZZ_CHECK(got == want, "clamped offset differs from min(m, max(0, offs[0..i]))",
               "i " + std::to_string(i) + ": got " + std::to_string(got) + ", want " + std::to_string(want));
  }
}

// The config and the output sides of mxmoe_quantize_fused / _source for an (R, C) input (B batches
// when three): the sides asked for, each output tensor present or not (a mask per side).
struct FusedOutputs {
  mxmoe_fused_config cfg{};
  bool want_row = false, want_col = false;
  struct SideArgs {
    Arg *q, *qt, *scale, *blocked, *dq, *dqt;
  } sa[2];
  mxmoe_fused_side side[2];

  // The picks in op_fused's original order (its corpus and regression inputs keep their meaning):
  // the config and sides here, then the caller's inputs, then add_outputs.
  explicit FusedOutputs(Call& c) {
    static const int32_t kBlk[] = {32, 128, 32, 128, 0, 1, 64, -128, INT32_MAX};
    const int ti = c.pick(0, 5);
    cfg.tile128 = ti < 4 ? 0 : ti == 4 ? 1 : c.fdp().ConsumeIntegral<int32_t>();
    cfg.row_block = cfg.tile128 && c.coin() ? (c.coin() ? 128 : 0) : kBlk[c.pick(0, 8)];
    cfg.col_block = cfg.tile128 && c.coin() ? (c.coin() ? 128 : 0) : kBlk[c.pick(0, 8)];
    cfg.mode = scale_mode(c);
    const int sides = c.pick(0, 8);  // 0-3 both, 4-5 row only, 6-7 col only, 8 none
    want_row = sides <= 5;
    want_col = sides <= 3 || sides == 6 || sides == 7;
  }

  void add_outputs(Call& c, bool three, int64_t B, int64_t R, int64_t C, bool with_offs, int64_t G) {
    const int64_t n_r = with_offs ? sadd(sceil(R, 32), G) : R / 32;
    // blocked sizes per side (mxmoe_blocked_size by hand)
    int64_t bs_row, bs_col;
    if (three) {
      bs_row = smul(B, smul(sround(R, 128), sround(C / 32, 4)));
      bs_col = smul(B, smul(sround(C, 128), sround(n_r, 4)));
    } else if (with_offs) {
      bs_row = smul(sadd(R, smul(128, G)), sround(C / 32, 4));
      bs_col = smul(sround(C, 128), sadd(sceil(R, 32), smul(4, G)));
    } else {
      bs_row = smul(sround(R, 128), sround(C / 32, 4));
      bs_col = smul(sround(C, 128), sround(n_r, 4));
    }
    if (bs_row > kMaxBytes) bs_row = 0;
    if (bs_col > kMaxBytes) bs_col = 0;
    for (int s = 0; s < 2; ++s) {
      const bool row = s == 0;
      int mask = c.pick(0, 64);  // 64: no output on this side (refused)
      if (mask == 0) mask = 1;
      if (mask == 64) mask = 0;
      const auto w = [&](int bit) { return (mask >> bit) & 1; };
      sa[s].q = &c.add(row ? "row.q" : "col.q", Role::kOut, MXMOE_DTYPE_E4M3, batched(three, B, {R, C}), false, w(0));
      sa[s].qt = &c.add(row ? "row.qt" : "col.qt", Role::kOut, MXMOE_DTYPE_E4M3, batched(three, B, {C, R}), false,
                        w(1));
      sa[s].scale = &c.add(row ? "row.scale" : "col.scale", Role::kOut, MXMOE_DTYPE_E8M0,
                           batched(three, B, row ? std::vector<int64_t>{R, C / 32} : std::vector<int64_t>{C, n_r}),
                           false, w(2));
      sa[s].blocked = &c.add(row ? "row.scale_blocked" : "col.scale_blocked", Role::kOut, MXMOE_DTYPE_E8M0,
                             {row ? bs_row : bs_col}, false, w(3));
      sa[s].dq = &c.add(row ? "row.dq" : "col.dq", Role::kOut, float_dtype(c), batched(three, B, {R, C}), false,
                        w(4));
      sa[s].dqt = &c.add(row ? "row.dqt" : "col.dqt", Role::kOut, float_dtype(c), batched(three, B, {C, R}), false,
                         w(5));
    }
  }

  // After Call::prepare: a side not passed is not an argument of the call (whatever chaos did to it).
  void bind() {
    for (int s = 0; s < 2; ++s)
      if (!(s == 0 ? want_row : want_col))
        for (Arg* a : {sa[s].q, sa[s].qt, sa[s].scale, sa[s].blocked, sa[s].dq, sa[s].dqt}) a->given = false;
    for (int s = 0; s < 2; ++s) {
      side[s].q = Call::ptr(*sa[s].q);
      side[s].qt = Call::ptr(*sa[s].qt);
      side[s].scale = Call::ptr(*sa[s].scale);
      side[s].scale_blocked = Call::ptr(*sa[s].blocked);
      side[s].dq = Call::ptr(*sa[s].dq);
      side[s].dqt = Call::ptr(*sa[s].dqt);
    }
  }
  const mxmoe_fused_side* row() const { return want_row ? &side[0] : nullptr; }
  const mxmoe_fused_side* col() const { return want_col ? &side[1] : nullptr; }
};

void op_fused(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_quantize_fused";
  Call c(fdp);
  const bool three = c.pick(0, 3) == 3;
  int64_t B = three ? c.small_batch() : 1, R = c.dim(), C = c.dim();
  const bool with_offs = three ? c.pick(0, 7) == 0 : c.coin();
  const int64_t G = with_offs ? c.groups() : 0;
  Call::cap({&B, &R, &C}, kMaxElems / 2);
  FusedOutputs fo(c);
  Arg& x = c.add("x", Role::kIn, float_dtype(c), batched(three, B, {R, C}), true);
  Arg& offs = c.add_offs("offs", G, R, with_offs);
  fo.add_outputs(c, three, B, R, C, with_offs, G);
  void* stream = c.stream();
  if (!c.prepare()) return;
  fo.bind();
  c.verbose_dump();
  c.check(mxmoe_quantize_fused(Call::ptr(x), Call::ptr(offs), fo.cfg, fo.row(), fo.col(), stream));
}

// ---- the MoE layer's entry points ------------------------------------------------------------------

// The rare (edge) choices sit at the top of each pick's range: an exhausted input picks the lowest
// value, which must stay the plain valid call (a seed's op bytes alone are one).
int64_t small_k(Call& c) { return c.pick(0, 15) == 15 ? 0 : c.pick(1, 8); }

void op_moe_routing(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_moe_routing";
  Call c(fdp);
  int64_t T = c.dim(), k = small_k(c);
  Call::cap({&T, &k}, kMaxElems / 4);
  int64_t E = c.pick(1, 70);
  const int em = c.pick(0, 15);
  if (em == 13) E = 0;
  if (em == 14) E = -static_cast<int64_t>(c.pick(1, 5));
  if (em == 15 && g_knobs.bigint) E = c.fdp().ConsumeIntegral<int64_t>();
  const int64_t Ealloc = std::min<int64_t>(std::max<int64_t>(E, 0), 4096);
  const mxmoe_dtype idt = c.coin() ? MXMOE_DTYPE_I32 : MXMOE_DTYPE_I64;
  Arg& idx = c.add_index("topk_idx", idt, {T, k}, std::max<int64_t>(E, 1));
  Arg& offs = c.add("offs", Role::kOut, MXMOE_DTYPE_I32, {Ealloc}, false);
  Arg& perm = c.add("perm", Role::kOut, MXMOE_DTYPE_I32, {smul(T, k)}, false);
  Arg& inv = c.add("inv", Role::kOut, MXMOE_DTYPE_I32, {T, k}, false);
  const int64_t ws = mxmoe_moe_routing_workspace_size(smul(T, k), std::max<int64_t>(E, 1), 0);
  Arg& work = c.add("workspace", Role::kScratch, MXMOE_DTYPE_E4M3, {std::max<int64_t>(ws, 0)}, false, ws > 0 || c.coin());
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  const mxmoe_status st = mxmoe_moe_routing(Call::ptr(idx), E, Call::ptr(offs), Call::ptr(perm), Call::ptr(inv),
                                            Call::ptr(work), stream);
  c.check(st);
  if (st != MXMOE_OK) return;
  // perm is a permutation of [0, N) and inv its inverse; offs ends are non-decreasing, <= N.
  const mxmoe_tensor &P = perm.t, &V = inv.t, &O = offs.t;
  const int64_t N = P.shape[0];
  std::vector<uint8_t> seen(static_cast<size_t>(N), 0);
  for (int64_t p = 0; p < N; ++p) {
    int32_t f;
    std::memcpy(&f, static_cast<const int32_t*>(P.data) + p * P.strides[0], 4);
    FUZZ_CHECK(f >= 0 && f < N && !seen[static_cast<size_t>(f)], "perm is not a permutation of [0, T*k)",
               "position " + std::to_string(p) + ": " + std::to_string(f));
    seen[static_cast<size_t>(f)] = 1;
    const int64_t t = f / std::max<int64_t>(V.shape[1], 1), j = f % std::max<int64_t>(V.shape[1], 1);
    int32_t back;
    std::memcpy(&back, static_cast<const int32_t*>(V.data) + t * V.strides[0] + j * V.strides[1], 4);
    FUZZ_CHECK(back == p, "inv is not perm's inverse", "entry " + std::to_string(f));
  }
  int32_t prev = 0;
  for (int64_t e = 0; e < O.shape[0]; ++e) {
    int32_t v;
    std::memcpy(&v, static_cast<const int32_t*>(O.data) + e * O.strides[0], 4);
    FUZZ_CHECK(v >= prev && v <= N, "offs is not a non-decreasing list of ends <= T*k", "e " + std::to_string(e));
    prev = v;
  }
}

void op_moe_gather(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_moe_gather";
  Call c(fdp);
  int64_t T = c.dim(), H = c.dim(), k = small_k(c);
  Call::cap({&T, &H}, kMaxElems / 2);
  Call::cap({&T, &k}, kMaxElems / 8);
  int64_t R = smul(T, k);
  if (c.pick(0, 3) == 3) R = sadd(R, c.pick(0, 40));  // padded routing: more rows than T*k
  Call::cap({&R, &H}, kMaxElems / 2);
  Arg& x = c.add("x", Role::kIn, float_dtype(c), {T, H}, false);
  Arg& perm = c.add_index("perm", MXMOE_DTYPE_I32, {R}, std::max<int64_t>(smul(T, k), 1));
  Arg& rs = c.add("row_scale", Role::kIn, float_dtype(c), {T, k}, false, c.coin());
  Arg& out = c.add("out", Role::kOut, float_dtype(c), {R, H}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_moe_gather(Call::ptr(x), Call::ptr(perm), k, Call::ptr(rs), Call::ptr(out), stream));
}

void op_moe_combine(FuzzedDataProvider& fdp, bool weight_grad) {
  g_op = weight_grad ? "mxmoe_moe_combine_weight_grad" : "mxmoe_moe_combine";
  Call c(fdp);
  int64_t T = c.dim(), H = c.dim(), k = small_k(c);
  Call::cap({&T, &H}, kMaxElems / 2);
  Call::cap({&T, &k}, kMaxElems / 8);
  int64_t N = smul(T, k);
  if (c.pick(0, 3) == 3) N = sadd(N, c.pick(-3, 40));
  Call::cap({&N, &H}, kMaxElems / 2);
  if (weight_grad) {
    Arg& dout = c.add("dout", Role::kIn, float_dtype(c), {T, H}, false);
    Arg& y = c.add("y", Role::kIn, float_dtype(c), {N, H}, false);
    Arg& inv = c.add_index("inv", MXMOE_DTYPE_I32, {T, k}, std::max<int64_t>(N, 1));
    Arg& dw = c.add("dw", Role::kOut, MXMOE_DTYPE_F32, {T, k}, false);
    void* stream = c.stream();
    if (!c.prepare()) return;
    c.verbose_dump();
    c.check(mxmoe_moe_combine_weight_grad(Call::ptr(dout), Call::ptr(y), Call::ptr(inv), Call::ptr(dw), stream));
    return;
  }
  Arg& y = c.add("y", Role::kIn, float_dtype(c), {N, H}, false);
  Arg& inv = c.add_index("inv", MXMOE_DTYPE_I32, {T, k}, std::max<int64_t>(N, 1));
  Arg& w = c.add("weights", Role::kIn, float_dtype(c), {T, k}, false, c.coin());
  Arg& out = c.add("out", Role::kOut, float_dtype(c), {T, H}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_moe_combine(Call::ptr(y), Call::ptr(inv), Call::ptr(w), Call::ptr(out), stream));
}

void op_moe_group_sum(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_moe_group_sum";
  Call c(fdp);
  int64_t M = c.dim(), C = c.dim();
  const int64_t G = c.groups();
  Call::cap({&M, &C}, kMaxElems);
  Arg& x = c.add("x", Role::kIn, float_dtype(c), {M, C}, false);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& out = c.add("out", Role::kOut, MXMOE_DTYPE_F32, {G, C}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_moe_group_sum(Call::ptr(x), Call::ptr(offs), Call::ptr(out), stream));
}

float activation_param(Call& c, float usual) {
  static const float kOdd[] = {0.0f, -1.0f, 1.702f, 7.0f, 1e30f, -0.0f};
  switch (c.pick(0, 9)) {
    case 9: return f32_of(static_cast<uint32_t>(c.rnd()));  // any bits: NaN, Inf
    case 8: return kOdd[c.pick(0, 5)];
    default: return usual;
  }
}

void op_swiglu(FuzzedDataProvider& fdp, bool backward) {
  g_op = backward ? "mxmoe_swiglu_backward" : "mxmoe_swiglu";
  Call c(fdp);
  int64_t N = c.dim(), I = c.dim();
  Call::cap({&N, &I}, kMaxElems / 4);
  const int32_t layout = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : c.pick(0, 1);
  const bool gpt = c.coin();
  const float alpha = activation_param(c, gpt ? 1.702f : 1.0f);
  const float limit = activation_param(c, gpt ? 7.0f : INFINITY);
  const float up = activation_param(c, gpt ? 1.0f : 0.0f);
  if (backward) {
    Arg& dy = c.add("dy", Role::kIn, float_dtype(c), {N, I}, false);
    Arg& h = c.add("h", Role::kIn, float_dtype(c), {N, smul(2, I)}, false);
    Arg& dh = c.add("dh", Role::kOut, h.t.dtype, {N, smul(2, I)}, false);
    void* stream = c.stream();
    if (!c.prepare()) return;
    c.verbose_dump();
    c.check(mxmoe_swiglu_backward(Call::ptr(dy), Call::ptr(h), layout, alpha, limit, up, Call::ptr(dh), stream));
    return;
  }
  Arg& h = c.add("h", Role::kIn, float_dtype(c), {N, smul(2, I)}, false);
  Arg& y = c.add("y", Role::kOut, h.t.dtype, {N, I}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_swiglu(Call::ptr(h), layout, alpha, limit, up, Call::ptr(y), stream));
}

// The shapes of a gather GEMM call: A (T, K) per token, M routed rows through `fanout` (any int64 at
// times, M not T * fanout at times), G <= 32 groups of N output columns, capped to the harness's budget.
struct GatherShape {
  int64_t T, K, N, G, fanout, M;
};
GatherShape gather_shape(Call& c, int64_t N) {
  GatherShape s{c.dim(), c.dim(), N, std::min<int64_t>(c.groups(), 32), 0, 0};
  s.fanout = c.pick(0, 15) == 15 ? c.fdp().ConsumeIntegral<int64_t>() : small_k(c);
  s.M = smul(s.T, std::max<int64_t>(s.fanout, 1));
  if (c.pick(0, 3) == 3) s.M = sadd(s.M, c.pick(-3, 40));
  int64_t GK = s.G + 1;
  Call::cap({&s.M, &s.N, &s.K}, kMaxMacs);
  Call::cap({&s.T, &s.K}, kMaxElems / 2);
  Call::cap({&GK, &s.N, &s.K}, kMaxMacs);
  s.G = std::min(s.G, GK);
  return s;
}

// mxmoe_grouped_mm_tile128_gather: the GEMM on routed rows of a per-token operand (indices any
// int32, negative ones padding rows), with an optional row scale.
void op_gemm_gather(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_grouped_mm_tile128_gather";
  Call c(fdp);
  const GatherShape sh = gather_shape(c, c.dim());
  const int64_t T = sh.T, K = sh.K, N = sh.N, G = sh.G, fanout = sh.fanout, M = sh.M;
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_E4M3, {T, K}, true);
  Arg& as = c.add("a_scale", Role::kIn, MXMOE_DTYPE_E8M0, {T, K / 32}, true);
  Arg& gather = c.add_index("gather", MXMOE_DTYPE_I32, {M}, std::max<int64_t>(smul(T, std::max<int64_t>(fanout, 1)), 1));
  Arg& rs = c.add("row_scale", Role::kIn, MXMOE_DTYPE_F32, {T, std::clamp<int64_t>(fanout, 0, 64)}, false, c.coin());
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_E4M3, {G, N, K}, true);
  Arg& bs = c.add("b_scale", Role::kIn, MXMOE_DTYPE_E8M0, {G, N, K / 32}, true);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& bias = c.add("bias", Role::kIn, float_dtype(c), {G, N}, true, c.coin());
  Arg& out = c.add("out", Role::kOut, float_dtype(c), {M, N}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_grouped_mm_tile128_gather(Call::ptr(a), Call::ptr(as), Call::ptr(gather), fanout, Call::ptr(rs),
                                          Call::ptr(b), Call::ptr(bs), Call::ptr(offs), Call::ptr(bias),
                                          Call::ptr(out), stream));
}

// mxmoe_grouped_mm_tile128_gather_dswiglu: the gather GEMM with the dSwiGLU epilogue (routing weights
// required, I a multiple of 128 mostly, h and the five outputs shaped around it).
void op_gemm_gather_dswiglu(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_grouped_mm_tile128_gather_dswiglu";
  Call c(fdp);
  GatherShape sh = gather_shape(c, c.pick(0, 3) == 3 ? c.dim() : 128 * c.pick(1, 3));
  Call::cap({&sh.M, &sh.N}, kMaxElems / 4);  // h and the outputs: M x 2I
  const int64_t T = sh.T, K = sh.K, I = sh.N, G = sh.G, fanout = sh.fanout, M = sh.M;
  const int32_t layout = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : 0;
  const bool gpt = c.coin();
  const float alpha = activation_param(c, gpt ? 1.702f : 1.0f);
  const float limit = activation_param(c, gpt ? 7.0f : INFINITY);
  const float up = activation_param(c, gpt ? 1.0f : 0.0f);
  const mxmoe_scale_mode mode = scale_mode(c);
  const int64_t I2 = smul(2, I), n_r = sadd(sceil(M, 32), G);
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_E4M3, {T, K}, true);
  Arg& as = c.add("a_scale", Role::kIn, MXMOE_DTYPE_E8M0, {T, K / 32}, true);
  Arg& gather = c.add_index("gather", MXMOE_DTYPE_I32, {M}, std::max<int64_t>(smul(T, std::max<int64_t>(fanout, 1)), 1));
  Arg& rs = c.add("row_scale", Role::kIn, MXMOE_DTYPE_F32, {T, std::clamp<int64_t>(fanout, 0, 64)}, false,
                  c.pick(0, 7) != 0);
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_E4M3, {G, I, K}, true);
  Arg& bs = c.add("b_scale", Role::kIn, MXMOE_DTYPE_E8M0, {G, I, K / 32}, true);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& h = c.add("h", Role::kIn, MXMOE_DTYPE_BF16, {M, I2}, false);
  Arg& q = c.add("dh_q", Role::kOut, MXMOE_DTYPE_E4M3, {M, I2}, false);
  Arg& sc = c.add("dh_scale", Role::kOut, MXMOE_DTYPE_E8M0, {M, I2 / 32}, false);
  Arg& qt = c.add("dh_qt", Role::kOut, MXMOE_DTYPE_E4M3, {I2, M}, false);
  Arg& st = c.add("dh_scale_t", Role::kOut, MXMOE_DTYPE_E8M0, {I2, n_r}, false);
  Arg& tw = c.add("tw_part", Role::kOut, MXMOE_DTYPE_F32, {M, I / 128}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_grouped_mm_tile128_gather_dswiglu(
      Call::ptr(a), Call::ptr(as), Call::ptr(gather), fanout, Call::ptr(rs), Call::ptr(b), Call::ptr(bs),
      Call::ptr(offs), Call::ptr(h), layout, alpha, limit, up, mode, Call::ptr(q), Call::ptr(sc), Call::ptr(qt),
      Call::ptr(st), Call::ptr(tw), stream));
}

// mxmoe_grouped_mm_tile128_gather_swiglu: the gather GEMM with the SwiGLU epilogue (2I a multiple of 256
// mostly; h and act(h)'s forms shaped around it, the columnwise pair mostly both or neither).
void op_gemm_gather_swiglu(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_grouped_mm_tile128_gather_swiglu";
  Call c(fdp);
  // Concatenated halves (2I a multiple of 256) or interleaved ones (of 128: gpt-oss's I % 128 == 64 too).
  const int32_t layout = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : c.pick(0, 1);
  const int pick_n = c.pick(0, 3);
  GatherShape sh = gather_shape(c, pick_n == 3 ? c.dim() : (layout == 1 ? 128 : 256) * c.pick(1, 3));
  Call::cap({&sh.M, &sh.N}, kMaxElems / 4);  // h: M x 2I
  const int64_t T = sh.T, K = sh.K, N = sh.N, G = sh.G, fanout = sh.fanout, M = sh.M, I = N / 2;
  const bool gpt = c.coin();
  const float alpha = activation_param(c, gpt ? 1.702f : 1.0f);
  const float limit = activation_param(c, gpt ? 7.0f : INFINITY);
  const float up = activation_param(c, gpt ? 1.0f : 0.0f);
  const mxmoe_scale_mode mode = scale_mode(c);
  const int64_t n_r = sadd(sceil(M, 32), G);
  const bool col = c.coin(), col_scale = c.pick(0, 9) == 9 ? !col : col;
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_E4M3, {T, K}, true);
  Arg& as = c.add("a_scale", Role::kIn, MXMOE_DTYPE_E8M0, {T, K / 32}, true);
  Arg& gather = c.add_index("gather", MXMOE_DTYPE_I32, {M}, std::max<int64_t>(smul(T, std::max<int64_t>(fanout, 1)), 1));
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_E4M3, {G, N, K}, true);
  Arg& bs = c.add("b_scale", Role::kIn, MXMOE_DTYPE_E8M0, {G, N, K / 32}, true);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& bias = c.add("bias", Role::kIn, float_dtype(c), {G, N}, true, c.coin());
  Arg& h = c.add("h", Role::kOut, MXMOE_DTYPE_BF16, {M, N}, false);
  Arg& q = c.add("act_q", Role::kOut, MXMOE_DTYPE_E4M3, {M, I}, false);
  Arg& sc = c.add("act_scale", Role::kOut, MXMOE_DTYPE_E8M0, {M, I / 32}, false);
  Arg& qt = c.add("act_qt", Role::kOut, MXMOE_DTYPE_E4M3, {I, M}, false, col);
  Arg& st = c.add("act_scale_t", Role::kOut, MXMOE_DTYPE_E8M0, {I, n_r}, false, col_scale);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_grouped_mm_tile128_gather_swiglu(Call::ptr(a), Call::ptr(as), Call::ptr(gather), fanout, Call::ptr(b),
                                                 Call::ptr(bs), Call::ptr(offs), Call::ptr(bias), layout, alpha,
                                                 limit, up, mode,
                                                 Call::ptr(h), Call::ptr(q), Call::ptr(sc), Call::ptr(qt),
                                                 Call::ptr(st), stream));
}

// mxmoe_moe_swiglu_weight_grad: the routing weights' grad from the unweighted dgrad and h.
void op_swiglu_weight_grad(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_moe_swiglu_weight_grad";
  Call c(fdp);
  int64_t T = c.dim(), I = c.dim(), k = small_k(c);
  Call::cap({&T, &I}, kMaxElems / 4);
  Call::cap({&T, &k}, kMaxElems / 8);
  int64_t N = smul(T, k);
  if (c.pick(0, 3) == 3) N = sadd(N, c.pick(-3, 40));
  Call::cap({&N, &I}, kMaxElems / 4);
  const int32_t layout = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : c.pick(0, 1);
  const bool gpt = c.coin();
  const float alpha = activation_param(c, gpt ? 1.702f : 1.0f);
  const float limit = activation_param(c, gpt ? 7.0f : INFINITY);
  const float up = activation_param(c, gpt ? 1.0f : 0.0f);
  Arg& dy = c.add("dy", Role::kIn, float_dtype(c), {N, I}, false);
  Arg& h = c.add("h", Role::kIn, MXMOE_DTYPE_BF16, {N, smul(2, I)}, false);
  Arg& inv = c.add_index("inv", MXMOE_DTYPE_I32, {T, k}, std::max<int64_t>(N, 1));
  Arg& dw = c.add("dw", Role::kOut, MXMOE_DTYPE_F32, {T, k}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_moe_swiglu_weight_grad(Call::ptr(dy), Call::ptr(h), Call::ptr(inv), layout, alpha, limit, up,
                                       Call::ptr(dw), stream));
}

// mxmoe_quantize_fused_source: the fused quantizer on a computed (R, C) input (gather of routed
// rows, SwiGLU, SwiGLU backward), the sides and outputs as op_fused (2D).
void op_fused_source(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_quantize_fused_source";
  Call c(fdp);
  int64_t R = c.dim(), C = c.dim();
  const bool with_offs = c.coin();
  const int64_t G = with_offs ? c.groups() : 0;
  Call::cap({&R, &C}, kMaxElems / 4);
  const int kp = c.pick(0, 12);  // 12: a kind that does not exist
  mxmoe_fused_source src{};
  src.kind = kp < 4 ? MXMOE_SOURCE_GATHER : kp < 8 ? MXMOE_SOURCE_SWIGLU : kp < 12 ? MXMOE_SOURCE_SWIGLU_BACKWARD
                                                                                : static_cast<mxmoe_source_kind>(
                                                                                      c.fdp().ConsumeIntegral<int32_t>());
  FusedOutputs fo(c);
  Arg& offs = c.add_offs("offs", G, R, with_offs);
  fo.add_outputs(c, false, 1, R, C, with_offs, G);
  Arg *a = nullptr, *b = nullptr, *perm = nullptr, *rs = nullptr;
  if (src.kind == MXMOE_SOURCE_GATHER) {
    int64_t T = c.pick(0, 15) == 15 ? 0 : c.dim();
    src.k = small_k(c);
    Call::cap({&T, &C}, kMaxElems / 4);
    a = &c.add("src.a", Role::kIn, float_dtype(c), {T, C}, false);
    perm = &c.add_index("src.perm", MXMOE_DTYPE_I32, {R}, std::max<int64_t>(smul(T, src.k), 1));
    rs = &c.add("src.row_scale", Role::kIn, MXMOE_DTYPE_F32, {T, src.k}, false, c.coin());
  } else {
    src.layout = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : c.pick(0, 1);
    const bool gpt = c.coin();
    src.alpha = activation_param(c, gpt ? 1.702f : 1.0f);
    src.limit = activation_param(c, gpt ? 7.0f : INFINITY);
    src.up_offset = activation_param(c, gpt ? 1.0f : 0.0f);
    if (src.kind == MXMOE_SOURCE_SWIGLU) {
      a = &c.add("src.a", Role::kIn, MXMOE_DTYPE_BF16, {R, smul(2, C)}, false);
    } else {
      a = &c.add("src.a", Role::kIn, MXMOE_DTYPE_BF16, {R, C}, false);
      b = &c.add("src.b", Role::kIn, MXMOE_DTYPE_BF16, {R, C / 2}, false, c.pick(0, 15) != 15);
      if (c.pick(0, 3) == 3) {  // the routing weights on dy: perm and row_scale (sometimes one alone)
        int64_t T = c.dim();
        src.k = small_k(c);
        Call::cap({&T, &src.k}, kMaxElems / 8);
        perm = &c.add_index("src.perm", MXMOE_DTYPE_I32, {R}, std::max<int64_t>(smul(T, src.k), 1), c.pick(0, 7) != 7);
        rs = &c.add("src.row_scale", Role::kIn, MXMOE_DTYPE_F32, {T, src.k}, false, c.pick(0, 7) != 7);
      }
    }
    if (c.pick(0, 15) == 15) src.k = c.fdp().ConsumeIntegral<int64_t>();  // ignored by these kinds
  }
  void* stream = c.stream();
  if (!c.prepare()) return;
  fo.bind();
  src.a = a ? Call::ptr(*a) : nullptr;
  src.b = b ? Call::ptr(*b) : nullptr;
  src.perm = perm ? Call::ptr(*perm) : nullptr;
  src.row_scale = rs ? Call::ptr(*rs) : nullptr;
  c.verbose_dump();
  c.check(mxmoe_quantize_fused_source(c.pick(0, 31) == 31 ? nullptr : &src, Call::ptr(offs), fo.cfg, fo.row(),
                                      fo.col(), stream));
}

}  // namespace

// ---- the bf16 layer's gather GEMMs (ops 29-32) ----------------------------------------------------

// mxmoe_grouped_mm_bf16_gather: bf16 rows of a per-token operand times B[g] (N, K) or, b_kn, (K, N).
void op_bf16_gather(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_grouped_mm_bf16_gather";
  Call c(fdp);
  const GatherShape sh = gather_shape(c, c.dim());
  const int64_t T = sh.T, K = sh.K, N = sh.N, G = sh.G, fanout = sh.fanout, M = sh.M;
  const int32_t b_kn = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : static_cast<int32_t>(c.coin());
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_BF16, {T, K}, false);
  Arg& gather = c.add_index("gather", MXMOE_DTYPE_I32, {M}, std::max<int64_t>(smul(T, std::max<int64_t>(fanout, 1)), 1));
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_BF16, b_kn == 1 ? std::vector<int64_t>{G, K, N} : std::vector<int64_t>{G, N, K},
                 false);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& out = c.add("out", Role::kOut, MXMOE_DTYPE_BF16, {M, N}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_grouped_mm_bf16_gather(Call::ptr(a), Call::ptr(gather), fanout, Call::ptr(b), b_kn, Call::ptr(offs),
                                       Call::ptr(out), stream));
}

// mxmoe_grouped_mm_bf16_kgather: groups along the routed rows, either operand read through the index.
void op_bf16_kgather(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_grouped_mm_bf16_kgather";
  Call c(fdp);
  int64_t T = c.dim(), M = c.dim(), N = c.dim(), G = std::min<int64_t>(c.groups(), 32);
  const int64_t fanout = c.pick(0, 15) == 15 ? c.fdp().ConsumeIntegral<int64_t>() : small_k(c);
  int64_t R = smul(T, std::max<int64_t>(fanout, 1));
  if (c.pick(0, 3) == 3) R = sadd(R, c.pick(-3, 40));
  int64_t GMN = G + 1;
  Call::cap({&R, &M, &N}, kMaxMacs);
  Call::cap({&GMN, &M, &N}, kMaxElems);
  Call::cap({&T, &M}, kMaxElems / 2);
  Call::cap({&T, &N}, kMaxElems / 2);
  G = std::min(G, GMN);
  const int32_t gather_b = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : static_cast<int32_t>(c.coin());
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_BF16, {gather_b == 0 ? T : R, M}, false);
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_BF16, {gather_b == 0 ? R : T, N}, false);
  Arg& gather = c.add_index("gather", MXMOE_DTYPE_I32, {R}, std::max<int64_t>(smul(T, std::max<int64_t>(fanout, 1)), 1));
  Arg& offs = c.add_offs("offs", G, R);
  Arg& out = c.add("out", Role::kOut, MXMOE_DTYPE_BF16, {G, M, N}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_grouped_mm_bf16_kgather(Call::ptr(a), Call::ptr(b), Call::ptr(gather), fanout, gather_b,
                                        Call::ptr(offs), Call::ptr(out), stream));
}

// mxmoe_grouped_mm_bf16_gather_swiglu: the bf16 gather GEMM writing h (M, 2I) and act(h) (M, I).
void op_bf16_gather_swiglu(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_grouped_mm_bf16_gather_swiglu";
  Call c(fdp);
  GatherShape sh = gather_shape(c, c.pick(0, 3) == 3 ? c.dim() : smul(2, c.dim()));
  Call::cap({&sh.M, &sh.N}, kMaxElems / 4);
  const int64_t T = sh.T, K = sh.K, N = sh.N, G = sh.G, fanout = sh.fanout, M = sh.M, I = N / 2;
  const int32_t layout = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : static_cast<int32_t>(c.coin());
  const bool gpt = c.coin();
  const float alpha = activation_param(c, gpt ? 1.702f : 1.0f);
  const float limit = activation_param(c, gpt ? 7.0f : INFINITY);
  const float up = activation_param(c, gpt ? 1.0f : 0.0f);
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_BF16, {T, K}, false);
  Arg& gather = c.add_index("gather", MXMOE_DTYPE_I32, {M}, std::max<int64_t>(smul(T, std::max<int64_t>(fanout, 1)), 1));
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_BF16, {G, N, K}, false);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& bias = c.add("bias", Role::kIn, float_dtype(c), {G, N}, true, c.coin());
  Arg& h = c.add("h", Role::kOut, MXMOE_DTYPE_BF16, {M, N}, false);
  Arg& act = c.add("act", Role::kOut, MXMOE_DTYPE_BF16, {M, I}, false);
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_grouped_mm_bf16_gather_swiglu(Call::ptr(a), Call::ptr(gather), fanout, Call::ptr(b), Call::ptr(offs),
                                              Call::ptr(bias), layout, alpha, limit, up, Call::ptr(h), Call::ptr(act),
                                              stream));
}

// mxmoe_grouped_mm_bf16_gather_dswiglu: the bf16 gather GEMM on w2 (G, K, I) as it lies, dH and the
// routing weights' partials from h (either layout), row_scale and act optional.
void op_bf16_gather_dswiglu(FuzzedDataProvider& fdp) {
  g_op = "mxmoe_grouped_mm_bf16_gather_dswiglu";
  Call c(fdp);
  GatherShape sh = gather_shape(c, c.dim());
  Call::cap({&sh.M, &sh.N}, kMaxElems / 4);
  const int64_t T = sh.T, K = sh.K, I = sh.N, G = sh.G, fanout = sh.fanout, M = sh.M;
  const int32_t layout = c.pick(0, 9) == 9 ? c.fdp().ConsumeIntegral<int32_t>() : static_cast<int32_t>(c.coin());
  const bool gpt = c.coin();
  const float alpha = activation_param(c, gpt ? 1.702f : 1.0f);
  const float limit = activation_param(c, gpt ? 7.0f : INFINITY);
  const float up = activation_param(c, gpt ? 1.0f : 0.0f);
  Arg& a = c.add("a", Role::kIn, MXMOE_DTYPE_BF16, {T, K}, false);
  Arg& gather = c.add_index("gather", MXMOE_DTYPE_I32, {M}, std::max<int64_t>(smul(T, std::max<int64_t>(fanout, 1)), 1));
  Arg& rs = c.add("row_scale", Role::kIn, MXMOE_DTYPE_F32, {T, std::clamp<int64_t>(fanout, 0, 64)}, false, c.coin());
  Arg& b = c.add("b", Role::kIn, MXMOE_DTYPE_BF16, {G, K, I}, false);
  Arg& offs = c.add_offs("offs", G, M);
  Arg& h = c.add("h", Role::kIn, MXMOE_DTYPE_BF16, {M, smul(2, I)}, false);
  Arg& dh = c.add("dh", Role::kOut, MXMOE_DTYPE_BF16, {M, smul(2, I)}, false);
  Arg& tw = c.add("tw_part", Role::kOut, MXMOE_DTYPE_F32, {M, sceil(I, 128)}, false);
  Arg& act = c.add("act", Role::kOut, MXMOE_DTYPE_BF16, {M, I}, false, c.coin());
  void* stream = c.stream();
  if (!c.prepare()) return;
  c.verbose_dump();
  c.check(mxmoe_grouped_mm_bf16_gather_dswiglu(Call::ptr(a), Call::ptr(gather), fanout, Call::ptr(rs), Call::ptr(b),
                                               Call::ptr(offs), Call::ptr(h), layout, alpha, limit, up, Call::ptr(dh),
                                               Call::ptr(tw), Call::ptr(act), stream));
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* s = std::getenv("MXMOE_FUZZ_SKIP")) {
    const std::string skip = std::string(",") + s + ",";
    auto has = [&](const char* w) { return skip.find(std::string(",") + w + ",") != std::string::npos; };
    g_knobs.huge = !has("huge");
    g_knobs.bigint = !has("bigint");
    g_knobs.null0 = !has("null0");
    g_knobs.stream = !has("stream");
  }
  if (const char* v = std::getenv("MXMOE_FUZZ_VERBOSE")) g_knobs.verbose = v[0] == '1';
  if (const char* o = std::getenv("MXMOE_FUZZ_ONLY")) g_knobs.only = std::atoi(o);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // Ops 0-16 are data[0] % 17 as they always were (the corpus and tests/fuzz/regressions keep their
  // meaning); op 16's inputs pick with data[1] between clamp_offsets and the MoE layer's entry
  // points 17-24 (added later: no regression input has op 16).
  int op = g_knobs.only >= 0 ? g_knobs.only % 33 : data[0] % 17;
  size_t skip = 1;
  if (g_knobs.only < 0 && op == 16 && size >= 2) {
    // 24: mxmoe_quantize_fused_source (added after 17-23); 25, 26: the gather GEMM and the SwiGLU
    // weight grad (added later still); 27 (data[1] 240-247, taken from 24): the dSwiGLU gather GEMM;
    // 28 (data[1] 232-239, taken from 24; its corpus seed is 224): the SwiGLU gather GEMM; 29-32
    // (data[1] 216-223, which no corpus or regression input used): the bf16 layer's gather GEMMs
    op = data[1] >= 248   ? 25 + data[1] % 2
         : data[1] >= 240 ? 27
         : data[1] >= 232 ? 28
         : data[1] >= 224 ? 24
         : data[1] >= 216 ? 29 + data[1] % 4
                          : 16 + data[1] % 8;
    skip = 2;
  }
  FuzzedDataProvider fdp(data + skip, size - skip);
  // The CPU backend's thread count: mostly 1 (threads are started per parallel_for, which would
  // dominate the run time), sometimes 2 (chunked paths). The library reads it once per process:
  // mxmoe_reload_env when it changes.
  static const char* kThreads[] = {"1", "1", "1", "2"};
  static const char* threads = nullptr;
  const char* want = kThreads[fdp.ConsumeIntegralInRange<int>(0, 3)];
  if (threads == nullptr || std::strcmp(want, threads) != 0) {
    setenv("MXMOE_NUM_THREADS", want, 1);
    if (mxmoe_reload_env() != MXMOE_OK) __builtin_trap();
    threads = want;
  }
  switch (op) {
    case 0: op_codecs(fdp); break;
    case 1: op_sizes(fdp, 0); break;
    case 2: op_sizes(fdp, 1); break;
    case 3: op_sizes(fdp, 2); break;
    case 4: op_sizes(fdp, 3); break;
    case 5: op_quantize(fdp); break;
    case 6: op_dequantize(fdp); break;
    case 7: op_blocked(fdp, true); break;
    case 8: op_blocked(fdp, false); break;
    case 9: op_gemm(fdp, false); break;
    case 10: op_gemm_kgroups(fdp, false); break;
    case 11: op_zero_rows(fdp); break;
    case 12: op_check_offsets(fdp); break;
    case 13: op_fused(fdp); break;
    case 14: op_gemm(fdp, true); break;
    case 15: op_gemm_kgroups(fdp, true); break;
    case 16: op_clamp_offsets(fdp); break;
    case 17: op_moe_routing(fdp); break;
    case 18: op_moe_gather(fdp); break;
    case 19: op_moe_combine(fdp, false); break;
    case 20: op_moe_combine(fdp, true); break;
    case 21: op_moe_group_sum(fdp); break;
    case 22: op_swiglu(fdp, false); break;
    case 23: op_swiglu(fdp, true); break;
    case 24: op_fused_source(fdp); break;
    case 25: op_gemm_gather(fdp); break;
    case 27: op_gemm_gather_dswiglu(fdp); break;
    case 28: op_gemm_gather_swiglu(fdp); break;
    case 29: op_bf16_gather(fdp); break;
    case 30: op_bf16_kgather(fdp); break;
    case 31: op_bf16_gather_swiglu(fdp); break;
    case 32: op_bf16_gather_dswiglu(fdp); break;
    default: op_swiglu_weight_grad(fdp); break;
  }
  return 0;
}
