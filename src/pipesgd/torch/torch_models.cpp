// The only translation unit that includes LibTorch.
#include "pipesgd/torch/torch_models.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/models/softmax_regression.h"
#include "pipesgd/torch/parameter_binding.h"
#include "pipesgd/torch/torchscript_export.h"

namespace pipesgd {
namespace {

constexpr std::int64_t image_side = 28;
constexpr std::size_t image_features = 784;
constexpr std::size_t class_count = 10;

// Intra-op threads requested by init_torch_runtime (0: not set). OpenMP keeps the thread count per
// calling thread, so every thread that runs a model applies it once itself (see apply_thread_setting).
std::atomic<int> configured_threads{0};

}  // namespace

void apply_torch_thread_setting() {
  thread_local int applied = 0;
  const int wanted = configured_threads.load(std::memory_order_relaxed);
  if (wanted > 0 && applied != wanted) {
    at::set_num_threads(wanted);
    applied = wanted;
  }
}

namespace {

// LibTorch's default initialisation draws from its global generator; this serialises seeding and
// construction so concurrent factory calls are deterministic.
std::mutex construction_mutex;

// [batch, 784] -> logits [batch, 10]. With a non-null `hook`, calls it before the forward first
// reads the parameters of each group of segments, in forward order, covering every segment once
// (the SegmentsNeededFn contract); with null, runs the plain forward.
using ForwardFn =
    std::function<torch::Tensor(const torch::Tensor& input, const SegmentsNeededFn* hook)>;

// A network plus its segments: one per layer that has parameters, in forward order, each listing
// that layer's parameter tensors in layout order.
struct Architecture {
  std::shared_ptr<torch::nn::Module> module;  // owns the parameters and BatchNorm buffers
  ForwardFn forward;
  std::vector<std::string> segment_names;
  std::vector<std::vector<torch::Tensor>> segment_parameters;
};

constexpr std::size_t no_segment = static_cast<std::size_t>(-1);

// Segments of a Sequential: one per child that has parameters, named by `names` in order. With a
// hook, the children run one by one (the same module calls as SequentialImpl::forward, so the
// result is bit-identical) and hook(s, s + 1) runs right before the child that owns segment s.
Architecture sequential_architecture(torch::nn::Sequential network, std::vector<std::string> names) {
  Architecture architecture;
  std::vector<std::size_t> segment_of_child;  // no_segment for children without parameters
  for (const torch::nn::AnyModule& child : *network) {
    std::vector<torch::Tensor> own = child.ptr()->parameters(/*recurse=*/true);
    if (own.empty()) {
      segment_of_child.push_back(no_segment);
    } else {
      segment_of_child.push_back(architecture.segment_parameters.size());
      architecture.segment_parameters.push_back(std::move(own));
    }
  }
  PIPESGD_ASSERT(!segment_of_child.empty());
  architecture.segment_names = std::move(names);
  architecture.module = network.ptr();
  architecture.forward = [network, segment_of_child = std::move(segment_of_child)](
                             const torch::Tensor& input, const SegmentsNeededFn* hook) mutable {
    if (hook == nullptr) return network->forward(input);
    torch::Tensor x = input;
    std::size_t child_index = 0;
    for (torch::nn::AnyModule& child : *network) {
      const std::size_t segment = segment_of_child[child_index++];
      if (segment != no_segment) (*hook)(segment, segment + 1);
      x = child.forward(x);
    }
    return x;
  };
  return architecture;
}

Architecture build_mlp() {
  using torch::nn::Linear;
  using torch::nn::ReLU;
  return sequential_architecture(
      torch::nn::Sequential(Linear(784, 500), ReLU(), Linear(500, 500), ReLU(), Linear(500, 10)),
      {"fc1", "fc2", "fc3"});
}

Architecture build_cnn() {
  using torch::nn::Conv2d;
  using torch::nn::Conv2dOptions;
  using torch::nn::Linear;
  using torch::nn::MaxPool2d;
  using torch::nn::MaxPool2dOptions;
  using torch::nn::ReLU;
  return sequential_architecture(
      torch::nn::Sequential(
          torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {1, image_side, image_side})),
          Conv2d(Conv2dOptions(1, 6, 5).padding(2)), ReLU(), MaxPool2d(MaxPool2dOptions(2)),
          Conv2d(Conv2dOptions(6, 16, 5)), ReLU(), MaxPool2d(MaxPool2dOptions(2)),
          torch::nn::Flatten(), Linear(400, 120), ReLU(), Linear(120, 84), ReLU(), Linear(84, 10)),
      {"conv1", "conv2", "fc1", "fc2", "fc3"});
}

