#include "pipesgd/comm/shm/region_layout.h"

#include <algorithm>
#include <cstring>

#include "pipesgd/comm/wait.h"

namespace pipesgd::shm_detail {

bool SharedFailureState::report(int rank, const std::string& reason) {
  if (claimed.exchange(1, std::memory_order_acq_rel) != 0) return false;
  const std::string text = rank_failure_message(rank, reason);
  const std::size_t n = std::min(text.size(), kBytes - 1);
  std::memcpy(message_text, text.data(), n);
  message_text[n] = '\0';
  published.store(1, std::memory_order_release);
  return true;
}

std::string SharedFailureState::message() const {
  if (!failed()) return {};
  return std::string(message_text, strnlen(message_text, kBytes));
}

}  // namespace pipesgd::shm_detail
