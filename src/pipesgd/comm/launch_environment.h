#pragma once
// The launcher that started this process and its ranks, as the environment tells (no MPI call):
// OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK; PMI launchers (MPICH's
// hydra, srun --mpi=pmi2) PMI_SIZE and PMI_RANK; PMIx launchers PMIX_RANK, without the world size.
#include <functional>
#include <string>

namespace pipesgd {

struct LaunchEnvironment {
  std::string launcher;  // "mpirun", "a PMI launcher" or "a PMIx launcher"; "" if none started us
  int size = 0;          // ranks of the launch; 0: unknown
  int rank = -1;         // this process's rank; -1: unknown

  bool launched() const { return !launcher.empty(); }
  // The launch has more than one rank for certain (rank 1 or above tells it without a size).
  bool several_ranks() const { return size > 1 || rank >= 1; }
};

// From `lookup` (as std::getenv: nullptr for an unset variable). The first launcher whose variables
// are set wins, in the order above; a value that is not a whole number counts as unknown.
LaunchEnvironment read_launch_environment(const std::function<const char*(const char*)>& lookup);

// This process's (std::getenv).
LaunchEnvironment launch_environment();

}  // namespace pipesgd