torch::nn::Conv2d conv3x3(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, out_channels, 3)
                               .stride(stride)
                               .padding(1)
                               .bias(false));
}

// ResNet basic block: conv3x3 + BN + ReLU + conv3x3 + BN, plus the shortcut, then ReLU. When the
// shape changes, the shortcut is option A of He et al.: subsample with the block's stride and pad the
// new channels with zeros (half before, half after the existing ones); it has no parameters.
class BasicBlockImpl final : public torch::nn::Module {
 public:
  BasicBlockImpl(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride)
      : conv1_(register_module("conv1", conv3x3(in_channels, out_channels, stride))),
        bn1_(register_module("bn1", torch::nn::BatchNorm2d(out_channels))),
        conv2_(register_module("conv2", conv3x3(out_channels, out_channels, 1))),
        bn2_(register_module("bn2", torch::nn::BatchNorm2d(out_channels))),
        stride_(stride),
        pad_before_((out_channels - in_channels) / 2),
        pad_after_(out_channels - in_channels - pad_before_) {
    PIPESGD_ASSERT(out_channels >= in_channels);
  }

  torch::Tensor forward(const torch::Tensor& input) {
    torch::Tensor out = torch::relu(bn1_->forward(conv1_->forward(input)));
    out = bn2_->forward(conv2_->forward(out));
    return torch::relu(out + shortcut(input));
  }

 private:
  torch::Tensor shortcut(const torch::Tensor& input) const {
    if (stride_ == 1 && pad_before_ == 0 && pad_after_ == 0) return input;
    torch::Tensor subsampled = input;
    if (stride_ != 1) {
      subsampled = input.slice(2, 0, c10::nullopt, stride_).slice(3, 0, c10::nullopt, stride_);
    }
    return torch::constant_pad_nd(subsampled, {0, 0, 0, 0, pad_before_, pad_after_}, 0.0);
  }

  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_;
  torch::nn::Conv2d conv2_;
  torch::nn::BatchNorm2d bn2_;
  std::int64_t stride_;
  std::int64_t pad_before_;
  std::int64_t pad_after_;
};
TORCH_MODULE(BasicBlock);

// A half-open range of segment indices.
struct SegmentRange {
  std::size_t first = 0;
  std::size_t end = 0;
};

// ResNet-20 (He et al., CIFAR variant) for 28x28 grey images; see torch_models.h. Submodules are
// registered in forward order, so named_modules() lists the layers in forward order.
//
// Forward runs in parts: the stem (conv1, bn1), each basic block, then fc. Before part p first reads
// its parameters, forward calls the hook for that part's segment range (set_part_segments).
class ResNetImpl final : public torch::nn::Module {
 public:
  ResNetImpl()
      : conv1_(register_module("conv1", conv3x3(1, 16, 1))),
        bn1_(register_module("bn1", torch::nn::BatchNorm2d(16))) {
    part_modules_.push_back({"conv1", "bn1"});
    std::int64_t in_channels = 16;
    for (int stage = 1; stage <= 3; ++stage) {
      const std::int64_t width = std::int64_t{16} << (stage - 1);
      for (int block = 1; block <= 3; ++block) {
        const std::int64_t stride = stage > 1 && block == 1 ? 2 : 1;
        const std::string block_name = concat("s", stage, "b", block);
        blocks_.push_back(register_module(block_name, BasicBlock(in_channels, width, stride)));
        part_modules_.push_back({block_name});
        in_channels = width;
      }
    }
    fc_ = register_module("fc", torch::nn::Linear(64, static_cast<std::int64_t>(class_count)));
    part_modules_.push_back({"fc"});

    // Kaiming-normal convolutions (fan-out, as torchvision's ResNet); BatchNorm weight 1, bias 0
    // (LibTorch's default); the linear layer keeps LibTorch's default initialisation.
    for (const auto& module : modules(/*include_self=*/false)) {
      if (auto* conv = module->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      }
    }
  }

  // The top-level modules (names as registered) whose parameters each forward part reads, in
  // forward order: {conv1, bn1}, one block each, {fc}.
  const std::vector<std::vector<std::string>>& part_modules() const { return part_modules_; }
  // The segment range of each part (same order as part_modules()).
  void set_part_segments(std::vector<SegmentRange> part_segments) {
    PIPESGD_ASSERT(part_segments.size() == part_modules_.size());
    part_segments_ = std::move(part_segments);
  }

