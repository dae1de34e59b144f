#include "pipesgd/comm/local_transport.h"

#include <sys/prctl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "pipesgd/comm/message_matching.h"
#include "pipesgd/comm/operation_pool.h"
#include "pipesgd/comm/wait.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace local_detail {

// An unmatched operation in its receiving rank's mailbox. The operation stays alive meanwhile: its
// Request withdraws it before letting it go (Operation::cancel), and its endpoint's pool owns it.
struct Entry {
  int sender;  // the sending rank
  Tag tag;
  Operation* operation;
};

// Messages waiting on one receiving rank (message_matching.h). Guarded by `mutex`, which also guards
// every Operation queued here.
struct Mailbox {
  std::mutex mutex;
  MatchingMailbox<Entry> unmatched;
};

// Emulated NIC state of one rank.
struct Link {
  std::mutex mutex;
  Clock::time_point egress_free{};
  Clock::time_point ingress_free{};
  double slowdown = 1;  // LocalFabric::slow_link
};

struct Operation final : RequestState, std::enable_shared_from_this<Operation> {
  LocalFabric* fabric = nullptr;
  Mailbox* mailbox = nullptr;  // the receiving rank's mailbox, whose mutex guards the fields below
  bool is_send = false;
  int owner = 0;  // rank that posted the operation
  int peer = 0;
  Tag tag = 0;
  const char* operation = "";
  std::span<const std::byte> send_bytes;
  std::span<std::byte> recv_buffer;
  bool queued = false;
  bool complete = false;
  // recv_in_place: a recv that accepts the sender's bytes lent instead of copied. Once matched, it
  // holds the lending send (`lender`, whose bytes are `lent`) until cancel() returns them; the
  // send (`lent_out`) completes only then.
  bool in_place = false;
  std::shared_ptr<Operation> lender;
  std::span<const std::byte> lent;
  bool lent_out = false;
  std::size_t bytes = 0;
  Clock::time_point ready_at{};       // a recv: when the message arrives (a send: never later than its match)
  Clock::time_point recv_ready_at{};  // an unmatched send: when its message arrives at the peer
  std::string error;
  // Signalled when this operation completes (or the run fails): only its own waiter wakes up.
  std::condition_variable completed;

  std::string describe_wait() const {
    return describe_message_wait(operation, is_send, peer, tag, owner);
  }

  // The wait (comm/wait.h): no polling; it sleeps on `completed` under the mailbox's lock.
  struct WaitSite {
    Operation& op;
    std::unique_lock<std::mutex>& lock;
    bool ready() const { return op.complete; }
    bool polling_pays() const { return false; }
    bool failed() const { return op.fabric->failed(); }
    std::string failure_message() const { return op.fabric->failure_message(); }
    void block(Clock::time_point, Clock::time_point until) { op.completed.wait_until(lock, until); }
  };

  std::size_t wait(Timeout timeout) override {
    std::unique_lock lock(mailbox->mutex);
    if (!complete) {
      WaitSite site{*this, lock};
      wait_or_throw(WaitPolicy{}, timeout, peer, site, [this] { return describe_wait(); });
    }
    const auto ready = ready_at;
    const std::size_t transferred = bytes;
    std::string failure = std::move(error);
    lock.unlock();
    if (!failure.empty()) throw CommError(concat(describe_wait(), ": ", failure));
    if (ready > Clock::now()) {
      // Emulated wire time. A small timer slack keeps microsecond latencies meaningful.
      thread_local bool slack_set = false;
      if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
        slack_set = true;
      }
      std::this_thread::sleep_until(ready);
    }
    return transferred;
  }

  bool test() override {
    std::lock_guard lock(mailbox->mutex);
    return complete && ready_at <= Clock::now();
  }

  std::span<const std::byte> wait_in_place(Timeout timeout, std::span<const std::byte> posted) override {
    const std::size_t n = wait(timeout);  // saw `complete` under the lock: lender and lent are settled
    return lender ? lent : posted.first(n);
  }
  bool lends() const override { return lender != nullptr; }

  void cancel() override {
    std::unique_lock lock(mailbox->mutex);
    if (lender) {  // a recv returning the bytes it was lent: the lending send completes now
      lender->complete = true;
      lender->completed.notify_one();
      lender.reset();
      lent = {};
      return;
    }
    if (lent_out && !complete) {
      // A send withdrawn while its bytes are lent: the receiver reads them once and returns them
      // at once (Transport::recv_in_place's contract), and it must be done before the buffer goes.
      const bool returned = completed.wait_for(lock, std::chrono::seconds(60), [this] { return complete; });
      PIPESGD_ASSERT(returned);
      return;
    }
    if (!queued) return;
    mailbox->unmatched.withdraw(is_send, [this](const Entry& entry) { return entry.operation == this; });
    queued = false;
  }
};

