#pragma once
// Two error tiers.
//  * Checked errors (classes below): anything a user, a data file or a peer can cause. They carry a
//    one-line message that names the problem; the CLI prints it and exits non-zero.
//  * PIPESGD_ASSERT: our own invariants. A failure is a bug in pipesgd; it prints file:line and aborts.
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pipesgd {

// Base of every checked error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A flag, flag combination or configuration the user gave is invalid.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A data, calibration or checkpoint file is missing, truncated or malformed.
class DataError : public Error {
 public:
  using Error::Error;
};

// Communication failed: a peer, a link or the transport itself.
class CommError : public Error {
 public:
  using Error::Error;
};

// A wait on a peer did not complete within its timeout.
class CommTimeoutError : public CommError {
 public:
  // `peer`: the rank whose message was waited for, or -1 when the wait was not on one peer (e.g. a
  // compute thread waiting for its own comm thread).
  explicit CommTimeoutError(const std::string& message, int peer = -1) : CommError(message), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// Another worker of the same run failed; this worker stops because of it.
class PeerFailedError : public CommError {
 public:
  using CommError::CommError;
};

// The workers disagree on a collective they submitted under one name (its kind, dtype, shape,
// reduction, root, scale factors or process set), or it needs a worker that has joined.
class CollectiveMismatchError : public Error {
 public:
  using Error::Error;
};

// A gradient is not finite (NaN or Inf) and --on-nonfinite stop is in effect.
class NumericalError : public Error {
 public:
  using Error::Error;
};

// Replicas that must hold identical weights do not (--check-consistency).
class ReplicaDivergenceError : public Error {
 public:
  using Error::Error;
};

// Builds a message from any streamable parts: concat("rank ", 3, " timed out"). Constrained to
// streamable parts, so that argument-dependent lookup from other libraries' own concat (pybind11's,
// over types of this namespace) does not pick it.
// (SFINAE rather than a requires-clause: the fuzz build compiles some sources as C++17.)
template <typename... Parts,
          typename = std::void_t<decltype((std::declval<std::ostream&>() << ... << std::declval<Parts>()))>>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

// "a, b and c": a list in a sentence, for messages.
inline std::string join_and(const std::vector<std::string>& items) {
  std::string text;
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (k > 0) text += k + 1 == items.size() ? " and " : ", ";
    text += items[k];
  }
  return text;
}

// "a, b, c": the names of a list, for messages.
inline std::string join(const std::vector<std::string>& items, const std::string& separator = ", ") {
  std::string text;
  for (const std::string& item : items) {
    if (!text.empty()) text += separator;
    text += item;
  }
  return text;
}

[[noreturn]] void assertion_failed(const char* expression, const char* file, int line);

}  // namespace pipesgd

#define PIPESGD_ASSERT(condition) \
  ((condition) ? static_cast<void>(0) : ::pipesgd::assertion_failed(#condition, __FILE__, __LINE__))
