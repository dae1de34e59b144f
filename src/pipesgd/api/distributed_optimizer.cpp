// DistributedOptimizer (include/pipesgd/distributed_optimizer.h): a registry method driven by the
// user's loop over a ParameterBinding of the user's module.
#include "pipesgd/distributed_optimizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <unordered_set>

#include "pipesgd/algo/registry.h"
#include "pipesgd/api/server_ranks.h"
#include "pipesgd/api/worker_impl.h"
#include "pipesgd/comm/rank_group_transport.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/optim/gradient_handoff.h"
#include "pipesgd/torch/parameter_binding.h"

namespace pipesgd {
namespace {

std::string text_of(float value) {
  std::ostringstream out;
  out << std::setprecision(9) << value;
  return out.str();
}

// DistributedOptimizerOptions::optimizer when the caller's optimizer applies the updates.
constexpr const char* kExternalOptimizer = "external";

// The method's option flags: the user's (with "--" added where left out) and the optimizer's.
OptionValues method_flags(const DistributedOptimizerOptions& options) {
  OptionValues flags;
  for (const auto& [flag, value] : options.flags) flags.set(flag.rfind("--", 0) == 0 ? flag : "--" + flag, value);
  const DistributedOptimizerOptions defaults;
  if (options.optimizer != defaults.optimizer && options.optimizer != kExternalOptimizer) {
    flags.set("--optimizer", options.optimizer);
  }
  if (options.optimizer == "adam" || options.adam_beta1 != defaults.adam_beta1) flags.set("--adam-beta1", text_of(options.adam_beta1));
  if (options.optimizer == "adam" || options.adam_beta2 != defaults.adam_beta2) flags.set("--adam-beta2", text_of(options.adam_beta2));
  if (options.optimizer == "adam" || options.adam_eps != defaults.adam_eps) flags.set("--adam-eps", text_of(options.adam_eps));
  return flags;
}

// Layers: every submodule that owns parameters requiring grad directly (the module itself first),
// in registration order; a parameter shared by several modules belongs to the first.
std::vector<DistributedOptimizer::Layer> layers_of(torch::nn::Module& module) {
  std::vector<DistributedOptimizer::Layer> segments;
  std::unordered_set<const void*> seen;
  auto add = [&](const std::string& name, torch::nn::Module& owner) {
    DistributedOptimizer::Layer segment{name.empty() ? std::string("(root)") : name, {}};
    for (const torch::Tensor& parameter : owner.parameters(/*recurse=*/false)) {
      if (!parameter.requires_grad() || !seen.insert(parameter.unsafeGetTensorImpl()).second) continue;
      segment.parameters.push_back(parameter);
    }
    if (!segment.parameters.empty()) segments.push_back(std::move(segment));
  };
  add("", module);
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) add(item.key(), *item.value());
  return segments;
}

DistributedOptimizerOptions without_initial_broadcast(DistributedOptimizerOptions options) {
  options.broadcast_initial_parameters = false;
  return options;
}

// The given layers as the binding's segments, after checking what the binding does not.
std::vector<ParameterSegment> segments_of(std::vector<DistributedOptimizer::Layer> layers) {
  if (layers.empty()) throw UsageError("the model has no parameters");
  std::unordered_set<std::string> names;
  std::unordered_set<const void*> seen;
  std::vector<ParameterSegment> segments;
  for (DistributedOptimizer::Layer& layer : layers) {
    if (layer.name.empty()) throw UsageError("a layer of the model has an empty name");
    if (!names.insert(layer.name).second) throw UsageError(concat("the model has two layers named '", layer.name, "'"));
    if (layer.parameters.empty()) throw UsageError(concat("layer '", layer.name, "' has no parameters"));
    for (const torch::Tensor& parameter : layer.parameters) {
      if (!parameter.defined()) throw UsageError(concat("layer '", layer.name, "' has an undefined parameter"));
      if (!seen.insert(parameter.unsafeGetTensorImpl()).second) {
        throw UsageError(concat("a parameter of layer '", layer.name, "' belongs to an earlier layer too"));
      }
    }
    segments.push_back(ParameterSegment{std::move(layer.name), std::move(layer.parameters)});
  }
  return segments;
}

// The binding's segments (names and parameter tensors) in the order `order` gives (old indices).
std::vector<ParameterSegment> segments_in_order(const ParameterBinding& binding, const std::vector<std::size_t>& order) {
  const Layout& layout = binding.layout();
  std::vector<ParameterSegment> old_segments(layout.segment_count());
  const auto& tensors = binding.tensors();
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    ParameterSegment& segment = old_segments[binding.tensor_segment(k)];
    segment.name = layout.segment(binding.tensor_segment(k)).name;
    segment.parameters.push_back(tensors[k]);
  }
  std::vector<ParameterSegment> segments;
  for (std::size_t s : order) segments.push_back(std::move(old_segments[s]));
  return segments;
}

