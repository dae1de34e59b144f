#pragma once
// Builds an allreduce algorithm by name (the list and each entry: allreduce_algorithms.h):
//  ring                RingAllreduce: bandwidth-optimal, 2(p-1) steps, segmented.
//  recursive-doubling  RecursiveDoublingAllreduce: log2(p) steps of whole vectors; small vectors.
//  halving-doubling    HalvingDoublingAllreduce (Rabenseifner): bandwidth-optimal, 2 log2(p) steps.
//  tree                TreeAllreduce: segmented reduce up a binary tree and broadcast down it.
//  direct              DirectAllreduce: reduce-scatter and allgather with every peer at once, two
//                      rounds; for shared memory with more ranks than cores.
// Every algorithm accepts any world size (the ring up to 2049 ranks), any count and every codec,
// and leaves every rank with a bit-identical result; their headers give the message pattern, bytes
// sent and codec error.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {

// Throws UsageError naming the valid algorithms if `algorithm` is not one of them. `transport` and
// `codec` must outlive the returned object.
std::unique_ptr<Allreduce> make_allreduce(std::string_view algorithm, Transport& transport,
                                          std::size_t max_count, const Codec& codec,
                                          AllreduceOptions options = {});

}  // namespace pipesgd
