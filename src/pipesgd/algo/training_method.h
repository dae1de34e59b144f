#pragma once
// The interface every training method implements, and what drives it: the trainer's loop and the
// tests (a method knows nothing of either). The calls are the same for every
// method:
//
//   gradients = method.begin_iteration(t, times)   // wait for / apply what iteration t needs
//   model.forward_backward(batch, gradients, ...)    // reports segments ready in backward order
//   method.end_iteration(t, times)                   // communicate (and update, if synchronous)
//   ...
//   method.finish(times)                             // apply what is still in flight
//
// All calls come from the worker's compute thread. A method that communicates off the compute
// thread does so through a CommWorker (comm/comm_worker.h). Methods are built through the registry
// (algo/registry.h) from a MethodContext (algo/method_descriptor.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "pipesgd/algo/iteration_times.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/checksum.h"
#include "pipesgd/core/model.h"
#include "pipesgd/optim/optimizer_interface.h"

namespace pipesgd {

class MethodReport;

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
  // The callback to pass to Model::forward_backward (called on the compute thread, once per segment
  // in backward order), or nullptr if the method does not need readiness reports.
  virtual const SegmentReadyFn* segment_ready() { return nullptr; }
  // What the method says about its run (algo/method_report.h); rank 0's is reported.
  virtual std::shared_ptr<MethodReport> report() const = 0;
  // A checksum of what every replica of a synchronous method holds identically between iterations
  // (--check-consistency): the model's parameters, unless the method keeps its true weights
  // elsewhere (sapipe's weight prediction).
  virtual std::uint64_t replica_checksum(FlatParameters& model) const { return checksum_of(model.parameters()); }
  // The tag sequence of iteration t's first gradient allreduce (Channel::kGradients), or for a
  // parameter-server method the version its push of iteration t carries, when the method's tags
  // tell the iteration; nullopt otherwise. (For tools that watch the wire: --inject-fault.)
  virtual std::optional<std::uint64_t> first_message_sequence(std::int64_t) const { return std::nullopt; }
  // The optimizer that applies this method's updates, whose state (momentum, moments) `auto`
  // (algo/auto/) hands to the method it switches to after finish(); nullptr if the method has none.
  virtual Optimizer* optimizer() { return nullptr; }
  // What a planning method computed its current plan from (averaged over the workers), once it
  // planned; nullopt before, or for a method that plans nothing. (`auto` chooses from it.)
  virtual std::optional<PlanningInputs> planning_inputs() const { return std::nullopt; }
  // Checkpoints (--checkpoint-dir). save_state, called after end_iteration(t), writes what this
  // worker's method needs to go on exactly with iteration t + 1 (it waits for the communication in
  // flight, applying nothing); load_state, called on a freshly built method before
  // begin_iteration(t + 1) and after the model's parameters were restored, reads it back, throwing
  // DataError naming the file for anything the file holds that this method cannot continue from.
  // The model's parameters are saved by the trainer. Every method implements both.
  virtual void save_state(CheckpointWriter& out) = 0;
  virtual void load_state(const CheckpointReader& in, std::int64_t next_iteration) = 0;
  // A commit that need not wait (--restarts' in-memory commits, train/elastic.h): the state
  // save_state(out) would write, handed to `ready` on the compute thread once complete. By default
  // at once; a method with communication in flight at the boundary may hand it over later, when
  // that communication completed on its own (at the latest in finish() or a later save_state; a
  // method destroyed first drops it: that commit never completes). `bytes_sent`: the transport's
  // count at the boundary with the boundary's communication done (nullopt: read it now).
  using CommitReady = std::function<void(CheckpointWriter part, std::optional<std::uint64_t> bytes_sent)>;
  virtual void save_state_when_ready(CheckpointWriter out, const CommitReady& ready) {
    save_state(out);
    ready(std::move(out), std::nullopt);
  }
};

}  // namespace pipesgd
