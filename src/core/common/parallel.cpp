#include "common/parallel.hpp"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "common/env.hpp"

namespace mxmoe {

int num_threads() {
  const int n = env::settings().num_threads;
  if (n != env::Settings::kUnset) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t workers = std::min<int64_t>(num_threads(), (n + grain - 1) / grain);
  if (workers <= 1) {
    body(0, n);
    return;
  }
  const int64_t chunk = (n + workers - 1) / workers;
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int64_t w) {
    const int64_t b = w * chunk, e = std::min(n, b + chunk);
    if (b >= e) return;
    try {
      body(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mxmoe
