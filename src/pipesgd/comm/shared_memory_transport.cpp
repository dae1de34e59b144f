#include "pipesgd/comm/shared_memory_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/thread_priority.h"

namespace pipesgd {
namespace shm_detail {
namespace {

// An operation slot's state word (the futex its owner sleeps on): a phase, plus kSleeper while the
// owner sleeps on it. pending -> copying (claimed by the process that matched it, under the mailbox
// lock) -> done; or pending -> withdrawn (its owner gave it up without the mailbox lock).
constexpr std::uint32_t kPending = 0;
constexpr std::uint32_t kCopying = 1;
constexpr std::uint32_t kDone = 2;
constexpr std::uint32_t kWithdrawn = 3;
constexpr std::uint32_t kPhaseMask = 3;
constexpr std::uint32_t kSleeper = 4;

// A completed operation's outcome.
constexpr std::uint32_t kOk = 0;
constexpr std::uint32_t kTooLarge = 1;   // the message did not fit the receive buffer
constexpr std::uint32_t kCopyFailed = 2;  // the cross-memory copy failed (errno in copy_errno)

constexpr std::size_t kFailureMessageBytes = 512;
constexpr std::uint64_t kProbeMagic = 0x7069706573676421ULL;

// What every member publishes of itself: its process id and where its probe word lives.
std::uint64_t probe_word = kProbeMagic;

}  // namespace

struct alignas(64) Slot {
  std::atomic<std::uint32_t> state{kPending};
  std::uint32_t outcome = kOk;
  std::int32_t copy_errno = 0;
  std::uint64_t address = 0;      // the owner's buffer, in the owner's address space
  std::uint64_t bytes = 0;        // a send's payload size, a recv's capacity
  std::uint64_t transferred = 0;  // set by the completer
  std::uint64_t message_bytes = 0;  // kTooLarge: the message's size
  std::uint32_t staged = 0;       // a completed recv: k + 1 if its message is in staging slot k of (peer, owner)
};

// A mailbox entry: an unmatched operation of member `member`, slot `slot`, with tag `tag`. A send
// entry with `staged` = k + 1 is an eager message of `bytes` bytes in staging slot k of its pair (its
// operation slot is done with).
struct Entry {
  std::uint64_t tag;
  std::int32_t member;
  std::uint32_t slot;
  std::uint32_t staged;
  std::uint64_t bytes;
};

struct Member {
  std::atomic<std::int32_t> pid{0};
  std::uint64_t probe_address = 0;
  std::uint64_t probe_value = 0;
  pthread_mutex_t mutex;  // robust, process-shared: guards the counts and entries below
  std::uint32_t unmatched_sends = 0;  // sends addressed to this member, oldest first
  std::uint32_t unmatched_recvs = 0;  // recvs this member posted, oldest first
  Entry sends[SharedMemoryTransport::kMailboxEntries];
  Entry recvs[SharedMemoryTransport::kMailboxEntries];
  Slot slots[SharedMemoryTransport::kSlots];
};

struct Region {
  std::atomic<std::uint32_t> attached{0};  // start-up barrier, phase 0 (a futex)
  std::atomic<std::uint32_t> probed{0};    // phase 1
  std::atomic<std::uint32_t> probe_failures{0};
  std::atomic<std::uint32_t> failure_claimed{0};  // the first reporter writes the message
  std::atomic<std::uint32_t> failed{0};           // set after the message is written
  std::uint64_t staging_slot_bytes = 0;           // member 0's staging, checked by the others
  std::uint32_t staging_slots_per_pair = 0;
  char failure_message[kFailureMessageBytes];
  // Member structures follow at kMembersOffset.
};

namespace {

constexpr std::size_t kMembersOffset = (sizeof(Region) + 63) / 64 * 64;

Member& member_at(Region* region, int index) {
  auto* base = reinterpret_cast<std::byte*>(region) + kMembersOffset;
  return *reinterpret_cast<Member*>(base + static_cast<std::size_t>(index) * sizeof(Member));
}

std::uint32_t* futex_word(std::atomic<std::uint32_t>& word) { return reinterpret_cast<std::uint32_t*>(&word); }

// Sleeps while `word` holds `expected`, at most `limit`. Shared (not private) futex: the word is in
// memory mapped by several processes.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, Clock::duration limit) {
  if (limit <= Clock::duration::zero()) return;
  const auto nanoseconds = std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
  timespec relative{static_cast<time_t>(nanoseconds / 1000000000), static_cast<long>(nanoseconds % 1000000000)};
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>& word, int waiters) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE, waiters, nullptr, nullptr, 0);
}

