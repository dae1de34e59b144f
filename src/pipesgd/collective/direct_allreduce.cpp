#include "pipesgd/collective/direct_allreduce.h"

#include "pipesgd/collective/allreduce_detail.h"
#include "pipesgd/collective/ring_allreduce.h"

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
  max_block_bytes_ = codec.encoded_bytes(max_count / p + 1);
  if (!codec.is_identity()) outgoing_.resize(p * max_block_bytes_);
  incoming_.resize(p * max_block_bytes_);
  receives_.resize(p);
  sends_.resize(p);
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

  // Round 0: every peer's share of our block arrives; our share of theirs leaves.
  const Tag scatter_tag = step_tag(tag, 0, 0);
  for (int k = 1; k < p; ++k) {
    const int peer = (rank - k + p) % p;
    receives_[peer] = transport_.recv(peer, scatter_tag, incoming(peer, own_bytes), kOperation);
  }
  for (int k = 1; k < p; ++k) {
    const int peer = (rank + k) % p;
    const std::span<float> theirs = block(peer);
    const std::size_t bytes = codec_.encoded_bytes(theirs.size());
    std::span<const std::byte> message = std::as_bytes(theirs);
    if (!identity) {
      codec_.encode(theirs, outgoing(peer, bytes));
      message = outgoing(peer, bytes);
    }
    sends_[peer] = transport_.send(peer, scatter_tag, message, kOperation);
  }
  for (int k = 1; k < p; ++k) {  // fixed order: rank-1, rank-2, ...
    const int peer = (rank - k + p) % p;
    expect_bytes(kOperation, receives_[peer].wait(timeout), own_bytes, peer, scatter_tag);
    codec_.decode_add(incoming(peer, own_bytes), own);
  }
  // Our sends read `data` (identity) or `outgoing_`; both are rewritten below.
  for (int k = 1; k < p; ++k) sends_[(rank + k) % p].wait(timeout);

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

}  // namespace pipesgd
