#pragma once
// nocomm: compute alone. Every worker runs the trainer's loop (data, forward, backward, update) on
// its own gradient and communicates nothing: not data-parallel training (the replicas drift apart),
// but the reference the communication path is measured against. `compare --algos nocomm,dsync,pipe`
// reports each method's compute stretch, its compute thread's busy time over nocomm's from the
// same compare (report/report.h finds nocomm by its trait, MethodTraits::compute_alone), and
// scripts/comm-path-bench.sh takes "compute alone" from it.
// Registry entry: algo/registry.cpp.
#include "pipesgd/algo/method_descriptor.h"

namespace pipesgd {

MethodDescriptor nocomm_method();

}  // namespace pipesgd
