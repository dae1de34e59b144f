#pragma once
// The allreduce algorithms: one descriptor each (name, make, rounds, cost coefficients) and the one
// list of them. Each entry lives beside its class (ring_allreduce.h: ring_allreduce_algorithm(),
// ...); the list (allreduce_algorithms.cpp) names each once. Everything that knows the algorithms
// takes them from here: make_allreduce (allreduce_factory.h), the simulator's rounds
// (allreduce_rounds.h), the cost model and --allreduce auto (timing/allreduce_cost_model.h),
// --allreduce's and bench's --algos help and check. Adding an algorithm: its class and entry in
// one file, and one line in the list.
//
// A header without dependencies (the standard library only; the classes `make` builds are only
// declared here), so that timing/ describes the algorithms without depending on their
// implementations.
#include <compare>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pipesgd {

class Allreduce;
class Codec;
class Transport;
struct AllreduceOptions;

// T(M) = messages·α + transferred·M·β + reduced·M·γ on the critical path of one allreduce
// (timing/allreduce_cost_model.h: the model and the formulas of each algorithm).
struct AllreduceCoefficients {
  double messages = 0;     // message latencies
  double transferred = 0;  // bytes sent per byte of the vector
  double reduced = 0;      // bytes summed per byte of the vector
};

// One message of a round (allreduce_rounds.h: what the rounds are).
struct AllreduceFlow {
  int from = 0;
  int to = 0;
  bool operator==(const AllreduceFlow&) const = default;
  auto operator<=>(const AllreduceFlow&) const = default;
};

// `repeat` consecutive rounds with the same flows, each message carrying `fraction` of the
// (encoded) vector; the receiver then reduces `reduced` of the vector (fp32 bytes per byte).
struct AllreduceRound {
  std::vector<AllreduceFlow> flows;  // sorted; what the network carries at once
  double fraction = 0;
  double reduced = 0;
  int repeat = 1;
  // true: a rank's next message waits only for its predecessor's (the ring): the data passes the
  // flows (in their sorted order, a cycle) one after another, so `repeat` rounds cost the slowest
  // window of `repeat` consecutive flows; false: a round costs its slowest flow.
  bool chained = false;
  bool operator==(const AllreduceRound&) const = default;
};

// One allreduce algorithm.
struct AllreduceAlgorithm {
  std::string_view name;  // what --allreduce, --algos and calibration files call it
  // Builds it: make_allreduce's contract (allreduce_factory.h).
  std::unique_ptr<Allreduce> (*make)(Transport& transport, std::size_t max_count, const Codec& codec,
                                     const AllreduceOptions& options) = nullptr;
  // Its message pattern on world_size >= 2 ranks (world size 1 has none).
  std::vector<AllreduceRound> (*rounds)(int world_size) = nullptr;
  // Its cost coefficients on world_size >= 2 ranks (world size 1 costs nothing).
  AllreduceCoefficients (*coefficients)(int world_size) = nullptr;
};

// Every algorithm, in the list's order: ring, recursive-doubling, halving-doubling, tree, direct
// (--allreduce auto breaks ties in this order).
std::span<const AllreduceAlgorithm> allreduce_algorithms();
// The entry called `name`; nullptr if there is none.
const AllreduceAlgorithm* find_allreduce_algorithm(std::string_view name);
// The names, in the list's order.
std::vector<std::string> allreduce_algorithm_names();

}  // namespace pipesgd
