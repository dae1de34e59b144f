#pragma once
// The Transport interface: point-to-point, non-blocking messages between the ranks of one run.
// Algorithms (collectives, training methods) only ever see this interface.
//
// Matching: a send from rank A to rank B with tag T matches the oldest posted recv on B from A with
// tag T (FIFO per (peer, tag)). A message must fit the receive buffer.
// Buffer ownership: a send's bytes and a recv's buffer belong to the transport until the returned
// Request has completed (wait() returned) or has been destroyed (which cancels it if unmatched).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace pipesgd {

using Tag = std::uint64_t;
using Timeout = std::chrono::milliseconds;

// Tag layout (every transport relies on it; MpiTransport maps it onto MPI communicators and tags):
//   bits 56-63 channel, bits 24-55 sequence, bits 12-23 step, bits 0-11 segment.
// A caller starts a collective with collective_tag(channel, sequence); the collective derives the
// tags of its messages with step_tag(), filling step and segment.
// Collectives that may be in flight at once over one transport need distinct tags; MpiTransport
// additionally needs that two collectives of one channel whose sequences differ by a multiple of
// kMpiSequenceWindow are never in flight at once (mpi/mpi_transport.h).
enum class Channel : std::uint8_t {
  kGradients = 0,  // training methods: sequence = iteration (or iteration * buckets + bucket)
  kControl = 1,    // the trainer's epoch-end reductions, barriers and result gathering
  kBenchmark = 2,  // benchmark and calibration: the timed allreduces and result gathering
  // The parameter server (ps/parameter_server.h): sequence = a worker's request or pull count,
  // step = 0 request / 1 pull reply, segment = shard.
  kParameterServer = 3,
  // Layer-wise methods' planning reductions (the per-layer profile the bucket plan is computed
  // from): sequence = the plan's count.
  kPlanning = 4,
  // The trainer's replica consistency checks (--check-consistency): sequence = the check's count.
  kConsistency = 5,
  // The API's negotiated collectives (api/collective_engine.h): the negotiation rounds (sequence =
  // the round's number) and the collectives they agree on (sequence = the collective's number in the
  // order every rank reads from the rounds).
  kNegotiation = 6,
  kCollectives = 7,
};
inline constexpr int kChannelCount = 8;

constexpr Tag collective_tag(Channel channel, std::uint64_t sequence) {
  return (static_cast<Tag>(channel) << 32) | (sequence & 0xffffffffu);
}

// Tag of segment `segment` (< 2^12) of step `step` (< 2^12) of a collective started with `tag`
// (a collective_tag, < 2^40): the message tags of one collective are distinct exactly when their
// (step, segment) pairs are.
constexpr Tag step_tag(Tag tag, int step, std::size_t segment) {
  return (tag << 24) | (static_cast<Tag>(step) << 12) | static_cast<Tag>(segment);
}

// The fields of a message tag (the layout above).
struct TagFields {
  unsigned channel;  // a Channel, or an unknown value from a foreign tag
  std::uint64_t sequence;
  unsigned step;
  unsigned segment;
};
constexpr TagFields decode_tag(Tag tag) {
  return {static_cast<unsigned>(tag >> 56), (tag >> 24) & 0xffffffffu, static_cast<unsigned>((tag >> 12) & 0xfff),
          static_cast<unsigned>(tag & 0xfff)};
}

// "tag gradients:17 step 3 segment 0": the fields of a message tag, for error messages.
std::string describe_tag(Tag tag);

// "<operation>: send to rank P (tag ...) on rank R" (or "recv from"): how every transport names a
// wait in its errors, before " timed out after S s" or " aborted: ...".
std::string describe_message_wait(const char* operation, bool is_send, int peer, Tag tag, int rank);

// The state of one outstanding operation; implemented by each transport.
class RequestState {
 public:
  virtual ~RequestState() = default;
  // Blocks until the operation completes; returns the bytes transferred. Throws CommTimeoutError
  // (naming operation, peer and tag) after `timeout`, PeerFailedError if the run failed.
  virtual std::size_t wait(Timeout timeout) = 0;
  // Non-blocking: true once wait() would return without blocking.
  virtual bool test() = 0;
  // Called when the Request is dropped before completion: must withdraw the operation so that the
  // transport never touches the caller's buffer afterwards. For a recv whose message was lent
  // (wait_in_place), returns the message to its sender.
  virtual void cancel() = 0;
  // A recv posted with Transport::recv_in_place into `posted` (its buffer): like wait(), but returns
  // the message itself: the sender's bytes if they were lent (then lends() is true until cancel()),
  // else the filled prefix of `posted`.
  virtual std::span<const std::byte> wait_in_place(Timeout timeout, std::span<const std::byte> posted) {
    return posted.first(wait(timeout));
  }
  virtual bool lends() const { return false; }
};

// Handle to one outstanding send or recv. Move-only; dropping an incomplete one cancels it.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<RequestState> state) : state_(std::move(state)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      reset();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { reset(); }

  bool valid() const { return state_ != nullptr; }
  // Waits for completion and releases the handle; returns bytes transferred.
  std::size_t wait(Timeout timeout) {
    std::size_t bytes = state_->wait(timeout);
    state_.reset();
    return bytes;
  }
  bool test() { return state_ && state_->test(); }
  // For a recv posted with Transport::recv_in_place into `posted`: waits like wait() and returns the
  // message's bytes. If the transport lent the sender's bytes, they stay valid until this Request is
  // reset or destroyed, which must follow promptly (the sender's send completes only then);
  // otherwise the handle is released as by wait().
  std::span<const std::byte> wait_in_place(Timeout timeout, std::span<const std::byte> posted) {
    const std::span<const std::byte> message = state_->wait_in_place(timeout, posted);
    if (!state_->lends()) state_.reset();
    return message;
  }

 private:
  void reset() {
    if (state_) {
      state_->cancel();
      state_.reset();
    }
  }
  std::shared_ptr<RequestState> state_;
};

// One rank's endpoint. Thread-safety: send/recv may be called concurrently from several threads of
// the same rank (e.g. the compute thread and the comm thread).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `operation` names the caller's operation in error messages; it must be a string literal.
  virtual Request send(int peer, Tag tag, std::span<const std::byte> bytes,
                       const char* operation) = 0;
  virtual Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) = 0;
  // A recv whose message the caller reads once, right away (a reduction step): the transport may
  // lend the sender's own bytes instead of copying them into `buffer` (LocalTransport does: one pass
  // over the data instead of a copy and a pass). Read it with Request::wait_in_place(timeout,
  // buffer). Default: recv into `buffer`.
  virtual Request recv_in_place(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) {
    return recv(peer, tag, buffer, operation);
  }
  // Reports that this rank failed; every other rank's pending and future waits throw
  // PeerFailedError naming this rank and `reason`. Idempotent.
  virtual void report_failure(const std::string& reason) = 0;
  // Total payload bytes this rank has sent so far (for metrics).
  virtual std::uint64_t bytes_sent() const = 0;
  // Human-readable description ("local, 4 ranks, 10gbe (10 Gbit/s, 20 us)").
  virtual std::string describe() const = 0;
  // True if a wait sleeps in the kernel until its operation completes; false if it polls (MPI).
  // A thread that polls must not run at real-time priority: it would starve the compute threads.
  virtual bool waits_sleep() const { return true; }
};

}  // namespace pipesgd
