// CollectiveEngine (collective_engine.h): negotiation rounds and the execution of what they agree on.
#include "pipesgd/api/collective_engine.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "pipesgd/api/collective_execution.h"
#include "pipesgd/comm/rank_group_transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/thread_priority.h"

namespace pipesgd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kMagic = 0x70736764;  // "psgd"
constexpr int kWords = 18;                    // int64 words of a row (and of the header)
constexpr int kShapeWords = 6;                // dimensions sent as they are; the rest enter word 12
// Row words: 0 key, 1 kind, 2 op, 3 dtype, 4 root, 5 ndim, 6..11 dims, 12 hash of the rest (more
// dims, scale factors, a new set's ranks), 13 age (ms), 14 phase, 15 process set, 16 elements,
// 17 its number among the unnamed of its set and phase (-1: named). Words 13, 14, 16 and 17 are the
// lister's and not compared (16 differs for allgather and alltoall).
constexpr int kAge = 13, kPhase = 14, kSet = 15, kElements = 16, kUnnamed = 17;
// Header words: 0 magic, 1 rows, 2 phase, 3 joined.
using Row = std::array<std::int64_t, kWords>;

std::int64_t hash_text(const std::string& text) {
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(hash >> 1);
}

bool dimension_zero_may_differ(CollectiveKind kind) {
  return kind == CollectiveKind::kAllgather || kind == CollectiveKind::kAlltoall;
}

Row describe(const Collective& call, std::int64_t key, std::uint64_t phase) {
  Row row{};
  row.fill(0);
  row[0] = key;
  row[1] = static_cast<std::int64_t>(call.kind);
  const bool reduces = call.kind == CollectiveKind::kAllreduce || call.kind == CollectiveKind::kReducescatter;
  row[2] = reduces ? static_cast<std::int64_t>(call.op) : -1;
  row[3] = -1;
  row[4] = call.kind == CollectiveKind::kBroadcast ? call.root : -1;
  row[5] = -1;
  for (int d = 0; d < kShapeWords; ++d) row[6 + d] = -1;
  std::string rest;
  if (call.input.defined()) {
    row[3] = static_cast<std::int64_t>(element_type_of(call.input.scalar_type(), collective_kind_name(call.kind)));
    const auto sizes = call.input.sizes();
    row[5] = static_cast<std::int64_t>(sizes.size());
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      const std::int64_t value = (d == 0 && dimension_zero_may_differ(call.kind)) ? -2 : sizes[d];
      if (d < kShapeWords) row[6 + d] = value;
      else rest += concat(value, ",");
    }
    row[kElements] = call.input.numel();
  }
  if (reduces) rest += concat("scale ", call.prescale, " ", call.postscale);
  for (const int rank : call.ranks) rest += concat(rank, " ");
  row[12] = hash_text(rest);
  row[kPhase] = static_cast<std::int64_t>(phase);
  row[kSet] = call.process_set;
  return row;
}

const char* dtype_text(std::int64_t code) {
  return code >= 0 && code <= static_cast<std::int64_t>(ElementType::kBool) ? element_type_name(static_cast<ElementType>(code))
                                                                            : "none";
}

std::string shape_text(const Row& row) {
  std::string text = "[";
  const std::int64_t ndim = row[5];
  for (std::int64_t d = 0; d < std::min<std::int64_t>(ndim, kShapeWords); ++d) {
    text += (d ? ", " : "") + (row[6 + d] == -2 ? std::string("?") : std::to_string(row[6 + d]));
  }
  return text + (ndim > kShapeWords ? ", ...]" : "]");
}

// Horovod's wording for the first difference between the listers' rows, or "" if they agree.
std::string mismatch_message(const std::vector<const Row*>& rows) {
  const Row& first = *rows[0];
  const auto kind_name = [](std::int64_t k) { return collective_kind_name(static_cast<CollectiveKind>(k)); };
  const std::string kind = kind_name(first[1]);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const Row& row = *rows[i];
    if (row[1] != first[1]) {
      return concat("Mismatched operations: One rank did an ", kind, ", but another rank did an ", kind_name(row[1]), ".");
    }
    if (row[kSet] != first[kSet]) {
      return concat("Mismatched process sets: One rank specified process set ", first[kSet],
                    ", but another rank specified process set ", row[kSet], ".");
    }
    if (row[3] != first[3]) {
      return concat("Mismatched data types: One rank had type ", dtype_text(first[3]), ", but another rank had type ",
                    dtype_text(row[3]), ".");
    }
    if (row[2] != first[2]) {
      return concat("Mismatched ", kind, " reduction operations: One rank specified ",
                    reduce_op_name(static_cast<ReduceOp>(first[2])), ", but another rank specified ",
                    reduce_op_name(static_cast<ReduceOp>(row[2])), ".");
    }
    if (row[4] != first[4]) {
      return concat("Mismatched ", kind, " root ranks: One rank specified root rank ", first[4],
                    ", but another rank specified root rank ", row[4], ".");
    }
    if (row[5] != first[5]) {
      return concat("Mismatched ", kind, " tensor shapes: One rank sent a tensor of rank ", first[5],
                    ", but another rank sent a tensor of rank ", row[5], ".");
    }
    if (!std::equal(row.begin() + 6, row.begin() + 6 + kShapeWords, first.begin() + 6)) {
      return concat("Mismatched ", kind, " tensor shapes: One rank sent a tensor of shape ", shape_text(first),
                    ", but another rank sent a tensor of shape ", shape_text(row), ".");
    }
    if (row[12] != first[12]) {
      return concat("Mismatched ", kind, " arguments: the ranks differ in the dimensions after the sixth, the scale "
                    "factors or the ranks of a new process set.");
    }
  }
  return "";
}

