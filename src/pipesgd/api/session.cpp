// Session (include/pipesgd/session.h): a world joined for the life of an object.
#include "pipesgd/session.h"

#include <exception>
#include <string>
#include <thread>

#include "pipesgd/api/api_trace.h"
#include "pipesgd/api/server_ranks.h"
#include "pipesgd/api/worker_impl.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/mpi/mpi_runtime.h"
#include "pipesgd/mpi/mpi_transport.h"

namespace pipesgd {

// Owns the world's pieces; members are destroyed worker first, then the transport, then MPI, then
// the trace's recorder.
struct Session::Impl {
  explicit Impl(const WorldOptions& options_) : options(options_), trace(options_) {}

  WorldOptions options;
  WorldTrace trace;  // WorldOptions::trace: checked before MPI starts
  int worker_count = 1;
  std::unique_ptr<MpiRuntime> runtime;         // join_mpi
  std::unique_ptr<MpiTransport> mpi_transport;  // join_mpi
  std::unique_ptr<LocalFabric> fabric;         // join_alone
  Transport* transport = nullptr;              // the world's transport (one of the two above)
  std::unique_ptr<Worker> worker;              // null on a server rank
  bool ended = false;                          // shut down, or failed
  bool failed = false;
  // A worker's track, installed on the joining thread for the session's life (its optimizers and
  // their comm threads record into the trace), and that thread.
  std::unique_ptr<ScopedThreadTrace> traced;
  std::thread::id joined_on = std::this_thread::get_id();

  ~Impl() { stop_tracing(); }
  void install_worker_trace(int rank) {
    if (ThreadTrace* track = trace.add_rank(rank, worker_count)) traced = std::make_unique<ScopedThreadTrace>(track);
  }
  // The joining thread records no more. A thread-local trace can be restored on its own thread only:
  // elsewhere (a session ended by another thread, against its contract) it is left as it is.
  void stop_tracing() noexcept {
    if (std::this_thread::get_id() == joined_on) {
      traced.reset();
    } else {
      (void)traced.release();
    }
  }

  // Leaves MPI as it is (a finalize could wait forever on a failed peer; mpi/mpi_transport.h).
  // Leaves MPI unfinalised (its objects leaked: a finalize could wait forever on a failed peer).
  // The worker stays: objects built on it (optimizers, the Python front end's references) may
  // still call it, and its waits then throw.
  void abandon_mpi() noexcept {
    (void)mpi_transport.release();
    (void)runtime.release();
  }
};

std::unique_ptr<Session> Session::join_mpi(int* argc, char*** argv, const WorldOptions& options) {
  prepare_world(options);
  auto impl = std::make_unique<Impl>(options);
  impl->runtime = std::make_unique<MpiRuntime>(argc, argv);
  impl->mpi_transport = std::make_unique<MpiTransport>(*impl->runtime);
  impl->transport = impl->mpi_transport.get();
  const int size = impl->transport->size();
  const int rank = impl->transport->rank();
  impl->worker_count = size - options.servers;
  if (impl->worker_count < 1) {
    // Every rank finds the same: MPI is finalised normally as impl goes.
    throw UsageError(concat("mpirun started ", size, " ranks: that leaves no worker beside ", options.servers,
                            " parameter servers"));
  }
  if (rank < impl->worker_count) {
    impl->worker = std::make_unique<Worker>(std::make_unique<Worker::Impl>(
        *impl->transport, impl->worker_count, options.servers, local_rank_from_environment(rank), /*mpi=*/true,
        options.timeout));
    impl->install_worker_trace(rank);
  } else {
    const ScopedThreadTrace serving(impl->trace.add_rank(rank, impl->worker_count));
    try {
      run_server_rank(*impl->transport, impl->worker_count, options.timeout, nullptr);
      // Worker 0 gathers the trace (every rank's: collective) once it told the servers to stop.
      impl->trace.gather(*impl->transport, options.timeout);
    } catch (const std::exception& error) {
      impl->transport->report_failure(error.what());
      impl->trace.write_after_failure(rank, error.what());
      impl->abandon_mpi();
      throw;
    }
  }
  return std::make_unique<Session>(std::move(impl));
}

std::unique_ptr<Session> Session::join_alone(const WorldOptions& options) {
  prepare_world(options);
  if (options.servers != 0) {
    throw UsageError(concat("a world of one worker alone has no parameter servers: WorldOptions::servers must be 0, got ",
                            options.servers, " (start the program under mpirun with join_mpi)"));
  }
  auto impl = std::make_unique<Impl>(options);
  impl->fabric = std::make_unique<LocalFabric>(1);
  impl->transport = &impl->fabric->endpoint(0);
  impl->worker = std::make_unique<Worker>(
      std::make_unique<Worker::Impl>(*impl->transport, 1, 0, 0, /*mpi=*/false, options.timeout));
  impl->install_worker_trace(0);
  return std::make_unique<Session>(std::move(impl));
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Session::~Session() {
  if (std::uncaught_exceptions() > 0) {
    fail("the program stopped with an exception");
    return;
  }
  try {
    shutdown();
  } catch (...) {
    // shutdown() failed the session already; a destructor does not throw.
  }
}

bool Session::is_worker() const { return impl_->worker != nullptr && !impl_->ended; }

Worker& Session::worker() {
  if (impl_->ended) throw UsageError(impl_->failed ? "the session failed earlier" : "the session was shut down");
  if (!impl_->worker) {
    throw UsageError(concat("rank ", impl_->transport->rank(), " is a parameter server: it runs no worker (check ",
                            "is_worker() after joining)"));
  }
  return *impl_->worker;
}

void Session::shutdown() {
  Impl& impl = *impl_;
  if (impl.ended) return;
  if (impl.worker) {  // (a server rank gathered its trace in join_mpi)
    try {
      if (impl.worker->rank() == 0 && impl.options.servers > 0) {
        send_server_shutdown(*impl.transport, impl.worker_count, impl.worker->impl().server_message_sequence,
                             impl.options.timeout);
      }
      impl.trace.gather(*impl.transport, impl.options.timeout);  // collective: every rank, servers too
    } catch (const std::exception& error) {
      fail(error.what());
      throw;
    }
  }
  impl.ended = true;
  impl.stop_tracing();
  impl.worker.reset();
  impl.mpi_transport.reset();  // collective over MPI_COMM_WORLD, as its construction was
  impl.runtime.reset();        // MPI_Finalize
  impl.fabric.reset();
  impl.trace.write();  // rank 0, once the world ended: a failure to write it leaves no rank waiting
}

void Session::fail(const std::string& reason) noexcept {
  Impl& impl = *impl_;
  if (impl.ended) return;
  impl.ended = true;
  impl.failed = true;
  try {
    impl.transport->report_failure(reason);
  } catch (...) {
    // Reporting is best effort: the others' timeouts still end their waits.
  }
  impl.trace.write_after_failure(impl.transport->rank(), reason);  // this rank's own: no gathering now
  impl.stop_tracing();
  impl.abandon_mpi();
}

}  // namespace pipesgd
