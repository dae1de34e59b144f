#include "pipesgd/collective/ring_allreduce.h"

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {
constexpr const char* kOperation = "ring allreduce";

void expect_bytes(std::size_t got, std::size_t expected, int peer, Tag tag) {
  if (got != expected) {
    throw CommError(concat(kOperation, ": message from rank ", peer, " (tag ", tag, ") has ", got,
                           " bytes, expected ", expected, " (ranks disagree on the element count)"));
  }
}
}  // namespace

RingAllreduce::RingAllreduce(Transport& transport, std::size_t max_count, const Codec& codec,
                             AllreduceOptions options)
    : transport_(transport), codec_(codec), options_(options), max_count_(max_count) {
  const int p = transport.size();
  const std::size_t max_chunk = max_count / p + 1;
  const std::size_t bytes = codec.encoded_bytes(max_chunk);
  send_buffer_.resize(bytes);
  receive_buffers_[0].resize(bytes);
  receive_buffers_[1].resize(bytes);
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

void RingAllreduce::run(std::span<float> data, Tag tag) {
  const int p = transport_.size();
  const int rank = transport_.rank();
  if (data.size() > max_count_) {
    throw UsageError(concat(kOperation, ": ", data.size(), " elements exceed the ", max_count_,
                            " this allreduce was built for"));
  }
  if (p == 1) return;
  const std::size_t n = data.size();
  const int right = (rank + 1) % p;
  const int left = (rank + p - 1) % p;
  auto chunk = [&](int c) { return data.subspan(chunk_offset(n, c), chunk_count(n, c)); };
  auto wrap = [p](int c) { return ((c % p) + p) % p; };
  const Timeout timeout = options_.timeout;
  const bool identity = codec_.is_identity();

  // Reduce-scatter: after step s, the chunk received holds the sum over s + 2 ranks.
  for (int step = 0; step < p - 1; ++step) {
    const Tag message_tag = step_tag(tag, step);
    std::span<float> outgoing = chunk(wrap(rank - step));
    std::span<float> incoming = chunk(wrap(rank - step - 1));
    const std::size_t incoming_bytes = codec_.encoded_bytes(incoming.size());
    std::span<std::byte> receive_into(receive_buffers_[0].data(), incoming_bytes);
    Request receive = transport_.recv(left, message_tag, receive_into, kOperation);
    std::span<const std::byte> message;
    if (identity) {
      message = std::as_bytes(outgoing);
    } else {
      const std::size_t used = codec_.encode(outgoing, send_buffer_);
      message = std::span<const std::byte>(send_buffer_.data(), used);
    }
    Request send = transport_.send(right, message_tag, message, kOperation);
    const std::size_t got = receive.wait(timeout);
    expect_bytes(got, receive_into.size(), left, message_tag);
    codec_.decode_add(receive_into, incoming);
    send.wait(timeout);
  }

  // Allgather: rank r now owns chunk r+1. It travels p-1 hops around the ring.
  const int owned = wrap(rank + 1);
  std::span<const std::byte> forward;  // bytes to send in the current step
  if (identity) {
    forward = std::as_bytes(chunk(owned));
  } else {
    std::span<float> mine = chunk(owned);
    const std::size_t used = codec_.encode(mine, send_buffer_);
    forward = std::span<const std::byte>(send_buffer_.data(), used);
    codec_.decode(forward, mine);  // keep exactly what every other rank will decode
  }
  for (int step = 0; step < p - 1; ++step) {
    const Tag message_tag = step_tag(tag, p - 1 + step);
    std::span<float> incoming = chunk(wrap(rank - step));
    std::span<std::byte> receive_into;
    if (identity) {
      receive_into = std::as_writable_bytes(incoming);
    } else {
      receive_into = std::span<std::byte>(receive_buffers_[step % 2].data(),
                                          codec_.encoded_bytes(incoming.size()));
    }
    Request receive = transport_.recv(left, message_tag, receive_into, kOperation);
    Request send = transport_.send(right, message_tag, forward, kOperation);
    const std::size_t got = receive.wait(timeout);
    expect_bytes(got, receive_into.size(), left, message_tag);
    if (!identity) codec_.decode(receive_into, incoming);
    send.wait(timeout);
    forward = std::span<const std::byte>(receive_into.data(), got);
  }
}

}  // namespace pipesgd
