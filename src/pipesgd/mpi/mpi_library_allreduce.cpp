#include "pipesgd/mpi/mpi_library_allreduce.h"

#include <mpi.h>

#include <climits>

#include "pipesgd/core/error.h"

namespace pipesgd {

struct MpiLibraryAllreduce::Communicator {
  MPI_Comm handle = MPI_COMM_NULL;
};

MpiLibraryAllreduce::MpiLibraryAllreduce(MpiRuntime&) : communicator_(std::make_unique<Communicator>()) {
  MPI_Comm_dup(MPI_COMM_WORLD, &communicator_->handle);
  MPI_Comm_set_errhandler(communicator_->handle, MPI_ERRORS_RETURN);
}

MpiLibraryAllreduce::~MpiLibraryAllreduce() { MPI_Comm_free(&communicator_->handle); }

void MpiLibraryAllreduce::run(std::span<float> data, Tag) {
  if (data.size() > static_cast<std::size_t>(INT_MAX)) {
    throw UsageError(concat("MPI_Allreduce: ", data.size(), " elements exceed MPI's int count"));
  }
  const int code = MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT,
                                 MPI_SUM, communicator_->handle);
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw CommError(concat("MPI_Allreduce failed: ", std::string(text, static_cast<std::size_t>(length))));
  }
}

}  // namespace pipesgd