// WorldOptions::trace: step() t as a "step" span of iteration t on the calling thread's trace. It
// encloses the method's end of iteration t and beginning of t + 1 (whose events carry t + 1), whose
// spans all end before step() returns, so the spans nest.
class StepSpan {
 public:
  explicit StepSpan(std::int64_t step) : trace_(current_thread_trace()), step_(step) {
    if (trace_ == nullptr) return;
    trace_->set_iteration(step);
    if (!trace_->recording()) {
      trace_ = nullptr;  // outside the window: no clock read
      return;
    }
    start_ = TraceClock::now();
  }
  ~StepSpan() {
    if (trace_ == nullptr) return;
    const std::int64_t next = trace_->iteration();
    trace_->set_iteration(step_);  // recorded in step_'s window even where the step began step_ + 1
    trace_->span("step", kTraceCompute, start_, TraceClock::now());
    trace_->set_iteration(next);
  }
  StepSpan(const StepSpan&) = delete;
  StepSpan& operator=(const StepSpan&) = delete;

 private:
  ThreadTrace* trace_;
  std::int64_t step_;
  TraceClock::time_point start_{};
};

// OptimizerState's sections (besides the method's own, written by its save_state).
constexpr std::int64_t kStateFormat = 1;
constexpr const char* kStateOrigin = "the optimizer state";

}  // namespace

struct DistributedOptimizer::Impl final : FlatParameters {
  Impl(Worker& worker_, const std::string& spec_, const DistributedOptimizerOptions& options_)
      : worker(worker_.impl()), spec(spec_), options(options_) {}

  const Layout& layout() const override { return binding->layout(); }
  std::span<float> parameters() override { return binding->parameters(); }
  bool reports_forward_progress() const override { return options.forward_hooks; }
  void set_forward_hook(SegmentsNeededFn hook) override { forward_hook = std::move(hook); }

