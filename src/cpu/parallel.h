// Internal: the CPU engines' worker pool (reference.cpp, cpu_engine.cpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mxmoe::cpu {

/// threads <= 0: every hardware thread.
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// Runs body(item, worker) for item in [0, n) on up to `threads` workers pulling items
/// from a shared counter. Items write disjoint outputs, so the schedule cannot change
/// the result; `worker` only selects scratch space. The first exception stops the
/// remaining items and is rethrown here.
inline void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& body) {
  const int nt = static_cast<int>(std::min<int64_t>(threads, n));
  if (nt <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&](int worker) {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        body(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next.store(n);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mxmoe::cpu
