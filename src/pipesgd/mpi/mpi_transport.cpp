#include "pipesgd/mpi/mpi_transport.h"

#include <mpi.h>
#include <sched.h>

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "pipesgd/comm/operation_pool.h"
#include "pipesgd/comm/shared_memory_transport.h"
#include "pipesgd/comm/wait.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/error_line.h"
#include "pipesgd/core/interrupt.h"

namespace pipesgd {
namespace {

constexpr std::size_t kFailureNoticeBytes = 512;
constexpr int kFailureTag = 1;
constexpr int kBusyPolls = 32;  // polls before a wait starts yielding the CPU
constexpr int kPollsPerFailureCheck = 64;
// How long the processes of a host wait for each other while they set up their shared memory.
constexpr Timeout kSharedMemoryStartup = std::chrono::seconds(120);
constexpr std::size_t kShmNameBytes = 64;
// LauncherWatch: how long a wait that began before SIGTERM / SIGINT may still block after it (mpirun
// sends SIGKILL 1 s after its SIGTERM, odls_base_sigkill_timeout), and how often it looks.
constexpr std::chrono::milliseconds kLauncherGrace(300);
constexpr std::chrono::milliseconds kLauncherWatchPeriod(20);
constexpr std::chrono::seconds kStuckReporting(3);

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace

// One outstanding MPI_Isend or MPI_Irecv. Pooled by the transport: after warm-up no message
// allocates.
class MpiRequest final : public RequestState {
 public:
  explicit MpiRequest(MpiTransport::Impl& owner) : owner_(owner) {}

  void start(int peer, Tag tag, bool is_send, std::size_t bytes, const char* operation) {
    peer_ = peer;
    tag_ = tag;
    is_send_ = is_send;
    bytes_ = bytes;
    operation_ = operation;
    done_ = false;
    request_ = MPI_REQUEST_NULL;
  }
  MPI_Request* handle() { return &request_; }

  std::size_t wait(Timeout timeout) override;
  bool test() override;
  void cancel() override;

  std::string describe_wait() const;

 private:
  // MPI_Test once; throws CommError if MPI reports an error.
  bool poll();

  MpiTransport::Impl& owner_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  int peer_ = -1;
  Tag tag_ = 0;
  bool is_send_ = false;
  bool done_ = false;
  std::size_t bytes_ = 0;
  const char* operation_ = "";
};

// A rank's last words when its launcher ends the job. mpirun ends the whole job when a rank or a
// host is lost: SIGTERM to every rank, SIGKILL a second later. A survivor is then usually blocked in
// a wait on the lost peer, or inside OpenMPI itself (its TCP transport, reporting a peer's hang-up,
// blocks in MPI_Test until the job is gone), or reporting its own failure to peers that are gone,
// and would die unheard. This thread looks every kLauncherWatchPeriod; kLauncherGrace after the
// first SIGTERM / SIGINT it writes this rank's one error line (core/error_line.h: unless the main
// thread wrote it already) and ends the process, exit status 1, if
//   - this rank is still telling its peers of its failure (the reason, as the CLI would print it),
//   - a wait of this rank failed (timed out, or aborted by a peer's failure: that error), or
//   - a wait that began before the signal is still blocked (that wait: operation, peer, tag).
// A run stopping cleanly at an iteration boundary after a signal has neither: the watch stays silent.
// Without any signal it ends the process the same way when telling the peers has taken
// kStuckReporting (normally at most 200 ms; longer only when OpenMPI wedges on a lost peer, which
// would leave the rank waiting forever, e.g. on the far side of a partition).
class LauncherWatch {
 public:
  // `own_failure`: this rank's failure reason while it is telling its peers (report_failure), else ""
  // (called from the watch's thread).
  LauncherWatch(int rank, std::function<std::string()> own_failure)
      : rank_(rank), own_failure_(std::move(own_failure)), thread_([this] { watch(); }) {}
  ~LauncherWatch() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  LauncherWatch(const LauncherWatch&) = delete;
  LauncherWatch& operator=(const LauncherWatch&) = delete;

