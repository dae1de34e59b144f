#pragma once
// The eager-message staging of a SharedMemoryTransport's region: per ordered pair (sender, receiver)
// of members, `slots_per_pair` slots of `slot_bytes` each, and a busy flag per slot. A sender claims
// a free slot of its pair and copies its message there; the receiver copies it out (or reads it in
// place) and releases the slot. Layout, from where the region places it (after the members): the
// busy flags (a 32-bit word per slot, all pairs), then the slots' bytes, page-aligned.
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pipesgd {

// Eager-message staging of a SharedMemoryTransport (shared_memory_transport.h); slot_bytes 0: none.
struct SharedMemoryStaging {
  std::size_t slot_bytes = 0;
  int slots_per_pair = 0;
};

namespace shm_detail {

class StagingArea {
 public:
  // Where the staging of `members` with `staging` ends when it starts at `offset` (64-aligned).
  static std::size_t end(std::size_t offset, int members, SharedMemoryStaging staging);

  StagingArea() = default;
  // The staging at `offset` of the region at `region` (in this process's mapping).
  StagingArea(std::byte* region, std::size_t offset, int members, SharedMemoryStaging staging);

  // Slot k (0-based) of pair (sender, receiver): its busy flag and its bytes.
  std::atomic<std::uint32_t>& busy(int sender, int receiver, std::uint32_t k) const {
    return flags_[index(sender, receiver, k)];
  }
  std::byte* data(int sender, int receiver, std::uint32_t k) const {
    return data_ + index(sender, receiver, k) * staging_.slot_bytes;
  }
  // Claims a free slot of pair (sender, receiver): k + 1, or 0 if every one is busy (or there is no
  // staging).
  std::uint32_t claim(int sender, int receiver) const;
  // Frees the slot a claim() returned `staged` (k + 1) for.
  void release(int sender, int receiver, std::uint32_t staged) const {
    busy(sender, receiver, staged - 1).store(0, std::memory_order_release);
  }
  // The slots of pairs (any member, `receiver`) holding a message not yet released.
  int busy_slots_to(int receiver) const;

 private:
  std::size_t index(int sender, int receiver, std::uint32_t k) const {
    return (static_cast<std::size_t>(sender) * static_cast<std::size_t>(members_) + static_cast<std::size_t>(receiver)) *
               static_cast<std::size_t>(staging_.slots_per_pair) +
           k;
  }

  std::atomic<std::uint32_t>* flags_ = nullptr;
  std::byte* data_ = nullptr;
  int members_ = 0;
  SharedMemoryStaging staging_;
};

}  // namespace shm_detail
}  // namespace pipesgd
