#pragma once
// The interface every training method implements, and what the trainer loop calls. The loop is the
// same for every method:
//
//   gradients = method.begin_iteration(t, times)   // wait for / apply what iteration t needs
//   model.forward_backward(batch, gradients, ...)    // reports segments ready in backward order
//   method.end_iteration(t, times)                   // communicate (and update, if synchronous)
//   ...
//   method.finish(times)                             // apply what is still in flight
//
// All calls come from the worker's compute thread. A method may own a comm thread of its own.
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/checksum.h"
#include "pipesgd/core/model.h"
#include "pipesgd/optim/delay_compensation.h"
#include "pipesgd/optim/optimizer.h"
#include "pipesgd/optim/sgd.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/timing/bucket_plan.h"
#include "pipesgd/timing/partial_staleness.h"

namespace pipesgd {

// Per-iteration measurements of one worker, in seconds unless named otherwise.
struct IterationTimes {
  double update = 0;     // optimizer step(s) on the compute thread
  double data = 0;       // loading the batch (Alg. 1 line 6)
  double forward = 0;
  double backward = 0;
  double compensation = 0;  // sapipe: the stale range's compensated update and weight prediction
  double wait = 0;       // exposed communication: compute thread blocked on communication
  double comm = 0;       // allreduce time on the thread that ran it (consumed this iteration)
  double iteration = 0;  // whole iteration on the compute thread
  double checkpoint = 0; // this worker's checkpoint after the iteration (its state copied; in `iteration`)
  double loss = 0;
  bool pipelined = false;  // false during warm-up / for synchronous methods

