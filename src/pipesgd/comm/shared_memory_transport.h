#pragma once
// SharedMemoryTransport: messages between the processes of one host (Linux), with waits that sleep
// in the kernel until the peer completes them. MpiTransport routes its same-host peers through it
// (mpi/mpi_transport.h); it needs no MPI itself, so tests run it in forked processes.
//
// Why: OpenMPI's shared-memory path progresses only while a rank polls it. A comm thread that polls
// takes the processor from the compute threads whenever the cores are shared (4 ranks on 2 cores:
// Pipe-SGD's comm threads spent a third of the machine polling), and one that sleeps between polls
// leaves each ring step waiting on a time slice. Here a wait sleeps on a futex and the peer that
// completes the operation wakes it, as a NIC's interrupt would.
//
// Waits (comm/wait.h's policy): a few polls, then (on any thread but a communication thread) up to
// kPollBeforeSleep of polling that yields the processor, then sleep on the operation's futex in slices
// of kWaitSlice.
//
// Protocol (LocalTransport's rendezvous, across processes): the region holds, per member process, a
// table of operation slots and a mailbox of unmatched sends addressed to it and unmatched recvs it
// posted, guarded by a process-shared robust mutex. A send or recv that finds its match in the
// mailbox removes it and copies the payload itself, once, straight between the two processes'
// buffers (cross-memory attach: process_vm_readv / process_vm_writev; memcpy within a process),
// then completes both operations; otherwise it leaves itself in the mailbox for its peer to find. So
// the second of the two to arrive moves the bytes, and a message needs no thread of the other side
// to be scheduled. Matching is FIFO per (peer, tag), as the Transport interface requires
// (comm/message_matching.h, with the queues in the region).
// Eager messages (SharedMemoryStaging): a send of at most `slot_bytes` first claims one of the
// staging slots its (sender, receiver) pair has in the region, copies its payload there (memcpy,
// several times faster than cross-memory attach) and completes as soon as it is posted; the receiver
// copies it out, or, for recv_in_place, reads it in place (the reduce-scatter's decode-add: one pass)
// and frees the slot when its Request goes. Larger sends, and sends that find every slot of their
// pair busy, take the rendezvous above. As with MPI's eager sends, the sender of an eager message
// does not learn that it did not fit the receive buffer; the receiver does.
//
// Failures: report_failure() sets the host's failure flag (with its message) and wakes every waiting
// operation of every member; their waits throw PeerFailedError "<wait> aborted: rank R failed: ...".
// A process that dies without a word is noticed by the timeouts, as under MPI: a copy from or into a
// process that is gone leaves its operation pending. `external_check`, if given, runs between the
// slices of a sleeping wait (every kWaitSlice) and may throw (MpiTransport: a failure notice from a
// rank on another host). A robust mutex left locked by a dead process is taken over.
//
// Limits: kSlots operations of one process in flight at once and kMailboxEntries unmatched messages
// per mailbox direction; beyond them send/recv throw CommError naming the limit.
//
// Thread-safety: as Transport (several threads of one process at once); one Request is waited on by
// one thread.
//
// The implementation, by concern (comm/shm/): sync.h (futexes, robust process-shared mutexes),
// shared_region.h (the mapping), region_layout.h (what the region holds), staging.h (the eager-message
// slots), mailbox.h (matching in the region), slot.h and operation.h (an operation's state machine,
// its shared and its process-local half); this file's .cpp ties them together: start-up, posting,
// copying, failures. Tests reach into it through tests/core/shared_memory_testing.h.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/comm/operation_pool.h"
#include "pipesgd/comm/shm/shared_region.h"
#include "pipesgd/comm/shm/staging.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/clock.h"

namespace pipesgd {

namespace shm_detail {
struct Region;
struct Match;
class Operation;
}  // namespace shm_detail

class SharedMemoryTransport final : public Transport {
 public:
  // The staging a host of `members` processes gets when `available_bytes` of shared memory are free
  // (statvfs of /dev/shm): kStagingSlotBytes slots, up to kStagingSlotsPerPair per pair, within a
  // quarter of what is free and at most kStagingBudget in all (pages are only used once touched: a
  // ring touches p of the p(p-1) pairs); none when not even one slot per pair fits.
  static constexpr std::size_t kStagingSlotBytes = 1 << 20;
  static constexpr int kStagingSlotsPerPair = 4;
  static constexpr std::size_t kStagingBudget = std::size_t{256} << 20;
  static SharedMemoryStaging staging_for(int members, std::size_t available_bytes);

