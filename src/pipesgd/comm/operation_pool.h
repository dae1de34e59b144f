#pragma once
// OperationPool: the RequestStates of one transport endpoint, reused so that after warm-up the hot
// path does not allocate (LocalTransport, SharedMemoryTransport, MpiTransport). An operation is free
// once the pool holds the only reference to it (every Request on it is gone) and the transport
// accepts it for reuse (SharedMemoryTransport never reuses an operation a dead peer may still copy
// into). Free operations are handed out round robin; the pool makes a new one only when none is
// free, up to its capacity. Thread-safe.
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace pipesgd {

template <typename Operation>
class OperationPool {
 public:
  // `capacity`: the most operations the pool makes (0: no bound).
  explicit OperationPool(std::size_t capacity = 0) : capacity_(capacity) {}

  // A free operation that `reusable(operation)` accepts; else a new one, make(index) (index: how many
  // the pool made before), while fewer than the capacity were made; else nullptr. The writes of the
  // last holder of a reused operation happen-before the caller's.
  template <typename Make, typename Reusable>
  std::shared_ptr<Operation> acquire(Make&& make, Reusable&& reusable) {
    std::lock_guard lock(mutex_);
    const std::size_t count = operations_.size();
    for (std::size_t n = 0; n < count; ++n) {
      std::shared_ptr<Operation>& candidate = operations_[cursor_ + n < count ? cursor_ + n : cursor_ + n - count];
      if (candidate.use_count() == 1 && reusable(*candidate)) {
        // Pairs with the release of the last other reference: its writes happen-before ours.
        std::atomic_thread_fence(std::memory_order_acquire);
        cursor_ = (cursor_ + n + 1) % count;
        return candidate;
      }
    }
    if (capacity_ != 0 && count >= capacity_) return nullptr;
    operations_.push_back(make(count));
    cursor_ = 0;
    return operations_.back();
  }
  template <typename Make>
  std::shared_ptr<Operation> acquire(Make&& make) {
    return acquire(make, [](const Operation&) { return true; });
  }

 private:
  const std::size_t capacity_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<Operation>> operations_;
  std::size_t cursor_ = 0;  // where the next search starts: after the operation handed out last
};

}  // namespace pipesgd
