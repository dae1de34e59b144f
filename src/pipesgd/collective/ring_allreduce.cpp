#include "pipesgd/collective/ring_allreduce.h"

#include <algorithm>
#include <cstdlib>

#include "pipesgd/collective/allreduce_detail.h"
#include "pipesgd/collective/allreduce_model_detail.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {
using allreduce_detail::expect_bytes;
constexpr const char* kOperation = "ring allreduce";
constexpr int kMaxSteps = 4096;
}  // namespace

std::size_t parse_segment_bytes(const std::string& text, const char* name) {
  if (text == "auto") return kAutoSegmentBytes;
  if (text == "none") return kUnsegmented;
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  const std::string unit(end ? end : "");
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KiB") scale = 1024;
  else if (unit == "M" || unit == "MiB") scale = 1024.0 * 1024;
  if (end == text.c_str() || scale == 0 || !(number * scale >= 4) || number * scale > 1e12) {
    throw UsageError(concat(name, " '", text,
                            "': expected auto, none or a size of at least 4 bytes such as 256K or 1M"));
  }
  return static_cast<std::size_t>(number * scale);
}

std::string describe_segment_bytes(std::size_t segment_bytes) {
  if (segment_bytes == kAutoSegmentBytes) return "auto";
  if (segment_bytes == kUnsegmented) return "unsegmented";
  if (segment_bytes % 1024 == 0) return concat(segment_bytes / 1024, " KiB");
  return concat(segment_bytes, " B");
}

RingAllreduce::RingAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                             AllreduceOptions options)
    : transport_(transport), codec_(codec), options_(options), max_count_(max_count) {
  const int p = transport.size();
  if (2 * (p - 1) > kMaxSteps) throw UsageError(concat(kOperation, ": at most 2049 ranks"));
  const std::size_t max_chunk = max_count / p + 1;
  segment_elements_ = allreduce_detail::segment_elements_for(options.segment_bytes, max_chunk);
  segment_bytes_ = codec.encoded_bytes(segment_elements_);
  const std::size_t segments = segment_count(max_chunk);
  const std::size_t region = segments * segment_bytes_;
  for (auto& buffer : send_buffers_) buffer.resize(region);
  for (auto& buffer : receive_buffers_) buffer.resize(region);
  for (auto& requests : receives_) requests.resize(segments);
  for (auto& requests : sends_) requests.resize(segments);
}

std::size_t RingAllreduce::chunk_count(std::size_t n, int chunk) const {
  const std::size_t p = transport_.size();
  return n / p + (static_cast<std::size_t>(chunk) < n % p ? 1 : 0);
}

std::size_t RingAllreduce::chunk_offset(std::size_t n, int chunk) const {
  const std::size_t p = transport_.size();
  const std::size_t c = chunk;
  return c * (n / p) + std::min(c, n % p);
}

std::size_t RingAllreduce::segment_count(std::size_t chunk_elements) const {
  return allreduce_detail::segment_count(chunk_elements, segment_elements_);
}

void RingAllreduce::run(std::span<float> data, Tag tag) {
  try {
    run_steps(data, tag);
  } catch (...) {
    // Withdraw everything still posted on `data` or our buffers before the caller sees the error.
    for (auto& requests : receives_) allreduce_detail::withdraw(requests);
    for (auto& requests : sends_) allreduce_detail::withdraw(requests);
    throw;
  }
}

