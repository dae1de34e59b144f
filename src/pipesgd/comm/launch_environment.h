#pragma once
// The launcher that started this process and its ranks, as the environment tells (no MPI call):
// OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK; PMI launchers (MPICH's
// hydra, srun --mpi=pmi2) PMI_SIZE and PMI_RANK; PMIx launchers PMIX_RANK, without the world size.
// A torchrun-style launch (torchrun, torch.distributed.launch, torchelastic) sets RANK and
// WORLD_SIZE (and LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...) but none of the MPI launchers'
// variables: its processes never join one MPI world, each would run alone.
#include <functional>
#include <string>

namespace pipesgd {

struct LaunchEnvironment {
  std::string launcher;  // "mpirun", "a PMI launcher" or "a PMIx launcher"; "" if none started us
  int size = 0;          // ranks of the launch; 0: unknown
  int rank = -1;         // this process's rank; -1: unknown

  // Without an MPI launcher: RANK and WORLD_SIZE, both whole numbers (torchrun's), else 0 and -1;
  // and the torchrun variables that are set, as "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=...
  // MASTER_PORT=..." ("" when RANK and WORLD_SIZE are not both whole numbers).
  int torchrun_size = 0;
  int torchrun_rank = -1;
  std::string torchrun_variables;

  bool launched() const { return !launcher.empty(); }
  // The launch has more than one rank for certain (rank 1 or above tells it without a size).
  bool several_ranks() const { return size > 1 || rank >= 1; }
  // Started torchrun-style with WORLD_SIZE > 1 and no MPI launcher (a torchrun of one process is a
  // plain process).
  bool torchrun_world() const { return !launched() && torchrun_size > 1; }
};

// From `lookup` (as std::getenv: nullptr for an unset variable). The first launcher whose variables
// are set wins, in the order above; a value that is not a whole number counts as unknown. The
// torchrun variables are read only when no MPI launcher's are set.
LaunchEnvironment read_launch_environment(const std::function<const char*(const char*)>& lookup);

// This process's (std::getenv).
LaunchEnvironment launch_environment();

}  // namespace pipesgd