  // Runs `work`; if it throws, the optimizer is unusable from then on (its backward disarmed).
  template <typename Work>
  decltype(auto) or_fail(Work&& work) {
    try {
      return work();
    } catch (...) {
      failed = true;
      if (binding) binding->disarm();
      throw;
    }
  }
  void check_usable(const char* call) const {
    if (failed) throw UsageError(concat("DistributedOptimizer::", call, ": the optimizer failed earlier; destroy it"));
    if (finished) throw UsageError(concat("DistributedOptimizer::", call, " after finish()"));
  }
  Transport& method_transport() { return uses_servers ? worker.world : peers(); }
  // The workers this optimizer trains with: the process set's (options.process_set) or every worker.
  Transport& peers() { return set_workers ? *set_workers : static_cast<Transport&>(worker.workers); }
  std::unique_ptr<RankGroupTransport> set_workers;  // options.process_set != 0
  // Root's (the set's rank 0) `tensor` to every member, through the negotiated collectives.
  void broadcast_in_set(torch::Tensor& tensor) {
    Collective call;
    call.kind = CollectiveKind::kBroadcast;
    call.input = tensor;
    call.output = tensor;
    call.process_set = options.process_set;
    call.root = set_ranks.front();
    worker.engine->submit(std::move(call), /*caller_waits=*/true)->wait();
  }
  std::vector<int> set_ranks;  // the members' worker ranks
  void first_step();
  void next_step();
  // What must match between a saved state and the optimizer that loads it.
  std::string configuration() const;
  // The state at this point: call between end_iteration(next - 1) and begin_iteration(next), or
  // with next == 0 before the first step (the fresh state).
  std::vector<std::byte> capture_state(std::int64_t next);
  // Makes this optimizer continue from `bytes` (a new optimizer before its first backward).
  void restore_state(std::span<const std::byte> bytes);
  // UsageError unless this is a new optimizer before its first backward (`call` names the caller).
  void check_restorable(const char* call) const;
  void arm(std::span<float> gradients) {
    gradients_ = gradients;
    next_forward_segment = 0;
    const SegmentReadyFn* ready = method ? method->segment_ready() : &record_first_backward;
    if (method && ready != nullptr && gradient_multiplier != 1.0f) {
      method_ready = ready;
      ready = &multiply_then_report;
    }
    binding->arm(gradients, ready != nullptr ? *ready : no_report,
                 static_cast<std::uint32_t>(options.backward_passes_per_step));
  }
  // MethodContext::announce (auto's choices): one line on the stderr of the set's first member.
  std::function<void(const std::string&)> announcer() const {
    if (worker.workers.rank() != set_ranks.front()) return {};
    return [](const std::string& line) { std::cerr << "pipesgd: " << line << std::endl; };
  }
  // The method's beginning of iteration t (what it records on the calling thread's trace carries t,
  // as does the next backward's), then the next backward armed; with the caller's optimizer
  // (handoff), the gradients to apply handed over instead and the arming left to step().
  void begin_current_iteration() {
    trace_set_iteration(t);
    const std::span<float> next = method->begin_iteration(t, times);
    if (!handoff) {
      arm(next);
      return;
    }
    gradients_ = next;
    hand_over();
  }
  // The handed-over gradients as the parameters' grads (undefined where a segment got none).
  void hand_over() {
    const auto& tensors = binding->tensors();
    if (handoff_views.size() != tensors.size()) {  // once per binding (the buffer does not move)
      handoff_views.clear();
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        handoff_views.push_back(torch::from_blob(handoff->gradient.data() + binding->tensor_offset(k),
                                                 tensors[k].sizes(), torch::kFloat32));
      }
    }
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      torch::Tensor parameter = tensors[k];
      if (handoff->updated[binding->tensor_segment(k)] != 0) {
        parameter.mutable_grad() = handoff_views[k];
      } else {
        parameter.mutable_grad().reset();
      }
    }
    handed_over = true;
  }
  // The method's step up to the handed-over gradients (handoff only); plain_sgd is this step's only.
  void synchronize_gradients() {
    handoff->clear();
    struct ForThisStep {
      PlainSgd& plain_sgd;
      ~ForThisStep() { plain_sgd = {}; }
    } plain_sgd_for_this_step{handoff->plain_sgd};
    if (!method) {
      first_step();
    } else {
      next_step();
    }
  }
  void clear_grads() {
    for (const torch::Tensor& parameter : binding->tensors()) {
      torch::Tensor tensor = parameter;
      tensor.mutable_grad().reset();
    }
    handed_over = false;
  }
  // After the caller's optimizer applied the handed-over gradients: the next backward armed.
  void arm_after_hand_over() {
    clear_grads();
    arm(gradients_);
  }
  // Hands over what is pending and has the caller's optimizer apply it now (several updates in one
  // call of the method: finish, HandedOverGradients::apply_pending).
  void apply_handed_over() {
    if (!handoff->any()) return;
    hand_over();
    if (user_optimizer != nullptr) {
      user_optimizer->step();
    } else if (apply_callback) {
      apply_callback();
    } else {
      throw UsageError("DistributedOptimizer: the method applies several updates at once here (finish); give the "
                       "optimizer that applies them (the constructor that takes it, or set_apply_callback)");
    }
    clear_grads();
    handoff->clear();
  }
  void multiply(std::span<float> gradients) const {
    for (float& value : gradients) value *= gradient_multiplier;
  }
  // The binding's segments were reordered: new segment k is old segment order[k].
  void reorder_layers(const std::vector<std::size_t>& order) {
    std::vector<std::size_t> layers(order.size());
    for (std::size_t k = 0; k < order.size(); ++k) layers[k] = layer_of_segment[order[k]];
    layer_of_segment = std::move(layers);
    for (std::size_t k = 0; k < layer_of_segment.size(); ++k) segment_of_layer[layer_of_segment[k]] = k;
  }
  // Forward is about to read segments below `end` (forward hooks).
  void forward_reaches(std::size_t end) {
    if (!forward_hook || end <= next_forward_segment) return;
    forward_hook(next_forward_segment, end);
    next_forward_segment = end;
  }

  Worker::Impl& worker;
  std::string spec;
  DistributedOptimizerOptions options;
  OptionValues flags;
  MethodSelection selection;
  bool uses_servers = false;
  std::int64_t warmup_iterations = 0;
  LrScheduleLength schedule_length;
  std::unique_ptr<ParameterBinding> binding;
  std::unique_ptr<TrainingMethod> method;
  // The first backward (before the method exists): its gradient and each layer's backward time.
  std::vector<float> first_gradients;
  std::vector<double> first_seconds;
  SegmentReadyFn record_first_backward;
  SegmentReadyFn no_report;
  // kSum: each worker's gradient times the worker count (the methods average).
  float gradient_multiplier = 1.0f;
  const SegmentReadyFn* method_ready = nullptr;  // what multiply_then_report reports to
  SegmentReadyFn multiply_then_report;
  // The given layers (construction order) <-> the binding's segments.
  std::vector<std::size_t> layer_of_segment;
  std::vector<std::size_t> segment_of_layer;
  // Forward hooks: the method's (SAPipe's), and the first segment forward has not yet reached.
  SegmentsNeededFn forward_hook;
  std::size_t next_forward_segment = 0;
  // lr_schedule "external": the factors the methods read; the rate factor 1 stands for.
  std::shared_ptr<ExternalLearningRates> external_rates;
  float base_learning_rate = 0;
  std::span<float> gradients_;
  // The caller's optimizer applies the updates (options.optimizer "external"): the method hands its
  // gradients over here; `handed_over` from the method's step until the caller applied them (the
  // next backward is armed then); views of the buffer per bound tensor (binding order).
  std::shared_ptr<HandedOverGradients> handoff;
  torch::optim::Optimizer* user_optimizer = nullptr;  // the C++ constructor's, else nullptr
  std::function<void()> apply_callback;               // set_apply_callback's
  bool handed_over = false;
  std::vector<torch::Tensor> handoff_views;
  IterationTimes times;
  std::int64_t t = 0;
  bool finished = false;
  bool failed = false;
  bool stepped = false;  // step() was called
  // Where step() puts the state at its boundary (step_and_save_state), or nullptr.
  std::vector<std::byte>* save_state_into = nullptr;
  // The state load_state() restored, until the first step (broadcast_optimizer_state sends it).
  std::vector<std::byte> loaded_state;
};

std::string DistributedOptimizer::Impl::configuration() const {
  const std::string method_options = selection.options->fingerprint();
  return concat("method ", spec, " (", fingerprint(selection.common), method_options.empty() ? "" : ", ",
                method_options, ", warm-up ", warmup_iterations, " iterations, ", schedule_length.iterations_per_epoch,
                " iterations per epoch, ", schedule_length.total_iterations, " in all), ", set_ranks.size(),
                " workers");
}

