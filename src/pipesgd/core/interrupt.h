#pragma once
// SIGINT and SIGTERM as a request to stop: the handler only stores the signal's number in a
// process-wide flag (a lock-free atomic: async-signal-safe), which a long run reads at its
// iteration boundaries and then stops cleanly (train/early_stop.h). A second request, SIGINT or
// SIGTERM, gets the default action and ends the process at once. A signal is the first request
// delivered again, not a second one, when it is the same signal within 100 ms of the first
// (coreutils `timeout` signals the process and then its process group) or the other one within
// 1 s (mpirun answers a Ctrl-C, which the terminal sent to every rank too, with SIGTERM).
#include <atomic>
#include <chrono>
#include <optional>
#include <string>

namespace pipesgd {

// 0, or the number of the first SIGINT / SIGTERM received since install_interrupt_handlers().
const std::atomic<int>& interrupt_signal();

// How long ago the first SIGINT / SIGTERM arrived (CLOCK_MONOTONIC); nullopt before one did.
// Async-signal-safe reads only: any thread may call it, at any time.
std::optional<std::chrono::nanoseconds> time_since_interrupt();

// Installs the handlers of SIGINT and SIGTERM (SA_RESTART: interrupted system calls resume).
void install_interrupt_handlers();

// A rank that stops early for a signal tells the others with this reason (Transport::report_failure):
// "interrupted by SIGTERM".
std::string interruption_notice(int signal);
// The signal of a failure message that carries a rank's interruption_notice ("... rank R failed:
// interrupted by SIGTERM"); nullopt for any other failure.
std::optional<int> interruption_in(const std::string& failure_message);

// "SIGINT", "SIGTERM", else "signal N".
std::string signal_name(int signal);

}  // namespace pipesgd
