#include "pipesgd/collective/allreduce_factory.h"

#include "pipesgd/core/error.h"

namespace pipesgd {

std::unique_ptr<Allreduce> make_allreduce(std::string_view algorithm, Transport& transport,
                                          std::size_t max_count, const Codec& codec,
                                          AllreduceOptions options) {
  const AllreduceAlgorithm* entry = find_allreduce_algorithm(algorithm);
  if (entry == nullptr) {
    throw UsageError(concat("unknown allreduce algorithm '", algorithm, "' (expected ",
                            join(allreduce_algorithm_names()), ")"));
  }
  return entry->make(transport, max_count, codec, options);
}

}  // namespace pipesgd
