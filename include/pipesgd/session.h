#pragma once
// A world joined for the life of an object: the init() ... shutdown() shape of Horovod, which the
// Python front end builds on, beside the callback form of world.h (run_threads / run_mpi).
//
//   std::unique_ptr<pipesgd::Session> session = pipesgd::Session::join_mpi(&argc, &argv, options);
//   if (!session->is_worker()) return 0;  // a server rank: it has served until the workers shut down
//   pipesgd::Worker& worker = session->worker();
//   ... build modules, a DistributedOptimizer, train ...
//   session->shutdown();                   // or let the session go out of scope
//
// join_mpi: one rank per process under mpirun; MPI is initialised here (once per process: a second
// join_mpi in the same process is a CommError). The last WorldOptions::servers ranks are parameter
// servers: on them join_mpi serves and returns only when worker 0 shuts down,
// with is_worker() false. join_alone: one worker and no peer, for a script run without a launcher
// (no MPI; parameter-server methods need servers and are refused by the optimizer).
//
// Shutdown: every worker calls shutdown() (or destroys the session) once it is done with its
// optimizers and collectives; worker 0 then tells the servers to stop; MPI is finalised.
// Failure: a worker that cannot go on calls fail(reason): every other rank's pending and next
// wait throws PeerFailedError naming this rank and `reason`, and MPI is left unfinalised (a
// finalize could wait forever on a peer that stopped). A session destroyed while an exception
// unwinds the stack fails with "the program stopped with an exception" rather than shutting down.
//
// Threads: the session and its Worker belong to the thread that joined.
#include <memory>

#include "pipesgd/world.h"

namespace pipesgd {

class Session {
 public:
  struct Impl;
  static std::unique_ptr<Session> join_mpi(int* argc, char*** argv, const WorldOptions& options = {});
  static std::unique_ptr<Session> join_alone(const WorldOptions& options = {});
  explicit Session(std::unique_ptr<Impl> impl);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // False on a server rank (after it served) and after shutdown() or fail().
  bool is_worker() const;
  // This rank's worker; UsageError on a server rank or after shutdown() / fail().
  Worker& worker();
  // See above. Idempotent; a no-op after fail(). Throws CommError if worker 0 cannot reach a
  // server within WorldOptions::timeout (MPI is then left unfinalised).
  void shutdown();
  // See above. Never throws; idempotent.
  void fail(const std::string& reason) noexcept;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipesgd
