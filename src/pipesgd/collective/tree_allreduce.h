#pragma once
// Tree allreduce: reduce up a binary tree to rank 0, then broadcast back down it, segment by
// segment.
//
// Message pattern. Rank i's parent is (i - 1) / 2 and its children are 2i + 1 and 2i + 2 where
// those are < p (heap numbering; any p >= 1, depth floor(log2 p)). The vector is cut into segments
// (AllreduceOptions::segment_bytes; kAutoSegmentBytes means kDefaultSegmentBytes, as for the ring;
// at most 4096 segments) that flow independently:
//  * reduce (step 0): for each segment j, a rank decode-adds its children's encoded segment j into
//    its own, then encodes the partial sum and sends it to its parent at once, while segment j+1 is
//    still arriving;
//  * broadcast (step 1): rank 0 encodes each fully reduced segment once, keeps decode(its own
//    encoding) and sends it to its children; every other rank decodes segment j from its parent
//    and forwards the very same bytes to its children, never re-encoding them. Broadcast segments
//    flow down while later segments are still being reduced (a rank forwards every segment that has
//    arrived each time it has sent one up), so large vectors pipeline up and down the tree.
// With int8 one scale covers one segment.
//
// Bytes sent per rank, with E(n) = codec.encoded_bytes summed over the segments (4n for `none`):
// E(n) up to the parent (not rank 0) plus E(n) down to each child: at most 3 E(n) (an inner rank
// with two children), E(n) for a leaf.
//
// Summation order: each rank adds its first child's partial sum, then its second's, to its own
// value; the order is fixed by the tree and does not depend on segmenting. Every rank ends
// bit-identical (the decode of rank 0's single encoding of the sum). With the identity codec, sends
// come straight from `data` and broadcast receives go straight into it.
//
// Codec error: a contribution goes through up to depth + 1 encodings (one per edge on its way up to
// rank 0, then rank 0's encoding of the sum).
//
// Buffers: one encoded vector per child (the children's partial sums), plus one for lossy codecs
// (the encoded partial sums sent up, reused for the broadcast bytes received and forwarded).
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {

class TreeAllreduce final : public Allreduce {
 public:
  // `transport` and `codec` must outlive this object.
  TreeAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                AllreduceOptions options = {});
  std::string_view name() const override { return "tree"; }
  void run(std::span<float> data, Tag tag) override;

 private:
  void run_segments(std::span<float> data, Tag tag);

  Transport& transport_;
  const Codec& codec_;
  AllreduceOptions options_;
  std::size_t max_count_;
  std::size_t segment_elements_;
  std::size_t segment_bytes_;  // encoded size of a full segment
  int parent_ = -1;            // -1 on rank 0
  std::vector<int> children_;  // zero, one or two ranks
  // Encoded segments at j * segment_bytes_: the partial sums arriving from each child, and (lossy
  // codecs) this rank's encoded segments: first sent up, then the broadcast bytes (rank 0: its
  // own).
  std::vector<std::vector<std::byte>> child_buffers_;
  std::vector<std::byte> staging_;
  // Per segment.
  std::vector<std::vector<Request>> child_receives_;  // [child][segment]
  std::vector<Request> up_sends_;
  std::vector<Request> down_receives_;
  std::vector<std::vector<Request>> down_sends_;  // [child][segment]
};

// Its entry of the algorithm list (allreduce_algorithms.h): "tree", its rounds and cost coefficients.
AllreduceAlgorithm tree_allreduce_algorithm();

}  // namespace pipesgd
