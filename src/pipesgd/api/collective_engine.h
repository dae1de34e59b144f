#pragma once
// CollectiveEngine: a Worker's communication thread for the negotiated collectives of
// include/pipesgd/collectives.h (the contract is there; this is how it is kept).
//
// Negotiation rounds: round n is one exchange among every worker (Channel::kNegotiation, sequence
// n): each sends every peer one message, a header and a row per collective it has pending (at most
// kRoundCapacity), and receives theirs. Every worker reads the same table and so takes the same
// decisions: which collectives are ready (every member of the set listed it, or has joined), in
// which order they run (rank 0's rows first, then rank 1's, ...; the k-th one read in the whole
// run is collective number k, Channel::kCollectives sequence k), which fail (a mismatch, a joined
// member, a phase left behind, a deadlock), when every worker has joined. A worker starts a round
// when it has something pending; an idle one listens for a peer's round and takes part in it
// (polling its posted receives with a back-off, see kBusyPollCeiling), so a collective of a
// process set never waits for the Python thread of a worker outside it.
//
// Execution: the engine thread runs the ready collectives one at a time over the set's ranks (a
// RankGroupTransport), with LibTorch for the element-wise scaling and pipesgd's collective layer
// (ring allreduce for float32 Sum/Average; collective/typed_collectives.h for the rest) for the
// messages. A communication error (a peer failed, a timeout) fails that collective and every later
// one: the world is broken.
//
// Turns: whoever holds the driver's mutex runs the rounds (and the collectives they make ready):
// the engine's own thread, or a thread that waits for a Work (Work::wait takes the turns itself
// while they make progress, so a blocking collective that every rank submitted completes on the
// caller's thread with no hand-off between threads; a turn that makes no progress hands back).
//
// Threads: submit(), new_phase() and process_set_ranks() from the Worker's thread; the rounds on
// the thread holding the driver's mutex. The transport is the Worker's and outlives the engine.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/api/collective_execution.h"
#include "pipesgd/api/collective_timeline.h"
#include "pipesgd/comm/rank_group_transport.h"
#include "pipesgd/collectives.h"
#include "pipesgd/comm/transport.h"

namespace pipesgd {

inline constexpr int kRoundCapacity = 64;  // collectives a worker lists per round
// An engine with nothing pending polls for a peer's round every kBusyPollCeiling at most during its
// first kIdleAfter of idleness, every kIdlePollCeiling after that.
inline constexpr std::chrono::microseconds kBusyPollCeiling{1000};
inline constexpr std::chrono::microseconds kYieldFirst{20};  // of each wait: yield, then sleep
inline constexpr std::chrono::milliseconds kIdleAfter{50};
inline constexpr std::chrono::milliseconds kIdlePollCeiling{10};
// After a wake-up by a submission, the engine thread waits while submissions keep coming (each
// within kBurstGap of the last, kBurstLimit at most), so that a burst of asynchronous collectives
// goes into one round (or to a caller that waits for them) instead of a round each.
inline constexpr std::chrono::microseconds kBurstGap{30};
inline constexpr std::chrono::microseconds kBurstLimit{300};
// A caller taking the turns (Work::wait) retries turns that made no progress for this long before
// it leaves them to the engine thread.
inline constexpr std::chrono::microseconds kCallerPatience{1000};

class CollectiveEngine {
 public:
  // `workers`: ranks 0..M-1 of the world (this worker among them). `stall`: how long every worker
  // may wait on collectives no peer submitted before they fail.
  CollectiveEngine(Transport& workers, Timeout timeout, std::chrono::milliseconds stall);
  // Stops the thread; collectives still pending fail with "the worker shut down".
  ~CollectiveEngine();
  CollectiveEngine(const CollectiveEngine&) = delete;
  CollectiveEngine& operator=(const CollectiveEngine&) = delete;

  // Checks what this rank alone can check (UsageError: a tensor that is not on the CPU, an
  // unsupported dtype, Adasum, a root outside the set, a set this rank is not in, a name pending
  // twice) and queues the collective. `caller_waits`: the caller calls wait() at once and takes the
  // turns itself (the engine thread is not woken for it; it still sees it at its next turn).
  std::shared_ptr<Work> submit(Collective call, bool caller_waits = false);
  void new_phase();
  // Horovod's timeline (api/collective_timeline.h): recorded on rank 0 from the next round on and
  // written to `path` by stop_timeline(); on other ranks only `path` is checked. UsageError for a
  // path that cannot be written, or another path while one is being recorded (the same path: it
  // goes on). stop_timeline() without one does nothing; a failure to write is the error of
  // core/atomic_file.h.
  void start_timeline(const std::string& path, bool mark_cycles);
  void stop_timeline();
  // The workers of process set `id` (0: all). UsageError for an unknown id.
  std::vector<int> process_set_ranks(int id) const;

