#pragma once
// The message pattern of each allreduce algorithm as rounds of concurrent flows: who sends to whom
// at once, and what share of the vector each message carries. The simulator's modelled collectives
// (sim/collective_rounds.h) play each distinct round on the simulated network once, so a large
// world keeps its topology's contention (fat-tree oversubscription, a parent's link shared by two
// children) without simulating every message of every allreduce.
//
// The rounds (AllreduceFlow, AllreduceRound: allreduce_algorithms.h) are each algorithm's entry,
// beside its class (collective/*_allreduce.cpp), and follow its header, with q the largest power of
// two <= p, r = p - q, and active index i the rank 2i+1 for i < r, else i + r (allreduce_detail.h):
//   ring               p-1 reduce-scatter rounds then p-1 allgather rounds: rank i -> i+1 mod p,
//                      1/p of the vector each; chained (below): a step's data travels on around
//                      the ring, so 2(p-1) steps pass every link about equally often.
//   recursive-doubling fold (2i -> 2i+1, i < r, whole vector), log2 q exchanges between active
//                      partners a, a ^ 2^s (whole vector), return (2i+1 -> 2i).
//   halving-doubling   fold, log2 q reduce-scatter exchanges (a ^ q/2 first, 1/2, 1/4, ... of the
//                      vector), log2 q allgather exchanges (a ^ 1 first, 1/q, 2/q, ...), return.
//   tree               per level, deepest first, every rank of that depth -> its parent (whole
//                      vector, added), then per level from the root down, parent -> each child.
//                      The runtime pipelines segments through the levels; these rounds do not
//                      (as MG-WFBP Table II does not), so they overstate a long vector's time.
//   direct             two rounds in which every rank sends 1/p of the vector to every other.
// Summed over the rounds, the messages on a rank's critical path, the bytes it sends and the bytes
// it reduces per byte of the vector are allreduce_coefficients()'s (timing/allreduce_cost_model.h),
// except direct's messages: its p-1 messages of a round travel at once, so a round costs one
// latency, not p-1 (a serial NIC still pays their bytes one after another).
#include <string_view>
#include <vector>

#include "pipesgd/collective/allreduce_algorithms.h"

namespace pipesgd {

// The rounds of `algorithm` (an allreduce_algorithm_names() entry) on `world_size` ranks (its
// entry's rounds); none for 1 rank. Throws UsageError for an unknown algorithm or world_size < 1.
std::vector<AllreduceRound> allreduce_rounds(std::string_view algorithm, int world_size);

}  // namespace pipesgd
