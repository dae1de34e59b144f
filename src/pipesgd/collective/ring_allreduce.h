#pragma once
// Ring allreduce (reduce-scatter then allgather around a ring of p ranks), with a codec applied inside
// every step as in Pipe-SGD Sec. 3.2:
//  * reduce-scatter step: encode the partial chunk, send it right; decode-add (fused) what arrives
//    from the left into the local chunk;
//  * allgather: the owner of a fully reduced chunk encodes it once and also keeps the decoded value
//    (so every rank ends bit-identical); the other ranks decode what arrives and forward the very
//    same bytes, never re-encoding.
// Chunk c holds n/p elements, plus one for c < n % p; any n >= 0 and p >= 1 work (chunks may be
// empty). With the identity codec messages go straight from and into `data`, without copies.
// Each rank sends 2(p-1)/p * n elements; with a lossy codec the result carries the codec's error of
// up to p-1 re-encodings of partial sums plus one of the final sum.
#include <memory>
#include <vector>

#include "pipesgd/collective/allreduce.h"
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

  Transport& transport_;
  const Codec& codec_;
  AllreduceOptions options_;
  std::size_t max_count_;
  // Encoded chunks: what we send during reduce-scatter, and two buffers that alternate between
  // receiving and forwarding during allgather.
  std::vector<std::byte> send_buffer_;
  std::vector<std::byte> receive_buffers_[2];
};

// Tag of step `step` of an allreduce called with `tag`.
constexpr Tag step_tag(Tag tag, int step) { return (tag << 16) | static_cast<Tag>(step); }

}  // namespace pipesgd
