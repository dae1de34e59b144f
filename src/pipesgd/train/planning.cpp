#include "pipesgd/train/planning.h"

#include "pipesgd/algo/bucketed_dsync.h"  // kCostProbes
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

bool calibrated_here(const MethodConfig& config, int workers, const std::string& algorithm) {
  return config.calibration && config.calibration->world_size == workers &&
         config.calibration->measured.count(algorithm) > 0;
}

}  // namespace

LinearCost planning_cost(const MethodConfig& config, const NetworkSpec& network, int workers,
                         double gradient_bytes) {
  const std::string algorithm = resolve_allreduce_algorithm(config, workers, gradient_bytes);
  if (calibrated_here(config, workers, algorithm)) return config.calibration->measured.at(algorithm);
  if (config.calibration) return allreduce_cost(algorithm, workers, config.calibration->link);
  LinkParameters link = default_link_parameters();
  if (network.emulated()) {
    link.alpha += network.latency_seconds;
    if (network.bits_per_second > 0) link.beta += 1.0 / network.bytes_per_second();
  }
  return allreduce_cost(algorithm, workers, link);
}

std::string planning_cost_source(const MethodConfig& config, const NetworkSpec& network, int workers) {
  if (config.calibration) {
    return config.calibration->world_size == workers
               ? "the calibration file's measured a + b*M"
               : "the calibration file's link parameters (Table II; it was measured at another world size)";
  }
  return concat("the allreduce timed over ", network.emulated() ? network.name : std::string("this transport"),
                " at ", kCostProbes, " sizes");
}

}  // namespace pipesgd
