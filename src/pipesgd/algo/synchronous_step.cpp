#include "pipesgd/algo/synchronous_step.h"

#include "pipesgd/core/clock.h"

namespace pipesgd {

void allreduce_then_step(Allreduce& allreduce, Optimizer& optimizer, std::span<float> parameters,
                         std::span<float> gradient, float scale, std::int64_t t, IterationTimes& times) {
  Stopwatch communication;
  allreduce.run(gradient, collective_tag(Channel::kGradients, static_cast<std::uint64_t>(t)));
  times.wait = times.comm = communication.seconds();
  Stopwatch update;
  optimizer.step(parameters, gradient, scale, 0);
  times.update = update.seconds();
}

}  // namespace pipesgd