// Waits for every request of a round within `timeout` in all. Blocking waits: a peer's failure
// ends them at once (PeerFailedError), a silent peer after the timeout (naming it and the round).
void wait_all(std::vector<Request>& requests, Timeout timeout) {
  const auto deadline = Clock::now() + timeout;
  for (Request& request : requests) {
    if (!request.valid()) continue;
    const auto left = std::chrono::duration_cast<Timeout>(deadline - Clock::now());
    request.wait(std::max(left, Timeout(1)));
  }
}

}  // namespace

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAlltoall: return "alltoall";
    case CollectiveKind::kReducescatter: return "reducescatter";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kJoin: return "join";
    case CollectiveKind::kAddProcessSet: return "add_process_set";
    case CollectiveKind::kRemoveProcessSet: return "remove_process_set";
  }
  return "collective";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
    case ReduceOp::kAdasum: return "Adasum";
  }
  return "unknown";
}

// --- Work ------------------------------------------------------------------------------------

struct Work::State {
  mutable std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  std::vector<torch::Tensor> results;
  std::string name;
  std::chrono::milliseconds patience{0};  // how long wait() waits for the engine at most
  std::shared_ptr<CollectiveEngine::Driver> driver;  // to take the engine's turns while waiting
  std::string key_text;       // the engine's key of the name
  bool held = true;           // the Work has not been waited for or destroyed
  bool name_released = false;
  // Under `mutex`: true for the one caller that frees the name (finished and no longer held).
  bool take_name_release() {
    if (!done || held || name_released) return false;
    name_released = true;
    return true;
  }
  // The holder is done with it (wait() ended, or the Work is destroyed).
  void let_go() noexcept {
    bool release = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      held = false;
      release = take_name_release();
    }
    if (release && driver != nullptr) CollectiveEngine::release_name(*driver, key_text);
  }
};

Work::Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

Work::~Work() { state_->let_go(); }

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

const std::vector<torch::Tensor>& Work::wait() {
  // Take the engine's turns while that helps (no hand-off between threads for a collective every
  // rank submitted); else a short collective completes within microseconds: yield for a moment
  // before sleeping (a futex wake-up costs more than the collective).
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  bool may_drive = state_->driver != nullptr;
  while (!is_completed() && std::chrono::steady_clock::now() < spin_until) {
    if (may_drive) may_drive = CollectiveEngine::drive(*state_->driver, *state_);
    if (!is_completed()) std::this_thread::yield();
  }
  if (state_->driver != nullptr && !is_completed()) CollectiveEngine::wake(*state_->driver);
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->finished.wait_for(lock, state_->patience, [&] { return state_->done; })) {
      throw CommTimeoutError(concat("collective '", state_->name, "': no result within ",
                                    state_->patience.count() / 1000, " s"));
    }
  }
  state_->let_go();
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->results;
}

const std::string& Work::name() const { return state_->name; }

// --- The engine ------------------------------------------------------------------------------

struct CollectiveEngine::Pending {
  Collective call;
  std::string name;     // as matched (given or "noname.N")
  std::string key_text; // "set:name", unique among what is pending
  Row row{};
  std::uint64_t phase = 0;
  std::optional<std::uint64_t> unnamed;
  Clock::time_point submitted;
  std::shared_ptr<Work::State> state;
};