 private:
  void watch() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, kLauncherWatchPeriod, [this] { return stop_; })) {
      const std::string reporting = own_failure_();
      if (!reporting.empty()) {
        if (reporting_since_ == 0) reporting_since_ = WaitNote::now_ns();
        if (WaitNote::now_ns() - reporting_since_ >= std::chrono::nanoseconds(kStuckReporting).count()) end_with(reporting);
      } else {
        reporting_since_ = 0;
      }
      const auto since = time_since_interrupt();
      if (!since || *since < kLauncherGrace) continue;
      if (!reporting.empty()) end_with(reporting);
      if (const std::string error = first_wait_error(); !error.empty()) end_with(error);
      const std::int64_t signal_ns = WaitNote::now_ns() - since->count();
      for (const WaitNote& wait : current_waits()) {
        if (wait.since_ns > signal_ns) continue;
        const std::string what = wait.peer >= 0 ? describe_message_wait(wait.operation, wait.is_send, wait.peer, wait.tag, wait.rank)
                                                : concat(wait.operation, ": barrier on rank ", wait.rank);
        end_with(concat(what, " aborted: the launcher is ending the job (", signal_name(interrupt_signal().load()),
                        " while this wait was blocked)"));
      }
    }
  }

  [[noreturn]] void end_with(const std::string& reason) {
    write_error_line(concat("rank ", rank_, ": ", reason));
    ::_exit(1);
  }

  const int rank_;
  const std::function<std::string()> own_failure_;
  std::int64_t reporting_since_ = 0;  // steady ns when the watch first saw report_failure in progress
  std::mutex mutex_;  // guards stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

