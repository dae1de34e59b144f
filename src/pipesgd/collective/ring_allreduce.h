#pragma once
// Ring allreduce (reduce-scatter then allgather around a ring of p ranks, 2(p-1) steps), with a codec
// applied inside every step as in Pipe-SGD Sec. 3.2:
//  * reduce-scatter: encode the partial chunk, send it right; decode-add (fused) what arrives from
//    the left into the local chunk;
//  * allgather: the owner of a fully reduced chunk encodes it once and keeps the decoded value itself
//    (so every rank ends bit-identical); the other ranks decode what arrives and forward the very
//    same bytes, never re-encoding.
// Chunk c holds n/p elements, plus one for c < n % p; any n >= 0 and p >= 1 work (chunks may be
// empty). Each chunk is cut into segments (AllreduceOptions::segment_bytes) that flow independently:
// segment j of step s+1 is sent as soon as segment j of step s is reduced, so reduction and coding
// overlap transfers (Pipe-SGD Fig. 3). The element-wise summation order is fixed by the ring and
// does not depend on segmenting. With the identity codec, sends come straight from `data` and
// allgather receives go straight into it.
// Each rank sends 2(p-1)/p * n elements; with a lossy codec the result carries the codec's error of
// up to p-1 re-encodings of partial sums plus one of the final sum.
#include <memory>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {

class RingAllreduce final : public Allreduce {
 public:
  // `transport` and `codec` must outlive this object.
  RingAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                AllreduceOptions options = {});
  std::string_view name() const override { return "ring"; }
  void run(std::span<float> data, Tag tag) override;

 private:
  std::size_t chunk_offset(std::size_t n, int chunk) const;
  std::size_t chunk_count(std::size_t n, int chunk) const;
  std::size_t segment_count(std::size_t chunk_elements) const;
  void run_steps(std::span<float> data, Tag tag);

  Transport& transport_;
  const Codec& codec_;
  AllreduceOptions options_;
  std::size_t max_count_;
  std::size_t segment_elements_;
  std::size_t segment_bytes_;  // encoded size of a full segment
  // Encoded segments: two send buffers (steps alternate) and three receive buffers (a step's
  // received bytes may still be forwarded while the next step's arrive).
  std::vector<std::byte> send_buffers_[2];
  std::vector<std::byte> receive_buffers_[3];
  std::vector<Request> receives_[2];  // [step parity][segment]
  std::vector<Request> sends_[2];
};

// Its entry of the algorithm list (allreduce_algorithms.h): "ring", its rounds and cost coefficients.
AllreduceAlgorithm ring_allreduce_algorithm();

}  // namespace pipesgd
