#pragma once
// Recursive-doubling allreduce: log2(q) steps, each exchanging the whole vector with one partner.
// Latency-optimal (few messages), bandwidth-poor: meant for small vectors.
//
// Message pattern. Any p >= 1 works through the power-of-two fold (allreduce_detail.h): with q the
// largest power of two <= p and r = p - q, ranks 2i and 2i+1 (i < r) pair up:
//  * step 0 (fold): rank 2i sends its encoded vector to rank 2i+1, which decode-adds it into its
//  own
//    and stays active; rank 2i sits out;
//  * steps 1..log2(q): active rank a (active index, 0..q-1) exchanges its whole encoded vector with
//    active rank a ^ 2^(s-1); both then hold decode(encode(own)) + decode(encode(partner's));
//  * step log2(q)+1: rank 2i+1 returns the result to rank 2i as exact fp32 (the result of the last
//    step is not an encoding that could be forwarded, and re-encoding it would leave rank 2i
//    different from the others).
// Every message is one unsegmented message (AllreduceOptions::segment_bytes is not used); with int8
// one scale covers the whole vector.
//
// Bytes sent per rank: log2(q) * E(n) by an unpaired active rank, E(n) by rank 2i, and
// log2(q) * E(n) + 4n by rank 2i+1, where E(n) = codec.encoded_bytes(n) (4n for `none`).
//
// Summation order and identical results: in every step both partners round-trip their own vector
// through the codec too and add the same two fp32 operands, a + b and b + a, which are bitwise
// equal; the q active ranks therefore end bit-identical, and the sitting-out ranks receive an exact
// copy. The result is a fixed binary tree of additions (pairs, then pairs of pairs, ...), so it
// differs in rounding from the ring's order. With the identity codec sends come straight from
// `data` and rank 2i receives the result straight into it.
//
// Codec error: each rank's contribution goes through up to log2(q) + 1 encodings (the fold, then
// one per step: partial sums are re-encoded every step, both partners' alike).
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {

class RecursiveDoublingAllreduce final : public Allreduce {
 public:
  // `transport` and `codec` must outlive this object.
  RecursiveDoublingAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                             AllreduceOptions options = {});
  std::string_view name() const override { return "recursive-doubling"; }
  void run(std::span<float> data, Tag tag) override;

 private:
  void run_steps(std::span<float> data, Tag tag);

  Transport& transport_;
  const Codec& codec_;
  AllreduceOptions options_;
  std::size_t max_count_;
  std::vector<std::byte> send_buffer_;     // this rank's encoded vector (lossy codecs only)
  std::vector<std::byte> receive_buffer_;  // the partner's encoded vector
  Request send_;
  Request receive_;
};

// Its entry of the algorithm list (allreduce_algorithms.h): "recursive-doubling", its rounds and cost coefficients.
AllreduceAlgorithm recursive_doubling_allreduce_algorithm();

}  // namespace pipesgd