CollectiveEngine::CollectiveEngine(Transport& workers, Timeout timeout, std::chrono::milliseconds stall)
    : workers_(workers), timeout_(timeout), stall_(stall) {
  std::vector<int> everyone(static_cast<std::size_t>(workers.size()));
  for (int rank = 0; rank < workers.size(); ++rank) everyone[static_cast<std::size_t>(rank)] = rank;
  process_sets_[0] = everyone;
  join_round_.assign(static_cast<std::size_t>(workers.size()), -1);
  round_buffers_.assign(static_cast<std::size_t>(workers.size()),
                        std::vector<std::int64_t>(static_cast<std::size_t>((kRoundCapacity + 1) * kWords)));
  round_receives_.resize(static_cast<std::size_t>(workers.size()));
  driver_ = std::make_shared<Driver>();
  driver_->engine = this;
  thread_ = std::thread([this] { run(); });
}

CollectiveEngine::~CollectiveEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  submitted_.notify_all();
  thread_.join();
  std::lock_guard<std::mutex> drive(driver_->turns);
  std::lock_guard<std::mutex> alive(driver_->alive);
  driver_->engine = nullptr;
}

std::vector<int> CollectiveEngine::process_set_ranks(int id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = process_sets_.find(id);
  if (found == process_sets_.end()) throw UsageError(concat("process set ", id, " does not exist (removed or never added)"));
  return found->second;
}

std::vector<int> CollectiveEngine::members_of(int set) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = process_sets_.find(set);
  return found == process_sets_.end() ? std::vector<int>{} : found->second;
}

void CollectiveEngine::new_phase() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++phase_;
  unnamed_counts_.clear();
}

void CollectiveEngine::start_timeline(const std::string& path, bool mark_cycles) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (timeline_started_ && path == timeline_path_) return;  // as Horovod: it goes on
    if (timeline_started_) {
      throw UsageError(concat("start_timeline: a timeline is being recorded to '", timeline_path_,
                              "': call stop_timeline() first"));
    }
  }
  auto timeline = std::make_unique<CollectiveTimeline>(path, mark_cycles);  // checks the path
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timeline_started_ = true;
    timeline_path_ = path;
  }
  if (workers_.rank() != 0) return;
  std::lock_guard<std::mutex> drive(driver_->turns);
  timeline_ = std::move(timeline);
}

void CollectiveEngine::stop_timeline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!timeline_started_) return;
    timeline_started_ = false;
  }
  std::unique_ptr<CollectiveTimeline> timeline;
  {
    std::lock_guard<std::mutex> drive(driver_->turns);
    timeline = std::move(timeline_);
  }
  if (timeline) timeline->write();
}

std::shared_ptr<Work> CollectiveEngine::submit(Collective call, bool caller_waits) {
  const char* what = collective_kind_name(call.kind);
  check_collective(call, workers_.size());
  auto entry = std::make_shared<Pending>();
  entry->state = std::make_shared<Work::State>();
  entry->state->patience = timeout_ * 4 + stall_ + std::chrono::seconds(60);
  entry->state->driver = driver_;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) std::rethrow_exception(broken_);
    if (stopping_) throw UsageError(concat(what, ": the worker has shut down"));
    const bool global_only = call.kind == CollectiveKind::kJoin || call.kind == CollectiveKind::kAddProcessSet ||
                             call.kind == CollectiveKind::kRemoveProcessSet;
    const int set = global_only ? 0 : call.process_set;
    if (call.kind == CollectiveKind::kRemoveProcessSet) {
      if (call.process_set == 0) throw UsageError("remove_process_set: the global process set cannot be removed");
      if (!process_sets_.count(call.process_set)) {
        throw UsageError(concat("remove_process_set: process set ", call.process_set, " does not exist"));
      }
    }
    const auto members = process_sets_.find(set);
    if (members == process_sets_.end()) {
      throw UsageError(concat(what, ": process set ", set, " does not exist (removed or never added)"));
    }
    if (!std::count(members->second.begin(), members->second.end(), workers_.rank())) {
      throw UsageError(concat(what, ": rank ", workers_.rank(), " is not in process set ", set));
    }
    if (call.kind == CollectiveKind::kBroadcast &&
        !std::count(members->second.begin(), members->second.end(), call.root)) {
      throw UsageError(concat("broadcast: root rank ", call.root, " is not in process set ", set));
    }
    if (call.kind == CollectiveKind::kAlltoall && !call.splits.empty() &&
        call.splits.size() != members->second.size()) {
      throw UsageError(concat("alltoall: splits has ", call.splits.size(), " entries, the process set has ",
                              members->second.size(), " ranks"));
    }
    if (call.kind == CollectiveKind::kJoin && joined_) throw UsageError("join: this rank has joined already");
    std::string name = call.name;
    if (call.kind == CollectiveKind::kJoin) {
      name = concat("pipesgd.join.", joins_++);  // every worker joins as often; not an unnamed one
    } else if (name.empty()) {
      entry->unnamed = unnamed_counts_[set]++;
      name = concat("noname.", *entry->unnamed);
    }
    const std::string key_text = concat(phase_, ":", set, ":", name);
    if (pending_names_.count(key_text)) {
      if (entry->unnamed) --unnamed_counts_[set];
      throw UsageError(concat("Requested to ", what, " a tensor with the same name as another tensor that is currently "
                              "being processed. If you want to request another tensor, use a different tensor name. "
                              "(name '", name, "': free again once the earlier one is synchronized)"));
    }
    call.process_set = call.kind == CollectiveKind::kRemoveProcessSet ? call.process_set : set;
    entry->name = name;
    entry->key_text = key_text;
    entry->phase = phase_;
    entry->state->name = name;
    entry->state->key_text = key_text;
    const int listed_set = set;
    entry->call = std::move(call);
    entry->row = describe(entry->call, hash_text(key_text), phase_);
    entry->row[kSet] = listed_set;
    entry->row[kUnnamed] = entry->unnamed ? static_cast<std::int64_t>(*entry->unnamed) : -1;
    entry->submitted = Clock::now();
    pending_names_[key_text] = 1;
    if (entry->call.kind == CollectiveKind::kJoin) joined_ = true;
    // The first of a burst wakes the engine thread; it collects the rest (collect_burst).
    wake = !caller_waits && incoming_.empty();
    incoming_.push_back(entry);
  }
  if (wake) submitted_.notify_all();
  return std::make_shared<Work>(entry->state);
}