  static constexpr std::size_t kSlots = 2048;
  static constexpr std::size_t kMailboxEntries = 2048;
  // How long a sleeping wait sleeps at most before it looks at the failure flags and its deadline.
  static constexpr std::chrono::milliseconds kWaitSlice{20};
  // How long a wait on a thread that is not a communication thread (core/thread_priority.h) polls,
  // yielding the processor, before it sleeps. Measured (D-Sync, 4 ranks on 2 cores, mlp, 3 rounds):
  // 13.4-15.0k samples/s without, 14.8-15.3k with 1 ms; 3 ms no better.
  static constexpr std::chrono::microseconds kPollBeforeSleep{1000};

  // Bytes of the region for `members` processes with `staging`.
  static std::size_t region_bytes(int members, SharedMemoryStaging staging = {});

  // `region`: region_bytes(members.size(), staging) bytes, zero-filled before any member attaches,
  // mapped in every member; every member passes the same `staging` (else CommError). `members`: the world ranks of the member processes, in the same order on every
  // member; this process is members[i] == `world_rank` for exactly one i. `world_size`: size() (ranks
  // outside `members` cannot be addressed: UsageError). Every member constructs its transport at
  // about the same time: the constructor waits (at most `startup_timeout`, else CommTimeoutError)
  // until every member has attached, then until every member has tried cross-memory attach to every
  // other, so all agree on usable().
  SharedMemoryTransport(SharedRegion region, std::vector<int> members, int world_rank, int world_size,
                        SharedMemoryStaging staging, Timeout startup_timeout,
                        std::function<void(const std::string& waiter)> external_check = {});
  ~SharedMemoryTransport() override;
  SharedMemoryTransport(const SharedMemoryTransport&) = delete;
  SharedMemoryTransport& operator=(const SharedMemoryTransport&) = delete;

  // False if some member could not read another's memory (cross-memory attach not permitted, e.g. a
  // container's seccomp policy): then the transport must not be used (send/recv assert).
  bool usable() const { return usable_; }
  // True if `world_rank` is a member (messages to it may go through this transport).
  bool reaches(int world_rank) const;
  const std::vector<int>& members() const { return members_; }

  int rank() const override { return world_rank_; }
  int size() const override { return world_size_; }
  Request send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) override;
  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override;
  Request recv_in_place(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override;
  void report_failure(const std::string& reason) override;
  std::uint64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  std::string describe() const override;

  // True once a member reported a failure; failure_message() is "rank R failed: <reason>".
  bool failed() const;
  std::string failure_message() const;

 private:
  friend class shm_detail::Operation;
  friend class SharedMemoryTransportTesting;  // tests/core/shared_memory_testing.h

  struct Deferred;

  int member_index(int world_rank, const char* operation) const;
  std::shared_ptr<shm_detail::Operation> acquire(const char* operation);
  Request post(int peer, Tag tag, std::byte* data, std::size_t bytes, bool is_send, bool in_place,
               const char* operation);
  // Called once `op` is posted (matched or queued, no lock held): a staged send completes then.
  void posted(shm_detail::Operation& op);
  // Under the lock of op's mailbox: removes op's match from it (claiming the match's slot) and
  // returns the pair, or adds op to it (shm/mailbox.h). Throws CommError if op's queue is full.
  std::optional<shm_detail::Match> match_or_queue(shm_detail::Operation& op);
  // Copies the payload of a matched pair and completes both operations (no lock held).
  void transfer(const shm_detail::Match& match);
  // Posts this process's deferred operations to `mailbox`, in order, if its lock can be taken within
  // `lock_limit`; false if it could not.
  bool flush(int mailbox, Clock::duration lock_limit);
  // flush() of every mailbox with deferred operations (nothing to do in the common case).
  void flush_all(Clock::duration lock_limit);
  // Removes `op` from its deferred queue (a cancel before it was posted); false if it was not there.
  bool withdraw_deferred(shm_detail::Operation& op);
  void wait_for_members(int phase, Timeout timeout);

  SharedRegion region_;
  shm_detail::Region* shared_ = nullptr;
  std::vector<int> members_;
  std::vector<int> member_of_rank_;  // world rank -> member index, -1 if not a member
  int world_rank_ = 0;
  int world_size_ = 1;
  int self_ = 0;  // this process's member index
  bool usable_ = false;
  SharedMemoryStaging staging_;
  shm_detail::StagingArea staging_area_;
  std::function<void(const std::string&)> external_check_;
  std::atomic<std::uint64_t> bytes_sent_{0};

  // Operation i owns slot i of this member (made on first use, at most kSlots).
  OperationPool<shm_detail::Operation> pool_{kSlots};
  std::unique_ptr<Deferred[]> deferred_;  // per mailbox (member index)
  std::atomic<int> deferred_count_{0};    // operations in all of deferred_
};

}  // namespace pipesgd
