#include "pipesgd/core/interrupt.h"

#include <time.h>

#include <csignal>
#include <cstdint>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

std::atomic<int> received{0};
std::atomic<std::int64_t> first_at{0};  // CLOCK_MONOTONIC ns of the first signal, 0 before
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free,
              "the signal handler may only touch lock-free atomics");

// How long after the first signal a repeat is the same request (see interrupt.h).
constexpr std::int64_t kSameSignalNs = 100'000'000;
constexpr std::int64_t kOtherSignalNs = 1'000'000'000;

bool set_action(int signal, void (*handler)(int)) {
  struct sigaction action{};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // interrupted system calls resume
  return ::sigaction(signal, &action, nullptr) == 0;
}

// Async-signal-safe: lock-free atomics, clock_gettime, sigaction and raise only.
extern "C" void on_interrupt(int signal) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const std::int64_t at = static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  std::int64_t first = 0;
  if (first_at.compare_exchange_strong(first, at, std::memory_order_relaxed)) {
    received.store(signal, std::memory_order_relaxed);
    return;
  }
  const int first_signal = received.load(std::memory_order_relaxed);  // 0 only while the first is stored
  if (at - first < (first_signal == signal || first_signal == 0 ? kSameSignalNs : kOtherSignalNs)) return;
  set_action(signal, SIG_DFL);  // a second request: the default action, once this handler returns
  ::raise(signal);
}

}  // namespace

const std::atomic<int>& interrupt_signal() { return received; }

std::optional<std::chrono::nanoseconds> time_since_interrupt() {
  const std::int64_t first = first_at.load(std::memory_order_relaxed);
  if (first == 0) return std::nullopt;
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return std::chrono::nanoseconds(static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec - first);
}

void install_interrupt_handlers() {
  const bool installed = set_action(SIGINT, on_interrupt) && set_action(SIGTERM, on_interrupt);
  PIPESGD_ASSERT(installed);
}

std::string interruption_notice(int signal) { return concat("interrupted by ", signal_name(signal)); }

std::optional<int> interruption_in(const std::string& failure_message) {
  for (const int signal : {SIGINT, SIGTERM}) {
    if (failure_message.find(concat(" failed: ", interruption_notice(signal))) != std::string::npos) return signal;
  }
  return std::nullopt;
}

std::string signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return concat("signal ", signal);
}

}  // namespace pipesgd