  // `hook` may be null (no calls); otherwise set_part_segments must have been called.
  torch::Tensor forward(const torch::Tensor& input, const SegmentsNeededFn* hook = nullptr) {
    std::size_t part = 0;
    const auto before_part = [&] {
      if (hook != nullptr) (*hook)(part_segments_[part].first, part_segments_[part].end);
      ++part;
    };
    torch::Tensor x = input.reshape({-1, 1, image_side, image_side});
    before_part();
    x = torch::relu(bn1_->forward(conv1_->forward(x)));
    for (BasicBlock& block : blocks_) {
      before_part();
      x = block->forward(x);
    }
    x = x.mean({2, 3});  // global average pooling
    before_part();
    return fc_->forward(x);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_;
  std::vector<BasicBlock> blocks_;
  torch::nn::Linear fc_{nullptr};
  std::vector<std::vector<std::string>> part_modules_;
  std::vector<SegmentRange> part_segments_;
};
TORCH_MODULE(ResNet);

// The segment range each forward part reads, from the segment names: a segment belongs to the part
// owning the module it is named after ("s2b1.bn1" belongs to the part of module "s2b1"). Asserts that
// every segment belongs to exactly one part and that the parts' ranges are non-empty, in forward
// order and contiguous (so the hook calls cover every segment once, in order).
std::vector<SegmentRange> forward_part_segments(
    const std::vector<std::vector<std::string>>& part_modules,
    const std::vector<std::string>& segment_names) {
  const auto owns = [](const std::string& module, const std::string& segment) {
    return segment == module ||
           (segment.size() > module.size() && segment.compare(0, module.size(), module) == 0 &&
            segment[module.size()] == '.');
  };
  std::vector<SegmentRange> ranges;
  std::size_t segment = 0;
  for (const std::vector<std::string>& modules : part_modules) {
    SegmentRange range{segment, segment};
    while (range.end < segment_names.size() &&
           std::any_of(modules.begin(), modules.end(), [&](const std::string& module) {
             return owns(module, segment_names[range.end]);
           })) {
      ++range.end;
    }
    PIPESGD_ASSERT(range.end > range.first);
    ranges.push_back(range);
    segment = range.end;
  }
  PIPESGD_ASSERT(segment == segment_names.size());
  return ranges;
}

Architecture build_resnet() {
  ResNet network;
  Architecture architecture;
  // One segment per module with parameters of its own (conv: weight; BatchNorm and linear: weight,
  // bias), named by its path, e.g. "s2b1.bn1".
  for (const auto& item : network->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    std::vector<torch::Tensor> own = item.value()->parameters(/*recurse=*/false);
    if (own.empty()) continue;
    architecture.segment_names.push_back(item.key());
    architecture.segment_parameters.push_back(std::move(own));
  }
  network->set_part_segments(
      forward_part_segments(network->part_modules(), architecture.segment_names));
  architecture.module = network.ptr();
  architecture.forward = [network](const torch::Tensor& input,
                                   const SegmentsNeededFn* hook) mutable {
    return network->forward(input, hook);
  };
  return architecture;
}

// A non-owning float tensor over `data`; the memory must outlive every use of the tensor.
torch::Tensor view_of(float* data, c10::IntArrayRef sizes) {
  return torch::from_blob(data, sizes, torch::TensorOptions().dtype(torch::kFloat32));
}

std::vector<ParameterSegment> parameter_segments(Architecture& architecture) {
  PIPESGD_ASSERT(architecture.segment_parameters.size() == architecture.segment_names.size());
  std::vector<ParameterSegment> segments;
  std::size_t parameter_count = 0;
  for (std::size_t s = 0; s < architecture.segment_names.size(); ++s) {
    for (const torch::Tensor& parameter : architecture.segment_parameters[s]) {
      PIPESGD_ASSERT(parameter.defined() && parameter.scalar_type() == torch::kFloat32 &&
                     parameter.is_contiguous());
    }
    parameter_count += architecture.segment_parameters[s].size();
    segments.push_back({architecture.segment_names[s], std::move(architecture.segment_parameters[s])});
  }
  // Every parameter of the network belongs to exactly one segment.
  PIPESGD_ASSERT(parameter_count == architecture.module->parameters(/*recurse=*/true).size());
  return segments;
}

// A model whose LibTorch parameters are views into its binding's flat buffer. Built and then used by
// one thread at a time (the Model contract); autograd runs CPU backward on the calling thread, so the
// binding's hooks run on that thread too.
class TorchModel final : public Model {
 public:
  TorchModel(std::string name, Architecture architecture)
      : name_(std::move(name)),
        module_(architecture.module),
        forward_(std::move(architecture.forward)),
        binding_(parameter_segments(architecture)) {}
  ~TorchModel() override = default;
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  const Layout& layout() const override { return binding_.layout(); }
  std::span<float> parameters() override { return binding_.parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& on_ready) override;
  Evaluation evaluate(const Batch& batch) override;
  // Every architecture calls the hook from forward_backward (see Architecture::forward).
  bool reports_forward_progress() const override { return true; }
  void set_forward_hook(SegmentsNeededFn hook) override { forward_hook_ = std::move(hook); }

