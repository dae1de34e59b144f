#include "pipesgd/collective/direct_allreduce.h"

#include "pipesgd/collective/allreduce_detail.h"
#include "pipesgd/collective/allreduce_model_detail.h"

namespace pipesgd {
namespace {
constexpr const char* kOperation = "direct allreduce";
using allreduce_detail::block_count;
using allreduce_detail::block_offset;
using allreduce_detail::expect_bytes;
}  // namespace

DirectAllreduce::DirectAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                                 AllreduceOptions options)
    : transport_(transport), codec_(codec), options_(options), max_count_(max_count) {
  const auto p = static_cast<std::size_t>(transport.size());
  const std::size_t max_block = max_count / p + 1;
  segment_elements_ = allreduce_detail::segment_elements_for(options.segment_bytes, max_block);
  segment_bytes_ = codec.encoded_bytes(segment_elements_);
  // A block encoded whole (round 1) or segment by segment (round 0), whichever is larger.
  max_block_bytes_ = std::max(codec.encoded_bytes(max_block),
                              allreduce_detail::segment_count(max_block, segment_elements_) *
                                  segment_bytes_);
  if (!codec.is_identity()) outgoing_.resize(p * max_block_bytes_);
  incoming_.resize(std::max(p * 2 * segment_bytes_, p * max_block_bytes_));
  // Round 0: two receive slots per peer and every segment of every peer's block in flight.
  receives_.resize(2 * p);
  sends_.resize(p * allreduce_detail::segment_count(max_block, segment_elements_));
}

void DirectAllreduce::run(std::span<float> data, Tag tag) {
  try {
    run_rounds(data, tag);
  } catch (...) {
    allreduce_detail::withdraw(receives_);  // nothing may land in `data` or our buffers any more
    allreduce_detail::withdraw(sends_);
    throw;
  }
}

