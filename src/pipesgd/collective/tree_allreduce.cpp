#include "pipesgd/collective/tree_allreduce.h"

#include <algorithm>

#include "pipesgd/collective/allreduce_detail.h"
#include "pipesgd/collective/allreduce_model_detail.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {
using allreduce_detail::expect_bytes;
constexpr const char* kOperation = "tree allreduce";
constexpr int kReduceStep = 0;
constexpr int kBroadcastStep = 1;
}  // namespace

TreeAllreduce::TreeAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                             AllreduceOptions options)
    : transport_(transport), codec_(codec), options_(options), max_count_(max_count) {
  const int p = transport.size();
  const int rank = transport.rank();
  segment_elements_ = allreduce_detail::segment_elements_for(options.segment_bytes,
                                                             std::max<std::size_t>(1, max_count));
  segment_bytes_ = codec.encoded_bytes(segment_elements_);
  if (p == 1) return;
  if (rank > 0) parent_ = (rank - 1) / 2;
  for (int child : {2 * rank + 1, 2 * rank + 2}) {
    if (child < p) children_.push_back(child);
  }
  const std::size_t segments = allreduce_detail::segment_count(max_count, segment_elements_);
  const std::size_t region = segments * segment_bytes_;
  child_buffers_.resize(children_.size());
  for (auto& buffer : child_buffers_) buffer.resize(region);
  if (!codec.is_identity()) staging_.resize(region);
  child_receives_.resize(children_.size());
  for (auto& requests : child_receives_) requests.resize(segments);
  down_sends_.resize(children_.size());
  for (auto& requests : down_sends_) requests.resize(segments);
  up_sends_.resize(segments);
  down_receives_.resize(segments);
}

void TreeAllreduce::run(std::span<float> data, Tag tag) {
  try {
    run_segments(data, tag);
  } catch (...) {
    // Withdraw everything still posted on `data` or our buffers before the caller sees the error.
    for (auto& requests : child_receives_) allreduce_detail::withdraw(requests);
    for (auto& requests : down_sends_) allreduce_detail::withdraw(requests);
    allreduce_detail::withdraw(up_sends_);
    allreduce_detail::withdraw(down_receives_);
    throw;
  }
}

