// run_mpi (include/pipesgd/world.h): the callback form of Session::join_mpi (session.h).
#include <exception>
#include <memory>

#include "pipesgd/session.h"
#include "pipesgd/world.h"

namespace pipesgd {

int run_mpi(int* argc, char*** argv, const WorldOptions& options, const std::function<void(Worker&)>& fn) {
  std::unique_ptr<Session> session = Session::join_mpi(argc, argv, options);
  if (session->is_worker()) {
    try {
      fn(session->worker());
    } catch (const std::exception& error) {
      session->fail(error.what());  // the others' waits throw PeerFailedError; MPI stays unfinalised
      throw;
    } catch (...) {
      session->fail("an exception that is not a std::exception");
      throw;
    }
  }
  session->shutdown();
  return 0;
}

}  // namespace pipesgd
