// pipesgd's checked errors: the exception classes and nothing else (no other pipesgd header, only
// the standard library). The one definition of each class: core/error.h includes this file for the
// code base (with its message helpers and assertion macro), and the public API's pipesgd/errors.h
// for users (installed beside it; the API's headers carry no internal helper).
// A classic include guard rather than #pragma once: the build tree's public copy
// (public_include/pipesgd/core/exceptions.h) and this file are two files of one content.
#ifndef PIPESGD_CORE_EXCEPTIONS_H_
#define PIPESGD_CORE_EXCEPTIONS_H_

#include <stdexcept>
#include <string>

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

}  // namespace pipesgd

#endif  // PIPESGD_CORE_EXCEPTIONS_H_
