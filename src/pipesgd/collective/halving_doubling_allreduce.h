#pragma once
// Halving-doubling allreduce (Rabenseifner): a reduce-scatter by recursive halving, then an
// allgather by recursive doubling; 2 log2(q) steps, bandwidth-optimal like the ring but with
// logarithmically many messages.
//
// Message pattern. Any p >= 1 works through the power-of-two fold (allreduce_detail.h): with q the
// largest power of two <= p and r = p - q, ranks 2i and 2i+1 (i < r) pair up:
//  * step 0 (fold): rank 2i sends its whole encoded vector to rank 2i+1, which decode-adds it into
//    its own and stays active; rank 2i sits out;
//  * the vector is cut into q blocks (n / q elements, plus one for block b < n % q; blocks may be
//    empty). Reduce-scatter, steps 1..log2(q): active rank a (active index, 0..q-1) holds a range
//    of 2h aligned blocks (h = q/2, q/4, ..., 1), sends the encoded half that partner a ^ h keeps
//    and decode-adds the half it keeps from the partner's message. Afterwards rank a owns block a,
//    fully reduced;
//  * the owner encodes its block once and keeps decode(its own encoding). Allgather, steps
//    log2(q)+1..2 log2(q): active rank a exchanges all the blocks it holds with partner a ^ h
//    (h = 1, 2, ..., q/2), forwarding the encoded bytes it received without re-encoding them, and
//    decodes what arrives;
//  * step 2 log2(q)+1: rank 2i+1 sends rank 2i the q encoded blocks (the very bytes every active
//    rank decoded), which it decodes.
// A message carries a contiguous range of blocks, each block encoded on its own (with int8, one
// scale per block). Every step sends one unsegmented message (AllreduceOptions::segment_bytes is
// not used).
//
// Bytes sent per rank, with B(k) the encoded size of k blocks (k / q * 4n for `none`; plus 4 bytes
// per non-empty block for int8): an unpaired active rank sends 2 B(q - 1), rank 2i sends B(q), rank
// 2i+1 sends 2 B(q - 1) + B(q).
//
// Summation order: block b's sum is a fixed binary tree of additions over the active ranks
// (partners at distance q/2 first, ...), each rank 2i+1 having first added rank 2i's vector; it
// differs in rounding from the ring's order. Every rank ends bit-identical: each block's value is
// the decode of its owner's single encoding, on every rank. With the identity codec, sends come
// straight from `data` and allgather and result receives go straight into it.
//
// Codec error: each rank's contribution goes through up to log2(q) + 2 encodings (the fold, one per
// reduce-scatter step as part of a partial sum, and the owner's encoding of the final sum).
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {

class HalvingDoublingAllreduce final : public Allreduce {
 public:
  // `transport` and `codec` must outlive this object.
  HalvingDoublingAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                           AllreduceOptions options = {});
  std::string_view name() const override { return "halving-doubling"; }
  void run(std::span<float> data, Tag tag) override;

 private:
  void run_steps(std::span<float> data, Tag tag);

  Transport& transport_;
  const Codec& codec_;
  AllreduceOptions options_;
  std::size_t max_count_;
  // Lossy codecs: block b's encoding at its packed offset (the sum of the encoded sizes of blocks
  // 0..b-1), so that a range of blocks is one contiguous message. Holds the halves sent during the
  // reduce-scatter, then the final encodings of all blocks.
  std::vector<std::byte> encoded_;
  // The partner's encoded half during the reduce-scatter (or the whole vector, on a rank 2i+1).
  std::vector<std::byte> received_;
  Request send_;
  Request receive_;
};

// Its entry of the algorithm list (allreduce_algorithms.h): "halving-doubling", its rounds and cost coefficients.
AllreduceAlgorithm halving_doubling_allreduce_algorithm();

}  // namespace pipesgd
