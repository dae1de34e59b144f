#pragma once
// The names of the allreduce algorithms, the one list of them: make_allreduce
// (collective/allreduce_factory.h) builds each, and the cost model (timing/allreduce_cost_model.h)
// describes each. A header of its own so that the cost model names them without depending on the
// implementations.
#include <array>
#include <string_view>

namespace pipesgd {

// In the order allreduce_factory.h lists them.
inline constexpr std::array<std::string_view, 5> kAllreduceAlgorithmNames = {
    "ring", "recursive-doubling", "halving-doubling", "tree", "direct"};

}  // namespace pipesgd