void CollectiveEngine::release_name(Driver& driver, const std::string& key_text) {
  std::lock_guard<std::mutex> alive(driver.alive);
  if (driver.engine == nullptr) return;
  std::lock_guard<std::mutex> lock(driver.engine->mutex_);
  driver.engine->pending_names_.erase(key_text);
}

void CollectiveEngine::complete(Pending& entry, std::vector<torch::Tensor> results) {
  settle(entry, std::move(results), nullptr);
}

void CollectiveEngine::fail(Pending& entry, std::exception_ptr error) {
  if (entry.call.kind == CollectiveKind::kJoin) {
    std::lock_guard<std::mutex> lock(mutex_);
    joined_ = false;
  }
  settle(entry, {}, std::move(error));
}

void CollectiveEngine::settle(Pending& entry, std::vector<torch::Tensor> results, std::exception_ptr error) {
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(entry.state->mutex);
    entry.state->results = std::move(results);
    entry.state->error = std::move(error);
    entry.state->done = true;
    release = entry.state->take_name_release();
  }
  entry.state->finished.notify_all();
  if (release) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_names_.erase(entry.key_text);
  }
}

void CollectiveEngine::fail_everything(std::exception_ptr error) {
  std::vector<std::shared_ptr<Pending>> all = std::move(pending_);
  pending_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_) broken_ = error;
    for (auto& entry : incoming_) all.push_back(entry);
    incoming_.clear();
  }
  for (auto& entry : all) fail(*entry, error);
}

void CollectiveEngine::post_round_receives(std::uint64_t round) {
  if (posted_round_ == round) return;
  const Tag tag = step_tag(collective_tag(Channel::kNegotiation, round), 0, 0);
  for (int peer = 0; peer < workers_.size(); ++peer) {
    if (peer == workers_.rank()) continue;
    auto& buffer = round_buffers_[static_cast<std::size_t>(peer)];
    round_receives_[static_cast<std::size_t>(peer)] =
        workers_.recv(peer, tag, std::as_writable_bytes(std::span(buffer)), "negotiation round");
  }
  posted_round_ = round;
}

bool CollectiveEngine::drive(Driver& driver, const Work::State& state) {
  std::unique_lock<std::mutex> drive(driver.turns, std::try_to_lock);
  if (!drive.owns_lock()) return true;  // the engine thread holds the turns: try again
  if (driver.engine == nullptr) return false;
  CollectiveEngine& engine = *driver.engine;
  const auto done = [&] {
    std::lock_guard<std::mutex> lock(state.mutex);
    return state.done;
  };
  // Turns without progress (a peer's engine took part in a round before its caller submitted the
  // peer's part) are retried at once for a moment: the next round is the one both callers list it
  // in, and each is gated by the peers anyway.
  const auto patience = Clock::now() + kCallerPatience;
  bool helps = true;
  while (!done()) {
    const Turn turn = engine.take_turn();
    if (turn == Turn::kStopped || (turn != Turn::kProgressed && Clock::now() >= patience)) {
      helps = false;
      break;
    }
  }
  // What is still pending (async collectives, or this one waiting for a peer) is the engine
  // thread's again.
  bool left = !engine.pending_.empty();
  {
    std::lock_guard<std::mutex> lock(engine.mutex_);
    left = left || !engine.incoming_.empty();
  }
  if (left) engine.hand_over();
  return helps && !done();
}

