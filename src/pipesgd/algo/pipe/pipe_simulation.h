#pragma once
// Pipe-SGD's schedule for the simulator (algo/simulated_method.h), as PipeSgd runs it
// (algo/pipe/pipe_sgd.h): iteration t begins by waiting for the allreduce of g[t-K] and applying it;
// after backward it hands g[t] to the comm thread, which allreduces the gradients in iteration
// order. The first warm-up iterations run as D-Sync (allreduce on the compute thread, then update).
#include <memory>

#include "pipesgd/algo/simulated_method.h"

namespace pipesgd {

std::unique_ptr<SimulatedMethod> simulate_pipe(const SimulationContext& context);

}  // namespace pipesgd