void complete(Slot& slot, std::uint64_t transferred, std::uint32_t outcome, int copy_errno, std::uint64_t message_bytes) {
  slot.transferred = transferred;
  slot.outcome = outcome;
  slot.copy_errno = copy_errno;
  slot.message_bytes = message_bytes;
  const std::uint32_t previous = slot.state.exchange(kDone, std::memory_order_acq_rel);
  if (previous & kSleeper) futex_wake(slot.state, 1);
}

// Moves a pending slot to `copying` (the caller matched it under its mailbox's lock); false if its
// owner withdrew it.
bool claim(Slot& slot) {
  std::uint32_t state = slot.state.load(std::memory_order_acquire);
  while ((state & kPhaseMask) == kPending) {
    if (slot.state.compare_exchange_weak(state, (state & kSleeper) | kCopying, std::memory_order_acq_rel)) return true;
  }
  return false;
}

// Moves a pending slot to `withdrawn` (its owner gives it up); false if it was claimed or completed.
bool withdraw(Slot& slot) {
  std::uint32_t state = slot.state.load(std::memory_order_acquire);
  while ((state & kPhaseMask) == kPending) {
    if (slot.state.compare_exchange_weak(state, kWithdrawn, std::memory_order_acq_rel)) return true;
  }
  return false;
}

timespec monotonic_deadline(Clock::duration from_now) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const auto nanoseconds =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(from_now, Clock::duration::zero())).count();
  long long total = static_cast<long long>(now.tv_nsec) + nanoseconds % 1000000000;
  timespec deadline{now.tv_sec + static_cast<time_t>(nanoseconds / 1000000000 + total / 1000000000),
                    static_cast<long>(total % 1000000000)};
  return deadline;
}

// A mailbox lock held by this thread. A lock whose holder died is taken over (its mailbox may hold
// a half-made change, but a run with a dead member is failing anyway).
class MailboxLock {
 public:
  // Takes `mutex`, waiting at most `limit` (zero: a few quick tries). owns() says whether it did.
  MailboxLock(pthread_mutex_t& mutex, Clock::duration limit) : mutex_(mutex) {
    int code = pthread_mutex_trylock(&mutex_);
    for (int tries = 0; code == EBUSY && tries < 64; ++tries) {
      if (tries % 8 == 7) sched_yield();
      code = pthread_mutex_trylock(&mutex_);
    }
    if (code == EBUSY && limit > Clock::duration::zero()) {
      const timespec deadline = monotonic_deadline(limit);
      code = pthread_mutex_clocklock(&mutex_, CLOCK_MONOTONIC, &deadline);
    }
    if (code == EOWNERDEAD) {
      pthread_mutex_consistent(&mutex_);
      code = 0;
    }
    if (code == ENOTRECOVERABLE) throw CommError("shared-memory transport: a mailbox lock is unrecoverable");
    owns_ = code == 0;
  }
  ~MailboxLock() {
    if (owns_) pthread_mutex_unlock(&mutex_);
  }
  MailboxLock(const MailboxLock&) = delete;
  MailboxLock& operator=(const MailboxLock&) = delete;
  bool owns() const { return owns_; }
  void unlock() {
    if (owns_) pthread_mutex_unlock(&mutex_);
    owns_ = false;
  }

 private:
  pthread_mutex_t& mutex_;
  bool owns_ = false;
};

// How long a cancel waits for a live peer to finish copying into or out of the operation's buffer.
constexpr std::chrono::seconds kCopierPatience{2};

// True if process `pid` has exited (reaped, or a zombie).
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) return true;
  char line[256] = {};
  const bool read = std::fgets(line, sizeof line, file) != nullptr;
  std::fclose(file);
  const char* state = read ? std::strrchr(line, ')') : nullptr;  // "pid (comm) S ..."
  return state != nullptr && (state[2] == 'Z' || state[2] == 'X');
}

void remove_entry(Entry* entries, std::uint32_t& count, std::uint32_t index) {
  std::memmove(entries + index, entries + index + 1, (count - index - 1) * sizeof(Entry));
  --count;
}

}  // namespace