  std::size_t gradient_copy_count() const { return binding_.gradient_copy_count(); }
  void set_out_of_place_accumulation(bool enabled) { out_of_place_accumulation_ = enabled; }

  // resnet's BatchNorm statistics (mlp and cnn have no buffers).
  std::vector<std::byte> buffers() override { return buffer_bytes(module_->buffers()); }
  void load_buffers(std::span<const std::byte> bytes) override { load_buffer_bytes(module_->buffers(), bytes); }
  // The scripted twin of this network (torchscript_export.h), built once, given the current
  // parameters and buffers.
  std::string torchscript() override {
    if (!scripted_) scripted_ = builtin_torchscript_module(name_);
    copy_flat_parameters(*scripted_, binding_.parameters());
    std::map<std::string, torch::Tensor> scripted_buffers;
    for (const torch::jit::NameTensor& buffer : scripted_->named_buffers()) scripted_buffers[buffer.name] = buffer.value;
    torch::NoGradGuard no_grad;
    for (const auto& buffer : module_->named_buffers()) {
      const auto found = scripted_buffers.find(buffer.key());
      PIPESGD_ASSERT(found != scripted_buffers.end());
      found->second.copy_(buffer.value());
    }
    return saved_torchscript(*scripted_);
  }

 private:
  void validate(const Batch& batch, bool allow_empty) const;

  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  std::optional<torch::jit::Module> scripted_;
  ForwardFn forward_;
  SegmentsNeededFn forward_hook_;  // empty: none
  ParameterBinding binding_;
  bool out_of_place_accumulation_ = false;
};

void TorchModel::validate(const Batch& batch, bool allow_empty) const {
  if (batch.size == 0 && !allow_empty) {
    throw UsageError(concat("model '", name_, "': empty batch"));
  }
  if (batch.features != image_features) {
    throw UsageError(concat("model '", name_, "' expects ", image_features,
                            " features per example (28x28 images), batch has ", batch.features));
  }
  if (batch.inputs.size() < batch.size * batch.features || batch.labels.size() < batch.size) {
    throw UsageError(concat("model '", name_, "': batch of ", batch.size, " examples has only ",
                            batch.inputs.size(), " input values and ", batch.labels.size(),
                            " labels"));
  }
  for (std::size_t row = 0; row < batch.size; ++row) {
    const std::int32_t label = batch.labels[row];
    if (label < 0 || static_cast<std::size_t>(label) >= class_count) {
      throw UsageError(concat("model '", name_, "': label ", label, " of example ", row,
                              " is outside [0, ", class_count, ")"));
    }
  }
}

// Read-only tensors over rows [first_row, first_row + rows) of the caller's batch (no copy of the
// inputs; labels are widened to int64 as cross_entropy requires).
torch::Tensor input_rows(const Batch& batch, std::size_t first_row, std::size_t rows) {
  float* data = const_cast<float*>(batch.inputs.data() + first_row * batch.features);
  return view_of(data, {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(batch.features)});
}

torch::Tensor label_rows(const Batch& batch, std::size_t first_row, std::size_t rows) {
  auto* data = const_cast<std::int32_t*>(batch.labels.data() + first_row);
  return torch::from_blob(data, {static_cast<std::int64_t>(rows)},
                          torch::TensorOptions().dtype(torch::kInt32))
      .to(torch::kInt64);
}

StepResult TorchModel::forward_backward(const Batch& batch, std::span<float> gradients,
                                        const SegmentReadyFn& on_ready) {
  PIPESGD_ASSERT(gradients.size() == binding_.layout().total());
  apply_torch_thread_setting();
  validate(batch, /*allow_empty=*/false);
  StepResult result;

  Stopwatch forward_watch;
  module_->train(true);  // BatchNorm: batch statistics, and the running statistics are updated
  const torch::Tensor labels = label_rows(batch, 0, batch.size);
  const torch::Tensor logits =
      forward_(input_rows(batch, 0, batch.size), forward_hook_ ? &forward_hook_ : nullptr);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
  result.forward_seconds = forward_watch.seconds();
  {
    torch::NoGradGuard no_grad;
    result.correct = static_cast<std::size_t>(logits.argmax(1).eq(labels).sum().item<std::int64_t>());
  }

  Stopwatch backward_watch;
  binding_.backward(loss, gradients, on_ready, /*create_graph=*/out_of_place_accumulation_);
  result.backward_seconds = backward_watch.seconds();
  result.loss = loss.item<double>();
  return result;
}

Evaluation TorchModel::evaluate(const Batch& batch) {
  apply_torch_thread_setting();
  validate(batch, /*allow_empty=*/true);
  torch::NoGradGuard no_grad;
  module_->eval();  // BatchNorm: running statistics
  Evaluation evaluation;
  evaluation.count = batch.size;
  const auto summed = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (std::size_t first_row = 0; first_row < batch.size; first_row += kEvaluationChunkRows) {
    const std::size_t rows = std::min(kEvaluationChunkRows, batch.size - first_row);
    const torch::Tensor labels = label_rows(batch, first_row, rows);
    const torch::Tensor logits = forward_(input_rows(batch, first_row, rows), /*hook=*/nullptr);
    evaluation.loss_sum += torch::nn::functional::cross_entropy(logits, labels, summed).item<double>();
    evaluation.correct +=
        static_cast<std::size_t>(logits.argmax(1).eq(labels).sum().item<std::int64_t>());
  }
  return evaluation;
}

// SoftmaxRegression (pure C++) with its TorchScript twin: the CLI's "softmax".
class ExportableSoftmax final : public SoftmaxRegression {
 public:
  using SoftmaxRegression::SoftmaxRegression;
  std::string torchscript() override {
    torch::jit::Module scripted = builtin_torchscript_module("softmax");
    copy_flat_parameters(scripted, parameters());
    return saved_torchscript(scripted);
  }
};

const char* const not_a_torch_model =
    "not a LibTorch model (expected one built by torch_model_factory(\"mlp\", \"cnn\" or "
    "\"resnet\"))";

}  // namespace

