#include "pipesgd/collective/allreduce_factory.h"

#include "pipesgd/collective/allreduce_algorithm_names.h"
#include "pipesgd/collective/direct_allreduce.h"
#include "pipesgd/collective/halving_doubling_allreduce.h"
#include "pipesgd/collective/recursive_doubling_allreduce.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/collective/tree_allreduce.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

std::vector<std::string> allreduce_algorithm_names() {
  return {kAllreduceAlgorithmNames.begin(), kAllreduceAlgorithmNames.end()};
}

std::unique_ptr<Allreduce> make_allreduce(std::string_view algorithm, Transport& transport,
                                          std::size_t max_count, const Codec& codec,
                                          AllreduceOptions options) {
  if (algorithm == "ring")
    return std::make_unique<RingAllreduce>(transport, max_count, codec, options);
  if (algorithm == "recursive-doubling") {
    return std::make_unique<RecursiveDoublingAllreduce>(transport, max_count, codec, options);
  }
  if (algorithm == "halving-doubling") {
    return std::make_unique<HalvingDoublingAllreduce>(transport, max_count, codec, options);
  }
  if (algorithm == "tree")
    return std::make_unique<TreeAllreduce>(transport, max_count, codec, options);
  if (algorithm == "direct")
    return std::make_unique<DirectAllreduce>(transport, max_count, codec, options);
  throw UsageError(concat("unknown allreduce algorithm '", algorithm, "' (expected ",
                          join(allreduce_algorithm_names()), ")"));
}

}  // namespace pipesgd
