#include "pipesgd/collective/recursive_doubling_allreduce.h"

#include "pipesgd/collective/allreduce_detail.h"
#include "pipesgd/collective/allreduce_model_detail.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {
using allreduce_detail::expect_bytes;
using allreduce_detail::PowerOfTwoFold;
constexpr const char* kOperation = "recursive-doubling allreduce";
}  // namespace

RecursiveDoublingAllreduce::RecursiveDoublingAllreduce(Transport& transport, std::size_t max_count,
                                                       const Codec& codec, AllreduceOptions options)
    : transport_(transport), codec_(codec), options_(options), max_count_(max_count) {
  const PowerOfTwoFold fold(transport.rank(), transport.size());
  if (transport.size() == 1) return;
  if (!codec.is_identity()) send_buffer_.resize(codec.encoded_bytes(max_count));
  if (!fold.sits_out) receive_buffer_.resize(codec.encoded_bytes(max_count));
}

void RecursiveDoublingAllreduce::run(std::span<float> data, Tag tag) {
  try {
    run_steps(data, tag);
  } catch (...) {
    // Withdraw everything still posted on `data` or our buffers before the caller sees the error.
    send_ = Request();
    receive_ = Request();
    throw;
  }
}

void RecursiveDoublingAllreduce::run_steps(std::span<float> data, Tag tag) {
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  allreduce_detail::check_count(kOperation, data.size(), max_count_);
  const int p = transport_.size();
  if (p == 1) return;
  const PowerOfTwoFold fold(transport_.rank(), p);
  const Timeout timeout = options_.timeout;
  const bool identity = codec_.is_identity();
  const std::size_t encoded = codec_.encoded_bytes(data.size());
  const int return_step = fold.steps + 1;
  // This rank's vector as a message: straight from `data`, or encoded into the send buffer. With a
  // lossy codec, `data` then becomes decode(encode(data)) when `round_trip` (both partners of a
  // step add the same two operands).
  auto own_message = [&](bool round_trip) -> std::span<const std::byte> {
    if (identity) return std::as_bytes(data);
    std::span<std::byte> out(send_buffer_.data(), encoded);
    codec_.encode(data, out);
    if (round_trip) codec_.decode(out, data);
    return out;
  };
  auto partner_message = [&]() { return std::span<std::byte>(receive_buffer_.data(), encoded); };

  if (fold.sits_out) {
    const Tag fold_tag = step_tag(tag, 0, 0);
    send_ = transport_.send(fold.partner, fold_tag, own_message(false), kOperation);
    send_.wait(timeout);  // `data` may be the send's bytes: only now may the result land in it
    const Tag result_tag = step_tag(tag, return_step, 0);
    receive_ = transport_.recv(fold.partner, result_tag, std::as_writable_bytes(data), kOperation);
    expect_bytes(kOperation, receive_.wait(timeout), data.size_bytes(), fold.partner, result_tag);
    return;
  }
  if (fold.partner >= 0) {  // the odd rank of a pair absorbs the even one's vector
    const Tag fold_tag = step_tag(tag, 0, 0);
    receive_ = transport_.recv(fold.partner, fold_tag, partner_message(), kOperation);
    expect_bytes(kOperation, receive_.wait(timeout), encoded, fold.partner, fold_tag);
    codec_.decode_add(partner_message(), data);
  }
  for (int step = 1; step <= fold.steps; ++step) {
    const int peer = fold.rank_of(fold.active_index ^ (1 << (step - 1)));
    const Tag message_tag = step_tag(tag, step, 0);
    receive_ = transport_.recv(peer, message_tag, partner_message(), kOperation);
    // With a lossy codec, `data` already holds decode(encode(own)) once the message is encoded.
    send_ = transport_.send(peer, message_tag, own_message(true), kOperation);
    expect_bytes(kOperation, receive_.wait(timeout), encoded, peer, message_tag);
    send_.wait(timeout);  // the identity codec sends from `data`, which the sum now overwrites
    codec_.decode_add(partner_message(), data);  // own + partner's: the same sum on both partners
  }
  if (fold.partner >= 0) {  // exact fp32, so that the even rank ends bit-identical
    send_ = transport_.send(fold.partner, step_tag(tag, return_step, 0), std::as_bytes(data),
                            kOperation);
    send_.wait(timeout);
  }
}

// ---------------------------------------------------------------------------------------------
// The entry of the algorithm list: rounds (allreduce_rounds.h) and cost coefficients
// (timing/allreduce_cost_model.h) on p >= 2 ranks.

namespace {

std::vector<AllreduceRound> recursive_doubling_rounds(int p) {
  const allreduce_model::Fold fold(p);
  std::vector<AllreduceRound> rounds;
  for (int distance = 1; distance < fold.q; distance *= 2) {
    rounds.push_back(allreduce_model::exchange(fold, distance, 1.0, 1.0));
  }
  return allreduce_model::folded(fold, std::move(rounds));
}

AllreduceCoefficients recursive_doubling_coefficients(int world_size) {
  const double steps = allreduce_model::floor_log2(world_size);
  return allreduce_model::folded(world_size, {steps, steps, steps});
}

std::unique_ptr<Allreduce> make_recursive_doubling(Transport& transport, std::size_t max_count, const Codec& codec,
                                   const AllreduceOptions& options) {
  return std::make_unique<RecursiveDoublingAllreduce>(transport, max_count, codec, options);
}

}  // namespace

AllreduceAlgorithm recursive_doubling_allreduce_algorithm() {
  return {"recursive-doubling", make_recursive_doubling, recursive_doubling_rounds, recursive_doubling_coefficients};
}

}  // namespace pipesgd