std::vector<std::byte> DistributedOptimizer::Impl::capture_state(std::int64_t next) {
  CheckpointWriter out;
  out.add_int("api.format", kStateFormat);
  out.add_string("api.configuration", configuration());
  out.add_int("api.next_iteration", next);
  // With the caller's optimizer the state is taken after the method's beginning of `next` (the
  // caller applied what it handed over): a restore begins `next` again and hands nothing over.
  nlohmann::json layers = nlohmann::json::array();
  for (const Segment& segment : binding->layout().segments()) layers.push_back({segment.name, segment.count});
  out.add_string("api.layers", layers.dump());
  out.add("api.parameters", std::span<const float>(binding->parameters()));
  if (method) method->save_state(out);
  return out.serialize();
}

void DistributedOptimizer::Impl::check_restorable(const char* call) const {
  check_usable(call);
  if (stepped || !binding->parameter_readiness_order().empty()) {
    throw UsageError(concat("DistributedOptimizer::", call, ": call it on a new optimizer, before its first backward"));
  }
}

void DistributedOptimizer::Impl::restore_state(std::span<const std::byte> bytes) {
  const CheckpointReader in = CheckpointReader::parse(bytes, kStateOrigin);
  if (in.integer("api.format") != kStateFormat) {
    throw DataError(concat("checkpoint '", kStateOrigin, "': format ", in.integer("api.format"), ", this pipesgd reads ", kStateFormat));
  }
  const std::string saved_configuration(in.string("api.configuration"));
  if (saved_configuration != configuration()) {
    throw UsageError(concat("the optimizer state was saved by another configuration: saved '", saved_configuration,
                            "', this optimizer '", configuration(), "'"));
  }
  const std::int64_t next = in.integer("api.next_iteration");
  if (next < 0) throw DataError(concat("checkpoint '", kStateOrigin, "': next iteration ", next));
  // The saved layer order, as indices of this binding's segments.
  nlohmann::json layers;
  try {
    layers = nlohmann::json::parse(in.string("api.layers"));
  } catch (const nlohmann::json::exception&) {
    throw DataError(concat("checkpoint '", kStateOrigin, "': its layer list does not parse"));
  }
  const Layout& layout = binding->layout();
  auto describe = [](const Layout& of) {
    std::string text;
    for (const Segment& segment : of.segments()) text += concat(text.empty() ? "" : ", ", segment.name, " (", segment.count, ")");
    return text;
  };
  // Segment names are module paths, unique within a module.
  std::map<std::string, std::size_t> index_of;
  for (std::size_t s = 0; s < layout.segment_count(); ++s) index_of.emplace(layout.segment(s).name, s);
  const std::string mismatch = concat("the optimizer state was saved for other layers than this module's (", describe(layout), ")");
  if (!layers.is_array() || layers.size() != layout.segment_count()) throw UsageError(mismatch);
  std::vector<std::size_t> order;
  for (const nlohmann::json& layer : layers) {
    if (!layer.is_array() || layer.size() != 2 || !layer[0].is_string() || !layer[1].is_number_unsigned()) {
      throw DataError(concat("checkpoint '", kStateOrigin, "': its layer list is malformed"));
    }
    const auto found = index_of.find(layer[0].get<std::string>());
    if (found == index_of.end() || layout.segment(found->second).count != layer[1].get<std::size_t>()) throw UsageError(mismatch);
    order.push_back(found->second);
    index_of.erase(found);  // each layer once
  }
  const std::span<const float> parameters = in.floats("api.parameters", layout.total());
  if (uses_servers && next > 0) {
    throw UsageError(concat("'", spec, "' keeps its state on its parameter servers: the API saves and loads the state of worker-only methods"));
  }
  // Everything checked: from here on a failure leaves the optimizer unusable.
  failed = true;
  binding->disarm();
  method.reset();
  std::vector<ParameterSegment> segments = segments_in_order(*binding, order);
  binding.reset();
  binding = std::make_unique<ParameterBinding>(std::move(segments));
  handoff_views.clear();  // views of the old binding's tensor offsets
  reorder_layers(order);
  std::copy(parameters.begin(), parameters.end(), binding->parameters().begin());
  times = IterationTimes{};
  t = next;
  if (next == 0) {
    first_gradients.assign(binding->layout().total(), 0.0f);
    arm(first_gradients);
  } else {
    method = make_method(selection, method_transport(), *this, warmup_iterations, {}, schedule_length, announcer());
    method->load_state(in, next);
    first_gradients = {};
    if (handoff) handoff->plain_sgd = {};  // nothing is applied again
    begin_current_iteration();
    if (handoff) {
      handoff->clear();  // applied before the state was saved
      arm_after_hand_over();
    }
  }
  failed = false;
}

