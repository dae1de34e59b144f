#pragma once
// DistributedOptimizer: trains a user's torch::nn::Module in the user's own loop with any pipesgd
// method, given as the CLI's method spec ("dsync", "pipe+int8", "wfbp", "dsync+optimal",
// "sapipe+wp3", "pssync", "asgd", "odsgd", ...) and the CLI's option flags.
//
// The loop (one DistributedOptimizer per worker, built by every worker at the same point):
//
//   pipesgd::DistributedOptimizer opt(worker, model, "pipe+int8", options);
//   for (...) {
//     torch::Tensor loss = loss_fn(model->forward(x), y);   // this worker's batch
//     loss.backward();                                       // gradients go to the flat buffer
//     opt.step();                                            // what the method does between iterations
//   }
//   opt.finish();   // applies every update still in flight; the parameters are final after it
//
// What the constructor does: takes the module's parameters that require grad, grouped into layers
// (a layer = a submodule that owns parameters directly, in module registration order), broadcasts
// worker 0's parameters and buffers to every worker (options.broadcast_initial_parameters), moves
// the parameters into one flat float32 buffer and rebinds them as views of it, and arms the first
// backward. Parameters must be float32 CPU tensors; a module without parameters that require grad
// is a UsageError.
//
// The first step() (the readiness rebuild): the first backward runs on this initial layout while
// autograd hooks on the parameters record the order in which the layers' gradients become ready.
// step() then takes worker 0's order (so every replica agrees), rebinds the parameters to a new
// flat buffer with the layers in forward order = reverse order of backward completion (as DDP
// rebuilds its buckets; layers that got no gradient come first), builds the method on it (the
// parameter servers get the layout and the initial weights now), and hands it the first
// iteration's gradient, permuted to the new layout, reporting the layers in backward order with the
// backward times measured. From the second step on, backward writes straight into the method's
// gradient buffer (gradient-as-bucket-view) and each layer is reported to the method as soon as
// its gradient is complete, so overlapping methods (wfbp, layer-wise dsync, sapipe) start
// communicating during backward.
//
// step(): the method's end of iteration t (communicate; synchronous methods update) and the
// beginning of t+1 (wait for and apply the updates t+1 depends on), then arms the next backward.
// A C++ module gives no hook before a layer's forward, so a method that would apply a layer's
// update just before that layer's forward (SAPipe's synchronous layers) applies every pending
// update in step(), before the next forward, unless options.forward_hooks is set: the caller then
// calls before_layer_forward(layer) before each layer's forward (the Python front end does, from
// forward pre-hooks), and the update waits until then; layers the forward did not reach are
// brought up to date in the next step().
//
// Gradients (zero_grad semantics): each step() leaves a zeroed gradient buffer armed, so calling
// zero_grad() is not needed (it zeroes the armed buffer again and is harmless before backward).
// options.backward_passes_per_step backwards per step (default 1) accumulate (sum) into the buffer;
// each layer is reported to the method after its last pass. Further backwards add into the buffer
// but are not reported, and methods that communicate during backward have already sent the layer. The parameters' .grad() are views of the buffer between backward and step();
// they read as undefined outside that window. Changing .grad() or the parameters by hand between
// backward and step() is not supported.
//
// Your optimizer applies the update (Horovod's and DDP's contract): build the optimizer with your
// torch::optim optimizer (the constructor that takes it), or give options.optimizer = "external".
// Then the method does not update the parameters itself: each step it produces the gradient to
// apply at this step (D-Sync and the layer-wise plans: this iteration's average; Pipe-SGD: that of
// iteration t-K; SAPipe+dc/none: stale or synchronous per layer, compensated) and hands it over as
// the parameters' .grad() (undefined for a layer that gets no update this step, e.g. during
// Pipe-SGD's first K-1 steps), and your optimizer's step() applies it, with its own rule, state,
// parameter groups and learning rate:
//
//   torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   pipesgd::DistributedOptimizer opt(worker, model, adamw, "pipe");
//   for (...) {
//     loss.backward();
//     opt.synchronize_gradients();   // optional: the gradients to apply are in .grad() now
//     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);   // edits are applied
//     opt.step();                    // adamw.step() on them, then the next backward armed
//   }
//   opt.finish();                    // the updates in flight, each applied by adamw
//
// With "external" and no torch::optim optimizer (the Python front end), the caller applies the
// .grad() between synchronize_gradients() and step(), and set_apply_callback() gives what applies
// several updates at once (finish). Methods whose servers apply the update (pssync, asgd, dcasgd,
// odsgd) and SAPipe's weight prediction (which needs the update rule) are a UsageError here.
// The state to save is then taken between step() and the next backward by save_state().
//
// Saving and restoring (resume; starting every worker from one state): step_and_save_state() is
// step() that also returns the optimizer's state at the step's boundary, load_state() continues
// from such a state on a new optimizer, and broadcast_optimizer_state() gives every worker root's.
// See OptimizerState below.
//
// Models other than a torch::nn::Module of this process (the Python front end's): the constructor
// that takes the layers (DistributedOptimizer::Layer) directly.
//
// Threads: used by its worker's thread only. Errors: UsageError with the CLI's one-line message
// for a bad spec, flag or hyper-parameter; CommError for a peer (timeouts from options.timeout).
// After an exception the optimizer is unusable (destroy it).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pipesgd/world.h"

