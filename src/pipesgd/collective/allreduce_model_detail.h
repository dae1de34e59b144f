#pragma once
// Building blocks of the algorithms' descriptors (allreduce_algorithms.h): their rounds and cost
// coefficients. Internal: include only from src/pipesgd/collective/*.cpp.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "pipesgd/collective/allreduce_algorithms.h"

namespace pipesgd::allreduce_model {

// floor(log2 p) for p >= 1.
inline int floor_log2(int p) {
  int log = 0;
  while ((std::int64_t{2} << log) <= p) ++log;
  return log;
}

inline AllreduceRound round_of(std::vector<AllreduceFlow> flows, double fraction, double reduced, int repeat = 1,
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
inline AllreduceRound exchange(const Fold& fold, int distance, double fraction, double reduced) {
  std::vector<AllreduceFlow> flows;
  for (int a = 0; a < fold.q; ++a) flows.push_back({fold.rank(a), fold.rank(a ^ distance)});
  return round_of(std::move(flows), fraction, reduced);
}

// The rounds of the q-rank algorithm with the r extra ranks folded in before and returned after.
inline std::vector<AllreduceRound> folded(const Fold& fold, std::vector<AllreduceRound> power_of_two) {
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

// The coefficients of the q-rank algorithm `power_of_two` (q = 2^floor(log2 p)) with the r = p - q
// extra ranks folded in: a pre-step (whole vector sent and added) and a post-step (result sent
// back), each one message.
inline AllreduceCoefficients folded(int world_size, AllreduceCoefficients power_of_two) {
  const double q = static_cast<double>(std::int64_t{1} << floor_log2(world_size));
  const double extra = world_size > q ? 1.0 : 0.0;
  return {power_of_two.messages + 2 * extra, power_of_two.transferred + 2 * extra, power_of_two.reduced + extra};
}

}  // namespace pipesgd::allreduce_model
