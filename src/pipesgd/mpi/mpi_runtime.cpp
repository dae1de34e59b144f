#include "pipesgd/mpi/mpi_runtime.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>

#include "pipesgd/core/error.h"

namespace pipesgd {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) throw CommError("MPI is already initialised in this process");
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    throw CommError("MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw CommError(concat("the MPI library provides thread level ", provided,
                           ", pipesgd needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE, ")"));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiRuntime::~MpiRuntime() { MPI_Finalize(); }

std::string MpiRuntime::library_version() const {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string text(version, static_cast<std::size_t>(length));
  const std::size_t line_end = text.find_first_of(",\n");
  return text.substr(0, line_end);
}

void MpiRuntime::exit_without_finalize(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(exit_code);
}

}  // namespace pipesgd