namespace pipesgd {

// The whole state of a DistributedOptimizer at a step boundary, what it needs to go on exactly with
// the next step: the iteration, the layers' order in the flat buffer, the flat parameters as they
// are between the method's end of one iteration and the beginning of the next (where the CLI's
// --checkpoint-dir saves), and the method's own state (momentum or Adam moments, the pipeline's
// updates in flight, SAPipe's stale gradients, the codecs' residuals, ...). Opaque bytes in
// pipesgd's checkpoint format (checksummed): store them as they are, e.g. in a file per worker.
struct OptimizerState {
  std::vector<std::byte> bytes;
};

struct DistributedOptimizerOptions {
  // "sgd" (momentum, weight decay as torch::optim::SGD, dampening 0, no Nesterov) or "adam"
  // (torch::optim::Adam semantics; learning_rate and weight_decay are its lr and L2). The
  // parameter-server methods' servers run SGD only, as in the CLI (--optimizer is theirs to reject).
  // "external": your optimizer applies the updates (see the top).
  std::string optimizer = "sgd";
  float learning_rate = 0.1f;  // --lr
  float momentum = 0.0f;       // --momentum (SGD)
  float weight_decay = 0.0f;   // --weight-decay
  float adam_beta1 = 0.9f, adam_beta2 = 0.999f, adam_eps = 1e-8f;  // --adam-beta1/2, --adam-eps
  // Every wait on a peer (--comm-timeout).
  std::chrono::milliseconds timeout{120000};
  // The method's option flags exactly as the CLI takes them: {"--staleness-k", "2"},
  // {"--warmup-iters", "0"}, {"--codec", "int8"}, ... (the leading "--" may be left out). A flag the
  // method does not take is the CLI's UsageError.
  std::map<std::string, std::string> flags;
  // What --warmup-epochs and the step/multistep schedules count in: the iterations (step() calls)
  // of one epoch of the user's loop (0: unknown; --warmup-epochs is then a UsageError).
  std::int64_t iterations_per_epoch = 0;
  // The run's total iterations (step() calls), which the cosine schedule anneals over (0: unknown).
  std::int64_t total_iterations = 0;
  // Learning-rate schedule, as the CLI's --lr-schedule / --lr-warmup (docs/user-guide.md,
  // "Learning-rate schedules"); it scales the learning rate of the update of step() t (0-based),
  // the servers' too:
  //   "constant"                    needs nothing
  //   "step:EVERY:GAMMA"            needs iterations_per_epoch >= 1
  //   "multistep:E1,E2,..:GAMMA"    needs iterations_per_epoch >= 1
  //   "cosine"                      needs total_iterations >= 1
  // lr_warmup_iterations (>= 0) ramps the rate linearly over the first steps with any schedule.
  // A malformed schedule, or a missing length, is a one-line UsageError from the constructor, e.g.
  // "lr_schedule 'step:1:0.5' needs DistributedOptimizerOptions::iterations_per_epoch (...), got 0".
  //   "external"                    the caller sets the rate before each step: set_learning_rate(lr)
  //                                 (no warm-up; learning_rate is the rate before the first set, > 0)
  std::string lr_schedule = "constant";
  std::int64_t lr_warmup_iterations = 0;
  // Backward passes whose gradients one step() sums (gradient accumulation), >= 1.
  int backward_passes_per_step = 1;
  // How the workers' gradients combine: their mean (kAverage) or their sum (kSum: each worker's
  // gradient is multiplied by the worker count before the method averages it).
  ReduceOp gradient_reduction = ReduceOp::kAverage;
  // The caller calls before_layer_forward(layer) before each layer's forward (see the top).
  bool forward_hooks = false;
  // Broadcast worker 0's parameters and buffers at construction (Worker::broadcast_parameters).
  bool broadcast_initial_parameters = true;
  // The workers that train this model together: a process set (Worker::add_process_set; 0 = every
  // worker). Only its members construct the optimizer; the method runs over them alone (its
  // collectives, the initial broadcast from the set's lowest rank, the Sum multiplier), so disjoint
  // sets train independent replicas at once. Parameter-server methods take the global set only.
  int process_set = 0;
};

class DistributedOptimizer {
 public:
  // A layer of a model given as layers: a name, unique in the model, and its parameters (distinct
  // float32 CPU tensors that require grad), in the model's forward order.
  struct Layer {
    std::string name;
    std::vector<torch::Tensor> parameters;
  };
  // See the top of this header. `worker` and `module` must outlive the optimizer.
  DistributedOptimizer(Worker& worker, torch::nn::Module& module, const std::string& method_spec,
                       const DistributedOptimizerOptions& options = {});
  template <typename ModuleType>
  DistributedOptimizer(Worker& worker, torch::nn::ModuleHolder<ModuleType>& module, const std::string& method_spec,
                       const DistributedOptimizerOptions& options = {})
      : DistributedOptimizer(worker, *module, method_spec, options) {}
  // Your optimizer applies the updates (options.optimizer becomes "external"; its hyper-parameter
  // fields are not used). `optimizer` must hold the module's parameters and outlive this object.
  DistributedOptimizer(Worker& worker, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                       const std::string& method_spec, DistributedOptimizerOptions options = {});
  template <typename ModuleType>
  DistributedOptimizer(Worker& worker, torch::nn::ModuleHolder<ModuleType>& module, torch::optim::Optimizer& optimizer,
                       const std::string& method_spec, const DistributedOptimizerOptions& options = {})
      : DistributedOptimizer(worker, *module, optimizer, method_spec, options) {}
  // A model given as its layers (the module's constructor finds them: every submodule that owns
  // parameters directly). options.broadcast_initial_parameters broadcasts these parameters (not
  // buffers: broadcast those with Worker::broadcast). UsageError for no layers, an empty or
  // repeated layer name, a parameter in two layers.
  DistributedOptimizer(Worker& worker, std::vector<Layer> layers, const std::string& method_spec,
                       const DistributedOptimizerOptions& options = {});
  // Leaves the module's parameters as they are (ordinary tensors again). Does not finish(): without
  // finish() the updates in flight are dropped and parameter servers see this worker vanish.
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // With the method's own optimizer: see the top. With yours: the method's step unless
  // synchronize_gradients() ran it already, your optimizer's step() on the handed-over .grad(), and
  // the next backward armed.
  void step();
  // With your optimizer: the method's step (communication), leaving the gradients to apply in the
  // parameters' .grad(), readable and editable until step(). Idempotent until step().
  void synchronize_gradients();
  // With "external" and no torch::optim optimizer, for the next step() (or synchronize_gradients())
  // and finish() only: the caller's optimizer is plain SGD without momentum (stateless) with this
  // learning rate and weight decay, so the method applies w -= lr * (g + weight_decay * w) itself,
  // in the pass that scales the gradient, and hands nothing over (the fast path; the Python front
  // end takes it for torch.optim.SGD without momentum). lr >= 0, weight_decay >= 0, finite.
  void apply_plain_sgd(float lr, float weight_decay);
  // With "external" and no torch::optim optimizer: what applies the .grad() when the method applies
  // several updates in one call (finish()). Called on the calling thread.
  void set_apply_callback(std::function<void()> apply);
  // With your optimizer: the state between step() and the next backward (your optimizer's own state
  // is yours to save: torch::save / state_dict). Waits for the communication in flight.
  OptimizerState save_state();
  // step(), returning the state at its boundary (see OptimizerState): loading it into a new
  // optimizer and running the same steps on the same batches gives the same parameters, bit for
  // bit, as going on with this one. It waits for the communication in flight at the boundary, so
  // it costs the overlap of one step: save every few hundred steps, not every step. UsageError for a
  // parameter-server method (its state lives on the servers).
  OptimizerState step_and_save_state();
  // Continues from `state`, saved by step_and_save_state() of an optimizer of the same
  // configuration (method spec, flags, hyper-parameters, schedule, worker count) over a module with
  // the same layers: restores the parameters, the method's state and the iteration, so the next
  // backward is the saved optimizer's next step. Call it on a new optimizer, before its first
  // backward, on every worker (each with its own saved state for a bit-identical resume; see
  // broadcast_optimizer_state for starting all from one). UsageError for a state of another
  // configuration or module, or when called later; DataError for corrupt bytes.
  void load_state(const OptimizerState& state);
  void zero_grad();
  // With lr_schedule "external": the learning rate of the update of the gradient the next step()
  // hands over (whenever the method applies it: a pipelined method K steps later), and of the
  // servers' update of it. lr >= 0 and finite. UsageError with another schedule.
  void set_learning_rate(float lr);
  // With options.forward_hooks: call before layer `layer` (an index into the layers in the order
  // the optimizer was given them: the constructor's `layers`, or the module's layers in
  // registration order) runs its forward; the method applies what that layer still needs. Cheap
  // and allocation-free; calls for layers that an earlier call already covered do nothing.
  void before_layer_forward(std::size_t layer);
  // Applies every update still in flight (the method's finish) and ends training with this
  // optimizer; step() after it is a UsageError. Idempotent.
  void finish();
  void synchronize() { finish(); }