void DistributedOptimizer::Impl::first_step() {
  binding->finish();
  // Worker 0's readiness order, so every replica lays its buffer out alike.
  const std::size_t count = binding->layout().segment_count();
  torch::Tensor order = torch::full({static_cast<std::int64_t>(count)}, -1, torch::kInt64);
  const std::vector<std::size_t>& completed = binding->segment_readiness_order();
  for (std::size_t k = 0; k < completed.size(); ++k) order[static_cast<std::int64_t>(k)] = static_cast<std::int64_t>(completed[k]);
  Worker::Impl& w = worker;
  broadcast_in_set(order);  // negotiated among the set's members (no count of this worker's own)
  // Forward order: layers that never completed (registration order), then reverse completion order.
  std::vector<std::size_t> forward;
  std::vector<char> placed(count, 0);
  std::vector<std::size_t> by_completion;
  for (std::size_t k = 0; k < count; ++k) {
    const std::int64_t segment = order[static_cast<std::int64_t>(k)].item<std::int64_t>();
    if (segment < 0) break;
    by_completion.push_back(static_cast<std::size_t>(segment));
    placed[static_cast<std::size_t>(segment)] = 1;
  }
  for (std::size_t s = 0; s < count; ++s) {
    if (!placed[s]) forward.push_back(s);
  }
  forward.insert(forward.end(), by_completion.rbegin(), by_completion.rend());
  const Layout old_layout = binding->layout();
  std::vector<ParameterSegment> segments = segments_in_order(*binding, forward);
  binding.reset();
  binding = std::make_unique<ParameterBinding>(std::move(segments));
  reorder_layers(forward);
  handoff_views.clear();
  if (uses_servers && w.workers.rank() == 0) {
    nlohmann::json description;
    description["spec"] = spec;
    description["flags"] = nlohmann::json::object();
    for (const auto& [flag, value] : flags.all()) description["flags"][flag] = value;
    description["lr"] = options.learning_rate;
    description["momentum"] = options.momentum;
    description["weight_decay"] = options.weight_decay;
    description["timeout_ms"] = options.timeout.count();
    description["lr_schedule"] = options.lr_schedule;
    description["lr_warmup_iterations"] = options.lr_warmup_iterations;
    description["iterations_per_epoch"] = schedule_length.iterations_per_epoch;
    description["total_iterations"] = schedule_length.total_iterations;
    description["total"] = binding->layout().total();
    description["segments"] = nlohmann::json::array();
    for (const Segment& segment : binding->layout().segments()) {
      description["segments"].push_back({{"name", segment.name}, {"count", segment.count}});
    }
    send_server_setup(w.world, w.worker_count, w.server_message_sequence,
                      ServerSetup{description.dump(), binding->parameters()}, options.timeout);
  }
  method = make_method(selection, method_transport(), *this, warmup_iterations, {}, schedule_length, announcer());
  // Iteration 0: its gradient was computed at the initial parameters, as every method's iteration 0 is.
  times = IterationTimes{};
  multiply(first_gradients);
  std::span<float> gradients = method->begin_iteration(0, times);
  const Layout& layout = binding->layout();
  for (std::size_t k = 0; k < count; ++k) {
    const Segment& from = old_layout.segment(forward[k]);
    std::copy_n(first_gradients.begin() + static_cast<std::ptrdiff_t>(from.offset), from.count,
                gradients.begin() + static_cast<std::ptrdiff_t>(layout.segment(k).offset));
  }
  if (const SegmentReadyFn* ready = method->segment_ready()) {
    for (std::size_t k = count; k-- > 0;) (*ready)(k, first_seconds[forward[k]]);
  }
  method->end_iteration(0, times);
  if (save_state_into != nullptr) *save_state_into = capture_state(1);
  first_gradients = {};
  loaded_state = {};
  t = 1;
  times = IterationTimes{};
  begin_current_iteration();
}

void DistributedOptimizer::Impl::next_step() {
  binding->finish();
  if (gradient_multiplier != 1.0f && method->segment_ready() == nullptr) multiply(gradients_);
  forward_reaches(binding->layout().segment_count());  // layers this iteration's forward did not reach
  method->end_iteration(t, times);
  if (save_state_into != nullptr) *save_state_into = capture_state(t + 1);
  loaded_state = {};
  ++t;
  times = IterationTimes{};
  begin_current_iteration();
}

DistributedOptimizer::DistributedOptimizer(Worker& worker, torch::nn::Module& module, const std::string& method_spec,
                                           const DistributedOptimizerOptions& options)
    : DistributedOptimizer(worker, layers_of(module), method_spec, without_initial_broadcast(options)) {
  // The module's buffers (batch-norm statistics) too; its parameters are views of the flat buffer now.
  impl_->options.broadcast_initial_parameters = options.broadcast_initial_parameters;
  if (options.broadcast_initial_parameters) {
    if (options.process_set == 0) {
      worker.broadcast_parameters(module, 0);
    } else {
      for (torch::Tensor buffer : module.buffers()) {
        torch::Tensor data = buffer.detach();
        impl_->broadcast_in_set(data);
      }
    }
  }
}

