#pragma once
// Shared state of the MPI tests, created by mpi_test_main.cpp: the process's MpiRuntime and one
// MpiTransport that tests may share (tests that break a transport make their own).
#include <memory>

#include "pipesgd/mpi/mpi_runtime.h"
#include "pipesgd/mpi/mpi_transport.h"

namespace pipesgd {
extern MpiRuntime* test_mpi_runtime;
extern MpiTransport* test_mpi_transport;
}  // namespace pipesgd
