#include "pipesgd/collective/allreduce_algorithms.h"

#include <array>

#include "pipesgd/collective/direct_allreduce.h"
#include "pipesgd/collective/halving_doubling_allreduce.h"
#include "pipesgd/collective/recursive_doubling_allreduce.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/collective/tree_allreduce.h"

namespace pipesgd {

std::span<const AllreduceAlgorithm> allreduce_algorithms() {
  // The list: one entry per algorithm, each defined beside its class.
  static const std::array kList = {
      ring_allreduce_algorithm(),
      recursive_doubling_allreduce_algorithm(),
      halving_doubling_allreduce_algorithm(),
      tree_allreduce_algorithm(),
      direct_allreduce_algorithm(),
  };
  return kList;
}

const AllreduceAlgorithm* find_allreduce_algorithm(std::string_view name) {
  for (const AllreduceAlgorithm& algorithm : allreduce_algorithms()) {
    if (algorithm.name == name) return &algorithm;
  }
  return nullptr;
}

std::vector<std::string> allreduce_algorithm_names() {
  std::vector<std::string> names;
  for (const AllreduceAlgorithm& algorithm : allreduce_algorithms()) names.emplace_back(algorithm.name);
  return names;
}

}  // namespace pipesgd