// A matched pair: the payload of `send_slot` of member `sender` (or, if `staged` = k + 1, the `bytes`
// in staging slot k of the pair) goes to `recv_slot` of `receiver`.
struct Match {
  int sender = -1;
  std::uint32_t send_slot = 0;
  int receiver = -1;
  std::uint32_t recv_slot = 0;
  std::uint32_t staged = 0;
  std::uint64_t bytes = 0;
};

// One send or recv of this process: a process-local handle on slot `index` of this member's slots.
class Operation final : public RequestState {
 public:
  Operation(SharedMemoryTransport& transport, std::uint32_t index) : transport_(transport), index_(index) {}

  void start(bool is_send, bool in_place, int peer, int peer_member, Tag tag, std::byte* data, std::size_t bytes,
             const char* operation) {
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

  std::size_t wait(Timeout timeout) override;
  std::span<const std::byte> wait_in_place(Timeout timeout, std::span<const std::byte> posted) override;
  bool lends() const override { return lent_; }
  bool test() override;
  void cancel() override;

  Slot& slot() { return member_at(transport_.shared_, transport_.self_).slots[index_]; }
  std::uint32_t index() const { return index_; }
  bool is_send() const { return is_send_; }
  Tag tag() const { return tag_; }
  int peer_member() const { return peer_member_; }
  // The member whose mailbox holds this operation while it is unmatched: the receiver's.
  int mailbox() const { return is_send_ ? peer_member_ : transport_.self_; }
  bool leaked() const { return leaked_; }
  std::size_t bytes() { return slot().bytes; }
  // A send whose payload is in staging slot k of (this member, peer): k + 1, else 0.
  std::uint32_t staged() const { return staged_; }
  void set_staged(std::uint32_t staged) { staged_ = staged; }
  std::atomic<bool> deferred{false};  // waiting in this process's deferred queue of mailbox()

  std::string describe_wait() const {
    return describe_message_wait(operation_, is_send_, peer_, tag_, transport_.world_rank_);
  }

 private:
  std::uint32_t phase() { return slot().state.load(std::memory_order_acquire) & kPhaseMask; }
  // Blocks until the slot is done (or throws: timeout, failure).
  void await_done(Timeout timeout);
  // After await_done: copies a staged message out and frees its staging slot; throws the outcome's error.
  std::size_t finish();
  // Frees the staging slot of a received staged message (once read).
  void release_staged();

  SharedMemoryTransport& transport_;
  const std::uint32_t index_;
  bool is_send_ = false;
  int peer_ = -1;
  int peer_member_ = -1;
  Tag tag_ = 0;
  const char* operation_ = "";
  bool in_place_ = false;  // a recv_in_place: a staged message may be read in place
  std::uint32_t staged_ = 0;
  bool lent_ = false;      // wait_in_place returned a staging slot's bytes: freed by cancel()
  bool finished_ = true;
  bool leaked_ = false;  // never reused: a copy into or out of it may still come
};

}  // namespace shm_detail

using shm_detail::Entry;
using shm_detail::Match;
using shm_detail::Member;
using shm_detail::Operation;
using shm_detail::Slot;
using shm_detail::member_at;

// The process-local side of deferred posting: an operation whose mailbox lock was busy when it was
// posted waits here, in posting order, until a thread of this process takes the lock (any wait does).
struct SharedMemoryTransport::Deferred {
  std::mutex mutex;
  std::deque<std::shared_ptr<Operation>> operations;
};

// ---------------------------------------------------------------------------------------------------
// SharedRegion

SharedRegion SharedRegion::create(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw CommError(concat("shm_open('", name, "') failed: ", std::strerror(errno)));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw CommError(concat("ftruncate of shared memory '", name, "' to ", bytes, " bytes failed: ", std::strerror(error)));
  }
  void* address = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (address == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw CommError(concat("mmap of shared memory '", name, "' failed: ", std::strerror(error)));
  }
  return SharedRegion(address, bytes);
}

SharedRegion SharedRegion::open(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw CommError(concat("shm_open('", name, "') failed: ", std::strerror(errno)));
  struct stat status {};
  if (fstat(fd, &status) != 0 || static_cast<std::size_t>(status.st_size) < bytes) {
    close(fd);
    throw CommError(concat("shared memory '", name, "' is smaller than ", bytes, " bytes"));
  }
  void* address = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (address == MAP_FAILED) throw CommError(concat("mmap of shared memory '", name, "' failed: ", std::strerror(error)));
  return SharedRegion(address, bytes);
}

