#include "pipesgd/algo/synchronous_step.h"

#include "pipesgd/core/clock.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

void allreduce_then_step(Allreduce& allreduce, Optimizer& optimizer, const LrSchedule& schedule,
                         std::span<float> parameters, std::span<float> gradient, float scale, std::int64_t t,
                         IterationTimes& times) {
  TracedStopwatch communication("wait", kTraceCompute);  // the allreduce runs on this thread: all exposed
  allreduce.run(gradient, collective_tag(Channel::kGradients, static_cast<std::uint64_t>(t)));
  times.wait = times.comm = communication.stop();
  TracedStopwatch update("update");
  optimizer.set_learning_rate_factor(schedule.factor(t));
  optimizer.step(parameters, gradient, scale, 0);
  times.update = update.stop();
}

}  // namespace pipesgd
