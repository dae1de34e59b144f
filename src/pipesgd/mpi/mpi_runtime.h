#pragma once
// MPI's lifetime in this process. Only the MPI adapter (this folder) includes <mpi.h>; the core sees
// MPI through the Transport interface and the Allreduce interface.
//
// Thread model: MPI_THREAD_MULTIPLE. A worker's compute thread (epoch-end control reductions) and
// its comm thread (gradient allreduces) may both be inside MPI at the same time; funnelling every
// call through one thread would add a hand-off (two wake-ups) per message on the hot path, and
// OpenMPI 4.1's ob1/vader/tcp stack supports MPI_THREAD_MULTIPLE. Construction fails with CommError
// if the library does not provide it.
#include <string>

namespace pipesgd {

class MpiRuntime {
 public:
  // Calls MPI_Init_thread. One MpiRuntime per process, created and destroyed on the main thread.
  MpiRuntime(int* argc, char*** argv);
  // MPI_Finalize, unless the run failed (finalize could wait forever on a dead peer; see
  // exit_without_finalize).
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "Open MPI v4.1.4, ..." (first line of MPI_Get_library_version).
  std::string library_version() const;

  // Ends the process at once with `exit_code` after flushing stdout/stderr, without MPI_Finalize:
  // the path for a failed run, where peers may be dead or hung.
  [[noreturn]] static void exit_without_finalize(int exit_code);

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace pipesgd