void SharedRegion::unlink(const std::string& name) { shm_unlink(name.c_str()); }

SharedRegion SharedRegion::anonymous(std::size_t bytes) {
  void* address = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (address == MAP_FAILED) throw CommError(concat("anonymous shared mmap of ", bytes, " bytes failed: ", std::strerror(errno)));
  return SharedRegion(address, bytes);
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    if (address_) munmap(address_, size_);
    address_ = std::exchange(other.address_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SharedRegion::~SharedRegion() {
  if (address_) munmap(address_, size_);
}

// ---------------------------------------------------------------------------------------------------
// SharedMemoryTransport

namespace {

std::size_t round_up(std::size_t value, std::size_t to) { return (value + to - 1) / to * to; }

// The region's parts: members, then the staging busy flags (one per slot of every ordered pair),
// then the staging slots' bytes (page-aligned).
std::size_t staging_flags_offset(int members) {
  return round_up(shm_detail::kMembersOffset + static_cast<std::size_t>(members) * sizeof(Member), 64);
}
std::size_t staging_slot_count(int members, SharedMemoryStaging staging) {
  if (staging.slot_bytes == 0) return 0;
  return static_cast<std::size_t>(members) * static_cast<std::size_t>(members) *
         static_cast<std::size_t>(staging.slots_per_pair);
}
std::size_t staging_data_offset(int members, SharedMemoryStaging staging) {
  return round_up(staging_flags_offset(members) + staging_slot_count(members, staging) * sizeof(std::atomic<std::uint32_t>),
                  4096);
}

}  // namespace

SharedMemoryStaging SharedMemoryTransport::staging_for(int members, std::size_t available_bytes) {
  if (members < 2) return {};
  const std::size_t pairs = static_cast<std::size_t>(members) * static_cast<std::size_t>(members - 1);
  const std::size_t budget = std::min(kStagingBudget, available_bytes / 4);
  const std::size_t per_pair = budget / pairs / kStagingSlotBytes;
  if (per_pair == 0) return {};
  return SharedMemoryStaging{kStagingSlotBytes, static_cast<int>(std::min<std::size_t>(per_pair, kStagingSlotsPerPair))};
}

std::size_t SharedMemoryTransport::region_bytes(int members, SharedMemoryStaging staging) {
  return staging_data_offset(members, staging) + staging_slot_count(members, staging) * staging.slot_bytes;
}

std::size_t SharedMemoryTransport::staging_index(int sender, int receiver, std::uint32_t k) const {
  return (static_cast<std::size_t>(sender) * members_.size() + static_cast<std::size_t>(receiver)) *
             static_cast<std::size_t>(staging_.slots_per_pair) + k;
}

std::atomic<std::uint32_t>& SharedMemoryTransport::staging_busy(int sender, int receiver, std::uint32_t k) const {
  auto* flags = reinterpret_cast<std::atomic<std::uint32_t>*>(region_.bytes().data() + staging_offset_);
  return flags[staging_index(sender, receiver, k)];
}

std::byte* SharedMemoryTransport::staging_data(int sender, int receiver, std::uint32_t k) const {
  return region_.bytes().data() + staging_data_offset_ + staging_index(sender, receiver, k) * staging_.slot_bytes;
}

std::uint32_t SharedMemoryTransport::claim_staging(int receiver) const {
  for (std::uint32_t k = 0; k < static_cast<std::uint32_t>(staging_.slots_per_pair); ++k) {
    std::atomic<std::uint32_t>& busy = staging_busy(self_, receiver, k);
    std::uint32_t free = 0;
    if (busy.load(std::memory_order_relaxed) == 0 && busy.compare_exchange_strong(free, 1, std::memory_order_acquire)) {
      return k + 1;
    }
  }
  return 0;
}

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
  staging_offset_ = staging_flags_offset(count);
  staging_data_offset_ = staging_data_offset(count, staging_);
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
  pthread_mutexattr_t attributes;
  pthread_mutexattr_init(&attributes);
  pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&me.mutex, &attributes);
  pthread_mutexattr_destroy(&attributes);
  me.probe_address = reinterpret_cast<std::uint64_t>(&shm_detail::probe_word);
  me.probe_value = shm_detail::probe_word;
  me.pid.store(static_cast<std::int32_t>(getpid()), std::memory_order_release);
  for (std::uint32_t i = 0; i < kSlots; ++i) pool_.push_back(std::make_shared<Operation>(*this, i));
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
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    const std::uint32_t arrived = counter.load(std::memory_order_acquire);
    if (arrived >= count) return;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      throw CommTimeoutError(concat("shared-memory transport: rank ", world_rank_, " waited more than ",
                                    Seconds(timeout).count(), " s for the ", count, " processes of this host to ",
                                    phase == 0 ? "attach" : "check cross-memory attach", " (", arrived, " did)"));
    }
    shm_detail::futex_wait(counter, arrived, std::min<Clock::duration>(deadline - now, kWaitSlice));
  }
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