  // Adds weight * other to every timing and the loss (for means over workers and iterations).
  void add_scaled(const IterationTimes& other, double weight) {
    update += weight * other.update;
    compensation += weight * other.compensation;
    data += weight * other.data;
    forward += weight * other.forward;
    backward += weight * other.backward;
    wait += weight * other.wait;
    comm += weight * other.comm;
    iteration += weight * other.iteration;
    checkpoint += weight * other.checkpoint;
    loss += weight * other.loss;
  }
};

struct MethodConfig {
  std::string name = "dsync";   // one of method_names()
  // Parameter-server methods (algo/ps_methods.h): the number S of server ranks, the last S ranks of
  // the method's transport. 0 for the other methods.
  int servers = 0;
  std::string codec = "none";
  int staleness = 2;            // K, pipe only
  // pipe: iterations run as D-Sync first; odsgd: iterations trained on the synchronous global
  // weights (algo/od_sgd.h).
  std::int64_t warmup_iterations = 0;
  SgdOptions sgd;
  // dcasgd: the servers' delay compensation (--dc-variant, --dc-lambda, --dc-momentum); odsgd's
  // dcasgd-* local updaters use its lambda and m (their variant is the updater's).
  DelayCompensationOptions delay_compensation;
  // odsgd: the workers' local updater (--local-updater: sgd, dcasgd-c, dcasgd-a) and its learning
  // rate (--local-lr; 0 = sgd.learning_rate).
  std::string local_updater = "sgd";
  float local_learning_rate = 0;
  // segment_bytes kAutoSegmentBytes lets the method choose: D-Sync segments (kDefaultSegmentBytes),
  // because the allreduce is on its critical path and segmenting overlaps reduction with transfer;
  // Pipe-SGD sends whole chunks (kUnsegmented), as its paper concludes from Eq. 5 vs 6: each segment
  // adds latency and synchronisation, and the whole allreduce is hidden behind compute anyway.
  AllreduceOptions allreduce{std::chrono::seconds(120), kAutoSegmentBytes};
  // Allreduce algorithm (collective/allreduce_factory.h) or "auto": the least predicted time for
  // the gradient's size from `calibration` (nullptr: default_link_parameters()).
  std::string allreduce_algorithm = "ring";
  std::shared_ptr<const Calibration> calibration;
  // Layer-wise communication (algo/bucketed_dsync.h), dsync only: the bucket plan
  // (timing/bucket_plan.h: wfbp, single, mgwfbp, optimal, fixed:<MiB>; "" = one allreduce after
  // backward on the compute thread, the classic D-Sync), the iterations profiled before planning,
  // how often to replan (0: never), and the cost model a + b·M of one allreduce the plans use
  // (set by the trainer: train/planning.h).
  std::string buckets;
  std::int64_t profile_iterations = 10;
  std::int64_t replan_every = 0;
  LinearCost bucket_cost;
  // sapipe (algo/sapipe.h): how many first layers are stale ("auto" or a count, --stale-layers) and
  // their compensation (--compensation: none, dc, wp1, wp2, wp3; dc and wp3 use
  // delay_compensation.lambda). Its synchronous layers use `buckets` (default optimal),
  // `profile_iterations` and `bucket_cost`; `warmup_iterations` run synchronously first.
  std::string stale_layers = "auto";
  std::string compensation = "none";
  // The optimizer of dsync, pipe, the layer-wise methods and sapipe (--optimizer): "sgd" (`sgd`) or
  // "adam" (`adam`, its learning rate from sgd.learning_rate). The parameter-server methods run SGD.
  std::string optimizer = "sgd";
  AdamOptions adam;
};

// The optimizer options `config` asks for (Adam's learning rate is --lr).
OptimizerOptions optimizer_options(const MethodConfig& config);

// One stall check of sapipe's --stale-layers auto (algo/sapipe.h).
struct StallCheck {
  std::int64_t iteration = 0;      // the check ran at the end of this iteration
  std::size_t stale_layers = 0;    // k checked
  double stall_fraction = 0;       // computation's wait / iteration time (mean over the workers)
  double cost_scale = 1;           // measured / modelled communication
  std::size_t next_stale_layers = 0;  // k after the check (== stale_layers: kept)
};

// What sapipe reports about its partition (algo/sapipe.h).
struct SapipeReport {
  std::size_t layers = 0;
  std::size_t stale_layers = 0;  // k
  double stale_fraction = 0;     // kappa = stale parameters / all parameters (sapipe.txt Def. 1)
  bool automatic = false;        // k from the timeline (--stale-layers auto) or given
  std::string compensation;
  std::int64_t bounded_compensations = 0;  // dc/wp3 updates whose DC scalar was bounded
  std::int64_t pipeline_start = 0;  // the first pipelined iteration
  bool profiled = false;            // the fields below are set
  std::optional<std::size_t> paper_stale_layers;  // the paper's program (Sec. 3.1) on the same profile
  double predicted_iteration = 0;  // the simulated steady-state iteration with k (without update)
  bool predicted_stall = false;     // even k stalls on the timeline
  std::size_t timeline_stale_layers = 0;  // auto: k from the timeline, before the stall checks
  std::vector<StallCheck> stall_checks;
  StalenessProfile profile;         // averaged over the workers
  LinearCost cost;
};

// The methods that are D-Sync with a fixed bucket plan (mg-wfbp.txt's names): wfbp -> "wfbp",
// synceasgd -> "single", mgwfbp -> "mgwfbp"; "" for any other name.
std::string implied_bucket_plan(const std::string& method);

// True if `config` runs layer-wise D-Sync (algo/bucketed_dsync.h): dsync with a plan, or a method
// whose name implies one. (sapipe's synchronous layers use plans too, but it is its own method.)
inline bool layer_wise(const MethodConfig& config) {
  return (config.name == "dsync" && !config.buckets.empty()) || !implied_bucket_plan(config.name).empty();
}

inline constexpr int kMaxStaleness = 64;  // upper bound of --staleness-k

// The allreduce algorithm `config` runs for `bytes` per rank on `world_size` ranks: "auto" resolved
// through the cost model. Throws UsageError for an unknown name.
std::string resolve_allreduce_algorithm(const MethodConfig& config, int world_size, double bytes);

// Builds the method's gradient allreduce for `count` elements (algorithm resolved as above).
std::unique_ptr<Allreduce> make_method_allreduce(const MethodConfig& config, Transport& transport,
                                                 std::size_t count, const Codec& codec);

// Segment size `auto` stands for with method `name` (see MethodConfig::allreduce).
inline std::size_t default_segment_bytes(const std::string& name) {
  return name == "pipe" ? kUnsegmented : kDefaultSegmentBytes;
}

// The options `config`'s method runs its allreduce with: `auto` segmenting resolved.
inline AllreduceOptions resolve_allreduce_options(const MethodConfig& config) {
  AllreduceOptions options = config.allreduce;
  if (options.segment_bytes == kAutoSegmentBytes) options.segment_bytes = default_segment_bytes(config.name);
  return options;
}

// What a method says about its communication at the end of a run.
struct MethodReport {
  std::string plan;                 // the bucket plan in use ("" for methods without buckets)
  std::size_t allreduce_calls = 0;  // gradient allreduces per iteration (0: not an allreduce method)
  double predicted_iteration = 0;   // the plan's timeline + update from its profile (0: none)
  double predicted_non_overlapped = 0;  // the plan's t_c^no (Eq. 8 / 21 minus t_f + t_b)
  // Layer-wise methods, once planned: what the plan was computed from (averaged over the workers).
  bool planned = false;
  LayerProfile profile;
  LinearCost cost;
  double update_seconds = 0;
  std::optional<SapipeReport> sapipe;  // sapipe runs
};

class TrainingMethod {
 public:
  virtual ~TrainingMethod() = default;
  // Prepares iteration t (0-based): waits for and applies the updates t depends on. Returns the
  // buffer backward must write this iteration's local gradient into.
  virtual std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) = 0;
  // Called once forward/backward of iteration t wrote the local gradient.
  virtual void end_iteration(std::int64_t t, IterationTimes& times) = 0;
  // Applies every update still in flight (pipelined methods); the model's parameters are final after.
  virtual void finish(IterationTimes& times) = 0;
  // The callback the trainer passes to Model::forward_backward (called on the compute thread, once
  // per segment in backward order), or nullptr if the method does not need readiness reports.
  virtual const SegmentReadyFn* segment_ready() { return nullptr; }
  virtual MethodReport report() const { return {}; }
  // A checksum of what every replica of a synchronous method holds identically between iterations
  // (--check-consistency): the model's parameters, unless the method keeps its true weights
  // elsewhere (sapipe's weight prediction).
  virtual std::uint64_t replica_checksum(Model& model) const { return checksum_of(model.parameters()); }
  // The tag sequence of iteration t's first gradient allreduce (Channel::kGradients), or for a
  // parameter-server method the version its push of iteration t carries, when the method's tags
  // tell the iteration; nullopt otherwise. (For tools that watch the wire: --inject-fault.)
  virtual std::optional<std::uint64_t> first_message_sequence(std::int64_t) const { return std::nullopt; }
  // Checkpoints (--checkpoint-dir). save_state, called after end_iteration(t), writes what this
  // worker's method needs to go on exactly with iteration t + 1 (it waits for the communication in
  // flight, applying nothing); load_state, called on a freshly built method before
  // begin_iteration(t + 1), reads it back, throwing DataError naming the file for anything the
  // file holds that this method cannot continue from. The model's parameters are saved by the
  // trainer. Every method implements both.
  virtual void save_state(CheckpointWriter& out) = 0;
  virtual void load_state(const CheckpointReader& in, std::int64_t next_iteration) = 0;
};

// Methods whose replicas hold identical weights between iterations (dsync and its plans, pipe,
// sapipe, pssync): --check-consistency stops them at the first difference. (asgd, dcasgd and odsgd
// replicas differ by design.)
bool replicas_identical(const std::string& method);

// Names accepted for --algo in this build.
std::vector<std::string> method_names();

// Builds a method for one worker. `model` and `transport` must outlive it. Throws UsageError for an
// unknown method or codec, or K < 1. For the parameter-server methods `transport` is the run's full
// transport (workers and servers); for the others it holds exactly the workers.
std::unique_ptr<TrainingMethod> make_training_method(const MethodConfig& config, Model& model,
                                                     Transport& transport);

}  // namespace pipesgd