class MpiTransport::Impl {
 public:
  Impl(MpiRuntime& runtime, MpiTransportOptions options)
      : options_(options),
        wait_policy_{.spin_polls = kBusyPolls,
                     .yield_for = options.spin_window,
                     .polls_per_check = kPollsPerFailureCheck,
                     .block_slice = options.poll_sleep,
                     .blocks_per_check = kPollsPerFailureCheck} {
    rank_ = runtime.rank();
    size_ = runtime.size();
    void* attribute = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attribute, &found);
    const long tag_upper_bound = found ? *static_cast<int*>(attribute) : 32767;
    if (tag_upper_bound < static_cast<long>((kMpiSequenceWindow << 24) - 1)) {
      throw CommError(concat("MPI_TAG_UB of this MPI library is ", tag_upper_bound,
                             "; pipesgd needs at least ", (kMpiSequenceWindow << 24) - 1));
    }
    for (auto& communicator : channels_) {
      MPI_Comm_dup(MPI_COMM_WORLD, &communicator);
      MPI_Comm_set_errhandler(communicator, MPI_ERRORS_RETURN);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &failure_communicator_);
    MPI_Comm_set_errhandler(failure_communicator_, MPI_ERRORS_RETURN);
    MPI_Comm_dup(MPI_COMM_WORLD, &barrier_communicator_);
    MPI_Comm_set_errhandler(barrier_communicator_, MPI_ERRORS_RETURN);
    post_failure_receive();
    const std::string same_host = set_up_shared_memory();
    launcher_watch_ = std::make_unique<LauncherWatch>(rank_, [this] {
      std::lock_guard lock(own_failure_mutex_);
      return reporting_ > 0 ? own_failure_ : std::string();
    });
    const std::string routes = describe_routes(host_names());
    description_ = concat("mpi (", size_, " ranks, MPI_THREAD_MULTIPLE, ", runtime.library_version(), "; ",
                          same_host, routes.empty() ? "" : "; ", routes, ")");
  }

  // Collective: every rank's host name (MPI_Get_processor_name; "simulated host H" with
  // simulated_hosts), indexed by rank.
  std::vector<std::string> host_names() const {
    std::array<char, MPI_MAX_PROCESSOR_NAME + 1> mine{};
    if (options_.simulated_hosts > 0) {
      std::snprintf(mine.data(), mine.size(), "simulated host %d", rank_ % options_.simulated_hosts);
    } else {
      int length = 0;
      MPI_Get_processor_name(mine.data(), &length);
    }
    std::vector<char> all(mine.size() * static_cast<std::size_t>(size_));
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), static_cast<int>(mine.size()),
                  MPI_CHAR, MPI_COMM_WORLD);
    std::vector<std::string> names;
    for (int rank = 0; rank < size_; ++rank) names.emplace_back(all.data() + mine.size() * static_cast<std::size_t>(rank));
    return names;
  }

  // Where the ranks are on more than one host: this rank's route to each peer, runs of consecutive
  // peers on one host by one route grouped, e.g. "2 hosts; rank 0 on h1 reaches rank 1 on h1 through
  // shared memory, ranks 2-3 on h2 through MPI over TCP". Empty when every rank is on this host.
  std::string describe_routes(const std::vector<std::string>& hosts) const {
    std::vector<std::string> distinct = hosts;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    if (distinct.size() <= 1) return {};
    const std::string between_hosts = inter_host_route();
    auto route_to = [&](int peer) {
      if (lanes_ && lanes_->reaches(peer)) return std::string("through shared memory");
      return hosts[static_cast<std::size_t>(peer)] == hosts[static_cast<std::size_t>(rank_)] ? std::string("through MPI")
                                                                                              : between_hosts;
    };
    std::string text = concat(distinct.size(), " hosts; rank ", rank_, " on ", hosts[static_cast<std::size_t>(rank_)],
                              " reaches ");
    bool first = true;
    for (int peer = 0; peer < size_;) {
      if (peer == rank_) {
        ++peer;
        continue;
      }
      int last = peer;
      while (last + 1 < size_ && last + 1 != rank_ && hosts[static_cast<std::size_t>(last + 1)] == hosts[static_cast<std::size_t>(peer)] &&
             route_to(last + 1) == route_to(peer)) {
        ++last;
      }
      text += concat(first ? "" : ", ", last == peer ? concat("rank ", peer) : concat("ranks ", peer, "-", last), " on ",
                     hosts[static_cast<std::size_t>(peer)], " ", route_to(peer));
      first = false;
      peer = last + 1;
    }
    return text;
  }

  // How MPI reaches other hosts, as far as OpenMPI's btl setting tells: "through MPI over TCP" when
  // TCP is the only network transport it may use.
  static std::string inter_host_route() {
    const char* setting = std::getenv("OMPI_MCA_btl");
    if (setting == nullptr || *setting == '\0' || *setting == '^') return "through MPI";
    std::vector<std::string> network;
    std::string list = setting;
    for (std::size_t start = 0; start <= list.size();) {
      const std::size_t end = std::min(list.find(',', start), list.size());
      const std::string name = list.substr(start, end - start);
      if (!name.empty() && name != "self" && name != "vader" && name != "sm" && name != "smcuda") network.push_back(name);
      start = end + 1;
    }
    if (network.size() == 1 && network[0] == "tcp") return "through MPI over TCP";
    return concat("through MPI (btl ", setting, ")");
  }

  // Collective: every rank of the world calls it at construction. Builds lanes_ for the ranks of this
  // host, or leaves it empty; returns what describe() says of it.
  std::string set_up_shared_memory() {
    int wanted = shared_memory_from_environment(options_.shared_memory) ? 1 : 0;
    int everyone = 0;
    MPI_Allreduce(&wanted, &everyone, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Comm host = MPI_COMM_NULL;
    if (options_.simulated_hosts > 0) {
      MPI_Comm_split(MPI_COMM_WORLD, rank_ % options_.simulated_hosts, rank_, &host);
    } else {
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
    }
    int host_rank = 0, host_size = 1;
    MPI_Comm_rank(host, &host_rank);
    MPI_Comm_size(host, &host_size);
    std::vector<int> members(static_cast<std::size_t>(host_size));
    MPI_Allgather(&rank_, 1, MPI_INT, members.data(), 1, MPI_INT, host);
    std::string note;
    if (!everyone) {
      note = "same-host peers through MPI (PIPESGD_MPI_SHARED_MEMORY=0 or shared_memory off)";
    } else if (host_size == 1) {
      note = "no other rank on this host";
    } else {
      note = attach_shared_memory(host, host_rank, std::move(members));
    }
    MPI_Comm_free(&host);
    return note;
  }

  // Collective over `host`: local rank 0 creates the shared-memory object and names it to the others;
  // every process maps it, then it is unlinked (nothing is left in /dev/shm, whatever happens later).
  std::string attach_shared_memory(MPI_Comm host, int host_rank, std::vector<int> members) {
    // Local rank 0 sizes the eager-message staging by what /dev/shm has free, and tells the others.
    std::array<std::uint64_t, 2> staging_fields{};
    if (host_rank == 0) {
      struct statvfs space {};
      const std::size_t available =
          statvfs("/dev/shm", &space) == 0 ? static_cast<std::size_t>(space.f_bavail) * space.f_frsize : 0;
      const SharedMemoryStaging chosen = SharedMemoryTransport::staging_for(static_cast<int>(members.size()), available);
      staging_fields = {chosen.slot_bytes, static_cast<std::uint64_t>(chosen.slots_per_pair)};
    }
    MPI_Bcast(staging_fields.data(), 2, MPI_UINT64_T, 0, host);
    const SharedMemoryStaging staging{static_cast<std::size_t>(staging_fields[0]), static_cast<int>(staging_fields[1])};
    const std::size_t bytes = SharedMemoryTransport::region_bytes(static_cast<int>(members.size()), staging);
    std::array<char, kShmNameBytes> name{};
    SharedRegion region;
    std::string failure;
    if (host_rank == 0) {
      std::random_device entropy;
      for (int attempt = 0; attempt < 3 && !region.mapped(); ++attempt) {
        const std::string candidate = concat("/pipesgd-", getpid(), "-", entropy() % 1000000000u);
        try {
          region = SharedRegion::create(candidate, bytes);
          std::strncpy(name.data(), candidate.c_str(), name.size() - 1);
        } catch (const CommError& error) {
          failure = error.what();
        }
      }
    }
    MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, host);
    if (host_rank != 0 && name[0] != '\0') {
      try {
        region = SharedRegion::open(name.data(), bytes);
      } catch (const CommError& error) {
        failure = error.what();
      }
    }
    int mapped = region.mapped() ? 1 : 0, all_mapped = 0;
    MPI_Allreduce(&mapped, &all_mapped, 1, MPI_INT, MPI_MIN, host);
    if (host_rank == 0 && name[0] != '\0') SharedRegion::unlink(name.data());
    if (!all_mapped) {
      return concat("same-host peers through MPI: shared memory unavailable",
                    failure.empty() ? std::string() : concat(" (", failure, ")"));
    }
    auto lanes = std::make_unique<SharedMemoryTransport>(
        std::move(region), members, rank_, size_, staging, kSharedMemoryStartup,
        [this](const std::string& waiter) {
          if (failure_noticed()) throw_peer_failed(waiter);
        });
    if (!lanes->usable()) return "same-host peers through MPI: cross-memory attach not permitted";
    lanes_ = std::move(lanes);
    return concat("the ", members.size(), " ranks of this host through shared memory");
  }

  ~Impl() {
    // After a failure, peers may be gone: leave MPI state alone (the process exits without
    // MPI_Finalize). Otherwise withdraw the posted failure receive and free the communicators.
    if (failures_.failed()) return;
    {
      std::lock_guard lock(failure_mutex_);
      if (failure_request_ != MPI_REQUEST_NULL) {
        MPI_Cancel(&failure_request_);
        MPI_Wait(&failure_request_, MPI_STATUS_IGNORE);
      }
    }
    for (auto& communicator : channels_) MPI_Comm_free(&communicator);
    MPI_Comm_free(&failure_communicator_);
    MPI_Comm_free(&barrier_communicator_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  Request start(int peer, Tag tag, const std::byte* bytes, std::size_t length, bool is_send,
                const char* operation) {
    if (peer < 0 || peer >= size_) {
      throw UsageError(concat(operation, ": peer rank ", peer, " out of range [0, ", size_, ")"));
    }
    const auto channel = static_cast<std::size_t>(tag >> 56);
    PIPESGD_ASSERT(channel < channels_.size());
    if (lanes_ && lanes_->reaches(peer)) {
      return is_send ? lanes_->send(peer, tag, std::span<const std::byte>(bytes, length), operation)
                     : lanes_->recv(peer, tag, std::span<std::byte>(const_cast<std::byte*>(bytes), length), operation);
    }
    if (length > static_cast<std::size_t>(INT_MAX)) {
      throw UsageError(concat(operation, ": message of ", length, " bytes exceeds MPI's 2 GiB limit"));
    }
    const std::uint64_t sequence = (tag >> 24) & 0xffffffffu;
    const int mpi_tag =
        static_cast<int>(((sequence % kMpiSequenceWindow) << 24) | (tag & 0xffffffu));
    std::shared_ptr<MpiRequest> request = acquire();
    request->start(peer, tag, is_send, length, operation);
    int code;
    if (is_send) {
      code = MPI_Isend(bytes, static_cast<int>(length), MPI_BYTE, peer, mpi_tag, channels_[channel],
                       request->handle());
      bytes_sent_.fetch_add(length, std::memory_order_relaxed);
    } else {
      code = MPI_Irecv(const_cast<std::byte*>(bytes), static_cast<int>(length), MPI_BYTE, peer,
                       mpi_tag, channels_[channel], request->handle());
    }
    if (code != MPI_SUCCESS) {
      throw CommError(concat(request->describe_wait(), ": ", is_send ? "MPI_Isend" : "MPI_Irecv",
                             " (MPI tag ", mpi_tag, ") failed: ", mpi_error_text(code)));
    }
    return Request(std::move(request));
  }

  // The wait of a request or a barrier (comm/wait.h's policy): calls `poll` until it returns true.
  // The first kBusyPolls polls spin (what is about to complete leaves without a syscall), then each
  // poll yields the CPU until options().spin_window has passed, then sleeps options().poll_sleep
  // between polls (MPI cannot block with a timeout). Every 64 polls, and at the deadline, a failure
  // notice throws PeerFailedError "<describe()> aborted: ..."; at the deadline otherwise
  // CommTimeoutError "<describe()> timed out after S s" naming `peer` (-1: not one peer's). `poll`
  // may throw (CommError).
  template <typename Poll, typename Describe>
  void poll_until(Timeout timeout, int peer, Poll&& poll, Describe&& describe) {
    struct Site {
      Impl& impl;
      Poll& poll;
      bool ready() { return poll(); }
      bool polling_pays() const { return true; }
      bool failed() { return impl.failure_noticed(); }
      std::string failure_message() const { return impl.failures_.message(); }
      void block(Clock::time_point, Clock::time_point) { std::this_thread::sleep_for(impl.options_.poll_sleep); }
    } site{*this, poll};
    wait_or_throw(wait_policy_, timeout, peer, site, describe);
  }

  void barrier(Timeout timeout, const char* operation) {
    auto describe_barrier = [&] { return concat(operation, ": barrier on rank ", rank_); };
    MPI_Request request = MPI_REQUEST_NULL;
    const int code = MPI_Ibarrier(barrier_communicator_, &request);
    if (code != MPI_SUCCESS) {
      throw CommError(concat(describe_barrier(), ": MPI_Ibarrier failed: ", mpi_error_text(code)));
    }
    const WaitNoteScope note({operation, false, -1, 0, rank_, WaitNote::now_ns()});
    poll_until(timeout, /*peer=*/-1, [&] {
      int complete = 0;
      const int test_code = MPI_Test(&request, &complete, MPI_STATUS_IGNORE);
      if (test_code != MPI_SUCCESS) {
        throw CommError(concat(describe_barrier(), ": MPI_Test failed: ", mpi_error_text(test_code)));
      }
      return complete != 0;
    }, describe_barrier);
  }

  void report_failure(const std::string& reason) {
    {
      std::lock_guard lock(own_failure_mutex_);
      if (own_failure_.empty()) own_failure_ = reason;
      ++reporting_;
    }
    struct Reported {
      Impl& impl;
      ~Reported() {
        std::lock_guard lock(impl.own_failure_mutex_);
        --impl.reporting_;
      }
    } reported{*this};
    if (lanes_) lanes_->report_failure(reason);  // wakes this host's waits at once
    if (!failures_.report(rank_, reason)) return;  // we failed already, or learnt of a peer's failure first
    std::array<char, kFailureNoticeBytes> notice{};
    std::strncpy(notice.data(), reason.c_str(), notice.size() - 1);
    std::vector<MPI_Request> sends;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request request;
      if (MPI_Isend(notice.data(), static_cast<int>(notice.size()), MPI_CHAR, peer, kFailureTag,
                    failure_communicator_, &request) == MPI_SUCCESS) {
        sends.push_back(request);
      }
    }
    // Small messages leave eagerly; give them a moment, then abandon what a dead peer never takes.
    const auto deadline = Clock::now() + std::chrono::milliseconds(200);
    for (MPI_Request& request : sends) {
      int done = 0;
      while (!done && Clock::now() < deadline) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (!done) MPI_Request_free(&request);
    }
  }

  std::uint64_t bytes_sent() const {
    return bytes_sent_.load(std::memory_order_relaxed) + (lanes_ ? lanes_->bytes_sent() : 0);
  }
  const std::string& describe() const { return description_; }
  // True when no wait polls MPI: every rank is reached through shared memory.
  bool waits_sleep() const { return lanes_ && static_cast<int>(lanes_->members().size()) == size_; }
  std::vector<int> shared_memory_peers() const { return lanes_ ? lanes_->members() : std::vector<int>{}; }
  const MpiTransportOptions& options() const { return options_; }

 private:
  // True once a failure notice has arrived (from any thread's poll) or this rank reported one.
  bool failure_noticed() {
    if (failures_.failed()) return true;
    std::unique_lock lock(failure_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || failure_request_ == MPI_REQUEST_NULL) return false;
    int arrived = 0;
    MPI_Status status;
    MPI_Test(&failure_request_, &arrived, &status);
    if (!arrived) return false;
    notice_[kFailureNoticeBytes - 1] = '\0';
    failures_.report(status.MPI_SOURCE, notice_.data());
    return true;
  }

  [[noreturn]] void throw_peer_failed(const std::string& waiter) { throw_wait_aborted(waiter, failures_.message()); }

  void post_failure_receive() {
    MPI_Irecv(notice_.data(), static_cast<int>(notice_.size()), MPI_CHAR, MPI_ANY_SOURCE, kFailureTag,
              failure_communicator_, &failure_request_);
  }

  // Reuses a finished request object or makes a new one (comm/operation_pool.h).
  std::shared_ptr<MpiRequest> acquire() {
    return pool_.acquire([this](std::size_t) { return std::make_shared<MpiRequest>(*this); });
  }

  MpiTransportOptions options_;
  WaitPolicy wait_policy_;
  int rank_ = 0;
  int size_ = 1;
  std::array<MPI_Comm, kChannelCount> channels_{};
  MPI_Comm failure_communicator_ = MPI_COMM_NULL;
  MPI_Comm barrier_communicator_ = MPI_COMM_NULL;  // barrier() only
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::string description_;

  OperationPool<MpiRequest> pool_;
  std::unique_ptr<SharedMemoryTransport> lanes_;  // this host's ranks, if set up
  std::mutex own_failure_mutex_;  // guards own_failure_
  std::string own_failure_;      // the reason of this rank's first report_failure, or ""
  int reporting_ = 0;            // report_failure calls in progress (telling the peers)
  std::unique_ptr<LauncherWatch> launcher_watch_;  // last: destroyed first (its thread reads the above)

  FailureState failures_;     // this rank's own failure, or the first notice of a peer's
  std::mutex failure_mutex_;  // guards failure_request_ and notice_
  MPI_Request failure_request_ = MPI_REQUEST_NULL;
  std::array<char, kFailureNoticeBytes> notice_{};
};