bool SharedMemoryTransport::failed() const { return shared_->failed.load(std::memory_order_acquire) != 0; }

std::string SharedMemoryTransport::failure_message() const {
  if (!failed()) return {};
  const char* text = shared_->failure_message;
  return std::string(text, strnlen(text, shm_detail::kFailureMessageBytes));
}

void SharedMemoryTransport::report_failure(const std::string& reason) {
  if (shared_->failure_claimed.exchange(1, std::memory_order_acq_rel) == 0) {
    const std::string message = concat("rank ", world_rank_, " failed: ", reason);
    const std::size_t n = std::min(message.size(), shm_detail::kFailureMessageBytes - 1);
    std::memcpy(shared_->failure_message, message.data(), n);
    shared_->failure_message[n] = '\0';
    shared_->failed.store(1, std::memory_order_release);
  }
  // Wake every sleeping wait of every member: each sees the flag and throws.
  for (std::size_t m = 0; m < members_.size(); ++m) {
    for (Slot& slot : member_at(shared_, static_cast<int>(m)).slots) {
      if (slot.state.load(std::memory_order_acquire) & shm_detail::kSleeper) shm_detail::futex_wake(slot.state, 1);
    }
  }
}

std::shared_ptr<void> SharedMemoryTransport::hold_mailbox_lock_for_tests() {
  pthread_mutex_t& mutex = member_at(shared_, self_).mutex;
  if (pthread_mutex_lock(&mutex) == EOWNERDEAD) pthread_mutex_consistent(&mutex);
  return std::shared_ptr<void>(&mutex, [](void* held) { pthread_mutex_unlock(static_cast<pthread_mutex_t*>(held)); });
}

int SharedMemoryTransport::busy_staging_slots_for_tests() const {
  int busy = 0;
  for (std::size_t sender = 0; sender < members_.size(); ++sender) {
    for (int k = 0; k < staging_.slots_per_pair; ++k) {
      busy += staging_busy(static_cast<int>(sender), self_, static_cast<std::uint32_t>(k)).load() != 0 ? 1 : 0;
    }
  }
  return busy;
}