void TreeAllreduce::run_segments(std::span<float> data, Tag tag) {
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  allreduce_detail::check_count(kOperation, data.size(), max_count_);
  if (transport_.size() == 1) return;
  const std::size_t n = data.size();
  const std::size_t segments = allreduce_detail::segment_count(n, segment_elements_);
  const Timeout timeout = options_.timeout;
  const bool identity = codec_.is_identity();
  const bool root = parent_ < 0;

  auto segment = [&](std::size_t j) {
    const std::size_t begin = std::min(n, j * segment_elements_);
    const std::size_t end = std::min(n, begin + segment_elements_);
    return data.subspan(begin, end - begin);
  };
  // Segment j's encoding in `buffer`.
  auto region = [&](std::vector<std::byte>& buffer, std::size_t j) {
    return std::span<std::byte>(buffer.data() + j * segment_bytes_,
                                codec_.encoded_bytes(segment(j).size()));
  };
  // Segment j of this rank's vector as a message: straight from `data`, or encoded into the staging
  // buffer. `keep_decoded`: rank 0 keeps exactly what the others will decode.
  auto message_of_segment = [&](std::size_t j, bool keep_decoded) -> std::span<const std::byte> {
    std::span<float> values = segment(j);
    if (identity) return std::as_bytes(values);
    std::span<std::byte> out = region(staging_, j);
    codec_.encode(values, out);
    if (keep_decoded) codec_.decode(out, values);
    return out;
  };
  auto send_down = [&](std::size_t j, std::span<const std::byte> message) {
    for (std::size_t c = 0; c < children_.size(); ++c) {
      down_sends_[c][j] =
          transport_.send(children_[c], step_tag(tag, kBroadcastStep, j), message, kOperation);
    }
  };

  for (std::size_t c = 0; c < children_.size(); ++c) {
    for (std::size_t j = 0; j < segments; ++j) {
      child_receives_[c][j] = transport_.recv(children_[c], step_tag(tag, kReduceStep, j),
                                              region(child_buffers_[c], j), kOperation);
    }
  }

  // Broadcast below rank 0: segment j arrives where it was sent up from (`data` or the staging
  // buffer), so its receive is posted only once its send up has completed (the parent cannot send
  // it down before that anyway). Segments [0, posted) have their receive posted, [0, forwarded)
  // have been decoded and forwarded to the children.
  std::size_t posted = 0;
  std::size_t forwarded = 0;
  auto post_broadcast_receive = [&] {
    const std::size_t j = posted++;
    up_sends_[j].wait(timeout);
    std::span<std::byte> into = identity ? std::as_writable_bytes(segment(j)) : region(staging_, j);
    down_receives_[j] =
        transport_.recv(parent_, step_tag(tag, kBroadcastStep, j), into, kOperation);
  };
  auto forward_broadcast = [&] {
    const std::size_t j = forwarded++;
    std::span<float> values = segment(j);
    expect_bytes(kOperation, down_receives_[j].wait(timeout), codec_.encoded_bytes(values.size()),
                 parent_, step_tag(tag, kBroadcastStep, j));
    std::span<const std::byte> message = identity ? std::as_bytes(values) : region(staging_, j);
    if (!identity) codec_.decode(message, values);
    send_down(j, message);  // the same bytes, never re-encoded
  };
  // Without blocking: posts and forwards whatever is ready, in segment order.
  auto forward_arrived_broadcast = [&](std::size_t sent_up) {
    while (posted < sent_up && up_sends_[posted].test()) post_broadcast_receive();
    while (forwarded < posted && down_receives_[forwarded].test()) forward_broadcast();
  };

  for (std::size_t j = 0; j < segments; ++j) {
    std::span<float> values = segment(j);
    for (std::size_t c = 0; c < children_.size(); ++c) {
      std::span<std::byte> message = region(child_buffers_[c], j);
      expect_bytes(kOperation, child_receives_[c][j].wait(timeout), message.size(), children_[c],
                   step_tag(tag, kReduceStep, j));
      codec_.decode_add(message, values);
    }
    // Segment j is reduced over this rank's subtree: on at once, up or (rank 0) down.
    if (root) {
      send_down(j, message_of_segment(j, true));
    } else {
      up_sends_[j] = transport_.send(parent_, step_tag(tag, kReduceStep, j),
                                     message_of_segment(j, false), kOperation);
      forward_arrived_broadcast(j + 1);
    }
  }
  if (!root) {
    while (posted < segments) post_broadcast_receive();
    while (forwarded < segments) forward_broadcast();
  }
  for (auto& requests : down_sends_) {
    for (std::size_t j = 0; j < segments; ++j) requests[j].wait(timeout);
  }
}

// ---------------------------------------------------------------------------------------------
// The entry of the algorithm list: rounds (allreduce_rounds.h) and cost coefficients
// (timing/allreduce_cost_model.h) on p >= 2 ranks.

namespace {

std::vector<AllreduceRound> tree_rounds(int p) {
  // Heap numbering: rank i's parent (i - 1) / 2; depth of i = floor(log2(i + 1)).
  auto depth_of = [](int rank) {
    int depth = 0;
    while ((2 << depth) <= rank + 1) ++depth;
    return depth;
  };
  const int depth = depth_of(p - 1);
  std::vector<AllreduceRound> rounds;
  for (int level = depth; level >= 1; --level) {
    std::vector<AllreduceFlow> up;
    for (int i = 0; i < p; ++i) {
      if (depth_of(i) == level) up.push_back({i, (i - 1) / 2});
    }
    rounds.push_back(allreduce_model::round_of(std::move(up), 1.0, 1.0));
  }
  for (int level = 1; level <= depth; ++level) {
    std::vector<AllreduceFlow> down;
    for (int i = 0; i < p; ++i) {
      if (depth_of(i) == level) down.push_back({(i - 1) / 2, i});
    }
    rounds.push_back(allreduce_model::round_of(std::move(down), 1.0, 0.0));
  }
  return rounds;
}

AllreduceCoefficients tree_coefficients(int world_size) {
  const double depth = allreduce_model::floor_log2(world_size);  // of the heap; levels up, then down
  return {2 * depth, 2 * depth, depth};
}

std::unique_ptr<Allreduce> make_tree(Transport& transport, std::size_t max_count, const Codec& codec,
                                   const AllreduceOptions& options) {
  return std::make_unique<TreeAllreduce>(transport, max_count, codec, options);
}

}  // namespace

AllreduceAlgorithm tree_allreduce_algorithm() {
  return {"tree", make_tree, tree_rounds, tree_coefficients};
}

}  // namespace pipesgd
