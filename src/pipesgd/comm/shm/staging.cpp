#include "pipesgd/comm/shm/staging.h"

#include <algorithm>

#include "pipesgd/comm/shared_memory_transport.h"

namespace pipesgd {
namespace shm_detail {
namespace {

std::size_t round_up(std::size_t value, std::size_t to) { return (value + to - 1) / to * to; }

std::size_t slot_count(int members, SharedMemoryStaging staging) {
  if (staging.slot_bytes == 0) return 0;
  return static_cast<std::size_t>(members) * static_cast<std::size_t>(members) *
         static_cast<std::size_t>(staging.slots_per_pair);
}

std::size_t data_offset(std::size_t offset, int members, SharedMemoryStaging staging) {
  return round_up(offset + slot_count(members, staging) * sizeof(std::atomic<std::uint32_t>), 4096);
}

}  // namespace

std::size_t StagingArea::end(std::size_t offset, int members, SharedMemoryStaging staging) {
  return data_offset(offset, members, staging) + slot_count(members, staging) * staging.slot_bytes;
}

StagingArea::StagingArea(std::byte* region, std::size_t offset, int members, SharedMemoryStaging staging)
    : flags_(reinterpret_cast<std::atomic<std::uint32_t>*>(region + offset)),
      data_(region + data_offset(offset, members, staging)),
      members_(members),
      staging_(staging) {}

std::uint32_t StagingArea::claim(int sender, int receiver) const {
  for (std::uint32_t k = 0; k < static_cast<std::uint32_t>(staging_.slots_per_pair); ++k) {
    std::atomic<std::uint32_t>& flag = busy(sender, receiver, k);
    std::uint32_t free = 0;
    if (flag.load(std::memory_order_relaxed) == 0 && flag.compare_exchange_strong(free, 1, std::memory_order_acquire)) {
      return k + 1;
    }
  }
  return 0;
}

int StagingArea::busy_slots_to(int receiver) const {
  int busy_slots = 0;
  for (int sender = 0; sender < members_; ++sender) {
    for (int k = 0; k < staging_.slots_per_pair; ++k) {
      busy_slots += busy(sender, receiver, static_cast<std::uint32_t>(k)).load() != 0 ? 1 : 0;
    }
  }
  return busy_slots;
}

}  // namespace shm_detail

SharedMemoryStaging SharedMemoryTransport::staging_for(int members, std::size_t available_bytes) {
  if (members < 2) return {};
  const std::size_t pairs = static_cast<std::size_t>(members) * static_cast<std::size_t>(members - 1);
  const std::size_t budget = std::min(kStagingBudget, available_bytes / 4);
  const std::size_t per_pair = budget / pairs / kStagingSlotBytes;
  if (per_pair == 0) return {};
  return SharedMemoryStaging{kStagingSlotBytes, static_cast<int>(std::min<std::size_t>(per_pair, kStagingSlotsPerPair))};
}

}  // namespace pipesgd