DistributedOptimizer::DistributedOptimizer(Worker& worker, std::vector<Layer> layers, const std::string& method_spec,
                                           const DistributedOptimizerOptions& options)
    : impl_(std::make_unique<Impl>(worker, method_spec, options)) {
  Impl& impl = *impl_;
  const LrScheduleSpec schedule = parse_api_lr_schedule(
      options.lr_schedule, options.lr_warmup_iterations,
      {"DistributedOptimizerOptions::lr_schedule", "DistributedOptimizerOptions::lr_warmup_iterations"});
  impl.schedule_length = LrScheduleLength{options.iterations_per_epoch, options.total_iterations};
  if (schedule.kind == LrScheduleKind::kExternal) {
    if (!(options.learning_rate > 0)) {
      throw UsageError(concat("lr_schedule 'external' needs DistributedOptimizerOptions::learning_rate > 0 (the rate ",
                              "before the first set_learning_rate), got ", options.learning_rate));
    }
    impl.external_rates = std::make_shared<ExternalLearningRates>();
    impl.schedule_length.external_factors = impl.external_rates;
    impl.base_learning_rate = options.learning_rate;
  }
  if (options.backward_passes_per_step < 1) {
    throw UsageError(concat("backward_passes_per_step must be >= 1, got ", options.backward_passes_per_step));
  }
  if ((schedule.kind == LrScheduleKind::kStep || schedule.kind == LrScheduleKind::kMultiStep) &&
      options.iterations_per_epoch <= 0) {
    throw UsageError(concat("lr_schedule '", schedule.text(), "' needs DistributedOptimizerOptions::iterations_per_epoch ",
                            "(the iterations of one epoch of your loop, >= 1), got ", options.iterations_per_epoch));
  }
  if (schedule.kind == LrScheduleKind::kCosine && options.total_iterations <= 0) {
    throw UsageError(concat("lr_schedule 'cosine' needs DistributedOptimizerOptions::total_iterations (the steps of ",
                            "the whole run, >= 1), got ", options.total_iterations));
  }
  if (options.timeout.count() <= 0) throw UsageError("--comm-timeout must be > 0");
  impl.flags = method_flags(options);
  // The servers of a parameter-server method are the world's: --servers defaults to them.
  const MethodDescriptor* descriptor = method_of_spec(method_spec);
  const bool takes_servers =
      descriptor != nullptr && std::any_of(descriptor->options.begin(), descriptor->options.end(),
                                           [](const OptionDeclaration& option) { return option.flag == "--servers"; });
  if (takes_servers && !impl.flags.has("--servers") && worker.servers() > 0) {
    impl.flags.set("--servers", std::to_string(worker.servers()));
  }
  CommonOptions base;
  base.optimizer.sgd = SgdOptions{options.learning_rate, options.momentum, options.weight_decay};
  base.timeout = options.timeout;
  base.lr_schedule = schedule;
  impl.selection = select_method(method_spec, impl.flags, FlagPolicy::kReject, base);
  const int servers = impl.selection.options->servers();
  impl.uses_servers = servers > 0;
  if (options.optimizer == kExternalOptimizer) {
    if (impl.uses_servers) {
      throw UsageError(concat("'", method_spec, "' applies the update on its parameter servers (SGD), so your optimizer ",
                              "cannot: use a worker-only method, or let the method update (optimizer \"sgd\")"));
    }
    const std::string reason = impl.selection.options->needs_update_rule();
    if (!reason.empty()) {
      throw UsageError(concat("'", method_spec, "' cannot hand its gradients to your optimizer: ", reason,
                              ", or let the method update with its own SGD or Adam"));
    }
    impl.handoff = std::make_shared<HandedOverGradients>();
    impl.handoff->apply_pending = [&impl] { impl.apply_handed_over(); };
    impl.selection.common.optimizer.name = kExternalOptimizer;
    impl.selection.common.optimizer.handoff = impl.handoff;
  }
  impl.set_ranks = worker.process_set_ranks(options.process_set);
  if (options.process_set != 0) {
    if (impl.uses_servers) {
      throw UsageError(concat("'", method_spec, "' trains through the world's parameter servers: it takes the global ",
                              "process set only, not process set ", options.process_set));
    }
    if (!std::count(impl.set_ranks.begin(), impl.set_ranks.end(), worker.rank())) {
      throw UsageError(concat("DistributedOptimizer: rank ", worker.rank(), " is not in process set ", options.process_set));
    }
    impl.set_workers = std::make_unique<RankGroupTransport>(worker.impl().workers, impl.set_ranks);
  }
  if (servers != worker.servers() && impl.uses_servers) {
    throw UsageError(concat("'", method_spec, "' needs ", servers, " parameter-server rank", servers == 1 ? "" : "s",
                            " (--servers ", servers, "); the world has ", worker.servers(),
                            ": create it with WorldOptions::servers = ", servers));
  }
  const WarmUp warmup = impl.selection.options->warmup();
  if (warmup.epochs > 0 && options.iterations_per_epoch <= 0) {
    throw UsageError("--warmup-epochs needs DistributedOptimizerOptions::iterations_per_epoch (the iterations of one "
                     "epoch of your loop); or give --warmup-iters");
  }
  impl.warmup_iterations = warmup.epochs * options.iterations_per_epoch + warmup.iterations;
  std::vector<ParameterSegment> segments = segments_of(std::move(layers));
  if (impl.uses_servers && static_cast<std::size_t>(servers) > segments.size()) {
    throw UsageError(concat("--servers ", servers, " exceeds the model's ", segments.size(),
                            " parameter segments: each server must own at least one whole segment"));
  }
  if (options.broadcast_initial_parameters) {
    for (ParameterSegment& segment : segments) {
      for (torch::Tensor& parameter : segment.parameters) {
        if (parameter.scalar_type() != torch::kFloat32 || !parameter.device().is_cpu()) continue;  // the binding names it
        impl.broadcast_in_set(parameter);
      }
    }
  }
  if (options.gradient_reduction == ReduceOp::kSum) impl.gradient_multiplier = static_cast<float>(impl.set_ranks.size());
  for (std::size_t k = 0; k < segments.size(); ++k) {
    impl.layer_of_segment.push_back(k);
    impl.segment_of_layer.push_back(k);
  }
  impl.multiply_then_report = [&impl](std::size_t segment, double seconds) {
    const Segment& range = impl.binding->layout().segment(segment);
    impl.multiply(impl.gradients_.subspan(range.offset, range.count));
    (*impl.method_ready)(segment, seconds);
  };
  impl.binding = std::make_unique<ParameterBinding>(std::move(segments));
  impl.first_gradients.assign(impl.binding->layout().total(), 0.0f);
  impl.first_seconds.assign(impl.binding->layout().segment_count(), 0.0);
  impl.record_first_backward = [&impl](std::size_t segment, double seconds) { impl.first_seconds[segment] = seconds; };
  impl.arm(impl.first_gradients);
}

