// run_mpi (include/pipesgd/world.h): the world over MpiTransport, one rank per process.
#include <memory>

#include "pipesgd/core/error.h"
#include "pipesgd/mpi/mpi_runtime.h"
#include "pipesgd/mpi/mpi_transport.h"
#include "pipesgd/world.h"

namespace pipesgd {

int run_mpi_world(Transport& transport, const WorldOptions& options, const std::function<void(Worker&)>& fn);

int run_mpi(int* argc, char*** argv, const WorldOptions& options, const std::function<void(Worker&)>& fn) {
  auto runtime = std::make_unique<MpiRuntime>(argc, argv);
  auto transport = std::make_unique<MpiTransport>(*runtime);
  try {
    run_mpi_world(*transport, options, fn);
  } catch (...) {
    // MPI_Finalize could wait forever on a failed peer: leave MPI as it is (mpi/mpi_transport.h).
    (void)transport.release();
    (void)runtime.release();
    throw;
  }
  transport.reset();
  runtime.reset();
  return 0;
}

}  // namespace pipesgd
