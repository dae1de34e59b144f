#include "pipesgd/comm/shared_memory_transport.h"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "pipesgd/comm/shm/mailbox.h"
#include "pipesgd/comm/shm/operation.h"
#include "pipesgd/comm/shm/region_layout.h"
#include "pipesgd/comm/shm/sync.h"
#include "pipesgd/comm/wait.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

using shm_detail::Entry;
using shm_detail::Match;
using shm_detail::Member;
using shm_detail::Operation;
using shm_detail::Slot;
using shm_detail::member_at;

namespace {

constexpr std::uint64_t kProbeMagic = 0x7069706573676421ULL;

// What every member publishes of itself: its process id and where its probe word lives.
std::uint64_t probe_word = kProbeMagic;

}  // namespace

// The process-local side of deferred posting: an operation whose mailbox lock was busy when it was
// posted waits here, in posting order, until a thread of this process takes the lock (any wait does).
struct SharedMemoryTransport::Deferred {
  std::mutex mutex;
  std::deque<std::shared_ptr<Operation>> operations;
};

std::size_t SharedMemoryTransport::region_bytes(int members, SharedMemoryStaging staging) {
  return shm_detail::StagingArea::end(shm_detail::staging_offset(members), members, staging);
}

// ---------------------------------------------------------------------------------------------------
// Start-up

SharedMemoryTransport::SharedMemoryTransport(SharedRegion region, std::vector<int> members, int world_rank,
                                             int world_size, SharedMemoryStaging staging, Timeout startup_timeout,
                                             std::function<void(const std::string&)> external_check)
    : region_(std::move(region)),
      members_(std::move(members)),
      member_of_rank_(static_cast<std::size_t>(std::max(world_size, 0)), -1),
      world_rank_(world_rank),
      world_size_(world_size),
      staging_(staging.slot_bytes > 0 && staging.slots_per_pair > 0 ? staging : SharedMemoryStaging{}),
      external_check_(std::move(external_check)) {
  const int count = static_cast<int>(members_.size());
  PIPESGD_ASSERT(count >= 1 && region_.mapped() && region_.bytes().size() >= region_bytes(count, staging_));
  staging_area_ = shm_detail::StagingArea(region_.bytes().data(), shm_detail::staging_offset(count), count, staging_);
  for (int i = 0; i < count; ++i) {
    const int rank = members_[static_cast<std::size_t>(i)];
    PIPESGD_ASSERT(rank >= 0 && rank < world_size && member_of_rank_[static_cast<std::size_t>(rank)] < 0);
    member_of_rank_[static_cast<std::size_t>(rank)] = i;
  }
  PIPESGD_ASSERT(world_rank >= 0 && world_rank < world_size && member_of_rank_[static_cast<std::size_t>(world_rank)] >= 0);
  self_ = member_of_rank_[static_cast<std::size_t>(world_rank)];
  shared_ = reinterpret_cast<shm_detail::Region*>(region_.bytes().data());
  deferred_ = std::make_unique<Deferred[]>(static_cast<std::size_t>(count));

  // Allow the other members to read and write this process's memory where a Yama policy would
  // otherwise restrict it to descendants (EINVAL without Yama: nothing to do).
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  Member& me = member_at(shared_, self_);
  shm_detail::init_robust_mutex(me.mutex);
  me.probe_address = reinterpret_cast<std::uint64_t>(&probe_word);
  me.probe_value = probe_word;
  me.pid.store(static_cast<std::int32_t>(getpid()), std::memory_order_release);
  if (self_ == 0) {
    shared_->staging_slot_bytes = staging_.slot_bytes;
    shared_->staging_slots_per_pair = static_cast<std::uint32_t>(staging_.slots_per_pair);
  }

  wait_for_members(0, startup_timeout);
  if (shared_->staging_slot_bytes != staging_.slot_bytes ||
      shared_->staging_slots_per_pair != static_cast<std::uint32_t>(staging_.slots_per_pair)) {
    throw CommError(concat("shared-memory transport: rank ", world_rank_, " was set up with staging slots of ",
                           staging_.slot_bytes, " bytes x ", staging_.slots_per_pair, ", rank ", members_[0], " with ",
                           shared_->staging_slot_bytes, " x ", shared_->staging_slots_per_pair));
  }
  // Cross-memory attach to every other member, and agreement on the result.
  for (int i = 0; i < count; ++i) {
    if (i == self_) continue;
    Member& peer = member_at(shared_, i);
    std::uint64_t value = 0;
    iovec local{&value, sizeof value};
    iovec remote{reinterpret_cast<void*>(peer.probe_address), sizeof value};
    const ssize_t read = process_vm_readv(peer.pid.load(std::memory_order_acquire), &local, 1, &remote, 1, 0);
    if (read != static_cast<ssize_t>(sizeof value) || value != peer.probe_value) {
      shared_->probe_failures.fetch_add(1, std::memory_order_acq_rel);
    }
  }
  wait_for_members(1, startup_timeout);
  usable_ = shared_->probe_failures.load(std::memory_order_acquire) == 0;
}