  struct Pending;
  // What a Work's state holds to take the engine's turns (null engine: the engine is gone).
  struct Driver {
    std::mutex turns;  // held by whoever runs rounds
    std::mutex alive;  // guards `engine` for wake()
    CollectiveEngine* engine = nullptr;  // null once the engine is gone (set under both mutexes)
  };
  // Work::wait's help: if no other thread holds the turns, takes them (with whatever else is
  // pending) until `state` is done or its turns made no progress for kCallerPatience. False once
  // taking turns cannot help `state` any more (the engine thread goes on; or the engine is gone).
  static bool drive(Driver& driver, const Work::State& state);
  // Work::wait before it sleeps: the engine thread takes the turns (a caller_waits submission did
  // not wake it).
  static void wake(Driver& driver);
  // A finished collective's name whose holder is done with it (include/pipesgd/collectives.h, Work)
  // is free again.
  static void release_name(Driver& driver, const std::string& key_text);

 private:
  enum class Turn { kIdle, kProgressed, kStuck, kStopped };
  void run();
  // One turn, with the driver's mutex held: takes what was submitted and runs a round if something
  // is pending or a peer started one. A communication error fails everything (kStopped).
  Turn take_turn();
  void run_round(std::uint64_t round);
  using Clock = std::chrono::steady_clock;
  // The engine thread's wait: until something is submitted, a turn is handed back, a peer's
  // message of the next round arrived (it started the round), or `limit` passed, polling the
  // round's posted receives with a back-off of up to kIdlePollCeiling. False once stopping.
  bool await_activity(Clock::duration limit);
  // The engine thread, after await_activity: waits out a burst of submissions (kBurstGap). Returns
  // at once if a peer started a round, a turn was handed back, or a caller took the submissions.
  // False once stopping.
  bool collect_burst();
  void post_round_receives(std::uint64_t round);
  void execute(Pending& entry, std::uint64_t number, const std::vector<int>& members, bool joined_here);
  void complete(Pending& entry, std::vector<torch::Tensor> results);
  void fail(Pending& entry, std::exception_ptr error);
  // Either of them: the Work is done; its name is freed if its holder is done with it too.
  void settle(Pending& entry, std::vector<torch::Tensor> results, std::exception_ptr error);
  // The engine thread takes the turns from here (woken if it sleeps).
  void hand_over();
  // With the turns held: did a peer start the next round (its message arrived)?
  bool peer_started_round();
  // The same, if no other thread holds the turns (one that does sees to the round); false otherwise.
  bool peer_started_round_unless_driven();
  void fail_everything(std::exception_ptr error);
  std::vector<int> members_of(int set) const;

  Transport& workers_;
  const Timeout timeout_;
  const std::chrono::milliseconds stall_;

  mutable std::mutex mutex_;  // guards the fields up to `stopping_`
  std::condition_variable submitted_;
  std::deque<std::shared_ptr<Pending>> incoming_;  // submitted, not yet seen by the engine thread
  std::map<std::string, int> pending_names_;       // set:name of what is submitted and not completed
  std::map<int, std::vector<int>> process_sets_;   // id -> ranks; 0 = every worker
  std::map<int, std::uint64_t> unnamed_counts_;    // per set, this phase
  std::uint64_t phase_ = 0;
  std::uint64_t joins_ = 0;  // join() calls of this worker
  bool joined_ = false;
  bool timeline_started_ = false;  // between start_timeline and stop_timeline (every rank)
  std::string timeline_path_;
  bool stopping_ = false;
  bool handed_over_ = false;  // a waiting caller left pending collectives to the engine thread
  std::exception_ptr broken_;                      // the communication error that broke the world

  std::shared_ptr<Driver> driver_;
  // The driver's (guarded by driver_->mutex).
  std::uint64_t round_ = 0;
  std::vector<std::shared_ptr<Pending>> pending_;  // in submission order
  std::vector<std::vector<std::int64_t>> round_buffers_;
  std::vector<Request> round_receives_;
  std::uint64_t posted_round_ = ~std::uint64_t{0};
  std::uint64_t collective_number_ = 0;
  std::vector<std::int64_t> join_round_;           // per rank: the round its join was first listed, -1
  std::unique_ptr<CollectiveTimeline> timeline_;   // rank 0, between start_timeline and stop_timeline
  struct SetChannel {
    std::unique_ptr<RankGroupTransport> group;  // the set's ranks, over workers_
    SetResources resources;
  };
  std::map<int, SetChannel> set_channels_;        // by process set, made at its first collective
  int next_process_set_ = 1;
  std::thread thread_;
};

}  // namespace pipesgd