// Completes a matched pair; the receiving mailbox's mutex is held by the caller. A recv_in_place
// borrows the send's bytes instead of a copy: the send then completes only when the recv returns
// them (Operation::cancel).
void transfer(Operation& send, Operation& recv) {
  const std::size_t n = send.send_bytes.size();
  const bool lend = recv.in_place && n > 0 && n <= recv.recv_buffer.size();
  if (lend) {
    recv.lender = send.shared_from_this();
    recv.lent = send.send_bytes;
    send.lent_out = true;
  } else if (n > recv.recv_buffer.size()) {
    std::string why = concat("message of ", n, " bytes from rank ", send.owner, " (",
                             describe_tag(send.tag), ") does not fit the receive buffer of ", recv.recv_buffer.size(),
                             " bytes");
    send.error = why;
    recv.error = why;
  } else if (n > 0) {
    std::memcpy(recv.recv_buffer.data(), send.send_bytes.data(), n);
  }
  send.bytes = recv.bytes = n;
  recv.ready_at = std::max(recv.ready_at, Clock::now());
  recv.complete = true;
  send.queued = recv.queued = false;
  if (!lend) {
    send.complete = true;
    send.completed.notify_one();
  }
  recv.completed.notify_one();
}

class Endpoint final : public Transport {
 public:
  Endpoint(LocalFabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return fabric_.size(); }