  std::int64_t iteration() const;  // steps taken
  const std::string& method_spec() const;
  // The layers in the order of the flat buffer (forward order; after the first step, by readiness).
  std::vector<std::string> layer_names() const;
  // The layers in the order the optimizer was given them (before_layer_forward's indices).
  std::vector<std::string> given_layer_names() const;
  // The whole flat parameter buffer as a tensor view (float32, not a copy): what the method updates.
  // The first step() moves the buffer (the readiness rebuild): take the view again after it.
  torch::Tensor flat_parameters();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The registry's methods, in the order the CLI's --help lists them.
struct MethodInfo {
  std::string name;                 // as in a method spec: "pipe"
  std::string summary;              // the CLI's one line
  bool uses_servers = false;        // needs WorldOptions::servers >= 1 (--servers, default 1)
  bool replicas_identical = false;  // every worker holds the same weights between steps
  // Communicates nothing ("nocomm"): the compute-alone baseline, not data-parallel training.
  bool compute_alone = false;
  // Applies gradients K-1 steps stale with nothing compensating ("pipe"): momentum amplifies them.
  bool stale_without_compensation = false;
  // Applies its synchronous layers' updates just before each layer's forward ("sapipe"): the caller
  // calls DistributedOptimizer::before_layer_forward before each layer's forward.
  bool needs_forward_hooks = false;
};
// The methods a DistributedOptimizer runs, in the registry's order (not those only `pipesgd train`
// drives, such as auto).
std::vector<MethodInfo> available_methods();
// The method spec used when none is given (the CLI's default --algo).
std::string default_method();

// Same as worker.broadcast_parameters(module, root).
void broadcast_parameters(Worker& worker, torch::nn::Module& module, int root = 0);

// Every worker's optimizer state becomes root's (as Horovod's broadcast_optimizer_state): the
// state root's optimizer was loaded with (load_state), or else root's fresh state (its parameters,
// iteration 0). A collective: every worker calls it on its new optimizer before the first backward
// (the usual resume: root loads the saved state, then this). Method state that is per worker by
// nature (the codecs' residuals, a local optimizer's weights) becomes root's too; for a
// bit-identical resume of such methods let each worker load its own state. UsageError after the
// first backward or a bad root.
void broadcast_optimizer_state(Worker& worker, DistributedOptimizer& optimizer, int root = 0);

}  // namespace pipesgd