std::string MpiRequest::describe_wait() const {
  return describe_message_wait(operation_, is_send_, peer_, tag_, owner_.rank());
}

bool MpiRequest::poll() {
  if (done_) return true;
  int complete = 0;
  MPI_Status status;
  const int code = MPI_Test(&request_, &complete, &status);
  if (code != MPI_SUCCESS) {
    throw CommError(concat(describe_wait(), ": MPI_Test failed: ", mpi_error_text(code)));
  }
  if (!complete) return false;
  if (!is_send_) {
    // (status.MPI_ERROR is only defined for multiple-completion calls; MPI_Test's code says it all.)
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    bytes_ = static_cast<std::size_t>(received);
  }
  done_ = true;
  return true;
}

std::size_t MpiRequest::wait(Timeout timeout) {
  if (!poll()) {
    const WaitNoteScope note({operation_, is_send_, peer_, tag_, owner_.rank(), WaitNote::now_ns()});
    owner_.poll_until(timeout, peer_, [this] { return poll(); }, [this] { return describe_wait(); });
  }
  return bytes_;
}

bool MpiRequest::test() { return poll(); }

void MpiRequest::cancel() {
  if (done_ || request_ == MPI_REQUEST_NULL) return;
  MPI_Cancel(&request_);
  // A cancelled receive completes at once; a send that is already being transferred cannot be
  // cancelled and completes when the peer takes it. Give it a moment, then abandon it.
  const auto deadline = Clock::now() + std::chrono::milliseconds(100);
  int complete = 0;
  while (!complete && Clock::now() < deadline) {
    MPI_Test(&request_, &complete, MPI_STATUS_IGNORE);
    if (!complete) sched_yield();
  }
  if (!complete) MPI_Request_free(&request_);
  done_ = true;
}

