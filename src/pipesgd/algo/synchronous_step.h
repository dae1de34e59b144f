#pragma once
// D-Sync's iteration end, shared by the methods that run it (dsync; pipe's warm-up).
#include <cstdint>
#include <span>

#include "pipesgd/algo/iteration_times.h"
#include "pipesgd/collective/allreduce.h"
#include "pipesgd/optim/lr_schedule.h"
#include "pipesgd/optim/optimizer.h"

namespace pipesgd {

// On the compute thread: allreduces `gradient` (Channel::kGradients, sequence t), then steps
// `parameters` with it scaled by `scale` (1 / workers) at the learning rate of `schedule` for t.
// times.wait = times.comm = the allreduce's time; times.update = the step's.
void allreduce_then_step(Allreduce& allreduce, Optimizer& optimizer, const LrSchedule& schedule,
                         std::span<float> parameters, std::span<float> gradient, float scale, std::int64_t t,
                         IterationTimes& times);

}  // namespace pipesgd
