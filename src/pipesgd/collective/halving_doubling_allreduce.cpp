#include "pipesgd/collective/halving_doubling_allreduce.h"

#include <algorithm>
#include <cstdint>

#include "pipesgd/collective/allreduce_detail.h"
#include "pipesgd/collective/allreduce_model_detail.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {
using allreduce_detail::block_count;
using allreduce_detail::block_offset;
using allreduce_detail::expect_bytes;
using allreduce_detail::PowerOfTwoFold;
constexpr const char* kOperation = "halving-doubling allreduce";
}  // namespace

HalvingDoublingAllreduce::HalvingDoublingAllreduce(Transport& transport, std::size_t max_count,
                                                   const Codec& codec, AllreduceOptions options)
    : transport_(transport), codec_(codec), options_(options), max_count_(max_count) {
  if (transport.size() == 1) return;
  const PowerOfTwoFold fold(transport.rank(), transport.size());
  const std::size_t blocks = static_cast<std::size_t>(fold.active_size);
  // Every block of a vector of at most max_count elements has at most max_count / q + 1 elements.
  const std::size_t largest_block = codec.encoded_bytes(max_count / blocks + 1);
  if (!codec.is_identity()) encoded_.resize(blocks * largest_block);
  if (!fold.sits_out) received_.resize((fold.partner >= 0 ? blocks : blocks / 2) * largest_block);
}

void HalvingDoublingAllreduce::run(std::span<float> data, Tag tag) {
  try {
    run_steps(data, tag);
  } catch (...) {
    // Withdraw everything still posted on `data` or our buffers before the caller sees the error.
    send_ = Request();
    receive_ = Request();
    throw;
  }
}

void HalvingDoublingAllreduce::run_steps(std::span<float> data, Tag tag) {
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  allreduce_detail::check_count(kOperation, data.size(), max_count_);
  const int p = transport_.size();
  if (p == 1) return;
  const PowerOfTwoFold fold(transport_.rank(), p);
  const std::size_t q = static_cast<std::size_t>(fold.active_size);
  const std::size_t n = data.size();
  const Timeout timeout = options_.timeout;
  const bool identity = codec_.is_identity();
  const int return_step = 2 * fold.steps + 1;

  // Blocks [first, last) of `data`.
  auto blocks_of_data = [&](std::size_t first, std::size_t last) {
    const std::size_t begin = block_offset(n, q, first);
    return data.subspan(begin, block_offset(n, q, last) - begin);
  };
  // Packed offset of block b's encoding: blocks 0..b-1 encoded back to back.
  const std::size_t small_block_bytes = codec_.encoded_bytes(n / q);
  const std::size_t large_block_bytes = codec_.encoded_bytes(n / q + 1);
  auto encoded_offset = [&](std::size_t b) {
    const std::size_t large = std::min(b, n % q);
    return large * large_block_bytes + (b - large) * small_block_bytes;
  };
  auto encoded_size = [&](std::size_t first, std::size_t last) {
    return encoded_offset(last) - encoded_offset(first);
  };
  // The encodings of blocks [first, last) in `encoded_`.
  auto encoded_blocks = [&](std::size_t first, std::size_t last) {
    PIPESGD_ASSERT(encoded_offset(last) <= encoded_.size());
    return std::span<std::byte>(encoded_.data() + encoded_offset(first), encoded_size(first, last));
  };
  // Calls action(block's elements, block's bytes within `message`) for blocks [first, last) of a
  // message holding exactly those blocks.
  auto for_each_block = [&](std::span<const std::byte> message, std::size_t first, std::size_t last,
                            auto action) {
    for (std::size_t b = first; b < last; ++b) {
      action(blocks_of_data(b, b + 1),
             message.subspan(encoded_offset(b) - encoded_offset(first), encoded_size(b, b + 1)));
    }
  };
  // Blocks [first, last) of this rank's vector as a message: straight from `data` with the identity
  // codec, otherwise each block encoded into its place in `encoded_`.
  auto message_of_blocks = [&](std::size_t first, std::size_t last) -> std::span<const std::byte> {
    if (identity) return std::as_bytes(blocks_of_data(first, last));
    std::span<std::byte> out = encoded_blocks(first, last);
    for (std::size_t b = first; b < last; ++b) {
      codec_.encode(blocks_of_data(b, b + 1),
                    out.subspan(encoded_offset(b) - encoded_offset(first), encoded_size(b, b + 1)));
    }
    return out;
  };
  auto decode_blocks = [&](std::span<const std::byte> message, std::size_t first,
                           std::size_t last) {
    for_each_block(message, first, last,
                   [&](std::span<float> values, std::span<const std::byte> bytes) {
                     codec_.decode(bytes, values);
                   });
  };
  auto decode_add_blocks = [&](std::span<const std::byte> message, std::size_t first,
                               std::size_t last) {
    for_each_block(message, first, last,
                   [&](std::span<float> values, std::span<const std::byte> bytes) {
                     codec_.decode_add(bytes, values);
                   });
  };
  // Where the partner's blocks [first, last) arrive to be added.
  auto receive_area = [&](std::size_t first, std::size_t last) {
    PIPESGD_ASSERT(encoded_size(first, last) <= received_.size());
    return std::span<std::byte>(received_.data(), encoded_size(first, last));
  };

  if (fold.sits_out) {
    const Tag fold_tag = step_tag(tag, 0, 0);
    send_ = transport_.send(fold.partner, fold_tag, message_of_blocks(0, q), kOperation);
    send_.wait(timeout);  // the result lands where the message came from
    const Tag result_tag = step_tag(tag, return_step, 0);
    std::span<std::byte> into = identity ? std::as_writable_bytes(data) : encoded_blocks(0, q);
    receive_ = transport_.recv(fold.partner, result_tag, into, kOperation);
    expect_bytes(kOperation, receive_.wait(timeout), into.size(), fold.partner, result_tag);
    if (!identity) decode_blocks(into, 0, q);
    return;
  }
  if (fold.partner >= 0) {  // the odd rank of a pair absorbs the even one's vector
    const Tag fold_tag = step_tag(tag, 0, 0);
    std::span<std::byte> into = receive_area(0, q);
    receive_ = transport_.recv(fold.partner, fold_tag, into, kOperation);
    expect_bytes(kOperation, receive_.wait(timeout), into.size(), fold.partner, fold_tag);
    decode_add_blocks(into, 0, q);
  }

  const std::size_t active = static_cast<std::size_t>(fold.active_index);
  int step = 1;
  // Reduce-scatter by recursive halving: this rank's blocks [first, last) halve every step.
  std::size_t first = 0;
  std::size_t last = q;
  for (std::size_t half = q / 2; half >= 1; half /= 2, ++step) {
    const int peer = fold.rank_of(static_cast<int>(active ^ half));
    const Tag message_tag = step_tag(tag, step, 0);
    const std::size_t middle = first + half;
    const bool keep_upper = (active & half) != 0;
    const std::size_t keep_first = keep_upper ? middle : first;
    const std::size_t keep_last = keep_upper ? last : middle;
    const std::size_t give_first = keep_upper ? first : middle;
    const std::size_t give_last = keep_upper ? middle : last;
    std::span<std::byte> into = receive_area(keep_first, keep_last);
    receive_ = transport_.recv(peer, message_tag, into, kOperation);
    send_ =
        transport_.send(peer, message_tag, message_of_blocks(give_first, give_last), kOperation);
    expect_bytes(kOperation, receive_.wait(timeout), into.size(), peer, message_tag);
    decode_add_blocks(into, keep_first, keep_last);
    send_.wait(timeout);
    first = keep_first;
    last = keep_last;
  }
  PIPESGD_ASSERT(first == active && last == active + 1);
  // The owner encodes its block once and keeps exactly what every other rank will decode.
  if (!identity) decode_blocks(message_of_blocks(active, active + 1), active, active + 1);

  // Allgather by recursive doubling: this rank holds the aligned blocks [first, first + half) and
  // receives the partner's adjacent ones; encoded bytes are forwarded as received.
  for (std::size_t half = 1; half < q; half *= 2, ++step) {
    const int peer = fold.rank_of(static_cast<int>(active ^ half));
    const Tag message_tag = step_tag(tag, step, 0);
    first = active / half * half;
    const std::size_t peer_first = first ^ half;
    std::span<const std::byte> message;
    std::span<std::byte> into;
    if (identity) {
      message = std::as_bytes(blocks_of_data(first, first + half));
      into = std::as_writable_bytes(blocks_of_data(peer_first, peer_first + half));
    } else {
      message = encoded_blocks(first, first + half);
      into = encoded_blocks(peer_first, peer_first + half);
    }
    receive_ = transport_.recv(peer, message_tag, into, kOperation);
    send_ = transport_.send(peer, message_tag, message, kOperation);
    expect_bytes(kOperation, receive_.wait(timeout), into.size(), peer, message_tag);
    if (!identity) decode_blocks(into, peer_first, peer_first + half);
    send_.wait(timeout);
  }

  if (fold.partner >= 0) {  // the very bytes every active rank decoded
    const std::span<const std::byte> result =
        identity ? std::as_bytes(data) : std::span<const std::byte>(encoded_blocks(0, q));
    send_ = transport_.send(fold.partner, step_tag(tag, return_step, 0), result, kOperation);
    send_.wait(timeout);
  }
}

