#include "pipesgd/comm/shm/operation.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "pipesgd/comm/wait.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/thread_priority.h"

namespace pipesgd::shm_detail {
namespace {

// How long a cancel waits for a live peer to finish copying into or out of the operation's buffer.
constexpr std::chrono::seconds kCopierPatience{2};

// The waits (comm/wait.h): a message about to land costs no sleep (a few polls first); a thread
// with nothing else to run (not a comm thread: e.g. D-Sync's compute thread inside its allreduce)
// polls, yielding the processor, before it sleeps, because a step's partner is often about to answer
// and a futex wake-up costs a trip through the scheduler (core/thread_priority.h); a comm thread
// sleeps at once. The failure flags are looked at between the sleeps.
constexpr WaitPolicy kCommThreadWait{.spin_polls = 64, .block_slice = SharedMemoryTransport::kWaitSlice};
constexpr WaitPolicy kOtherThreadWait{.spin_polls = 64,
                                      .yield_for = SharedMemoryTransport::kPollBeforeSleep,
                                      .block_slice = SharedMemoryTransport::kWaitSlice};

}  // namespace

void Operation::start(bool is_send, bool in_place, int peer, int peer_member, Tag tag, std::byte* data,
                      std::size_t bytes, const char* operation) {
  is_send_ = is_send;
  in_place_ = in_place;
  staged_ = 0;
  lent_ = false;
  peer_ = peer;
  peer_member_ = peer_member;
  tag_ = tag;
  operation_ = operation;
  finished_ = false;
  Slot& own = slot();
  own.state.store(kPending, std::memory_order_relaxed);
  own.outcome = kOk;
  own.copy_errno = 0;
  own.address = reinterpret_cast<std::uint64_t>(data);
  own.bytes = bytes;
  own.transferred = 0;
  own.message_bytes = 0;
  own.staged = 0;
}

std::string Operation::describe_wait() const {
  return describe_message_wait(operation_, is_send_, peer_, tag_, transport_.world_rank_);
}

void Operation::release_staged() {
  Slot& own = slot();
  if (own.staged == 0) return;
  transport_.staging_area_.release(peer_member_, transport_.self_, own.staged);
  own.staged = 0;
}

std::size_t Operation::finish() {
  finished_ = true;
  Slot& own = slot();
  if (own.outcome == kOk) {
    if (own.staged) {  // an eager message: copy it out of its staging slot, which is free again
      std::memcpy(reinterpret_cast<std::byte*>(own.address),
                  transport_.staging_area_.data(peer_member_, transport_.self_, own.staged - 1), own.transferred);
      release_staged();
    }
    return own.transferred;
  }
  std::string why;
  if (own.outcome == kTooLarge) {
    why = is_send_ ? concat("message of ", own.message_bytes, " bytes does not fit the receive buffer of rank ", peer_)
                   : concat("message of ", own.message_bytes, " bytes from rank ", peer_,
                            " does not fit the receive buffer of ", own.bytes, " bytes");
  } else {
    why = concat("cross-memory copy of ", own.message_bytes, " bytes failed: ", std::strerror(own.copy_errno));
  }
  throw CommError(concat(describe_wait(), ": ", why));
}

std::size_t Operation::wait(Timeout timeout) {
  await_done(timeout);
  return finish();
}

std::span<const std::byte> Operation::wait_in_place(Timeout timeout, std::span<const std::byte> posted) {
  await_done(timeout);
  Slot& own = slot();
  if (in_place_ && own.staged && own.outcome == kOk) {  // read it where it is; cancel() frees it
    lent_ = true;
    return {transport_.staging_area_.data(peer_member_, transport_.self_, own.staged - 1), own.transferred};
  }
  return posted.first(finish());
}

// The slot's side of the wait. Polling cannot help an operation that is not posted yet (deferred:
// its mailbox lock was busy); blocking posts it first, waiting at most a slice for the lock, and
// otherwise posts what else this process deferred before it sleeps on the slot's futex.
struct Operation::WaitSite {
  Operation& op;

  bool ready() const { return phase(op.slot()) == kDone; }
  bool polling_pays() const { return !op.deferred.load(std::memory_order_acquire); }
  bool failed() const {
    if (op.transport_.failed()) return true;
    if (op.transport_.external_check_) op.transport_.external_check_(op.describe_wait());
    return false;
  }
  std::string failure_message() const { return op.transport_.failure_message(); }
  void block(Clock::time_point now, Clock::time_point until) {
    if (op.deferred.load(std::memory_order_acquire)) {
      op.transport_.flush(op.mailbox(), until - now);
      return;
    }
    op.transport_.flush_all(Clock::duration::zero());
    sleep_until_done(op.slot(), until - now);
  }
};

void Operation::await_done(Timeout timeout) {
  PIPESGD_ASSERT(!finished_ && !lent_);
  WaitSite site{*this};
  if (site.ready()) return;
  const WaitNoteScope note({operation_, is_send_, peer_, tag_, transport_.world_rank_, WaitNote::now_ns()});
  wait_or_throw(is_communication_thread() ? kCommThreadWait : kOtherThreadWait, timeout, peer_, site,
                [this] { return describe_wait(); });
}

bool Operation::test() {
  if (finished_) return true;
  if (deferred.load(std::memory_order_acquire)) transport_.flush(mailbox(), Clock::duration::zero());
  return phase(slot()) == kDone;
}

void Operation::cancel() {
  if (lent_) {  // the lent bytes of a staged message go back: its staging slot is free again
    release_staged();
    lent_ = false;
    finished_ = true;
    return;
  }
  if (finished_) return;
  finished_ = true;
  if (deferred.load(std::memory_order_acquire) && transport_.withdraw_deferred(*this)) {
    if (staged_) transport_.staging_area_.release(transport_.self_, peer_member_, staged_);
    return;
  }
  Slot& own = slot();
  if (phase(own) == kDone) {
    if (!is_send_) release_staged();  // received but never read
    return;
  }
  {
    Member& box = member_at(transport_.shared_, mailbox());
    RobustLock lock(box.mutex, std::chrono::seconds(1));
    if (lock.owns()) {
      const int sender = is_send_ ? transport_.self_ : peer_member_;
      // (an eager send's entry is a message, no longer its slot's: it may carry a reused index)
      if (box.mailbox.withdraw(is_send_, [&](const Entry& entry) {
            return entry.slot == index_ && entry.staged == 0 && entry.sender == sender;
          })) {
        return;  // unmatched: nobody will touch the buffer
      }
    } else if (withdraw(own)) {
      // The lock's holder is stuck (stopped, or dead and not yet taken over): the entry stays as a
      // tombstone that matchers drop, so this slot is never reused.
      leaked_ = true;
      return;
    }
  }
  // Matched: the peer that claimed it is copying, and the buffer must outlive the copy; unless the
  // peer is gone (killed between its claim and its completion), or stuck (stopped) for longer than
  // any copy takes, when the slot is given up instead (the run is failing then).
  const pid_t copier = member_at(transport_.shared_, peer_member_).pid.load(std::memory_order_acquire);
  const Clock::time_point deadline = Clock::now() + kCopierPatience;
  while (phase(own) != kDone && Clock::now() < deadline && !process_gone(copier)) {
    sleep_until_done(own, SharedMemoryTransport::kWaitSlice);
  }
  if (phase(own) != kDone) leaked_ = true;  // its copier died mid-copy
}

}  // namespace pipesgd::shm_detail