MpiTransport::MpiTransport(MpiRuntime& runtime, MpiTransportOptions options)
    : impl_(std::make_unique<Impl>(runtime, options)) {}
MpiTransport::~MpiTransport() = default;
int MpiTransport::rank() const { return impl_->rank(); }
int MpiTransport::size() const { return impl_->size(); }
Request MpiTransport::send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) {
  return impl_->start(peer, tag, bytes.data(), bytes.size(), true, operation);
}
Request MpiTransport::recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) {
  return impl_->start(peer, tag, buffer.data(), buffer.size(), false, operation);
}
void MpiTransport::report_failure(const std::string& reason) { impl_->report_failure(reason); }
std::uint64_t MpiTransport::bytes_sent() const { return impl_->bytes_sent(); }
std::string MpiTransport::describe() const { return impl_->describe(); }
void MpiTransport::barrier(Timeout timeout, const char* operation) { impl_->barrier(timeout, operation); }
bool MpiTransport::waits_sleep() const { return impl_->waits_sleep(); }
std::vector<int> MpiTransport::shared_memory_peers() const { return impl_->shared_memory_peers(); }

bool shared_memory_from_environment(bool fallback) {
  const char* value = std::getenv("PIPESGD_MPI_SHARED_MEMORY");
  if (value == nullptr) return fallback;
  const std::string text(value);
  if (text == "1") return true;
  if (text == "0") return false;
  throw UsageError(concat("PIPESGD_MPI_SHARED_MEMORY must be 0 or 1, got '", text, "'"));
}

}  // namespace pipesgd