DistributedOptimizer::~DistributedOptimizer() {
  if (impl_->binding) impl_->binding->disarm();
  impl_->method.reset();   // joins its communication before the buffer it uses goes
  impl_->binding.reset();  // the module's parameters become ordinary tensors again
}

DistributedOptimizer::DistributedOptimizer(Worker& worker, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                           const std::string& method_spec, DistributedOptimizerOptions options)
    : DistributedOptimizer(worker, module, method_spec, [&] {
        options.optimizer = kExternalOptimizer;
        return options;
      }()) {
  impl_->user_optimizer = &optimizer;
}

void DistributedOptimizer::step() {
  impl_->check_usable("step");
  impl_->stepped = true;
  impl_->or_fail([&] {
    if (impl_->handoff) {
      if (!impl_->handed_over) {
        const StepSpan span(impl_->t);
        impl_->synchronize_gradients();
      }
      if (impl_->user_optimizer != nullptr) impl_->user_optimizer->step();
      impl_->arm_after_hand_over();
    } else {
      const StepSpan span(impl_->t);
      if (!impl_->method) {
        impl_->first_step();
      } else {
        impl_->next_step();
      }
    }
  });
}

void DistributedOptimizer::apply_plain_sgd(float lr, float weight_decay) {
  if (impl_->finished) return;  // finish() is idempotent; so is what precedes it
  impl_->check_usable("apply_plain_sgd");
  if (!impl_->handoff) throw UsageError("DistributedOptimizer::apply_plain_sgd needs optimizer \"external\"");
  if (!std::isfinite(lr) || lr < 0 || !std::isfinite(weight_decay) || weight_decay < 0) {
    throw UsageError(concat("apply_plain_sgd: learning rate and weight decay must be finite and >= 0, got ", lr, " and ",
                            weight_decay));
  }
  impl_->handoff->plain_sgd = PlainSgd{true, lr, weight_decay};
}

void DistributedOptimizer::set_apply_callback(std::function<void()> apply) {
  impl_->check_usable("set_apply_callback");
  impl_->apply_callback = std::move(apply);
}

void DistributedOptimizer::synchronize_gradients() {
  impl_->check_usable("synchronize_gradients");
  if (!impl_->handoff) {
    throw UsageError("DistributedOptimizer::synchronize_gradients needs your optimizer to apply the updates "
                     "(DistributedOptimizerOptions::optimizer \"external\", or the constructor that takes it)");
  }
  if (impl_->handed_over) return;
  impl_->stepped = true;
  const StepSpan span(impl_->t);
  impl_->or_fail([&] { impl_->synchronize_gradients(); });
}

OptimizerState DistributedOptimizer::save_state() {
  impl_->check_usable("save_state");
  if (!impl_->handoff) {
    throw UsageError("DistributedOptimizer::save_state needs your optimizer to apply the updates; with the method's "
                     "own optimizer use step_and_save_state()");
  }
  if (impl_->handed_over || !impl_->binding->parameter_readiness_order().empty()) {
    throw UsageError("DistributedOptimizer::save_state: call it between step() and the next backward");
  }
  return impl_->or_fail([&] { return OptimizerState{impl_->capture_state(impl_->t)}; });
}

OptimizerState DistributedOptimizer::step_and_save_state() {
  impl_->check_usable("step_and_save_state");
  if (impl_->handoff) {
    step();
    return save_state();
  }
  if (impl_->uses_servers) {
    throw UsageError(concat("DistributedOptimizer::step_and_save_state: '", impl_->spec, "' keeps its state on its ",
                            "parameter servers: the API saves the state of worker-only methods"));
  }
  OptimizerState state;
  impl_->save_state_into = &state.bytes;
  try {
    step();
  } catch (...) {
    impl_->save_state_into = nullptr;
    throw;
  }
  impl_->save_state_into = nullptr;
  return state;
}

