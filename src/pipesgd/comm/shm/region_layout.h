#pragma once
// The layout of a SharedMemoryTransport's region: a header (the start-up barrier, the host's failure
// state, the staging every member must agree on), then one Member per process (its pid, its mailbox
// and its table of operation slots), then the eager-message staging (shm/staging.h). The region is
// zero-filled before any member attaches, and nothing in it is constructed: zero bytes are the
// initial state of every field (each member initialises its own mutex).
#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "pipesgd/comm/shared_memory_transport.h"
#include "pipesgd/comm/shm/mailbox.h"
#include "pipesgd/comm/shm/slot.h"
#include "pipesgd/comm/shm/staging.h"

namespace pipesgd::shm_detail {

// comm/wait.h's FailureState, in the region: the first member's report wins; messages are cut to
// kBytes - 1 bytes.
struct SharedFailureState {
  static constexpr std::size_t kBytes = 512;
  std::atomic<std::uint32_t> claimed{0};    // the first reporter writes the message
  std::atomic<std::uint32_t> published{0};  // set after the message is written
  char message_text[kBytes];

  // Records "rank R failed: <reason>" unless a failure is recorded already; true if this one was.
  bool report(int rank, const std::string& reason);
  bool failed() const { return published.load(std::memory_order_acquire) != 0; }
  // "" until a failure is recorded.
  std::string message() const;
};

struct Member {
  std::atomic<std::int32_t> pid{0};
  std::uint64_t probe_address = 0;  // where this process's probe word lives (cross-memory attach check)
  std::uint64_t probe_value = 0;
  pthread_mutex_t mutex;  // robust, process-shared: guards `mailbox`
  Mailbox mailbox;
  Slot slots[SharedMemoryTransport::kSlots];
};

struct Region {
  std::atomic<std::uint32_t> attached{0};  // start-up barrier, phase 0 (a futex)
  std::atomic<std::uint32_t> probed{0};    // phase 1
  std::atomic<std::uint32_t> probe_failures{0};
  std::uint64_t staging_slot_bytes = 0;    // member 0's staging, checked by the others
  std::uint32_t staging_slots_per_pair = 0;
  SharedFailureState failure;
  // Member structures follow at kMembersOffset.
};

constexpr std::size_t kMembersOffset = (sizeof(Region) + 63) / 64 * 64;

inline Member& member_at(Region* region, int index) {
  auto* base = reinterpret_cast<std::byte*>(region) + kMembersOffset;
  return *reinterpret_cast<Member*>(base + static_cast<std::size_t>(index) * sizeof(Member));
}

// Where the staging of a region of `members` starts (after the members, 64-aligned).
constexpr std::size_t staging_offset(int members) {
  return (kMembersOffset + static_cast<std::size_t>(members) * sizeof(Member) + 63) / 64 * 64;
}

}  // namespace pipesgd::shm_detail
