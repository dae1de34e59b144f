#pragma once
// The shared half of a SharedMemoryTransport operation's state machine: its slot in the region, which
// the process that posted it (the owner) and the process that completes it both write.
//
// The state word (the futex the owner sleeps on) holds a phase, plus kSleeper while the owner sleeps
// on it: pending -> copying (claimed by the process that matched it, under the mailbox lock) -> done;
// or pending -> withdrawn (its owner gave it up without the mailbox lock). The process-local half is
// shm/operation.h.
#include <atomic>
#include <cstdint>

#include "pipesgd/comm/shm/sync.h"

namespace pipesgd::shm_detail {

constexpr std::uint32_t kPending = 0;
constexpr std::uint32_t kCopying = 1;
constexpr std::uint32_t kDone = 2;
constexpr std::uint32_t kWithdrawn = 3;
constexpr std::uint32_t kPhaseMask = 3;
constexpr std::uint32_t kSleeper = 4;

// A completed operation's outcome.
constexpr std::uint32_t kOk = 0;
constexpr std::uint32_t kTooLarge = 1;    // the message did not fit the receive buffer
constexpr std::uint32_t kCopyFailed = 2;  // the cross-memory copy failed (errno in copy_errno)

struct alignas(64) Slot {
  std::atomic<std::uint32_t> state{kPending};
  std::uint32_t outcome = kOk;
  std::int32_t copy_errno = 0;
  std::uint64_t address = 0;        // the owner's buffer, in the owner's address space
  std::uint64_t bytes = 0;          // a send's payload size, a recv's capacity
  std::uint64_t transferred = 0;    // set by the completer
  std::uint64_t message_bytes = 0;  // kTooLarge: the message's size
  std::uint32_t staged = 0;         // a completed recv: k + 1 if its message is in staging slot k of (peer, owner)
};

inline std::uint32_t phase(const Slot& slot) { return slot.state.load(std::memory_order_acquire) & kPhaseMask; }

// Completes `slot` (the completer: the process that copied, or the owner of a staged send) and wakes
// its owner if it sleeps.
inline void complete(Slot& slot, std::uint64_t transferred, std::uint32_t outcome, int copy_errno,
                     std::uint64_t message_bytes) {
  slot.transferred = transferred;
  slot.outcome = outcome;
  slot.copy_errno = copy_errno;
  slot.message_bytes = message_bytes;
  const std::uint32_t previous = slot.state.exchange(kDone, std::memory_order_acq_rel);
  if (previous & kSleeper) futex_wake(slot.state, 1);
}

// Moves a pending slot to `copying` (the caller matched it under its mailbox's lock); false if its
// owner withdrew it.
inline bool claim(Slot& slot) {
  std::uint32_t state = slot.state.load(std::memory_order_acquire);
  while ((state & kPhaseMask) == kPending) {
    if (slot.state.compare_exchange_weak(state, (state & kSleeper) | kCopying, std::memory_order_acq_rel)) return true;
  }
  return false;
}

// Moves a pending slot to `withdrawn` (its owner gives it up); false if it was claimed or completed.
inline bool withdraw(Slot& slot) {
  std::uint32_t state = slot.state.load(std::memory_order_acquire);
  while ((state & kPhaseMask) == kPending) {
    if (slot.state.compare_exchange_weak(state, kWithdrawn, std::memory_order_acq_rel)) return true;
  }
  return false;
}

// For the owner, about to sleep on `slot` until it is done, at most `limit`: marks it slept on and
// sleeps, unless it is done (or changed meanwhile: the caller looks again).
inline void sleep_until_done(Slot& slot, Clock::duration limit) {
  std::uint32_t state = slot.state.load(std::memory_order_acquire);
  if ((state & kPhaseMask) == kDone) return;
  if (!(state & kSleeper)) {
    if (!slot.state.compare_exchange_strong(state, state | kSleeper, std::memory_order_acq_rel)) return;
    state |= kSleeper;
  }
  futex_wait(slot.state, state, limit);
}

}  // namespace pipesgd::shm_detail
