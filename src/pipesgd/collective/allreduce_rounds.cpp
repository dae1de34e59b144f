#include "pipesgd/collective/allreduce_rounds.h"

#include <algorithm>
#include <string>

#include "pipesgd/collective/allreduce_algorithm_names.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

AllreduceRound round_of(std::vector<AllreduceFlow> flows, double fraction, double reduced, int repeat = 1,
                        bool chained = false) {
  std::sort(flows.begin(), flows.end());
  return {std::move(flows), fraction, reduced, repeat, chained};
}

// The fold of p ranks onto q active ones (allreduce_detail.h): q, r and the ranks by active index.
struct Fold {
  explicit Fold(int p) {
    while (q * 2 <= p) q *= 2;
    r = p - q;
  }
  int rank(int active) const { return active < r ? 2 * active + 1 : active + r; }
  int q = 1, r = 0;
};

// Every active rank exchanges with its partner at distance `distance`, `fraction` of the vector.
AllreduceRound exchange(const Fold& fold, int distance, double fraction, double reduced) {
  std::vector<AllreduceFlow> flows;
  for (int a = 0; a < fold.q; ++a) flows.push_back({fold.rank(a), fold.rank(a ^ distance)});
  return round_of(std::move(flows), fraction, reduced);
}

std::vector<AllreduceRound> folded(const Fold& fold, std::vector<AllreduceRound> power_of_two) {
  if (fold.r == 0) return power_of_two;
  std::vector<AllreduceFlow> in, out;
  for (int i = 0; i < fold.r; ++i) {
    in.push_back({2 * i, 2 * i + 1});
    out.push_back({2 * i + 1, 2 * i});
  }
  std::vector<AllreduceRound> rounds{round_of(std::move(in), 1.0, 1.0)};
  for (AllreduceRound& round : power_of_two) rounds.push_back(std::move(round));
  rounds.push_back(round_of(std::move(out), 1.0, 0.0));
  return rounds;
}

}  // namespace

std::vector<AllreduceRound> allreduce_rounds(std::string_view algorithm, int world_size) {
  if (std::find(kAllreduceAlgorithmNames.begin(), kAllreduceAlgorithmNames.end(), algorithm) ==
      kAllreduceAlgorithmNames.end()) {
    std::string known;
    for (std::string_view name : kAllreduceAlgorithmNames) known += concat(known.empty() ? "" : ", ", name);
    throw UsageError(concat("unknown allreduce algorithm '", algorithm, "' (known: ", known, ")"));
  }
  if (world_size < 1) throw UsageError(concat("allreduce rounds: world size must be at least 1, got ", world_size));
  const int p = world_size;
  if (p == 1) return {};
  const double share = 1.0 / p;
  if (algorithm == "ring") {
    std::vector<AllreduceFlow> flows;
    for (int i = 0; i < p; ++i) flows.push_back({i, (i + 1) % p});
    return {round_of(flows, share, share, p - 1, true), round_of(flows, share, 0.0, p - 1, true)};
  }
  if (algorithm == "direct") {
    std::vector<AllreduceFlow> flows;
    for (int i = 0; i < p; ++i) {
      for (int j = 0; j < p; ++j) {
        if (i != j) flows.push_back({i, j});
      }
    }
    // A rank sends p-1 blocks of 1/p at once: the round carries (p-1)/p of the vector per rank,
    // split over p-1 flows, and the owner reduces its block from p-1 peers.
    return {round_of(flows, share, (p - 1) * share), round_of(flows, share, 0.0)};
  }
  if (algorithm == "tree") {
    // Heap numbering: rank i's parent (i - 1) / 2; depth of i = floor(log2(i + 1)).
    auto depth_of = [](int rank) {
      int depth = 0;
      while ((2 << depth) <= rank + 1) ++depth;
      return depth;
    };
    const int depth = depth_of(p - 1);
    std::vector<AllreduceRound> rounds;
    for (int level = depth; level >= 1; --level) {
      std::vector<AllreduceFlow> up;
      for (int i = 0; i < p; ++i) {
        if (depth_of(i) == level) up.push_back({i, (i - 1) / 2});
      }
      rounds.push_back(round_of(std::move(up), 1.0, 1.0));
    }
    for (int level = 1; level <= depth; ++level) {
      std::vector<AllreduceFlow> down;
      for (int i = 0; i < p; ++i) {
        if (depth_of(i) == level) down.push_back({(i - 1) / 2, i});
      }
      rounds.push_back(round_of(std::move(down), 1.0, 0.0));
    }
    return rounds;
  }
  const Fold fold(p);
  std::vector<AllreduceRound> rounds;
  if (algorithm == "recursive-doubling") {
    for (int distance = 1; distance < fold.q; distance *= 2) rounds.push_back(exchange(fold, distance, 1.0, 1.0));
    return folded(fold, std::move(rounds));
  }
  PIPESGD_ASSERT(algorithm == "halving-doubling");
  double fraction = 0.5;
  for (int distance = fold.q / 2; distance >= 1; distance /= 2, fraction /= 2) {
    rounds.push_back(exchange(fold, distance, fraction, fraction));
  }
  fraction = 1.0 / fold.q;
  for (int distance = 1; distance < fold.q; distance *= 2, fraction *= 2) {
    rounds.push_back(exchange(fold, distance, fraction, 0.0));
  }
  return folded(fold, std::move(rounds));
}

}  // namespace pipesgd