SharedMemoryTransport::~SharedMemoryTransport() = default;

void SharedMemoryTransport::wait_for_members(int phase, Timeout timeout) {
  std::atomic<std::uint32_t>& counter = phase == 0 ? shared_->attached : shared_->probed;
  const auto count = static_cast<std::uint32_t>(members_.size());
  if (counter.fetch_add(1, std::memory_order_acq_rel) + 1 >= count) {
    shm_detail::futex_wake(counter, INT32_MAX);
    return;
  }
  // The wait policy of comm/wait.h: sleep on the counter (a futex) until every member has arrived.
  struct Site {
    std::atomic<std::uint32_t>& counter;
    std::uint32_t count;
    std::uint32_t arrived = 0;
    bool ready() {
      arrived = counter.load(std::memory_order_acquire);
      return arrived >= count;
    }
    bool polling_pays() const { return false; }
    bool failed() const { return false; }
    void block(Clock::time_point now, Clock::time_point until) { shm_detail::futex_wait(counter, arrived, until - now); }
  } site{counter, count};
  if (wait_for(WaitPolicy{.block_slice = kWaitSlice}, timeout, site) == WaitOutcome::kDone) return;
  throw CommTimeoutError(concat("shared-memory transport: rank ", world_rank_, " waited more than ",
                                Seconds(timeout).count(), " s for the ", count, " processes of this host to ",
                                phase == 0 ? "attach" : "check cross-memory attach", " (", site.arrived, " did)"));
}

bool SharedMemoryTransport::reaches(int world_rank) const {
  return world_rank >= 0 && world_rank < world_size_ && member_of_rank_[static_cast<std::size_t>(world_rank)] >= 0;
}

int SharedMemoryTransport::member_index(int world_rank, const char* operation) const {
  if (!reaches(world_rank)) {
    throw UsageError(concat(operation, ": rank ", world_rank_, " addressed rank ", world_rank,
                            ", which is not a process of this host's shared-memory transport"));
  }
  return member_of_rank_[static_cast<std::size_t>(world_rank)];
}

std::string SharedMemoryTransport::describe() const {
  return concat("shared memory (", members_.size(), " processes of this host; futex waits, cross-memory attach",
                staging_.slot_bytes > 0 ? concat(", eager messages up to ", staging_.slot_bytes / 1024, " KiB") : "", ")");
}

// ---------------------------------------------------------------------------------------------------
// Failures

bool SharedMemoryTransport::failed() const { return shared_->failure.failed(); }

std::string SharedMemoryTransport::failure_message() const { return shared_->failure.message(); }

