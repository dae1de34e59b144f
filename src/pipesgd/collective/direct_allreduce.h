#pragma once
// Direct allreduce: a reduce-scatter and an allgather in which every rank exchanges with every
// other rank at once, in two rounds, instead of passing blocks around a ring in 2(p-1) steps.
//
// Message pattern. The vector is cut into p blocks (n / p elements, plus one for block b < n % p;
// blocks may be empty); rank b owns block b.
//  * round 0 (reduce-scatter): rank r sends block b, encoded, to every other rank b (in the order
//    r+1, r+2, ... so that no rank is everybody's first peer), cut into segments
//    (AllreduceOptions::segment_bytes, each encoded on its own), and receives its own block's
//    segments from every other rank into two alternating cache-sized slots per peer; it decode-adds
//    segment j of every peer, in the fixed order r-1, r-2, ..., r+1 (mod p), then segment j+1;
//  * the owner encodes its fully reduced block once and keeps decode(its own encoding);
//  * round 1 (allgather): the owner sends that encoding to every other rank, which decodes it into
//    place.
// Bytes sent per rank: 2 (p-1) encoded blocks, 2(p-1)/p of the vector as in the ring; p-1 messages
// per round are in flight at once.
//
// Why it exists: on a shared-memory transport with more ranks than cores (MPI oversubscribed), each
// of the ring's 2(p-1) dependent steps needs both partners to be scheduled; two rounds need far fewer
// hand-offs. On a network with a serial NIC the alpha-beta model charges it the same as the ring
// (timing/allreduce_cost_model.h); `pipesgd calibrate` measures which one wins where.
//
// Summation order: block b is own + rank b-1's + rank b-2's + ... (mod p), fixed. Every rank ends
// bit-identical: each block's value is the decode of its owner's single encoding everywhere. With
// the identity codec sends come straight from `data` and the allgather receives straight into it.
//
// Codec error: an element goes through two encodings: its rank's contribution (one encoding) and
// the owner's encoding of the final sum.
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {

class DirectAllreduce final : public Allreduce {
 public:
  // `transport` and `codec` must outlive this object.
  DirectAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                  AllreduceOptions options = {});
  std::string_view name() const override { return "direct"; }
  void run(std::span<float> data, Tag tag) override;

 private:
  void run_rounds(std::span<float> data, Tag tag);

  Transport& transport_;
  const Codec& codec_;
  AllreduceOptions options_;
  std::size_t max_count_;
  std::size_t max_block_bytes_;          // encoded size of the largest block
  std::size_t segment_elements_;         // round 0 cuts blocks into segments of this many
  std::size_t segment_bytes_;            // encoded size of a full segment
  std::vector<std::byte> outgoing_;      // lossy codecs: block b encoded at b * max_block_bytes_
  std::vector<std::byte> incoming_;      // peer k's message at k * max_block_bytes_
  std::vector<Request> receives_;        // per peer
  std::vector<Request> sends_;           // per peer
};

// Its entry of the algorithm list (allreduce_algorithms.h): "direct", its rounds and cost coefficients.
AllreduceAlgorithm direct_allreduce_algorithm();

}  // namespace pipesgd
