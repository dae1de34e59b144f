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
// Waits: a few polls, then (on any thread but a communication thread) up to kPollBeforeSleep of
// polling that yields the processor, then sleep on the operation's futex in slices of kWaitSlice.
//
// Protocol (LocalTransport's rendezvous, across processes): the region holds, per member process, a
// table of operation slots and a mailbox of unmatched sends addressed to it and unmatched recvs it
// posted, guarded by a process-shared robust mutex. A send or recv that finds its match in the
// mailbox removes it and copies the payload itself, once, straight between the two processes'
// buffers (cross-memory attach: process_vm_readv / process_vm_writev; memcpy within a process),
// then completes both operations; otherwise it leaves itself in the mailbox for its peer to find. So
// the second of the two to arrive moves the bytes, and a message needs no thread of the other side
// to be scheduled. Matching is FIFO per (peer, tag), as the Transport interface requires.
// recv_in_place copies like recv (no lending across address spaces).
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

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/clock.h"

namespace pipesgd {

namespace shm_detail {
struct Region;
struct Match;
class Operation;
}  // namespace shm_detail

// A memory region shared by the processes of one host: a POSIX shared-memory object (shm_open,
// mmap'ed MAP_SHARED) or an anonymous shared mapping inherited across fork() (tests). Unmapped on
// destruction. Creating functions throw CommError naming the call that failed.
class SharedRegion {
 public:
  // Creates the object `name` ("/pipesgd-...", must not exist) of `bytes` zero bytes and maps it.
  static SharedRegion create(const std::string& name, std::size_t bytes);
  // Maps the existing object `name`, which must hold at least `bytes` bytes.
  static SharedRegion open(const std::string& name, std::size_t bytes);
  // Removes `name` (the mappings stay valid); errors are ignored.
  static void unlink(const std::string& name);
  // An anonymous MAP_SHARED mapping of `bytes` zero bytes: shared with children forked afterwards.
  static SharedRegion anonymous(std::size_t bytes);

  SharedRegion() = default;
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  std::span<std::byte> bytes() const { return {static_cast<std::byte*>(address_), size_}; }
  bool mapped() const { return address_ != nullptr; }

 private:
  SharedRegion(void* address, std::size_t size) : address_(address), size_(size) {}
  void* address_ = nullptr;
  std::size_t size_ = 0;
};

class SharedMemoryTransport final : public Transport {
 public:
  static constexpr std::size_t kSlots = 2048;
  static constexpr std::size_t kMailboxEntries = 2048;
  // How long a sleeping wait sleeps at most before it looks at the failure flags and its deadline.
  static constexpr std::chrono::milliseconds kWaitSlice{20};
  // How long a wait on a thread that is not a communication thread (core/thread_priority.h) polls,
  // yielding the processor, before it sleeps. Measured (D-Sync, 4 ranks on 2 cores, mlp, 3 rounds):
  // 13.4-15.0k samples/s without, 14.8-15.3k with 1 ms; 3 ms no better.
  static constexpr std::chrono::microseconds kPollBeforeSleep{1000};

  // Bytes of the region for `members` processes.
  static std::size_t region_bytes(int members);

  // `region`: region_bytes(members.size()) bytes, zero-filled before any member attaches, mapped in
  // every member. `members`: the world ranks of the member processes, in the same order on every
  // member; this process is members[i] == `world_rank` for exactly one i. `world_size`: size() (ranks
  // outside `members` cannot be addressed: UsageError). Every member constructs its transport at
  // about the same time: the constructor waits (at most `startup_timeout`, else CommTimeoutError)
  // until every member has attached, then until every member has tried cross-memory attach to every
  // other, so all agree on usable().
  SharedMemoryTransport(SharedRegion region, std::vector<int> members, int world_rank, int world_size,
                        Timeout startup_timeout, std::function<void(const std::string& waiter)> external_check = {});
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
  void report_failure(const std::string& reason) override;
  std::uint64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  std::string describe() const override;

  // True once a member reported a failure; failure_message() is "rank R failed: <reason>".
  bool failed() const;
  std::string failure_message() const;

  // Tests only: takes this process's own mailbox lock until the returned handle is destroyed (on
  // the same thread), so that the other members' posts to this process are deferred meanwhile.
  std::shared_ptr<void> hold_mailbox_lock_for_tests();

 private:
  friend class shm_detail::Operation;

  struct Deferred;

  int member_index(int world_rank, const char* operation) const;
  std::shared_ptr<shm_detail::Operation> acquire(const char* operation);
  Request post(int peer, Tag tag, std::byte* data, std::size_t bytes, bool is_send, const char* operation);
  // Under the lock of op's mailbox: removes op's match from it (claiming the match's slot) and
  // returns the pair, or adds op to it.
  std::optional<shm_detail::Match> match_or_queue(shm_detail::Operation& op);
  // Copies the payload of a matched pair and completes both operations (no lock held).
  void transfer(const shm_detail::Match& match);
  // Posts this process's deferred operations to `mailbox`, in order, if its lock can be taken within
  // `lock_limit`; false if it could not.
  bool flush(int mailbox, Clock::duration lock_limit);
  // flush() of every mailbox with deferred operations (nothing to do in the common case).
  void flush_all(Clock::duration lock_limit);
  void wait_for_members(int phase, Timeout timeout);

  SharedRegion region_;
  shm_detail::Region* shared_ = nullptr;
  std::vector<int> members_;
  std::vector<int> member_of_rank_;  // world rank -> member index, -1 if not a member
  int world_rank_ = 0;
  int world_size_ = 1;
  int self_ = 0;  // this process's member index
  bool usable_ = false;
  std::function<void(const std::string&)> external_check_;
  std::atomic<std::uint64_t> bytes_sent_{0};

  std::mutex pool_mutex_;                                   // guards pool_ and cursor_
  std::vector<std::shared_ptr<shm_detail::Operation>> pool_;  // pool_[i] owns slot i of this member
  std::size_t cursor_ = 0;
  std::unique_ptr<Deferred[]> deferred_;  // per mailbox (member index)
  std::atomic<int> deferred_count_{0};    // operations in all of deferred_
};

}  // namespace pipesgd