void RingAllreduce::run_steps(std::span<float> data, Tag tag) {
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  const int p = transport_.size();
  const int rank = transport_.rank();
  allreduce_detail::check_count(kOperation, data.size(), max_count_);
  if (p == 1) return;
  const std::size_t n = data.size();
  const int right = (rank + 1) % p;
  const int left = (rank + p - 1) % p;
  const int last_step = 2 * (p - 1) - 1;
  const Timeout timeout = options_.timeout;
  const bool identity = codec_.is_identity();
  auto wrap = [p](int c) { return ((c % p) + p) % p; };
  // Steps 0..p-2 reduce-scatter, p-1..2p-3 allgather. Rank r sends chunk outgoing(s) and receives
  // incoming(s); incoming(s) == outgoing(s+1), and after the reduce-scatter r owns chunk r+1.
  auto outgoing = [&](int s) { return s < p - 1 ? wrap(rank - s) : wrap(rank + 1 - (s - (p - 1))); };
  auto incoming = [&](int s) { return s < p - 1 ? wrap(rank - s - 1) : wrap(rank - (s - (p - 1))); };
  auto reducing = [&](int s) { return s < p - 1; };
  // Segment j of chunk c, as elements of `data`.
  auto segment = [&](int c, std::size_t j) {
    const std::size_t count = chunk_count(n, c);
    const std::size_t begin = std::min(count, j * segment_elements_);
    const std::size_t end = std::min(count, begin + segment_elements_);
    return data.subspan(chunk_offset(n, c) + begin, end - begin);
  };
  auto region = [&](std::vector<std::byte>& buffer, std::size_t j, std::size_t elements) {
    return std::span<std::byte>(buffer.data() + j * segment_bytes_, codec_.encoded_bytes(elements));
  };
  // Encodes segment j of the chunk `values` into the send buffer of step s and posts its send.
  // `keep_decoded`: the owner keeps exactly what the others will decode.
  auto send_segment = [&](int s, std::size_t j, std::span<float> values, bool keep_decoded) {
    std::span<const std::byte> message;
    if (identity) {
      message = std::as_bytes(values);
    } else {
      std::span<std::byte> out = region(send_buffers_[s % 2], j, values.size());
      codec_.encode(values, out);
      if (keep_decoded) codec_.decode(out, values);
      message = out;
    }
    sends_[s % 2][j] = transport_.send(right, step_tag(tag, s, j), message, kOperation);
  };
  auto post_receives = [&](int s) {
    const int c = incoming(s);
    const std::size_t segments = segment_count(chunk_count(n, c));
    for (std::size_t j = 0; j < segments; ++j) {
      std::span<float> target = segment(c, j);
      if (reducing(s)) {  // read once, by the decode-add: the transport may lend the sender's bytes
        receives_[s % 2][j] = transport_.recv_in_place(left, step_tag(tag, s, j),
                                                       region(receive_buffers_[s % 3], j, target.size()), kOperation);
        continue;
      }
      std::span<std::byte> into =
          identity ? std::as_writable_bytes(target) : region(receive_buffers_[s % 3], j, target.size());
      receives_[s % 2][j] = transport_.recv(left, step_tag(tag, s, j), into, kOperation);
    }
  };

  post_receives(0);
  {
    const int c = outgoing(0);
    const std::size_t segments = segment_count(chunk_count(n, c));
    for (std::size_t j = 0; j < segments; ++j) send_segment(0, j, segment(c, j), p == 1);
  }
  for (int s = 0; s <= last_step; ++s) {
    if (s < last_step) post_receives(s + 1);
    const int c = incoming(s);
    const std::size_t segments = segment_count(chunk_count(n, c));
    for (std::size_t j = 0; j < segments; ++j) {
      std::span<float> target = segment(c, j);
      const Tag message_tag = step_tag(tag, s, j);
      if (reducing(s)) {
        Request& receive = receives_[s % 2][j];
        const std::span<const std::byte> message =
            receive.wait_in_place(timeout, region(receive_buffers_[s % 3], j, target.size()));
        expect_bytes(kOperation, message.size(), codec_.encoded_bytes(target.size()), left, message_tag);
        codec_.decode_add(message, target);
        receive = Request();  // the sender's bytes, if lent, go back at once
        // The reduced segment goes on at once: to the next reduce-scatter step, or, after the last
        // one, as this rank's fully reduced (owned) chunk into the allgather.
        if (s < last_step) send_segment(s + 1, j, target, s == p - 2);
      } else {
        const std::size_t got = receives_[s % 2][j].wait(timeout);
        expect_bytes(kOperation, got, codec_.encoded_bytes(target.size()), left, message_tag);
        std::span<const std::byte> message;
        if (identity) {
          message = std::as_bytes(target);
        } else {
          message = std::span<const std::byte>(receive_buffers_[s % 3].data() + j * segment_bytes_, got);
          codec_.decode(message, target);
        }
        if (s < last_step) {  // forward the same bytes, never re-encoded
          sends_[(s + 1) % 2][j] = transport_.send(right, step_tag(tag, s + 1, j), message, kOperation);
        }
      }
    }
    const std::size_t sent = segment_count(chunk_count(n, outgoing(s)));
    for (std::size_t j = 0; j < sent; ++j) sends_[s % 2][j].wait(timeout);
  }
}

// ---------------------------------------------------------------------------------------------
// The entry of the algorithm list: rounds (allreduce_rounds.h) and cost coefficients
// (timing/allreduce_cost_model.h) on p >= 2 ranks.

namespace {

std::vector<AllreduceRound> ring_rounds(int p) {
  const double share = 1.0 / p;
  std::vector<AllreduceFlow> flows;
  for (int i = 0; i < p; ++i) flows.push_back({i, (i + 1) % p});
  return {allreduce_model::round_of(flows, share, share, p - 1, true),
          allreduce_model::round_of(flows, share, 0.0, p - 1, true)};
}

AllreduceCoefficients ring_coefficients(int world_size) {
  const double p = world_size;
  return {2 * (p - 1), 2 * (p - 1) / p, (p - 1) / p};
}

std::unique_ptr<Allreduce> make_ring(Transport& transport, std::size_t max_count, const Codec& codec,
                                   const AllreduceOptions& options) {
  return std::make_unique<RingAllreduce>(transport, max_count, codec, options);
}

}  // namespace

AllreduceAlgorithm ring_allreduce_algorithm() {
  return {"ring", make_ring, ring_rounds, ring_coefficients};
}

}  // namespace pipesgd
