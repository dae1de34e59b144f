#include "pipesgd/comm/wait.h"

#include "pipesgd/core/error.h"

namespace pipesgd {

std::string rank_failure_message(int rank, const std::string& reason) { return concat("rank ", rank, " failed: ", reason); }

void throw_wait_aborted(const std::string& wait, const std::string& failure) {
  throw PeerFailedError(concat(wait, " aborted: ", failure));
}

void throw_wait_timed_out(const std::string& wait, Timeout timeout, int peer, const char* suffix) {
  throw CommTimeoutError(concat(wait, " timed out after ", Seconds(timeout).count(), " s", suffix), peer);
}

bool FailureState::record(std::string message) {
  std::lock_guard lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) return false;
  message_ = std::move(message);
  failed_.store(true, std::memory_order_release);
  return true;
}

std::string FailureState::message() const {
  std::lock_guard lock(mutex_);
  return message_;
}

}  // namespace pipesgd