// ---------------------------------------------------------------------------------------------
// The entry of the algorithm list: rounds (allreduce_rounds.h) and cost coefficients
// (timing/allreduce_cost_model.h) on p >= 2 ranks.

namespace {

std::vector<AllreduceRound> halving_doubling_rounds(int p) {
  const allreduce_model::Fold fold(p);
  std::vector<AllreduceRound> rounds;
  double fraction = 0.5;
  for (int distance = fold.q / 2; distance >= 1; distance /= 2, fraction /= 2) {
    rounds.push_back(allreduce_model::exchange(fold, distance, fraction, fraction));
  }
  fraction = 1.0 / fold.q;
  for (int distance = 1; distance < fold.q; distance *= 2, fraction *= 2) {
    rounds.push_back(allreduce_model::exchange(fold, distance, fraction, 0.0));
  }
  return allreduce_model::folded(fold, std::move(rounds));
}

AllreduceCoefficients halving_doubling_coefficients(int world_size) {
  const int log2_q = allreduce_model::floor_log2(world_size);
  const double q = static_cast<double>(std::int64_t{1} << log2_q);
  return allreduce_model::folded(world_size, {2.0 * log2_q, 2 * (q - 1) / q, (q - 1) / q});
}

std::unique_ptr<Allreduce> make_halving_doubling(Transport& transport, std::size_t max_count, const Codec& codec,
                                   const AllreduceOptions& options) {
  return std::make_unique<HalvingDoublingAllreduce>(transport, max_count, codec, options);
}

}  // namespace

AllreduceAlgorithm halving_doubling_allreduce_algorithm() {
  return {"halving-doubling", make_halving_doubling, halving_doubling_rounds, halving_doubling_coefficients};
}

}  // namespace pipesgd
