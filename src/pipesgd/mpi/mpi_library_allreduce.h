#pragma once
// The MPI library's own MPI_Allreduce(MPI_SUM, MPI_FLOAT), behind the Allreduce interface: the
// baseline that `pipesgd bench allreduce --transport mpi` and `pipesgd calibrate` measure our
// algorithms against. Exact fp32 only (no codec). MPI_Allreduce is blocking and cannot time out; the
// benchmark's barriers (MpiTransport::barrier, with timeouts) stand guard around it.
#include <memory>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/mpi/mpi_runtime.h"

namespace pipesgd {

class MpiLibraryAllreduce final : public Allreduce {
 public:
  // Collective: duplicates MPI_COMM_WORLD. `runtime` must outlive this object.
  explicit MpiLibraryAllreduce(MpiRuntime& runtime);
  ~MpiLibraryAllreduce() override;
  std::string_view name() const override { return "MPI_Allreduce"; }
  // `tag` is unused: MPI orders collectives on a communicator itself.
  void run(std::span<float> data, Tag tag) override;

 private:
  struct Communicator;
  std::unique_ptr<Communicator> communicator_;
};

}  // namespace pipesgd
