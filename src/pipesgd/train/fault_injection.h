#pragma once
// --inject-fault rank=R,iter=N,kind=crash|hang[,at=iteration|checkpoint]: makes worker R fail at the
// start of iteration N (at=iteration, the default), or halfway through writing its checkpoint after
// iteration N (at=checkpoint: a torn temporary file is left behind, as a crash mid-write would), for
// testing what the other workers do (they must exit with one line naming the peer, the operation
// and the iteration within --comm-timeout, never hang).
//   crash  the worker stops without telling anyone, as a killed process: under --transport local
//          its thread ends silently; under mpi the process kills itself (SIGKILL).
//   hang   the worker stops communicating but stays alive: under local its thread blocks until
//          another worker has failed, then ends silently; under mpi the process sleeps until it is
//          killed (mpirun kills it once another rank exits with an error).
#include <cstdint>
#include <string>

namespace pipesgd {

struct FaultInjection {
  enum class Kind { kCrash, kHang };
  int rank = -1;  // -1: no fault
  std::int64_t iteration = 0;
  Kind kind = Kind::kCrash;
  bool during_checkpoint = false;  // at=checkpoint
  bool active() const { return rank >= 0; }
};

// Parses "rank=R,iter=N,kind=crash|hang" (keys in any order, each once). Throws UsageError naming
// --inject-fault and the bad part.
FaultInjection parse_fault_injection(const std::string& text);

// Thrown on the faulty worker's own thread to end it silently (not a std::exception: no handler
// reports it to the peers).
struct InjectedFault {};

}  // namespace pipesgd
