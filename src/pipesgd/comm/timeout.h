#pragma once
#include <chrono>
#include <cmath>
#include <string>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

// Longest accepted wait: 10^7 s (about 116 days) keeps every deadline far from clock overflow.
inline constexpr double kMaxTimeoutSeconds = 1e7;
inline constexpr double kMinTimeoutSeconds = 1e-3;

// Converts a user-given timeout in seconds; throws UsageError naming `flag` if it is not a number in
// [0.001, 10^7].
inline Timeout timeout_from_seconds(double seconds, const std::string& flag) {
  if (!std::isfinite(seconds) || seconds < kMinTimeoutSeconds || seconds > kMaxTimeoutSeconds) {
    throw UsageError(concat(flag, " must be between ", kMinTimeoutSeconds, " and ",
                            kMaxTimeoutSeconds, " seconds, got ", seconds));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000)));
}

}  // namespace pipesgd
