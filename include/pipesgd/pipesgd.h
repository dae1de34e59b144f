#pragma once
// pipesgd's public C++ API (docs/user-guide.md, "C++ API"):
//   pipesgd/world.h                  run_threads / run_mpi, Worker (rank, size, collectives)
//   pipesgd/distributed_optimizer.h  DistributedOptimizer: any method of the CLI in your own loop
//   pipesgd/session.h                Session: the same world joined for the life of an object (init/shutdown)
//   pipesgd/errors.h                 the exception types (UsageError, DataError, CommError, ...)
// Link the CMake target pipesgd::pipesgd (find_package(pipesgd)).
#include "pipesgd/distributed_optimizer.h"
#include "pipesgd/elastic.h"
#include "pipesgd/errors.h"
#include "pipesgd/session.h"
#include "pipesgd/world.h"