void SharedMemoryTransport::report_failure(const std::string& reason) {
  shared_->failure.report(world_rank_, reason);
  // Wake every sleeping wait of every member: each sees the flag and throws.
  for (std::size_t m = 0; m < members_.size(); ++m) {
    for (Slot& slot : member_at(shared_, static_cast<int>(m)).slots) {
      if (slot.state.load(std::memory_order_acquire) & shm_detail::kSleeper) shm_detail::futex_wake(slot.state, 1);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Posting and copying

std::shared_ptr<Operation> SharedMemoryTransport::acquire(const char* operation) {
  std::shared_ptr<Operation> op = pool_.acquire(
      [this](std::size_t index) { return std::make_shared<Operation>(*this, static_cast<std::uint32_t>(index)); },
      [](const Operation& candidate) { return !candidate.leaked(); });
  if (!op) {
    throw CommError(concat(operation, ": rank ", world_rank_, " has more than ", kSlots,
                           " shared-memory messages in flight"));
  }
  return op;
}

Request SharedMemoryTransport::send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) {
  bytes_sent_.fetch_add(bytes.size(), std::memory_order_relaxed);
  return post(peer, tag, const_cast<std::byte*>(bytes.data()), bytes.size(), true, false, operation);
}

Request SharedMemoryTransport::recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) {
  return post(peer, tag, buffer.data(), buffer.size(), false, false, operation);
}

Request SharedMemoryTransport::recv_in_place(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) {
  return post(peer, tag, buffer.data(), buffer.size(), false, true, operation);
}

Request SharedMemoryTransport::post(int peer, Tag tag, std::byte* data, std::size_t bytes, bool is_send,
                                    bool in_place, const char* operation) {
  PIPESGD_ASSERT(usable_);
  const int peer_member = member_index(peer, operation);
  std::shared_ptr<Operation> op = acquire(operation);
  op->start(is_send, in_place, peer, peer_member, tag, data, bytes, operation);
  if (is_send && bytes > 0 && bytes <= staging_.slot_bytes && peer_member != self_) {
    if (const std::uint32_t staged = staging_area_.claim(self_, peer_member)) {
      std::memcpy(staging_area_.data(self_, peer_member, staged - 1), data, bytes);
      op->set_staged(staged);
    }
  }
  Deferred& deferred = deferred_[static_cast<std::size_t>(op->mailbox())];
  std::optional<Match> match;
  {
    std::unique_lock local(deferred.mutex);
    // Behind operations already deferred to this mailbox (FIFO per peer and tag), or when its lock
    // is busy (its holder may be descheduled): a later wait of this process posts it.
    shm_detail::RobustLock lock(member_at(shared_, op->mailbox()).mutex, Clock::duration::zero());
    if (!deferred.operations.empty() || !lock.owns()) {
      op->deferred.store(true, std::memory_order_release);
      deferred.operations.push_back(op);
      deferred_count_.fetch_add(1, std::memory_order_acq_rel);
      return Request(std::move(op));
    }
    try {
      match = match_or_queue(*op);
    } catch (...) {
      if (op->staged()) staging_area_.release(self_, peer_member, op->staged());
      throw;
    }
  }
  if (match) transfer(*match);
  posted(*op);
  return Request(std::move(op));
}

void SharedMemoryTransport::posted(Operation& op) {
  if (op.staged()) shm_detail::complete(op.slot(), op.bytes(), shm_detail::kOk, 0, op.bytes());
}

std::optional<Match> SharedMemoryTransport::match_or_queue(Operation& op) {
  const Entry posted = op.is_send() ? Entry{op.tag(), self_, op.index(), op.staged(), op.bytes()}
                                    : Entry{op.tag(), op.peer_member(), op.index(), 0, 0};
  Match match;
  switch (shm_detail::post_to_mailbox(shared_, op.mailbox(), op.is_send(), posted, match)) {
    case shm_detail::Posted::kMatched:
      return match;
    case shm_detail::Posted::kQueued:
      return std::nullopt;
    case shm_detail::Posted::kFull:
      break;
  }
  if (op.is_send()) {
    throw CommError(concat(op.describe_wait(), ": more than ", kMailboxEntries,
                           " unmatched shared-memory messages addressed to that rank"));
  }
  throw CommError(concat(op.describe_wait(), ": more than ", kMailboxEntries, " unmatched shared-memory receives"));
}

void SharedMemoryTransport::transfer(const Match& match) {
  Slot& recv = member_at(shared_, match.receiver).slots[match.recv_slot];
  if (match.staged) {  // the receiver copies it out (or reads it in place) and frees the staging slot
    if (match.bytes > recv.bytes) {
      staging_area_.release(match.sender, match.receiver, match.staged);
      shm_detail::complete(recv, 0, shm_detail::kTooLarge, 0, match.bytes);
      return;
    }
    recv.staged = match.staged;
    shm_detail::complete(recv, match.bytes, shm_detail::kOk, 0, match.bytes);
    return;
  }
  Slot& send = member_at(shared_, match.sender).slots[match.send_slot];
  const std::uint64_t n = send.bytes;
  if (n > recv.bytes) {
    shm_detail::complete(send, 0, shm_detail::kTooLarge, 0, n);
    shm_detail::complete(recv, 0, shm_detail::kTooLarge, 0, n);
    return;
  }
  auto* target = reinterpret_cast<std::byte*>(recv.address);
  auto* source = reinterpret_cast<std::byte*>(send.address);
  if (n > 0 && match.sender == match.receiver) {
    std::memcpy(target, source, n);
  } else if (n > 0) {
    // Cross-memory attach: the other process's buffer is the remote side. It may move fewer bytes
    // than asked (a page boundary under memory pressure): go on from there.
    const bool reading = match.receiver == self_;
    const pid_t other = member_at(shared_, reading ? match.sender : match.receiver).pid.load(std::memory_order_acquire);
    std::uint64_t done = 0;
    while (done < n) {
      iovec local{(reading ? target : source) + done, n - done};
      iovec remote{(reading ? source : target) + done, n - done};
      const ssize_t moved = reading ? process_vm_readv(other, &local, 1, &remote, 1, 0)
                                    : process_vm_writev(other, &local, 1, &remote, 1, 0);
      if (moved > 0) {
        done += static_cast<std::uint64_t>(moved);
        continue;
      }
      const int error = moved < 0 ? errno : EFAULT;
      if (error == EINTR) continue;
      // The other process is gone: its operation never completes, and neither does ours, so our
      // wait ends in its timeout (or a failure notice), as a dead MPI peer's would.
      if (error == ESRCH) return;
      shm_detail::complete(send, 0, shm_detail::kCopyFailed, error, n);
      shm_detail::complete(recv, 0, shm_detail::kCopyFailed, error, n);
      return;
    }
  }
  shm_detail::complete(send, n, shm_detail::kOk, 0, n);
  shm_detail::complete(recv, n, shm_detail::kOk, 0, n);
}

bool SharedMemoryTransport::flush(int mailbox, Clock::duration lock_limit) {
  Deferred& deferred = deferred_[static_cast<std::size_t>(mailbox)];
  std::vector<Match> matches;
  std::vector<std::shared_ptr<Operation>> staged;  // staged sends, complete once posted
  {
    std::unique_lock local(deferred.mutex);
    if (deferred.operations.empty()) return true;
    shm_detail::RobustLock lock(member_at(shared_, mailbox).mutex, lock_limit);
    if (!lock.owns()) return false;
    while (!deferred.operations.empty()) {
      Operation& op = *deferred.operations.front();
      std::optional<Match> match = match_or_queue(op);  // may throw (a full mailbox): the rest stay deferred
      op.deferred.store(false, std::memory_order_release);
      deferred_count_.fetch_sub(1, std::memory_order_acq_rel);
      if (match) matches.push_back(*match);
      if (op.staged()) staged.push_back(deferred.operations.front());
      deferred.operations.pop_front();
    }
  }
  for (const Match& match : matches) transfer(match);
  for (const std::shared_ptr<Operation>& op : staged) posted(*op);
  return true;
}

void SharedMemoryTransport::flush_all(Clock::duration lock_limit) {
  if (deferred_count_.load(std::memory_order_acquire) == 0) return;
  for (std::size_t m = 0; m < members_.size(); ++m) flush(static_cast<int>(m), lock_limit);
}

bool SharedMemoryTransport::withdraw_deferred(Operation& op) {
  Deferred& queue = deferred_[static_cast<std::size_t>(op.mailbox())];
  std::lock_guard local(queue.mutex);
  auto it = std::find_if(queue.operations.begin(), queue.operations.end(),
                         [&op](const std::shared_ptr<Operation>& queued) { return queued.get() == &op; });
  if (it == queue.operations.end()) return false;
  queue.operations.erase(it);
  deferred_count_.fetch_sub(1, std::memory_order_acq_rel);
  op.deferred.store(false, std::memory_order_release);
  return true;
}

}  // namespace pipesgd
