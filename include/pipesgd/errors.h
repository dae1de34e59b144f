#pragma once
// The exception types of pipesgd's public API. Every failure of the API is one of these:
//   Error                        base of every checked error (a std::runtime_error)
//     UsageError                 a flag, option or call the user gave is invalid
//     DataError                  a data, calibration or checkpoint file (or state) is missing or corrupt
//     CommError                  communication failed: a peer, a link or the transport
//       CommTimeoutError         a wait on a peer did not complete within its timeout (peer(): the rank)
//       PeerFailedError          another worker of the run failed; this one stops because of it
//     CollectiveMismatchError    the workers disagree on a collective submitted under one name
//     NumericalError             a gradient is not finite and the run was told to stop on it
//     ReplicaDivergenceError     replicas that must hold identical weights do not
// Each carries a one-line message (what()) that names the problem.
//
// The classes are defined once, in pipesgd/core/exceptions.h (installed beside this header; it holds
// those classes and nothing else), which the implementation shares.
#include "pipesgd/core/exceptions.h"
