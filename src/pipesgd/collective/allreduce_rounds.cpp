#include "pipesgd/collective/allreduce_rounds.h"

#include <string>

#include "pipesgd/core/error.h"

namespace pipesgd {

std::vector<AllreduceRound> allreduce_rounds(std::string_view algorithm, int world_size) {
  const AllreduceAlgorithm* entry = find_allreduce_algorithm(algorithm);
  if (entry == nullptr) {
    throw UsageError(concat("unknown allreduce algorithm '", algorithm, "' (known: ", join(allreduce_algorithm_names()), ")"));
  }
  if (world_size < 1) throw UsageError(concat("allreduce rounds: world size must be at least 1, got ", world_size));
  if (world_size == 1) return {};
  return entry->rounds(world_size);
}

}  // namespace pipesgd