void DistributedOptimizer::load_state(const OptimizerState& state) {
  impl_->check_restorable("load_state");
  impl_->restore_state(state.bytes);
  impl_->loaded_state = state.bytes;
}

void DistributedOptimizer::set_learning_rate(float lr) {
  impl_->check_usable("set_learning_rate");
  if (!impl_->external_rates) {
    throw UsageError(concat("DistributedOptimizer::set_learning_rate needs lr_schedule 'external', this optimizer's is '",
                            impl_->options.lr_schedule, "'"));
  }
  if (!std::isfinite(lr) || lr < 0) throw UsageError(concat("learning rate must be finite and >= 0, got ", lr));
  impl_->external_rates->set(impl_->t, static_cast<double>(lr) / static_cast<double>(impl_->base_learning_rate));
}

void DistributedOptimizer::before_layer_forward(std::size_t layer) {
  if (!impl_->options.forward_hooks) {
    throw UsageError("DistributedOptimizer::before_layer_forward needs DistributedOptimizerOptions::forward_hooks");
  }
  if (layer >= impl_->segment_of_layer.size()) {
    throw UsageError(concat("DistributedOptimizer::before_layer_forward: layer ", layer, " of ",
                            impl_->segment_of_layer.size()));
  }
  if (impl_->failed || impl_->finished) return;
  impl_->forward_reaches(impl_->segment_of_layer[layer] + 1);
}

void DistributedOptimizer::zero_grad() {
  impl_->check_usable("zero_grad");
  if (impl_->handed_over) {  // the gradients to apply, as torch's zero_grad would
    std::fill(impl_->handoff->gradient.begin(), impl_->handoff->gradient.end(), 0.0f);
    return;
  }
  std::fill(impl_->gradients_.begin(), impl_->gradients_.end(), 0.0f);
}

void DistributedOptimizer::finish() {
  if (impl_->finished) return;
  impl_->check_usable("finish");
  if (impl_->handed_over) {
    throw UsageError("DistributedOptimizer::finish after synchronize_gradients(): call step() first, which applies "
                     "the gradients handed over");
  }
  impl_->binding->disarm();
  impl_->finished = true;
  if (!impl_->method) return;
  try {
    if (impl_->handoff) impl_->handoff->clear();
    impl_->method->finish(impl_->times);
    if (impl_->handoff) {
      impl_->handoff->plain_sgd = {};
      impl_->apply_handed_over();
    }
  } catch (...) {
    impl_->failed = true;
    throw;
  }
}

void broadcast_optimizer_state(Worker& worker, DistributedOptimizer& optimizer, int root) {
  DistributedOptimizer::Impl& impl = optimizer.impl();
  if (root < 0 || root >= worker.size()) {
    throw UsageError(concat("broadcast_optimizer_state: root ", root, " is not a worker rank (0..", worker.size() - 1, ")"));
  }
  if (&worker.impl() != &impl.worker) throw UsageError("broadcast_optimizer_state: the optimizer belongs to another worker");
  impl.check_restorable("broadcast_optimizer_state");
  std::vector<std::byte> state;
  if (worker.rank() == root) state = impl.loaded_state.empty() ? impl.capture_state(0) : impl.loaded_state;
  torch::Tensor size = torch::tensor({static_cast<std::int64_t>(state.size())}, torch::kInt64);
  worker.broadcast(size, root);
  state.resize(static_cast<std::size_t>(size.item<std::int64_t>()));
  torch::Tensor bytes = torch::from_blob(state.data(), {static_cast<std::int64_t>(state.size())}, torch::kUInt8);
  worker.broadcast(bytes, root);  // in place: into `state`
  if (worker.rank() == root) return;
  impl.restore_state(state);
  impl.loaded_state = std::move(state);
}

std::vector<MethodInfo> available_methods() {
  std::vector<MethodInfo> methods;
  for (const MethodDescriptor* descriptor : method_registry()) {
    const bool servers = descriptor->traits.uses_servers || descriptor->parse(OptionValues{})->servers() > 0;
    const MethodTraits& traits = descriptor->traits;
    methods.push_back({descriptor->name, descriptor->summary, servers, traits.replicas_identical,
                       traits.compute_alone, traits.stale_without_compensation, traits.needs_forward_hooks});
  }
  return methods;
}

std::string default_method() { return default_method_spec(); }

std::int64_t DistributedOptimizer::iteration() const { return impl_->t; }
const std::string& DistributedOptimizer::method_spec() const { return impl_->spec; }

std::vector<std::string> DistributedOptimizer::layer_names() const {
  std::vector<std::string> names;
  for (const Segment& segment : impl_->binding->layout().segments()) names.push_back(segment.name);
  return names;
}

std::vector<std::string> DistributedOptimizer::given_layer_names() const {
  std::vector<std::string> names;
  for (const std::size_t segment : impl_->segment_of_layer) names.push_back(impl_->binding->layout().segment(segment).name);
  return names;
}

torch::Tensor DistributedOptimizer::flat_parameters() {
  std::span<float> parameters = impl_->binding->parameters();
  return torch::from_blob(parameters.data(), {static_cast<std::int64_t>(parameters.size())}, torch::kFloat32);
}

}  // namespace pipesgd
