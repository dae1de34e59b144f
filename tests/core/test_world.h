#pragma once
// Test harness: runs one function per rank of a LocalFabric, each rank on its own std::thread.
//
//   run_ranks(4, [&](int rank, Transport& transport) { ... });
//
// If a rank throws, the harness reports the failure on that rank's transport (so the other ranks'
// pending and future waits throw PeerFailedError at once instead of waiting for their timeouts),
// joins every thread, and rethrows the first exception caught (the root cause: it is recorded before
// the failure is reported, so it always precedes the PeerFailedErrors it causes) in the calling
// thread. Header-only so that every test file can include it.
//
// gtest assertions (EXPECT_*, ASSERT_*) may be used inside `body`; note that a failing ASSERT_* only
// returns from `body`, it does not throw, so the other ranks are not told. Prefer throwing (or
// collecting results and asserting after run_ranks returns) when other ranks would otherwise wait.
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/transport.h"

namespace pipesgd {

// The same on a fabric of the caller's (e.g. to slow a link mid-run: LocalFabric::slow_link).
inline void run_ranks_on(LocalFabric& fabric, const std::function<void(int rank, Transport& transport)>& body) {
  const int world_size = fabric.size();
  std::mutex first_failure_mutex;
  std::exception_ptr first_failure;

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      try {
        body(rank, transport);
      } catch (...) {
        std::string reason = "unknown exception";
        try {
          throw;
        } catch (const std::exception& error) {
          reason = error.what();
        } catch (...) {
        }
        {
          std::lock_guard lock(first_failure_mutex);
          if (!first_failure) first_failure = std::current_exception();
        }
        transport.report_failure(reason);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (first_failure) std::rethrow_exception(first_failure);
}

inline void run_ranks(int world_size, const std::function<void(int rank, Transport& transport)>& body,
                      NetworkSpec network = {}) {
  LocalFabric fabric(world_size, std::move(network));
  run_ranks_on(fabric, body);
}

}  // namespace pipesgd
