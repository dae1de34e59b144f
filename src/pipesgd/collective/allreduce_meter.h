#pragma once
// AllreduceMeter: what one worker's gradient allreduces cost the threads that ran them: processor
// time on the running thread's own CPU clock (core/clock.h thread_cpu_seconds) and the fp32 bytes
// allreduced. CPU time per allreduced byte is the figure the communication path is tuned by: a
// wait that sleeps costs nothing, a copy, a decode-add, a wake-up do.
//
// Installed like a trace (ScopedAllreduceMeter on the thread that builds a method): every
// TracedAllreduce built on that thread records into it (collective/traced_allreduce.h), whichever
// thread then runs it (the compute thread for D-Sync, the comm thread for pipelined methods).
// Totals since construction; written with relaxed atomics by the running thread, read by any.
#include <atomic>
#include <cstdint>

namespace pipesgd {

struct AllreduceMeter {
  std::atomic<std::uint64_t> cpu_nanoseconds{0};
  std::atomic<std::uint64_t> bytes{0};  // fp32 payload allreduced (4 per element, whatever the codec)
  std::atomic<std::uint64_t> calls{0};

  void record(double cpu_seconds, std::uint64_t payload_bytes) {
    cpu_nanoseconds.fetch_add(static_cast<std::uint64_t>(cpu_seconds > 0 ? cpu_seconds * 1e9 : 0),
                              std::memory_order_relaxed);
    bytes.fetch_add(payload_bytes, std::memory_order_relaxed);
    calls.fetch_add(1, std::memory_order_relaxed);
  }
};

// The meter installed on the calling thread (nullptr: none).
AllreduceMeter* current_allreduce_meter();

// Installs `meter` (may be nullptr) on the calling thread for its lifetime; restores the previous.
class ScopedAllreduceMeter {
 public:
  explicit ScopedAllreduceMeter(AllreduceMeter* meter);
  ~ScopedAllreduceMeter();
  ScopedAllreduceMeter(const ScopedAllreduceMeter&) = delete;
  ScopedAllreduceMeter& operator=(const ScopedAllreduceMeter&) = delete;

 private:
  AllreduceMeter* previous_;
};

}  // namespace pipesgd