std::shared_ptr<Operation> SharedMemoryTransport::acquire(const char* operation) {
  std::lock_guard lock(pool_mutex_);
  for (std::size_t n = 0; n < pool_.size(); ++n) {
    std::shared_ptr<Operation>& candidate = pool_[(cursor_ + n) % pool_.size()];
    if (candidate.use_count() == 1 && !candidate->leaked()) {
      // Pairs with the release of the last other reference: its writes happen-before ours.
      std::atomic_thread_fence(std::memory_order_acquire);
      cursor_ = (cursor_ + n + 1) % pool_.size();
      return candidate;
    }
  }
  throw CommError(concat(operation, ": rank ", world_rank_, " has more than ", kSlots,
                         " shared-memory messages in flight"));
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
    if (const std::uint32_t staged = claim_staging(peer_member)) {
      std::memcpy(staging_data(self_, peer_member, staged - 1), data, bytes);
      op->set_staged(staged);
    }
  }
  Deferred& deferred = deferred_[static_cast<std::size_t>(op->mailbox())];
  std::optional<Match> match;
  {
    std::unique_lock local(deferred.mutex);
    // Behind operations already deferred to this mailbox (FIFO per peer and tag), or when its lock
    // is busy (its holder may be descheduled): a later wait of this process posts it.
    shm_detail::MailboxLock lock(member_at(shared_, op->mailbox()).mutex, Clock::duration::zero());
    if (!deferred.operations.empty() || !lock.owns()) {
      op->deferred.store(true, std::memory_order_release);
      deferred.operations.push_back(op);
      deferred_count_.fetch_add(1, std::memory_order_acq_rel);
      return Request(std::move(op));
    }
    try {
      match = match_or_queue(*op);
    } catch (...) {
      if (op->staged()) staging_busy(self_, peer_member, op->staged() - 1).store(0, std::memory_order_release);
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
  Member& box = member_at(shared_, op.mailbox());
  if (op.is_send()) {
    for (std::uint32_t i = 0; i < box.unmatched_recvs;) {
      const Entry entry = box.recvs[i];
      if (entry.member != self_ || entry.tag != op.tag()) {
        ++i;
        continue;
      }
      shm_detail::remove_entry(box.recvs, box.unmatched_recvs, i);
      if (shm_detail::claim(box.slots[entry.slot])) {
        return Match{self_, op.index(), op.mailbox(), entry.slot, op.staged(), op.bytes()};
      }
      // else: a recv its owner withdrew; dropped, look further
    }
    if (box.unmatched_sends == kMailboxEntries) {
      throw CommError(concat(op.describe_wait(), ": more than ", kMailboxEntries,
                             " unmatched shared-memory messages addressed to that rank"));
    }
    box.sends[box.unmatched_sends++] = Entry{op.tag(), self_, op.index(), op.staged(), op.bytes()};
    return std::nullopt;
  }
  Member& sender = member_at(shared_, op.peer_member());
  for (std::uint32_t i = 0; i < box.unmatched_sends;) {
    const Entry entry = box.sends[i];
    if (entry.member != op.peer_member() || entry.tag != op.tag()) {
      ++i;
      continue;
    }
    shm_detail::remove_entry(box.sends, box.unmatched_sends, i);
    if (entry.staged) return Match{op.peer_member(), entry.slot, self_, op.index(), entry.staged, entry.bytes};
    if (shm_detail::claim(sender.slots[entry.slot])) return Match{op.peer_member(), entry.slot, self_, op.index()};
  }
  if (box.unmatched_recvs == kMailboxEntries) {
    throw CommError(concat(op.describe_wait(), ": more than ", kMailboxEntries, " unmatched shared-memory receives"));
  }
  box.recvs[box.unmatched_recvs++] = Entry{op.tag(), op.peer_member(), op.index(), 0, 0};
  return std::nullopt;
}

void SharedMemoryTransport::transfer(const Match& match) {
  Slot& recv = member_at(shared_, match.receiver).slots[match.recv_slot];
  if (match.staged) {  // the receiver copies it out (or reads it in place) and frees the staging slot
    if (match.bytes > recv.bytes) {
      staging_busy(match.sender, match.receiver, match.staged - 1).store(0, std::memory_order_release);
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
    shm_detail::MailboxLock lock(member_at(shared_, mailbox).mutex, lock_limit);
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

namespace shm_detail {

void Operation::release_staged() {
  Slot& own = slot();
  if (own.staged == 0) return;
  transport_.staging_busy(peer_member_, transport_.self_, own.staged - 1).store(0, std::memory_order_release);
  own.staged = 0;
}

std::size_t Operation::finish() {
  finished_ = true;
  Slot& own = slot();
  if (own.outcome == kOk) {
    if (own.staged) {  // an eager message: copy it out of its staging slot, which is free again
      std::memcpy(reinterpret_cast<std::byte*>(own.address),
                  transport_.staging_data(peer_member_, transport_.self_, own.staged - 1), own.transferred);
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
    return {transport_.staging_data(peer_member_, transport_.self_, own.staged - 1), own.transferred};
  }
  return posted.first(finish());
}

void Operation::await_done(Timeout timeout) {
  PIPESGD_ASSERT(!finished_ && !lent_);
  const Clock::time_point deadline = Clock::now() + timeout;
  Slot& own = slot();
  // A message about to land costs no sleep: a few polls first.
  for (int polls = 0; polls < 64 && !deferred.load(std::memory_order_acquire); ++polls) {
    if ((own.state.load(std::memory_order_acquire) & kPhaseMask) == kDone) return;
  }
  // A thread with nothing else to run (not a comm thread: e.g. D-Sync's compute thread inside its
  // allreduce) polls, yielding the processor, before it sleeps: a step's partner is often about to
  // answer, and a futex wake-up costs a trip through the scheduler (core/thread_priority.h).
  if (!is_communication_thread()) {
    const Clock::time_point spin_until = Clock::now() + SharedMemoryTransport::kPollBeforeSleep;
    while (Clock::now() < spin_until && !deferred.load(std::memory_order_acquire)) {
      if ((own.state.load(std::memory_order_acquire) & kPhaseMask) == kDone) return;
      sched_yield();
    }
  }
  for (;;) {
    const Clock::time_point now = Clock::now();
    const Clock::duration slice = std::min<Clock::duration>(SharedMemoryTransport::kWaitSlice, deadline - now);
    // Post what this process deferred first (this operation, or ones its peers wait for).
    if (deferred.load(std::memory_order_acquire)) {
      transport_.flush(mailbox(), slice);
    } else {
      transport_.flush_all(Clock::duration::zero());
    }
    std::uint32_t state = own.state.load(std::memory_order_acquire);
    if ((state & kPhaseMask) == kDone) return;
    if (transport_.failed()) throw PeerFailedError(concat(describe_wait(), " aborted: ", transport_.failure_message()));
    if (transport_.external_check_) transport_.external_check_(describe_wait());
    if (Clock::now() >= deadline) {
      throw CommTimeoutError(concat(describe_wait(), " timed out after ", Seconds(timeout).count(), " s"), peer_);
    }
    if (deferred.load(std::memory_order_acquire)) continue;  // its lock is still busy: try again
    if (!(state & kSleeper)) {
      if (!own.state.compare_exchange_strong(state, state | kSleeper, std::memory_order_acq_rel)) continue;
      state |= kSleeper;
    }
    futex_wait(own.state, state, slice);
  }
}

bool Operation::test() {
  if (finished_) return true;
  if (deferred.load(std::memory_order_acquire)) transport_.flush(mailbox(), Clock::duration::zero());
  return phase() == kDone;
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
  if (deferred.load(std::memory_order_acquire)) {
    SharedMemoryTransport::Deferred& queue = transport_.deferred_[static_cast<std::size_t>(mailbox())];
    std::lock_guard local(queue.mutex);
    auto it = std::find_if(queue.operations.begin(), queue.operations.end(),
                           [this](const std::shared_ptr<Operation>& op) { return op.get() == this; });
    if (it != queue.operations.end()) {
      queue.operations.erase(it);
      transport_.deferred_count_.fetch_sub(1, std::memory_order_acq_rel);
      deferred.store(false, std::memory_order_release);
      if (staged_) transport_.staging_busy(transport_.self_, peer_member_, staged_ - 1).store(0, std::memory_order_release);
      return;
    }
  }
  Slot& own = slot();
  if (phase() == kDone) {
    if (!is_send_) release_staged();  // received but never read
    return;
  }
  {
    Member& box = member_at(transport_.shared_, mailbox());
    MailboxLock lock(box.mutex, std::chrono::seconds(1));
    if (lock.owns()) {
      Entry* entries = is_send_ ? box.sends : box.recvs;
      std::uint32_t& count = is_send_ ? box.unmatched_sends : box.unmatched_recvs;
      for (std::uint32_t i = 0; i < count; ++i) {
        // (an eager send's entry is a message, no longer its slot's: it may carry a reused index)
        if (entries[i].slot == index_ && entries[i].staged == 0 &&
            entries[i].member == (is_send_ ? transport_.self_ : peer_member_)) {
          remove_entry(entries, count, i);
          return;  // unmatched: nobody will touch the buffer
        }
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
  while (phase() != kDone && Clock::now() < deadline && !process_gone(copier)) {
    std::uint32_t state = own.state.load(std::memory_order_acquire);
    if ((state & kPhaseMask) == kDone) break;  // completed since the loop's check: no wake-up will come
    if (!(state & kSleeper) && !own.state.compare_exchange_strong(state, state | kSleeper)) continue;
    futex_wait(own.state, state | kSleeper, SharedMemoryTransport::kWaitSlice);
  }
  if (phase() != kDone) leaked_ = true;  // its copier died mid-copy
}

}  // namespace shm_detail

}  // namespace pipesgd