void DirectAllreduce::run_rounds(std::span<float> data, Tag tag) {
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  allreduce_detail::check_count(kOperation, data.size(), max_count_);
  const int p = transport_.size();
  if (p == 1) return;
  const int rank = transport_.rank();
  const std::size_t n = data.size();
  const Timeout timeout = options_.timeout;
  const bool identity = codec_.is_identity();
  auto block = [&](int b) {
    return data.subspan(block_offset(n, p, b), block_count(n, p, b));
  };
  auto incoming = [&](int peer, std::size_t bytes) {
    return std::span<std::byte>(incoming_.data() + peer * max_block_bytes_, bytes);
  };
  auto outgoing = [&](int b, std::size_t bytes) {
    return std::span<std::byte>(outgoing_.data() + b * max_block_bytes_, bytes);
  };
  const std::span<float> own = block(rank);
  const std::size_t own_bytes = codec_.encoded_bytes(own.size());

  // Round 0: every peer's share of our block arrives, in segments; our share of theirs leaves.
  // Segment j of our block uses tag segment j. Each peer's segments land in two alternating slots
  // of incoming_, so what is added next is still in cache (the slots are reposted as soon as their
  // segment has been added).
  const std::size_t segment = segment_elements_;
  const std::size_t own_segments = allreduce_detail::segment_count(own.size(), segment);
  auto segment_of = [&](std::span<float> values, std::size_t j) {
    const std::size_t begin = std::min(values.size(), j * segment);
    return values.subspan(begin, std::min(segment, values.size() - begin));
  };
  auto slot = [&](int peer, std::size_t j, std::size_t bytes) {
    return std::span<std::byte>(
        incoming_.data() + (static_cast<std::size_t>(peer) * 2 + j % 2) * segment_bytes_, bytes);
  };
  auto post_receive = [&](int peer, std::size_t j) {
    const std::size_t bytes = codec_.encoded_bytes(segment_of(own, j).size());
    receives_[2 * peer + j % 2] =
        transport_.recv(peer, step_tag(tag, 0, j), slot(peer, j, bytes), kOperation);
  };
  for (int k = 1; k < p; ++k) {
    const int peer = (rank - k + p) % p;
    for (std::size_t j = 0; j < std::min<std::size_t>(2, own_segments); ++j) post_receive(peer, j);
  }
  std::size_t sends = 0;
  for (int k = 1; k < p; ++k) {
    const int peer = (rank + k) % p;
    const std::span<float> theirs = block(peer);
    const std::size_t segments = allreduce_detail::segment_count(theirs.size(), segment);
    std::span<std::byte> encoded;
    if (!identity) encoded = outgoing(peer, codec_.encoded_bytes(theirs.size()));
    std::size_t offset = 0;
    for (std::size_t j = 0; j < segments; ++j) {
      const std::span<float> values = segment_of(theirs, j);
      std::span<const std::byte> message = std::as_bytes(values);
      if (!identity) {
        std::span<std::byte> out = encoded.subspan(offset, codec_.encoded_bytes(values.size()));
        codec_.encode(values, out);
        offset += out.size();
        message = out;
      }
      sends_[sends++] = transport_.send(peer, step_tag(tag, 0, j), message, kOperation);
    }
  }
  for (std::size_t j = 0; j < own_segments; ++j) {
    const std::span<float> values = segment_of(own, j);
    const std::size_t bytes = codec_.encoded_bytes(values.size());
    for (int k = 1; k < p; ++k) {  // fixed order: rank-1, rank-2, ...
      const int peer = (rank - k + p) % p;
      const Tag message_tag = step_tag(tag, 0, j);
      expect_bytes(kOperation, receives_[2 * peer + j % 2].wait(timeout), bytes, peer, message_tag);
      codec_.decode_add(slot(peer, j, bytes), values);
      if (j + 2 < own_segments) post_receive(peer, j + 2);
    }
  }
  // Our sends read `data` (identity) or `outgoing_`; both are rewritten below.
  for (std::size_t i = 0; i < sends; ++i) sends_[i].wait(timeout);

  // Round 1: our reduced block goes to every peer; theirs arrive.
  const Tag gather_tag = step_tag(tag, 1, 0);
  for (int k = 1; k < p; ++k) {
    const int peer = (rank - k + p) % p;
    const std::span<float> theirs = block(peer);
    const std::size_t bytes = codec_.encoded_bytes(theirs.size());
    receives_[peer] = identity ? transport_.recv(peer, gather_tag, std::as_writable_bytes(theirs), kOperation)
                               : transport_.recv(peer, gather_tag, incoming(peer, bytes), kOperation);
  }
  std::span<const std::byte> final_message = std::as_bytes(own);
  if (!identity) {
    std::span<std::byte> encoded = outgoing(rank, own_bytes);
    codec_.encode(own, encoded);
    codec_.decode(encoded, own);  // the owner keeps what everybody else decodes
    final_message = encoded;
  }
  for (int k = 1; k < p; ++k) {
    const int peer = (rank + k) % p;
    sends_[peer] = transport_.send(peer, gather_tag, final_message, kOperation);
  }
  for (int k = 1; k < p; ++k) {
    const int peer = (rank - k + p) % p;
    const std::span<float> theirs = block(peer);
    const std::size_t bytes = codec_.encoded_bytes(theirs.size());
    expect_bytes(kOperation, receives_[peer].wait(timeout), bytes, peer, gather_tag);
    if (!identity) codec_.decode(incoming(peer, bytes), theirs);
  }
  for (int k = 1; k < p; ++k) sends_[(rank + k) % p].wait(timeout);
}

// ---------------------------------------------------------------------------------------------
// The entry of the algorithm list: rounds (allreduce_rounds.h) and cost coefficients
// (timing/allreduce_cost_model.h) on p >= 2 ranks.

namespace {

std::vector<AllreduceRound> direct_rounds(int p) {
  const double share = 1.0 / p;
  std::vector<AllreduceFlow> flows;
  for (int i = 0; i < p; ++i) {
    for (int j = 0; j < p; ++j) {
      if (i != j) flows.push_back({i, j});
    }
  }
  // A rank sends p-1 blocks of 1/p at once: the round carries (p-1)/p of the vector per rank,
  // split over p-1 flows, and the owner reduces its block from p-1 peers.
  return {allreduce_model::round_of(flows, share, (p - 1) * share), allreduce_model::round_of(flows, share, 0.0)};
}

// As the ring's (timing/allreduce_cost_model.h): the same messages and bytes per rank.
AllreduceCoefficients direct_coefficients(int world_size) {
  const double p = world_size;
  return {2 * (p - 1), 2 * (p - 1) / p, (p - 1) / p};
}

std::unique_ptr<Allreduce> make_direct(Transport& transport, std::size_t max_count, const Codec& codec,
                                   const AllreduceOptions& options) {
  return std::make_unique<DirectAllreduce>(transport, max_count, codec, options);
}

}  // namespace

AllreduceAlgorithm direct_allreduce_algorithm() {
  return {"direct", make_direct, direct_rounds, direct_coefficients};
}

}  // namespace pipesgd