std::string torch_version() { return TORCH_VERSION; }

void init_torch_runtime(int threads) {
  if (threads < 1) throw UsageError(concat("torch threads must be at least 1, got ", threads));
  configured_threads.store(threads, std::memory_order_relaxed);
  at::set_num_threads(threads);
  static std::once_flag interop_once;
  std::call_once(interop_once, [threads] {
    try {
      at::set_num_interop_threads(threads);
    } catch (const c10::Error&) {
      // Inter-op parallel work already started (or the count was set elsewhere); keep it.
    }
  });
}

std::vector<std::string> torch_model_names() { return {"mlp", "cnn", "resnet", "softmax"}; }

ModelFactory torch_model_factory(const std::string& name) {
  if (name == "softmax") {
    return [](std::uint64_t seed) -> std::unique_ptr<Model> {
      return std::make_unique<ExportableSoftmax>(image_features, class_count, seed);
    };
  }
  Architecture (*build)() = nullptr;
  if (name == "mlp") {
    build = build_mlp;
  } else if (name == "cnn") {
    build = build_cnn;
  } else if (name == "resnet") {
    build = build_resnet;
  } else {
    throw UsageError(concat("unknown model '", name, "' (expected mlp, cnn, resnet, softmax)"));
  }
  return [name, build](std::uint64_t seed) -> std::unique_ptr<Model> {
    std::lock_guard<std::mutex> lock(construction_mutex);
    torch::manual_seed(seed);
    return std::make_unique<TorchModel>(name, build());
  };
}

std::size_t torch_gradient_copy_count(const Model& model) {
  const auto* torch_model = dynamic_cast<const TorchModel*>(&model);
  if (torch_model == nullptr) throw UsageError(not_a_torch_model);
  return torch_model->gradient_copy_count();
}

void set_torch_out_of_place_accumulation_for_testing(Model& model, bool enabled) {
  auto* torch_model = dynamic_cast<TorchModel*>(&model);
  if (torch_model == nullptr) throw UsageError(not_a_torch_model);
  torch_model->set_out_of_place_accumulation(enabled);
}

}  // namespace pipesgd