void CollectiveEngine::wake(Driver& driver) {
  std::lock_guard<std::mutex> alive(driver.alive);
  if (driver.engine != nullptr) driver.engine->hand_over();
}

void CollectiveEngine::hand_over() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handed_over_ = true;
  }
  submitted_.notify_all();
}

bool CollectiveEngine::peer_started_round() {
  post_round_receives(round_);
  return std::any_of(round_receives_.begin(), round_receives_.end(),
                     [](Request& request) { return request.valid() && request.test(); });
}

bool CollectiveEngine::peer_started_round_unless_driven() {
  std::unique_lock<std::mutex> drive(driver_->turns, std::try_to_lock);
  return drive.owns_lock() && peer_started_round();
}

CollectiveEngine::Turn CollectiveEngine::take_turn() {
  torch::NoGradGuard no_grad;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : incoming_) pending_.push_back(entry);
    incoming_.clear();
    if (stopping_ || broken_) return Turn::kStopped;
  }
  try {
    if (pending_.empty()) {
      // Nothing of this rank's: take part only in a round a peer started.
      if (!peer_started_round()) return Turn::kIdle;
    }
    const std::size_t before = pending_.size();
    const std::uint64_t completed_before = collective_number_;
    run_round(round_++);
    return pending_.size() != before || collective_number_ != completed_before ? Turn::kProgressed : Turn::kStuck;
  } catch (...) {
    fail_everything(std::current_exception());
    return Turn::kStopped;
  }
}

bool CollectiveEngine::await_activity(Clock::duration limit) {
  const auto start = Clock::now();
  const auto until = limit == Clock::duration::max() ? Clock::time_point::max() : start + limit;
  const auto woken = [&] { return stopping_ || !incoming_.empty() || handed_over_; };
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (woken()) return !stopping_;
    }
    if (peer_started_round_unless_driven()) return true;
    const auto now = Clock::now();
    if (now >= until) return true;
    if (now - start < kYieldFirst) {
      // Right after a collective the next (or the peer's round) often follows within microseconds:
      // yield the core instead of sleeping, so that neither needs a futex wake-up.
      std::this_thread::yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    submitted_.wait_for(lock, std::min<Clock::duration>(pause, until - now), woken);
    // Promptly while collectives come in quick succession (a peer's round is likely soon), rarely
    // once idle for a while (the worker's compute threads own the cores).
    const bool recently_active = now - start < kIdleAfter;
    pause = std::min<std::chrono::microseconds>(pause * 2, recently_active ? kBusyPollCeiling : kIdlePollCeiling);
  }
}

bool CollectiveEngine::collect_burst() {
  const auto start = Clock::now();
  auto last_change = start;
  std::size_t last_count = 0;
  for (;;) {
    const auto now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return false;
      if (handed_over_ || incoming_.empty()) return true;
      if (incoming_.size() != last_count) {
        last_count = incoming_.size();
        last_change = now;
      }
    }
    if (now - last_change >= kBurstGap || now - start >= kBurstLimit) return true;
    if (peer_started_round_unless_driven()) return true;
    // Sleep, not spin: the submitting thread needs the core (later submissions of a burst do not
    // notify, see submit()).
    std::unique_lock<std::mutex> lock(mutex_);
    submitted_.wait_for(lock, kBurstGap, [&] { return stopping_ || handed_over_; });
  }
}

void CollectiveEngine::run() {
  auto pause = std::chrono::microseconds(0);  // after a turn without progress: the next one's delay
  for (;;) {
    Turn turn = Turn::kIdle;
    {
      std::lock_guard<std::mutex> drive(driver_->turns);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        handed_over_ = false;
      }
      turn = take_turn();
    }
    if (turn == Turn::kStopped) break;
    if (turn == Turn::kProgressed) {
      pause = std::chrono::microseconds(0);
      continue;
    }
    if (turn == Turn::kIdle) {
      pause = std::chrono::microseconds(0);
      if (!await_activity(Clock::duration::max()) || !collect_burst()) break;
      continue;
    }
    // Nothing could run: the next round starts when this rank submits, when a peer starts it (it
    // submitted what was missing), or after a growing pause.
    pause = std::min(pause * 2 + std::chrono::microseconds(100), std::chrono::microseconds(10000));
    if (!await_activity(pause)) break;
  }
  // Stopped (or the world broke: everything failed already): what is still pending fails.
  std::lock_guard<std::mutex> drive(driver_->turns);
  const auto stopped = std::make_exception_ptr(UsageError("collective: the worker shut down before it ran"));
  std::vector<std::shared_ptr<Pending>> left = std::move(pending_);
  pending_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : incoming_) left.push_back(entry);
    incoming_.clear();
  }
  for (auto& entry : left) fail(*entry, stopped);
  for (Request& request : round_receives_) request = Request();
}