  Request send(int peer, Tag tag, std::span<const std::byte> bytes,
               const char* operation) override {
    check_peer(peer, operation);
    auto op = acquire();
    op->is_send = true;
    op->peer = peer;
    op->tag = tag;
    op->operation = operation;
    op->send_bytes = bytes;
    op->mailbox = fabric_.mailboxes_[peer].get();
    Clock::time_point arrival = emulate_wire(peer, bytes.size());
    bytes_sent_.fetch_add(bytes.size(), std::memory_order_relaxed);

    Mailbox& box = *op->mailbox;
    {
      std::lock_guard lock(box.mutex);
      if (const std::optional<Entry> match = box.unmatched.match(true, rank_, tag)) {
        Operation& recv = *match->operation;
        recv.ready_at = arrival;
        transfer(*op, recv);
      } else {
        op->recv_ready_at = arrival;
        op->queued = true;
        box.unmatched.queue(true, Entry{rank_, tag, op.get()});
      }
    }
    return Request(std::move(op));
  }

  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return post_recv(peer, tag, buffer, operation, false);
  }
  Request recv_in_place(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return post_recv(peer, tag, buffer, operation, true);
  }

  void report_failure(const std::string& reason) override { fabric_.report_failure(rank_, reason); }
  std::uint64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  std::string describe() const override {
    return concat("local (", fabric_.size(), " ranks as threads, ", pipesgd::describe(fabric_.network()),
                  ")");
  }

 private:
  Request post_recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation, bool in_place) {
    check_peer(peer, operation);
    auto op = acquire();
    op->is_send = false;
    op->in_place = in_place;
    op->peer = peer;
    op->tag = tag;
    op->operation = operation;
    op->recv_buffer = buffer;
    op->mailbox = fabric_.mailboxes_[rank_].get();
    op->ready_at = Clock::time_point{};
    Mailbox& box = *op->mailbox;
    {
      std::lock_guard lock(box.mutex);
      if (const std::optional<Entry> match = box.unmatched.match(false, peer, tag)) {
        Operation& send = *match->operation;
        op->ready_at = send.recv_ready_at;
        transfer(send, *op);
      } else {
        op->queued = true;
        box.unmatched.queue(false, Entry{peer, tag, op.get()});
      }
    }
    return Request(std::move(op));
  }

  void check_peer(int peer, const char* operation) const {
    if (peer < 0 || peer >= fabric_.size()) {
      throw UsageError(concat(operation, ": rank ", rank_, " addressed peer ", peer,
                              " outside the world of ", fabric_.size(), " ranks"));
    }
  }

  // Reuses a finished Operation or makes a new one (operation_pool.h): after warm-up the pool covers
  // every operation in flight, so the hot path does not allocate.
  std::shared_ptr<Operation> acquire() {
    std::shared_ptr<Operation> op = pool_.acquire([](std::size_t) { return std::make_shared<Operation>(); });
    reset(*op);
    return op;
  }

  void reset(Operation& op) {
    op.fabric = &fabric_;
    op.owner = rank_;
    op.queued = op.complete = false;
    op.in_place = op.lent_out = false;
    op.lender.reset();
    op.lent = {};
    op.bytes = 0;
    op.error.clear();
    op.send_bytes = {};
    op.recv_buffer = {};
    op.ready_at = op.recv_ready_at = Clock::time_point{};
  }

  // Books a message of n bytes to `peer` on this rank's egress and the peer's ingress and returns
  // when it arrives. The send itself completes as soon as it is matched: the bytes were copied then,
  // so the buffer is free, and the wire time is carried by the arrival alone (no extra wake-up).
  Clock::time_point emulate_wire(int peer, std::size_t n) {
    const NetworkSpec& net = fabric_.network();
    if (!net.emulated() || peer == rank_) return Clock::time_point{};
    const auto wire = std::chrono::duration_cast<Clock::duration>(
        Seconds(net.bits_per_second > 0 ? static_cast<double>(n) / net.bytes_per_second() : 0.0));
    const auto latency =
        std::chrono::duration_cast<Clock::duration>(Seconds(net.latency_seconds));
    Link& out = *fabric_.links_[rank_];
    Link& in = *fabric_.links_[peer];
    std::scoped_lock lock(out.mutex, in.mutex);
    const auto egress_start = std::max(Clock::now(), out.egress_free);
    out.egress_free = egress_start + std::chrono::duration_cast<Clock::duration>(wire * out.slowdown);
    const auto arrival = std::max(out.egress_free + latency,
                                  in.ingress_free + std::chrono::duration_cast<Clock::duration>(wire * in.slowdown));
    in.ingress_free = arrival;
    return arrival;
  }

  LocalFabric& fabric_;
  int rank_;
  OperationPool<Operation> pool_;
  std::atomic<std::uint64_t> bytes_sent_{0};
};

}  // namespace local_detail

void LocalFabric::slow_link(int rank, double factor) {
  PIPESGD_ASSERT(rank >= 0 && rank < ranks_ && factor > 0);
  local_detail::Link& link = *links_[static_cast<std::size_t>(rank)];
  std::lock_guard lock(link.mutex);
  link.slowdown = factor;
}

LocalFabric::LocalFabric(int ranks, NetworkSpec network) : ranks_(ranks), network_(std::move(network)) {
  if (ranks < 1) throw UsageError(concat("a local fabric needs at least one rank, got ", ranks));
  for (int r = 0; r < ranks; ++r) {
    mailboxes_.push_back(std::make_unique<local_detail::Mailbox>());
    links_.push_back(std::make_unique<local_detail::Link>());
  }
  for (int r = 0; r < ranks; ++r) {
    endpoints_.push_back(std::make_unique<local_detail::Endpoint>(*this, r));
  }
}

LocalFabric::~LocalFabric() = default;

Transport& LocalFabric::endpoint(int rank) {
  PIPESGD_ASSERT(rank >= 0 && rank < ranks_);
  return *endpoints_[rank];
}

void LocalFabric::report_failure(int rank, const std::string& reason) {
  if (!failure_.report(rank, reason)) return;
  // Only queued (unmatched) operations can be blocked in wait(); wake each of them.
  for (auto& box : mailboxes_) {
    std::lock_guard lock(box->mutex);
    const auto wake = [](const local_detail::Entry& entry) { entry.operation->completed.notify_all(); };
    box->unmatched.sends.for_each(wake);
    box->unmatched.recvs.for_each(wake);
  }
}

}  // namespace pipesgd
