#pragma once
// The sharded parameter server's core, over the Transport interface (no training method yet).
//
// Ranks: one Transport holds M workers and S servers. Workers are ranks 0..M-1, servers are ranks
// M..M+S-1; server rank M + s owns shard s of a ShardPlan (ps/shard_plan.h) and runs one
// ParameterServerShard. Every worker rank runs one ParameterClient, which talks to all S servers.
//
// Protocol (all messages on Channel::kParameterServer, one message per shard):
//   worker -> server, step 0 (request), sequence = the worker's request count (push, pull,
//     checkpoint and close requests share one sequence, so a server handles each worker's requests
//     in order), segment = shard. Payload: a 32-byte header (uint64 kind: push, pull, checkpoint or
//     close; uint64 version, or for a checkpoint the iteration the workers continue from; uint64 the
//     pushing worker's iteration, for the learning-rate schedule; float64 the worker's learning-rate
//     factor of that iteration, for an external schedule) then, for a push, the shard's fp32
//     gradients.
//   server -> worker, step 1 (pull reply), sequence = the worker's pull count, segment = shard.
//     Payload: the 8-byte version of the weights, then the shard's fp32 weights.
// A server keeps exactly one receive posted per worker (there is no any-source receive) and polls
// them with Request::test(). A client keeps at most one push and one pull in flight, so at most
// three requests of a worker are ever in flight and no two messages of one (worker, server) pair
// whose sequences differ by a multiple of kMpiSequenceWindow (128) coexist.
//
// Versions: a shard's version counts its updates (0 = the initial weights). Synchronous mode: the
// gradients pushed by the M workers with version t are summed in worker order 0..M-1
// (deterministic) and applied as one SGD step with gradient scale 1/M; the version becomes t + 1. A
// push whose version is not the shard's current version, or whose iteration differs from the other
// workers' pushes of that version, is a protocol error (CommError).
// Learning rate: every update steps at ServeOptions::learning_rate_schedule's rate for the iteration
// the push carries (synchronous: the workers' common iteration; asynchronous: the pushing worker's);
// with an external schedule (the API's, set by the workers' caller), at the factor the push carries.
// Asynchronous mode: every push is applied as it arrives with gradient scale `async_scale`, version
// += 1; the push's version (the weights the gradient was computed on) must not exceed the shard's
// version. Asynchronous mode with delay compensation (DC-ASGD, `dcasgd`): the shard keeps, per
// worker, a backup of the weights it last sent that worker (the initial weights before its first
// pull); a push of worker m is compensated with them (optim/delay_compensation.h, w_then = backup_m,
// w_now = the shard's weights) before the SGD step, so a gradient computed on old weights is
// corrected for how far the weights moved since. A pull carries a minimum version: the server answers it once its version reaches it (0 =
// answer with the latest weights at once) and the reply carries the version of the weights sent.
//
// Checkpoints: a worker that checkpoints after iteration t sends a checkpoint marker of iteration
// t + 1 once its push and pull of t are complete (ParameterClient::mark_checkpoint). A server holds
// each marked worker's later requests (it does not repost that worker's receive) until every worker
// has marked the same iteration, then calls ServeOptions::on_checkpoint, in which save_state()
// captures exactly the state that the workers' checkpoints continue from: every push a worker made
// before its marker is applied, none made after. (In synchronous mode this is the shard at version
// t + 1; in asynchronous mode it is a consistent cut of whatever order the pushes arrived in.) A
// resumed run builds fresh shards and clients, restores the shards with load_state() before
// serve(), and starts every message sequence at 0 again: only versions carry meaning across it.
//
// Failures: the serve loop polls with Request::test(), which does not report a failed peer, so a
// server notices a failed worker by the timeout of its posted receive (clients, which wait, notice
// a failed server at once through the transport).
//
// Buffers: every message buffer is allocated at construction; push, pull and the serve loop do not
// allocate (the transport itself may).
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/optim/delay_compensation.h"
#include "pipesgd/optim/lr_schedule.h"
#include "pipesgd/optim/sgd.h"
#include "pipesgd/ps/shard_plan.h"

namespace pipesgd {

class ParameterServerShard;

enum class ServerMode { kSynchronous, kAsynchronous };

// The protocol's message headers (above): a request's and a pull reply's, in bytes.
inline constexpr std::size_t kPsRequestHeaderBytes = 32;
inline constexpr std::size_t kPsReplyHeaderBytes = 8;

struct ServeOptions {
  ServerMode mode = ServerMode::kSynchronous;
  // Asynchronous mode: the gradient scale of each push (e.g. 1, or 1/M).
  float async_scale = 1.0f;
  // Every wait on a worker (a posted receive, a reply send) fails with CommTimeoutError after this.
  Timeout timeout{60000};
  // If set, serve() throws PeerFailedError once *stop is true (checked while idle): lets the owner
  // of a local run stop its servers at once when a worker failed, instead of after `timeout`.
  // Written by any thread, read by the serving thread.
  const std::atomic<bool>* stop = nullptr;
  // Asynchronous mode only: compensate each push for its worker's delay (DC-ASGD). serve() throws
  // UsageError if set in synchronous mode.
  std::optional<DelayCompensationOptions> delay_compensation = std::nullopt;
  // Called on the serving thread once every worker's checkpoint marker of `iteration` arrived
  // (see "Checkpoints" above), before any later request is handled; it may call
  // shard.save_state(). Unset: a checkpoint marker is a protocol error (CommError).
  std::function<void(const ParameterServerShard& shard, std::int64_t iteration)> on_checkpoint{};
  // The run's learning-rate schedule (optim/lr_schedule.h): the update of a push of iteration t
  // uses factor(t) times the shard's SGD learning rate.
  LrSchedule learning_rate_schedule{};
};

// One shard of the parameters, served on a server rank. Thread contract: constructed and served by
// one thread of the server rank; weights()/version() may be read by that thread after serve()
// returns.
class ParameterServerShard {
 public:
  // `initial_weights` is the full flat vector (plan.total() elements); the shard copies its range.
  // The shard index is transport.rank() - workers. Throws UsageError if the transport's size is not
  // workers + plan.servers(), the rank is not a server rank, or the weights' size is wrong.
  ParameterServerShard(Transport& transport, const ShardPlan& plan, int workers,
                       std::span<const float> initial_weights, SgdOptions sgd);

  // Serves the workers until every one of them has closed (ParameterClient::close()). Throws
  // CommTimeoutError (naming the operation, the worker's rank and the tag) if a worker's message
  // does not arrive within options.timeout, CommError on a protocol violation (e.g. a synchronous
  // push of the wrong version), and whatever the transport throws.
  void serve(const ServeOptions& options);
  ~ParameterServerShard();

  // Checkpoints: the shard's weights, version, SGD momentum and, for DC-ASGD, every worker's backup
  // weights and the compensation's state (sections "server.*"). load_state, called before serve(),
  // restores them; it throws DataError naming the file if a section is missing or of another size
  // (e.g. a checkpoint of another shard plan or worker count).
  void save_state(CheckpointWriter& out) const;
  void load_state(const CheckpointReader& in);

  int shard_index() const { return shard_; }
  const Shard& shard() const { return plan_shard_; }
  std::span<const float> weights() const { return weights_; }
  std::uint64_t version() const { return version_; }

 private:
  struct WorkerState;
  struct ServeSession;
  // serve() in two parts, as ps-lite separates its network layer (Van) from its request handler:
  // the network loop (receive_requests, check_idle_workers) completes each worker's one posted
  // receive and hands the request to handle_request, which checks it against the protocol and
  // dispatches it by kind. A handler reposts the worker's receive when the worker may send its next
  // request. All of it runs on the serving thread; none of it allocates (the transport may), except
  // to build an error message and in set_up_delay_compensation, once before the loop.
  void set_up_delay_compensation(const ServeOptions& options);
  // Handles every request that arrived since the last call; false if none did.
  bool receive_requests(ServeSession& session);
  // Idle: throws PeerFailedError once options.stop is set, CommTimeoutError for a worker whose
  // posted receive is older than options.timeout.
  void check_idle_workers(const ServeSession& session) const;
  void handle_request(ServeSession& session, int worker, std::size_t bytes);
  void handle_push(ServeSession& session, int worker, std::size_t bytes, std::uint64_t version);
  void handle_synchronous_push(ServeSession& session, int worker, std::uint64_t version);
  void handle_asynchronous_push(const ServeSession& session, int worker, std::uint64_t version);
  // Sets the SGD's learning rate for the update of worker `worker`'s push (its iteration).
  void set_learning_rate_for_push(const ServeSession& session, int worker);
  void handle_pull(const ServeSession& session, int worker, std::uint64_t min_version);
  void handle_checkpoint_marker(ServeSession& session, int worker, std::int64_t iteration);
  void handle_close(ServeSession& session, int worker);
  void post_receive(int worker);
  void send_reply(int worker, Timeout timeout);
  void answer_pulls(Timeout timeout);
  // "parameter server shard S on rank R", the start of every error message of serve().
  std::string where() const;

  Transport& transport_;
  int workers_;
  int shard_;
  Shard plan_shard_;
  std::vector<float> weights_;
  std::vector<float> sum_;  // synchronous mode: the summed gradients
  // Delay compensation (allocated by serve() when enabled): per-worker backups of the weights last
  // sent, the compensated gradient, and the compensation's state.
  std::vector<std::vector<float>> backups_;
  std::vector<float> compensated_;
  std::optional<DelayCompensation> compensation_;
  // The checkpoint load_state() restored from, if any: serve() takes the delay compensation's
  // backups and state from it when it sets the compensation up.
  std::optional<CheckpointReader> restored_;
  Sgd sgd_;
  std::uint64_t version_ = 0;
  std::vector<WorkerState> state_;
};

class ParameterClient;

// If `message` is a worker's request message (Channel::kParameterServer, step 0) that is a push, the
// version it carries; otherwise nullopt. (For tools that watch the wire, e.g. fault injection.)
std::optional<std::uint64_t> push_version_of_request(std::span<const std::byte> message);

// A push in flight. wait() returns the version that was pushed once every shard has received it.
// Cheap to copy; valid until the client's next push() (which completes it first) or destruction.
class PushHandle {
 public:
  std::uint64_t wait(Timeout timeout);

 private:
  friend class ParameterClient;
  PushHandle(ParameterClient* client, std::uint64_t sequence, std::uint64_t version)
      : client_(client), sequence_(sequence), version_(version) {}
  ParameterClient* client_;
  std::uint64_t sequence_;
  std::uint64_t version_;
};

// A pull in flight (valid until the client's next pull(), which completes it first; waiting it
// again after that returns its version only while no later pull has completed, else UsageError).
// wait() copies every shard's weights into the span given to pull() and returns the
// smallest version among the shards (all shards report the same version in synchronous mode, and
// whenever the pull asked for a minimum version every shard has reached).
class PullHandle {
 public:
  std::uint64_t wait(Timeout timeout);

 private:
  friend class ParameterClient;
  PullHandle(ParameterClient* client, std::uint64_t sequence)
      : client_(client), sequence_(sequence) {}
  ParameterClient* client_;
  std::uint64_t sequence_;
};

// A worker's endpoint to the servers. Thread contract: not thread-safe; one thread of the worker
// rank (e.g. its comm thread) calls push/pull/close and waits the handles. At most one push and one
// pull are in flight: push() and pull() first complete the previous push / pull (waiting up to the
// client's timeout). The gradients are copied at push(); the weights span of a pull must stay valid
// until its handle's wait() returned.
class ParameterClient {
 public:
  // Throws UsageError if the transport's size is not workers + plan.servers() or the rank is not a
  // worker rank. `timeout` bounds the implicit waits of push/pull/close. `plan` must outlive the
  // client.
  // `schedule`: the worker's learning-rate schedule, whose factor each push carries (the servers
  // use it when their own schedule is external).
  ParameterClient(Transport& transport, const ShardPlan& plan, int workers,
                  Timeout timeout = Timeout{60000}, LrSchedule schedule = {});
  ParameterClient(const ParameterClient&) = delete;
  ParameterClient& operator=(const ParameterClient&) = delete;

  // Sends gradients (plan.total() elements) of the worker's iteration `iteration` (>= 0; the servers
  // update at that iteration's scheduled learning rate) computed on weights of `version`, one
  // message per shard.
  PushHandle push(std::span<const float> gradients, std::uint64_t version, std::int64_t iteration);
  // Asks every shard for its weights once it reached `min_version` (0: the latest at once).
  PullHandle pull(std::span<float> weights, std::uint64_t min_version = 0);
  // Completes any push/pull in flight, then tells every server that this worker checkpoints and
  // continues from `iteration` (see "Checkpoints" above). The servers hold this worker's later
  // requests until every worker has marked the same iteration.
  void mark_checkpoint(std::int64_t iteration);
  // Completes any push/pull in flight, then tells every server this worker is done. Call once,
  // after the last pull; a server's serve() returns once all workers closed.
  void close();

 private:
  friend class PushHandle;
  friend class PullHandle;
  void wait_push(std::uint64_t sequence, Timeout timeout);
  std::uint64_t wait_pull(std::uint64_t sequence, Timeout timeout);
  Tag request_tag(int shard) const;

  Transport& transport_;
  const ShardPlan& plan_;
  int workers_;
  Timeout timeout_;
  LrSchedule schedule_;
  bool closed_ = false;
  std::uint64_t request_sequence_ = 0;
  // Buffers first: destroyed after the requests that may point into them.
  std::vector<std::vector<float>> push_buffers_;   // per shard: header + gradients
  std::vector<std::vector<float>> reply_buffers_;  // per shard: version + weights
  std::vector<float> pull_header_;                 // the pull request (same for every shard)
  std::vector<float> close_header_;                // the close request
  std::vector<float> checkpoint_header_;           // the checkpoint marker
  std::span<float> pull_target_;
  std::uint64_t push_count_ = 0, pull_count_ = 0;  // handles issued
  std::uint64_t push_done_ = 0, pull_done_ = 0;    // handles completed
  std::uint64_t pull_version_ = 0;                 // of the last completed pull
  std::vector<Request> push_requests_;             // per shard
  std::vector<Request> pull_requests_;             // per shard: the pull request send
  std::vector<Request> reply_requests_;            // per shard: the reply receive
};

}  // namespace pipesgd