void CollectiveEngine::run_round(std::uint64_t round) {
  const int me = workers_.rank();
  const int size = workers_.size();
  post_round_receives(round);
  if (timeline_) timeline_->round_started();
  // This rank's message: the header and a row per listed collective.
  const std::size_t listed = std::min<std::size_t>(pending_.size(), kRoundCapacity);
  std::vector<std::int64_t> own(static_cast<std::size_t>((listed + 1) * kWords), 0);
  // Joined: a join is among what this rank lists (not merely submitted: every rank must see the
  // join it completes).
  bool joined = false;
  for (std::size_t i = 0; i < listed; ++i) joined = joined || pending_[i]->call.kind == CollectiveKind::kJoin;
  std::uint64_t phase = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    phase = phase_;
  }
  own[0] = kMagic;
  own[1] = static_cast<std::int64_t>(listed);
  own[2] = static_cast<std::int64_t>(phase);
  own[3] = joined ? 1 : 0;
  const auto now = Clock::now();
  for (std::size_t i = 0; i < listed; ++i) {
    Row row = pending_[i]->row;
    row[kAge] = std::chrono::duration_cast<std::chrono::milliseconds>(now - pending_[i]->submitted).count();
    std::copy(row.begin(), row.end(), own.begin() + static_cast<std::ptrdiff_t>((i + 1) * kWords));
  }
  const Tag tag = step_tag(collective_tag(Channel::kNegotiation, round), 0, 0);
  std::vector<Request> requests;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != me) requests.push_back(workers_.send(peer, tag, std::as_bytes(std::span(own)), "negotiation round"));
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer != me) requests.push_back(std::move(round_receives_[static_cast<std::size_t>(peer)]));
  }
  posted_round_ = ~std::uint64_t{0};
  wait_all(requests, timeout_);
  const auto round_ended = Clock::now();

  // The table every rank reads identically.
  std::vector<const std::int64_t*> messages(static_cast<std::size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    messages[static_cast<std::size_t>(rank)] =
        rank == me ? own.data() : round_buffers_[static_cast<std::size_t>(rank)].data();
    if (messages[static_cast<std::size_t>(rank)][0] != kMagic) {
      throw CommError(concat("negotiation round ", round, ": rank ", rank, "'s message is not a negotiation round"));
    }
  }
  std::vector<std::unordered_map<std::int64_t, const Row*>> lists(static_cast<std::size_t>(size));
  std::vector<std::vector<const Row*>> rows(static_cast<std::size_t>(size));
  std::vector<bool> rank_joined(static_cast<std::size_t>(size));
  std::int64_t latest_phase = 0;
  for (int rank = 0; rank < size; ++rank) {
    const std::int64_t* message = messages[static_cast<std::size_t>(rank)];
    rank_joined[static_cast<std::size_t>(rank)] = message[3] != 0;
    latest_phase = std::max(latest_phase, message[2]);
    if (rank_joined[static_cast<std::size_t>(rank)] && join_round_[static_cast<std::size_t>(rank)] < 0) {
      join_round_[static_cast<std::size_t>(rank)] = static_cast<std::int64_t>(round);
    }
    for (std::int64_t i = 0; i < message[1]; ++i) {
      const Row* row = reinterpret_cast<const Row*>(message + (i + 1) * kWords);
      rows[static_cast<std::size_t>(rank)].push_back(row);
      lists[static_cast<std::size_t>(rank)].emplace((*row)[0], row);
      if (timeline_) timeline_->listed((*row)[0], rank, round_ended);
    }
  }
  if (timeline_) {
    std::set<std::int64_t> listed_now;
    for (const auto& list : lists) {
      for (const auto& [key, row] : list) listed_now.insert(key);
    }
    timeline_->keep_only(listed_now);
  }
  std::unordered_map<std::int64_t, std::shared_ptr<Pending>> mine;
  for (std::size_t i = 0; i < listed; ++i) mine.emplace(pending_[i]->row[0], pending_[i]);
  const auto remove = [&](const std::shared_ptr<Pending>& entry) {
    pending_.erase(std::find(pending_.begin(), pending_.end(), entry));
  };

  std::set<std::int64_t> ready;
  bool progressed = false;
  for (int lister = 0; lister < size; ++lister) {
    for (const Row* row : rows[static_cast<std::size_t>(lister)]) {
      const std::int64_t key = (*row)[0];
      const auto kind = static_cast<CollectiveKind>((*row)[1]);
      if (kind == CollectiveKind::kJoin || ready.count(key)) continue;
      const std::vector<int> members = members_of(static_cast<int>((*row)[kSet]));
      if (members.empty()) continue;  // an empty set: no worker can submit on it
      bool all = true;
      std::vector<const Row*> listers;
      std::vector<int> absent_joined;
      for (const int member : members) {
        const auto found = lists[static_cast<std::size_t>(member)].find(key);
        if (found != lists[static_cast<std::size_t>(member)].end()) {
          listers.push_back(found->second);
        } else if (rank_joined[static_cast<std::size_t>(member)] && kind != CollectiveKind::kAddProcessSet &&
                   kind != CollectiveKind::kRemoveProcessSet) {
          absent_joined.push_back(member);
        } else {
          all = false;
        }
      }
      if (!all) continue;
      ready.insert(key);
      progressed = true;
      const std::uint64_t number = collective_number_++;
      if (!std::count(members.begin(), members.end(), me)) continue;
      std::shared_ptr<Pending> entry;
      if (const auto found = mine.find(key); found != mine.end()) entry = found->second;
      if (!entry && (*row)[kUnnamed] >= 0 && (*row)[kPhase] == static_cast<std::int64_t>(phase)) {
        // Joined here: count the unnamed collective this rank stood in for, so that its unnamed
        // collectives stay in step with its peers' once it goes on.
        std::lock_guard<std::mutex> lock(mutex_);
        std::uint64_t& count = unnamed_counts_[static_cast<int>((*row)[kSet])];
        count = std::max<std::uint64_t>(count, static_cast<std::uint64_t>((*row)[kUnnamed]) + 1);
      }
      const std::string mismatch = mismatch_message(listers);
      if (entry) remove(entry);
      if (!mismatch.empty()) {
        if (entry) {
          fail(*entry, std::make_exception_ptr(CollectiveMismatchError(concat(mismatch, " (collective '", entry->name, "')"))));
        }
        continue;
      }
      const auto op = static_cast<ReduceOp>((*row)[2]);
      const bool joined_may_take_part =
          kind == CollectiveKind::kBarrier ||
          (kind == CollectiveKind::kAllreduce && (op == ReduceOp::kSum || op == ReduceOp::kAverage));
      if (!absent_joined.empty() && !joined_may_take_part) {
        if (entry) {
          fail(*entry, std::make_exception_ptr(CollectiveMismatchError(concat(
                           collective_kind_name(kind), " '", entry->name, "': rank ", absent_joined.front(),
                           " has joined (hvd.join) and cannot take part in a ", collective_kind_name(kind),
                           reduce_op_name(op) == std::string("Sum") || kind != CollectiveKind::kAllreduce
                               ? ""
                               : concat(" with ", reduce_op_name(op)),
                           ": only allreduce with Sum or Average and barrier go on while ranks have joined"))));
        }
        continue;
      }
      try {
        if (entry) {
          if (timeline_) timeline_->decided(key, kind, entry->name, entry->submitted, round_ended);
          execute(*entry, number, members, false);
        } else {
          // This rank has joined: it takes part with zeros (an allreduce) or nothing (a barrier).
          Pending stand_in;
          stand_in.call.kind = kind;
          stand_in.call.op = op;
          stand_in.call.process_set = static_cast<int>((*row)[kSet]);
          if (kind == CollectiveKind::kAllreduce) {
            stand_in.call.input = torch::zeros({(*row)[kElements]}, torch::TensorOptions().dtype(
                                                  scalar_type_of(static_cast<ElementType>((*row)[3]))));
          }
          stand_in.state = std::make_shared<Work::State>();
          execute(stand_in, number, members, true);
        }
      } catch (const CommError&) {
        if (entry) fail(*entry, std::current_exception());
        throw;
      }
    }
  }
  // Join: complete once every worker has joined; the result is the last to join.
  if (std::all_of(rank_joined.begin(), rank_joined.end(), [](bool j) { return j; })) {
    int last = 0;
    for (int rank = 0; rank < size; ++rank) {
      if (join_round_[static_cast<std::size_t>(rank)] >= join_round_[static_cast<std::size_t>(last)]) last = rank;
    }
    std::fill(join_round_.begin(), join_round_.end(), -1);
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i]->call.kind != CollectiveKind::kJoin) continue;
      std::shared_ptr<Pending> entry = pending_[i];
      remove(entry);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        joined_ = false;
      }
      complete(*entry, {torch::tensor(static_cast<std::int64_t>(last))});
      break;
    }
    progressed = true;
  }
  if (progressed) return;

  // Nothing could run. What a rank lists while a member does not fails on it if it is of an earlier
  // phase than some rank's, if it waited longer than the timeout, or, once every rank has listed
  // such a collective for longer than the stall limit (every rank computes the same), all of it.
  const auto stall_ms = static_cast<std::int64_t>(stall_.count());
  bool deadlocked = true;
  for (int rank = 0; rank < size && deadlocked; ++rank) {
    bool waiting = false;
    for (const Row* row : rows[static_cast<std::size_t>(rank)]) {
      if (static_cast<CollectiveKind>((*row)[1]) != CollectiveKind::kJoin && (*row)[kAge] > stall_ms) waiting = true;
    }
    deadlocked = waiting;
  }
  std::map<int, std::set<std::uint64_t>> given_back;
  std::vector<std::pair<std::shared_ptr<Pending>, std::exception_ptr>> failing;
  std::vector<std::shared_ptr<Pending>> listed_entries(pending_.begin(),
                                                       pending_.begin() + static_cast<std::ptrdiff_t>(listed));
  for (const std::shared_ptr<Pending>& entry : listed_entries) {
    if (entry->call.kind == CollectiveKind::kJoin) {
      // A join waits for every worker, however long their data lasts, unless a peer went on to a
      // later phase without joining.
      if (static_cast<std::int64_t>(entry->phase) < latest_phase) {
        remove(entry);
        fail(*entry, std::make_exception_ptr(CollectiveMismatchError(
                         "join: a rank called init() again (a new phase) without joining")));
      }
      continue;
    }
    const std::int64_t age_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - entry->submitted).count();
    const bool earlier_phase = static_cast<std::int64_t>(entry->phase) < latest_phase;
    const bool too_old = age_ms > timeout_.count();
    if (!deadlocked && !earlier_phase && !too_old) continue;
    std::vector<int> missing;
    for (const int member : members_of(entry->call.process_set)) {
      if (!lists[static_cast<std::size_t>(member)].count(entry->row[0])) missing.push_back(member);
    }
    std::string ranks_text;
    for (std::size_t k = 0; k < missing.size(); ++k) ranks_text += (k ? ", " : "") + std::to_string(missing[k]);
    const std::string subject = concat("Mismatched collectives: '", entry->name, "' (",
                                       collective_kind_name(entry->call.kind), ") was not submitted by rank",
                                       missing.size() > 1 ? "s " : " ", ranks_text);
    std::exception_ptr error;
    if (earlier_phase) {
      error = std::make_exception_ptr(CollectiveMismatchError(concat(
          subject, " before ", missing.size() == 1 ? "it" : "they",
          " called init() again (a new phase) (the ranks issued different collectives)")));
    } else if (deadlocked) {
      error = std::make_exception_ptr(CollectiveMismatchError(concat(
          subject, " within ", stall_.count() / 1000.0, " s (the ranks issued different collectives)")));
    } else {
      error = std::make_exception_ptr(CommTimeoutError(concat(subject, " within ", timeout_.count() / 1000.0,
                                                              " s (timeout)"),
                                                       missing.empty() ? -1 : missing.front()));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (entry->unnamed && entry->phase == phase_) given_back[entry->call.process_set].insert(*entry->unnamed);
    }
    remove(entry);
    failing.emplace_back(entry, error);
  }
  {
    // Numbers go back before the callers learn of the failure (they may submit again at once).
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [set, numbers] : given_back) {
      std::uint64_t& count = unnamed_counts_[set];
      while (count > 0 && numbers.count(count - 1)) --count;
    }
  }
  for (auto& [entry, error] : failing) fail(*entry, error);
}

