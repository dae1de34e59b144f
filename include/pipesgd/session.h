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
// Trace (WorldOptions::trace): the joining thread is the worker's "compute" track for the session's
// life (what its DistributedOptimizers and their comm threads do is recorded); a server rank's
// "serve" track records inside join_mpi. shutdown() gathers every rank's events at rank 0 (a
// collective over the whole world, servers included: they take part before join_mpi returns),
// and rank 0 writes the file after MPI is finalised. fail(reason) writes this rank's own events up to
// it: rank 0 to the file, rank R > 0 to FILE.rank-R.
//
// Threads: the session and its Worker belong to the thread that joined; call shutdown() and fail()
// there (the trace is installed on that thread).
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
  // server, or (with a trace) a rank does not join the trace's gathering, within
  // WorldOptions::timeout (the session then fails: MPI is left unfinalised); on rank 0, the error of
  // writing the trace file, after the world ended.
  void shutdown();
  // See above. Never throws; idempotent.
  void fail(const std::string& reason) noexcept;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipesgd
