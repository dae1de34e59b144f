#include "pipesgd/ps/parameter_server.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>

#include "pipesgd/comm/wait.h"  // throw_wait_timed_out: the waits' timeout error
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

namespace {

// Request header: three uint64 (kind, version, iteration) and the float64 learning-rate factor of a
// push in the first eight floats of a request buffer.
constexpr std::size_t kRequestHeaderFloats = kPsRequestHeaderBytes / sizeof(float);
// Reply header: one uint64 (version) in the first two floats of a reply buffer.
constexpr std::size_t kReplyHeaderFloats = kPsReplyHeaderBytes / sizeof(float);
constexpr int kRequestStep = 0;
constexpr int kReplyStep = 1;

enum RequestKind : std::uint64_t { kPush = 1, kPull = 2, kClose = 3, kCheckpoint = 4 };

Tag ps_tag(std::uint64_t sequence, int step, int shard) {
  return step_tag(collective_tag(Channel::kParameterServer, sequence), step,
                  static_cast<std::size_t>(shard));
}

void write_u64(std::vector<float>& buffer, std::size_t index, std::uint64_t value) {
  std::memcpy(reinterpret_cast<std::byte*>(buffer.data()) + index * sizeof(std::uint64_t), &value,
              sizeof value);
}

std::uint64_t read_u64(const std::vector<float>& buffer, std::size_t index) {
  std::uint64_t value;
  std::memcpy(&value,
              reinterpret_cast<const std::byte*>(buffer.data()) + index * sizeof(std::uint64_t),
              sizeof value);
  return value;
}

void check_world(const Transport& transport, const ShardPlan& plan, int workers) {
  if (workers < 1) throw UsageError(concat("parameter server: need >= 1 worker, got ", workers));
  if (transport.size() != workers + plan.servers()) {
    throw UsageError(concat("parameter server: ", workers, " workers and ", plan.servers(),
                            " servers need ", workers + plan.servers(),
                            " ranks, the transport has ", transport.size()));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server

struct ParameterServerShard::WorkerState {
  std::vector<float> request;  // header + shard gradients; the one posted receive
  std::vector<float> reply;    // version + shard weights (a snapshot: the weights move on)
  Request receive;
  Request reply_send;
  bool receiving = false;
  Clock::time_point posted_at{};
  Tag receive_tag = 0;
  std::uint64_t request_sequence = 0;  // next request's sequence
  std::uint64_t reply_sequence = 0;    // next reply's sequence
  bool pushed = false;                 // synchronous: holds its push of the current version
  bool pull_pending = false;
  std::uint64_t pull_min_version = 0;
  bool closed = false;
  bool at_checkpoint = false;          // sent its checkpoint marker; its requests are held
};

namespace {
// Checks the world and the rank; returns the server's shard index.
int server_shard(const Transport& transport, const ShardPlan& plan, int workers) {
  check_world(transport, plan, workers);
  const int shard = transport.rank() - workers;
  if (shard < 0 || shard >= plan.servers()) {
    throw UsageError(concat("parameter server: rank ", transport.rank(),
                            " is a worker rank (workers are 0..", workers - 1, ")"));
  }
  return shard;
}
}  // namespace

ParameterServerShard::ParameterServerShard(Transport& transport, const ShardPlan& plan, int workers,
                                           std::span<const float> initial_weights, SgdOptions sgd)
    : transport_(transport),
      workers_(workers),
      shard_(server_shard(transport, plan, workers)),
      plan_shard_(plan.shard(shard_)),
      sgd_(plan_shard_.count(), sgd) {
  if (initial_weights.size() != plan.total()) {
    throw UsageError(concat("parameter server: initial weights have ", initial_weights.size(),
                            " elements, the layout has ", plan.total()));
  }
  const auto first = initial_weights.begin() + static_cast<std::ptrdiff_t>(plan_shard_.begin);
  weights_.assign(first, first + static_cast<std::ptrdiff_t>(plan_shard_.count()));
  sum_.assign(plan_shard_.count(), 0.0f);
  state_.resize(static_cast<std::size_t>(workers));
  for (WorkerState& w : state_) {
    w.request.assign(kRequestHeaderFloats + plan_shard_.count(), 0.0f);
    w.reply.assign(kReplyHeaderFloats + plan_shard_.count(), 0.0f);
  }
}

ParameterServerShard::~ParameterServerShard() = default;

void ParameterServerShard::post_receive(int worker) {
  WorkerState& w = state_[static_cast<std::size_t>(worker)];
  PIPESGD_ASSERT(!w.receiving);
  w.receive_tag = ps_tag(w.request_sequence++, kRequestStep, shard_);
  w.receive = transport_.recv(worker, w.receive_tag, std::as_writable_bytes(std::span(w.request)),
                              "ps serve");
  w.receiving = true;
  w.posted_at = Clock::now();
}

void ParameterServerShard::send_reply(int worker, Timeout timeout) {
  WorkerState& w = state_[static_cast<std::size_t>(worker)];
  // The previous reply's buffer is reused: the worker received it before asking again (a client
  // has one pull in flight), so this wait returns at once in a correct run.
  if (w.reply_send.valid()) w.reply_send.wait(timeout);
  write_u64(w.reply, 0, version_);
  std::copy(weights_.begin(), weights_.end(), w.reply.begin() + kReplyHeaderFloats);
  if (!backups_.empty()) {
    // The worker's next gradient is computed on exactly these weights.
    std::copy(weights_.begin(), weights_.end(), backups_[static_cast<std::size_t>(worker)].begin());
  }
  w.reply_send = transport_.send(worker, ps_tag(w.reply_sequence++, kReplyStep, shard_),
                                 std::as_bytes(std::span(w.reply)), "ps pull reply");
  w.pull_pending = false;
}

void ParameterServerShard::answer_pulls(Timeout timeout) {
  for (int m = 0; m < workers_; ++m) {
    const WorkerState& w = state_[static_cast<std::size_t>(m)];
    if (w.pull_pending && version_ >= w.pull_min_version) send_reply(m, timeout);
  }
}

// The state of one serve() call that its request handlers share; lives on serve()'s stack.
struct ParameterServerShard::ServeSession {
  const ServeOptions& options;
  bool synchronous = true;
  std::size_t push_bytes = 0;              // of a push request: header + the shard's gradients
  int closed = 0;                          // workers that closed; serving ends when all did
  int pushed = 0;                          // synchronous: workers holding a push of the current version
  std::uint64_t push_iteration = 0;        // synchronous: the iteration those pushes carry
  int marked = 0;                          // workers whose checkpoint marker arrived
  std::int64_t checkpoint_iteration = -1;  // of the markers received so far
};

std::string ParameterServerShard::where() const {
  return concat("parameter server shard ", shard_, " on rank ", transport_.rank());
}

void ParameterServerShard::set_up_delay_compensation(const ServeOptions& options) {
  const std::size_t count = plan_shard_.count();
  backups_.clear();
  compensation_.reset();
  if (!options.delay_compensation) return;
  if (options.mode == ServerMode::kSynchronous) {
    throw UsageError(concat(where(), ": delay compensation applies to asynchronous serving only"));
  }
  compensation_.emplace(count, *options.delay_compensation);
  // Every worker starts from the initial weights: the shard's weights before any push.
  backups_.assign(static_cast<std::size_t>(workers_), weights_);
  compensated_.assign(count, 0.0f);
  if (restored_) {  // or from where the checkpoint left it
    const std::span<const float> backups = restored_->floats("server.dc.backups");
    if (backups.size() != static_cast<std::size_t>(workers_) * count) {
      throw DataError(concat("checkpoint '", restored_->origin(), "': ", backups.size(),
                             " DC-ASGD backup weights, shard ", shard_, " of ", workers_, " workers needs ",
                             static_cast<std::size_t>(workers_) * count));
    }
    for (std::size_t m = 0; m < backups_.size(); ++m) {
      std::copy_n(backups.begin() + static_cast<std::ptrdiff_t>(m * count), count, backups_[m].begin());
    }
    compensation_->load_state(*restored_, "server.");
  }
}

void ParameterServerShard::serve(const ServeOptions& options) {
  ServeSession session{.options = options,
                       .synchronous = options.mode == ServerMode::kSynchronous,
                       .push_bytes = (kRequestHeaderFloats + plan_shard_.count()) * sizeof(float)};
  set_up_delay_compensation(options);
  for (int m = 0; m < workers_; ++m) {
    WorkerState& w = state_[static_cast<std::size_t>(m)];
    std::vector<float> request = std::move(w.request), reply = std::move(w.reply);
    w = WorkerState{};
    w.request = std::move(request);
    w.reply = std::move(reply);
    post_receive(m);
  }
  int idle_rounds = 0;
  while (session.closed < workers_) {
    if (receive_requests(session)) {
      idle_rounds = 0;
      continue;
    }
    check_idle_workers(session);
    // Poll without burning a core: yield a few times, then sleep briefly.
    if (++idle_rounds < 16) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  for (WorkerState& w : state_) {
    if (w.reply_send.valid()) w.reply_send.wait(options.timeout);
  }
}

bool ParameterServerShard::receive_requests(ServeSession& session) {
  bool progress = false;
  for (int m = 0; m < workers_; ++m) {
    WorkerState& w = state_[static_cast<std::size_t>(m)];
    if (!w.receiving || !w.receive.test()) continue;
    const std::size_t bytes = w.receive.wait(session.options.timeout);  // complete: returns at once
    w.receiving = false;
    progress = true;
    handle_request(session, m, bytes);
  }
  return progress;
}

void ParameterServerShard::check_idle_workers(const ServeSession& session) const {
  const ServeOptions& options = session.options;
  if (options.stop != nullptr && options.stop->load(std::memory_order_acquire)) {
    throw PeerFailedError(concat(where(), ": stopped because a worker of the run failed"));
  }
  const auto now = Clock::now();
  for (int m = 0; m < workers_; ++m) {
    const WorkerState& w = state_[static_cast<std::size_t>(m)];
    if (w.receiving && now - w.posted_at > options.timeout) {
      const std::string waiting = session.synchronous
                                      ? concat("waiting for the push of version ", version_, ", i.e. at iteration ", version_)
                                      : std::string("waiting for a push, pull or close");
      throw_wait_timed_out(concat("ps serve: recv from rank ", m, " (", describe_tag(w.receive_tag), ") on rank ",
                                  transport_.rank()),
                           options.timeout, m, concat(" (", where(), ", ", waiting, ")").c_str());
    }
  }
}

void ParameterServerShard::handle_request(ServeSession& session, int worker, std::size_t bytes) {
  const WorkerState& w = state_[static_cast<std::size_t>(worker)];
  if (bytes < kRequestHeaderFloats * sizeof(float)) {
    throw CommError(concat(where(), ": request of ", bytes, " bytes from rank ", worker, " (",
                           describe_tag(w.receive_tag), ") is shorter than its header"));
  }
  const std::uint64_t kind = read_u64(w.request, 0);
  const std::uint64_t version = read_u64(w.request, 1);  // a checkpoint marker's iteration
  switch (kind) {
    case kPush: {
      // --trace: the server's track shows each request handled, at the push's version.
      trace_set_iteration(static_cast<std::int64_t>(version));
      TraceArgs args;
      args.iteration = static_cast<std::int64_t>(version);
      args.bytes = bytes;
      args.worker = worker;
      const TraceSpan span("push", kTraceServer, args);
      handle_push(session, worker, bytes, version);
      return;
    }
    case kPull: {
      TraceArgs args;
      args.worker = worker;
      const TraceSpan span("pull", kTraceServer, args);
      handle_pull(session, worker, version);
      return;
    }
    case kCheckpoint:
      handle_checkpoint_marker(session, worker, static_cast<std::int64_t>(version));
      return;
    case kClose:
      handle_close(session, worker);
      return;
    default:
      throw CommError(concat(where(), ": request of unknown kind ", kind, " from rank ", worker, " (",
                             describe_tag(w.receive_tag), ")"));
  }
}

void ParameterServerShard::handle_push(ServeSession& session, int worker, std::size_t bytes,
                                       std::uint64_t version) {
  if (bytes != session.push_bytes) {
    throw CommError(concat(where(), ": push of ", bytes, " bytes from rank ", worker, " (",
                           describe_tag(state_[static_cast<std::size_t>(worker)].receive_tag), "), expected ",
                           session.push_bytes));
  }
  if (session.synchronous) {
    handle_synchronous_push(session, worker, version);
  } else {
    handle_asynchronous_push(session, worker, version);
  }
}

void ParameterServerShard::handle_synchronous_push(ServeSession& session, int worker, std::uint64_t version) {
  WorkerState& w = state_[static_cast<std::size_t>(worker)];
  if (version != version_ || session.closed > 0 || session.marked > 0) {
    throw CommError(concat(where(), ": synchronous push of version ", version, " from rank ", worker, " (",
                           describe_tag(w.receive_tag), ") but the shard is at version ", version_,
                           session.closed > 0 ? " and a worker has closed" : "",
                           session.marked > 0 ? concat(" and other workers marked a checkpoint of iteration ",
                                                       session.checkpoint_iteration)
                                              : std::string()));
  }
  const std::uint64_t iteration = read_u64(w.request, 2);
  if (session.pushed == 0) {
    session.push_iteration = iteration;
  } else if (iteration != session.push_iteration) {
    throw CommError(concat(where(), ": synchronous push of version ", version, " from rank ", worker, " (",
                           describe_tag(w.receive_tag), ") carries iteration ", iteration,
                           ", the other workers' pushes of this version carry ", session.push_iteration));
  }
  w.pushed = true;  // its buffer holds the gradients until the update; no receive reposted
  if (++session.pushed < workers_) return;
  // Sum in worker order 0..M-1: the result does not depend on arrival order.
  const std::size_t count = plan_shard_.count();
  const std::vector<float>& first = state_[0].request;
  std::copy(first.begin() + kRequestHeaderFloats, first.end(), sum_.begin());
  for (int k = 1; k < workers_; ++k) {
    const float* g = state_[static_cast<std::size_t>(k)].request.data() + kRequestHeaderFloats;
    for (std::size_t i = 0; i < count; ++i) sum_[i] += g[i];
  }
  set_learning_rate_for_push(session, 0);
  sgd_.step(weights_, sum_, 1.0f / static_cast<float>(workers_));
  ++version_;
  session.pushed = 0;
  for (int k = 0; k < workers_; ++k) {
    state_[static_cast<std::size_t>(k)].pushed = false;
    post_receive(k);
  }
  answer_pulls(session.options.timeout);
}

void ParameterServerShard::handle_asynchronous_push(const ServeSession& session, int worker, std::uint64_t version) {
  const WorkerState& w = state_[static_cast<std::size_t>(worker)];
  if (version > version_) {
    throw CommError(concat(where(), ": push of version ", version, " from rank ", worker, " (",
                           describe_tag(w.receive_tag), ") is ahead of the shard's version ", version_));
  }
  const std::span<const float> gradients(w.request.data() + kRequestHeaderFloats, plan_shard_.count());
  set_learning_rate_for_push(session, worker);
  if (compensation_) {
    compensation_->compensate(gradients, weights_, backups_[static_cast<std::size_t>(worker)], compensated_);
    sgd_.step(weights_, compensated_, session.options.async_scale);
  } else {
    sgd_.step(weights_, gradients, session.options.async_scale);
  }
  ++version_;
  post_receive(worker);
  answer_pulls(session.options.timeout);
}

void ParameterServerShard::set_learning_rate_for_push(const ServeSession& session, int worker) {
  const auto iteration = static_cast<std::int64_t>(read_u64(state_[static_cast<std::size_t>(worker)].request, 2));
  if (iteration < 0) {
    throw CommError(concat(where(), ": push from rank ", worker, " carries iteration ", iteration));
  }
  const LrSchedule& schedule = session.options.learning_rate_schedule;
  if (schedule.spec().kind == LrScheduleKind::kExternal) {
    // The workers' rate, set by their caller: it travels with the push.
    const std::uint64_t bits = read_u64(state_[static_cast<std::size_t>(worker)].request, 3);
    const double factor = std::bit_cast<double>(bits);
    if (!std::isfinite(factor) || factor < 0) {
      throw CommError(concat(where(), ": push from rank ", worker, " carries learning-rate factor ", factor));
    }
    sgd_.set_learning_rate_factor(factor);
  } else {
    sgd_.set_learning_rate_factor(schedule.factor(iteration));
  }
}

void ParameterServerShard::handle_pull(const ServeSession& session, int worker, std::uint64_t min_version) {
  WorkerState& w = state_[static_cast<std::size_t>(worker)];
  if (w.pull_pending) {
    throw CommError(concat(where(), ": second pull from rank ", worker, " (", describe_tag(w.receive_tag),
                           ") while one is pending"));
  }
  w.pull_pending = true;
  w.pull_min_version = min_version;
  post_receive(worker);
  if (version_ >= min_version) send_reply(worker, session.options.timeout);
}

void ParameterServerShard::handle_checkpoint_marker(ServeSession& session, int worker, std::int64_t iteration) {
  WorkerState& w = state_[static_cast<std::size_t>(worker)];
  if (!session.options.on_checkpoint) {
    throw CommError(concat(where(), ": checkpoint marker from rank ", worker, " (", describe_tag(w.receive_tag),
                           ") but this server writes no checkpoints"));
  }
  const bool pushes_pending = session.synchronous && session.pushed > 0;
  if (w.pull_pending || session.closed > 0 || pushes_pending ||
      (session.checkpoint_iteration >= 0 && iteration != session.checkpoint_iteration)) {
    throw CommError(concat(where(), ": checkpoint marker of iteration ", iteration, " from rank ", worker, " (",
                           describe_tag(w.receive_tag), ") ",
                           w.pull_pending       ? std::string("with its pull unanswered")
                           : session.closed > 0 ? std::string("after a worker closed")
                           : pushes_pending     ? concat("while other workers pushed version ", version_)
                                                : concat("while other workers marked iteration ",
                                                         session.checkpoint_iteration)));
  }
  session.checkpoint_iteration = iteration;
  w.at_checkpoint = true;  // its receive stays unposted: later requests wait for the cut
  if (++session.marked < workers_) return;
  session.options.on_checkpoint(*this, iteration);
  session.checkpoint_iteration = -1;
  session.marked = 0;
  for (int k = 0; k < workers_; ++k) {
    state_[static_cast<std::size_t>(k)].at_checkpoint = false;
    post_receive(k);
  }
}

void ParameterServerShard::handle_close(ServeSession& session, int worker) {
  WorkerState& w = state_[static_cast<std::size_t>(worker)];
  if (session.marked > 0) {
    throw CommError(concat(where(), ": rank ", worker, " closed (", describe_tag(w.receive_tag),
                           ") while other workers marked a checkpoint of iteration ", session.checkpoint_iteration));
  }
  if (session.synchronous && session.pushed > 0) {
    throw CommError(concat(where(), ": rank ", worker, " closed (", describe_tag(w.receive_tag),
                           ") while other workers pushed version ", version_));
  }
  if (w.pull_pending) {
    throw CommError(concat(where(), ": rank ", worker, " closed (", describe_tag(w.receive_tag),
                           ") with a pull of version ", w.pull_min_version, " unanswered"));
  }
  w.closed = true;
  ++session.closed;
}

void ParameterServerShard::save_state(CheckpointWriter& out) const {
  out.add_int("server.shard", shard_);
  out.add_int("server.version", static_cast<std::int64_t>(version_));
  out.add("server.weights", std::span<const float>(weights_));
  sgd_.save_state(out, "server.");
  if (compensation_) {
    std::vector<float> backups;
    backups.reserve(backups_.size() * weights_.size());
    for (const std::vector<float>& backup : backups_) backups.insert(backups.end(), backup.begin(), backup.end());
    out.add("server.dc.backups", std::span<const float>(backups));
    compensation_->save_state(out, "server.");
  }
}

void ParameterServerShard::load_state(const CheckpointReader& in) {
  if (in.integer("server.shard") != shard_) {
    throw DataError(concat("checkpoint '", in.origin(), "': holds shard ", in.integer("server.shard"),
                           ", read by the server of shard ", shard_));
  }
  const std::int64_t version = in.integer("server.version");
  if (version < 0) throw DataError(concat("checkpoint '", in.origin(), "': server version ", version));
  const std::span<const float> weights = in.floats("server.weights");
  if (weights.size() != weights_.size()) {
    throw DataError(concat("checkpoint '", in.origin(), "': ", weights.size(), " weights for shard ", shard_,
                           " of ", weights_.size()));
  }
  sgd_.load_state(in, "server.");
  std::copy(weights.begin(), weights.end(), weights_.begin());
  version_ = static_cast<std::uint64_t>(version);
  restored_ = in;
}

// ---------------------------------------------------------------------------------------------
// Client

std::optional<std::uint64_t> push_version_of_request(std::span<const std::byte> message) {
  std::uint64_t header[2];
  if (message.size() < sizeof header) return std::nullopt;
  std::memcpy(header, message.data(), sizeof header);
  if (header[0] != kPush) return std::nullopt;
  return header[1];
}

std::uint64_t PushHandle::wait(Timeout timeout) {
  const TraceSpan span("push", kTraceComm);  // --trace: until every shard received it
  client_->wait_push(sequence_, timeout);
  return version_;
}

std::uint64_t PullHandle::wait(Timeout timeout) {
  const TraceSpan span("pull", kTraceComm);  // --trace: until every shard's weights are in
  return client_->wait_pull(sequence_, timeout);
}

ParameterClient::ParameterClient(Transport& transport, const ShardPlan& plan, int workers,
                                 Timeout timeout, LrSchedule schedule)
    : transport_(transport), plan_(plan), workers_(workers), timeout_(timeout), schedule_(std::move(schedule)) {
  check_world(transport, plan, workers);
  if (transport.rank() >= workers) {
    throw UsageError(concat("parameter client: rank ", transport.rank(),
                            " is a server rank (workers are 0..", workers - 1, ")"));
  }
  const auto servers = static_cast<std::size_t>(plan.servers());
  push_buffers_.resize(servers);
  reply_buffers_.resize(servers);
  for (std::size_t s = 0; s < servers; ++s) {
    push_buffers_[s].assign(kRequestHeaderFloats + plan.shards()[s].count(), 0.0f);
    write_u64(push_buffers_[s], 0, kPush);
    reply_buffers_[s].assign(kReplyHeaderFloats + plan.shards()[s].count(), 0.0f);
  }
  pull_header_.assign(kRequestHeaderFloats, 0.0f);
  write_u64(pull_header_, 0, kPull);
  close_header_.assign(kRequestHeaderFloats, 0.0f);
  write_u64(close_header_, 0, kClose);
  checkpoint_header_.assign(kRequestHeaderFloats, 0.0f);
  write_u64(checkpoint_header_, 0, kCheckpoint);
  push_requests_.resize(servers);
  pull_requests_.resize(servers);
  reply_requests_.resize(servers);
}

PushHandle ParameterClient::push(std::span<const float> gradients, std::uint64_t version, std::int64_t iteration) {
  if (closed_) throw UsageError("parameter client: push after close()");
  PIPESGD_ASSERT(iteration >= 0);
  if (gradients.size() != plan_.total()) {
    throw UsageError(concat("parameter client: push of ", gradients.size(),
                            " gradients, the layout has ", plan_.total()));
  }
  if (push_done_ < push_count_) wait_push(push_count_ - 1, timeout_);  // frees the buffers
  for (int s = 0; s < plan_.servers(); ++s) {
    const Shard& shard = plan_.shard(s);
    std::vector<float>& buffer = push_buffers_[static_cast<std::size_t>(s)];
    write_u64(buffer, 1, version);
    write_u64(buffer, 2, static_cast<std::uint64_t>(iteration));
    write_u64(buffer, 3, std::bit_cast<std::uint64_t>(schedule_.factor(iteration)));
    std::copy(gradients.begin() + static_cast<std::ptrdiff_t>(shard.begin),
              gradients.begin() + static_cast<std::ptrdiff_t>(shard.end),
              buffer.begin() + kRequestHeaderFloats);
    push_requests_[static_cast<std::size_t>(s)] =
        transport_.send(workers_ + s, request_tag(s), std::as_bytes(std::span(buffer)), "ps push");
  }
  ++request_sequence_;
  return PushHandle(this, push_count_++, version);
}

PullHandle ParameterClient::pull(std::span<float> weights, std::uint64_t min_version) {
  if (closed_) throw UsageError("parameter client: pull after close()");
  if (weights.size() != plan_.total()) {
    throw UsageError(concat("parameter client: pull into ", weights.size(),
                            " weights, the layout has ", plan_.total()));
  }
  if (pull_done_ < pull_count_) wait_pull(pull_count_ - 1, timeout_);
  write_u64(pull_header_, 1, min_version);
  for (int s = 0; s < plan_.servers(); ++s) {
    const auto index = static_cast<std::size_t>(s);
    // The reply's receive first, so the server's reply never waits for it.
    reply_requests_[index] =
        transport_.recv(workers_ + s, ps_tag(pull_count_, kReplyStep, s),
                        std::as_writable_bytes(std::span(reply_buffers_[index])), "ps pull reply");
    pull_requests_[index] = transport_.send(workers_ + s, request_tag(s),
                                            std::as_bytes(std::span(pull_header_)), "ps pull");
  }
  ++request_sequence_;
  pull_target_ = weights;
  return PullHandle(this, pull_count_++);
}

void ParameterClient::wait_push(std::uint64_t sequence, Timeout timeout) {
  if (sequence < push_done_) return;
  PIPESGD_ASSERT(sequence == push_done_ && sequence < push_count_);
  for (Request& request : push_requests_) {
    if (request.valid()) request.wait(timeout);
  }
  ++push_done_;
}

std::uint64_t ParameterClient::wait_pull(std::uint64_t sequence, Timeout timeout) {
  if (sequence < pull_done_) {
    if (sequence + 1 == pull_done_) return pull_version_;
    throw UsageError("parameter client: waiting a pull handle after a later pull completed");
  }
  PIPESGD_ASSERT(sequence == pull_done_ && sequence < pull_count_);
  std::uint64_t version = ~std::uint64_t{0};
  for (int s = 0; s < plan_.servers(); ++s) {
    const auto index = static_cast<std::size_t>(s);
    const Shard& shard = plan_.shard(s);
    if (pull_requests_[index].valid()) pull_requests_[index].wait(timeout);
    const std::size_t bytes = reply_requests_[index].wait(timeout);
    const std::vector<float>& reply = reply_buffers_[index];
    if (bytes != reply.size() * sizeof(float)) {
      throw CommError(concat("ps pull reply from rank ", workers_ + s, " on rank ",
                             transport_.rank(), ": ", bytes, " bytes, expected ",
                             reply.size() * sizeof(float)));
    }
    version = std::min(version, read_u64(reply, 0));
    std::copy(reply.begin() + kReplyHeaderFloats, reply.end(),
              pull_target_.begin() + static_cast<std::ptrdiff_t>(shard.begin));
  }
  ++pull_done_;
  pull_version_ = version;
  return version;
}

void ParameterClient::mark_checkpoint(std::int64_t iteration) {
  if (closed_) throw UsageError("parameter client: checkpoint marker after close()");
  PIPESGD_ASSERT(iteration >= 0);
  if (push_done_ < push_count_) wait_push(push_count_ - 1, timeout_);
  if (pull_done_ < pull_count_) wait_pull(pull_count_ - 1, timeout_);
  write_u64(checkpoint_header_, 1, static_cast<std::uint64_t>(iteration));
  for (int s = 0; s < plan_.servers(); ++s) {
    push_requests_[static_cast<std::size_t>(s)] = transport_.send(
        workers_ + s, request_tag(s), std::as_bytes(std::span(checkpoint_header_)), "ps checkpoint marker");
  }
  ++request_sequence_;
  for (Request& request : push_requests_) request.wait(timeout_);
}

void ParameterClient::close() {
  if (closed_) return;
  if (push_done_ < push_count_) wait_push(push_count_ - 1, timeout_);
  if (pull_done_ < pull_count_) wait_pull(pull_count_ - 1, timeout_);
  for (int s = 0; s < plan_.servers(); ++s) {
    push_requests_[static_cast<std::size_t>(s)] = transport_.send(
        workers_ + s, request_tag(s), std::as_bytes(std::span(close_header_)), "ps close");
  }
  ++request_sequence_;
  for (Request& request : push_requests_) request.wait(timeout_);
  closed_ = true;
}

Tag ParameterClient::request_tag(int shard) const {
  return ps_tag(request_sequence_, kRequestStep, shard);
}

}  // namespace pipesgd