void CollectiveEngine::execute(Pending& entry, std::uint64_t number, const std::vector<int>& members, bool joined_here) {
  const Collective& call = entry.call;
  if (call.kind == CollectiveKind::kAddProcessSet) {
    const int id = next_process_set_++;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      process_sets_[id] = call.ranks;
    }
    complete(entry, {torch::tensor(static_cast<std::int64_t>(id))});
    return;
  }
  if (call.kind == CollectiveKind::kRemoveProcessSet) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      process_sets_.erase(call.process_set);
    }
    set_channels_.erase(call.process_set);
    complete(entry, {});
    return;
  }
  SetChannel& channel = set_channels_[call.process_set];
  if (!channel.group) channel.group = std::make_unique<RankGroupTransport>(workers_, members);
  std::vector<torch::Tensor> results;
  try {
    const auto start = Clock::now();
    results = run_collective(call, *channel.group, members, number, timeout_, channel.resources);
    if (timeline_ && !joined_here) {
      const std::uint64_t bytes = call.input.defined() ? call.input.nbytes() : 0;
      timeline_->ran(call.kind, entry.name, number, bytes, start, Clock::now());
    }
  } catch (const CommError&) {
    throw;
  } catch (...) {
    if (!joined_here) fail(entry, std::current_exception());
    return;
  }
  if (!joined_here) complete(entry, std::move(results));
}

}  // namespace pipesgd
