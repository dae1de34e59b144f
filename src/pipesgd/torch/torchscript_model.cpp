#include "pipesgd/torch/torchscript_model.h"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "pipesgd/core/error.h"
#include "pipesgd/torch/parameter_binding.h"
#include "pipesgd/torch/torchscript_export.h"
#include "pipesgd/torch/torchscript_load.h"
#include "pipesgd/torch/torch_models.h"

namespace pipesgd {
namespace {

constexpr std::int64_t probe_rows = 2;  // BatchNorm in train mode needs more than one value per channel

// Rethrows our checked errors unchanged; turns anything else LibTorch throws into UsageError(prefix:
// its line).
[[noreturn]] void rethrow_as_usage_error(const std::string& prefix) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    throw UsageError(concat(prefix, ": ", torch_error_line(error)));
  }
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) text += concat(i == 0 ? "" : ", ", sizes[i]);
  return text + "]";
}

std::string read_model_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw DataError(concat("cannot read model file '", path, "' (missing or unreadable)"));
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) throw DataError(concat("cannot read model file '", path, "'"));
  return bytes;
}

// The segments of `module` in registration (forward) order: each submodule's own trainable parameters.
std::vector<ParameterSegment> module_segments(const torch::jit::Module& module) {
  std::vector<ParameterSegment> segments;
  for (const torch::jit::NameModule& item : module.named_modules()) {
    ParameterSegment segment{item.name.empty() ? std::string("root") : item.name, {}};
    for (const torch::jit::NameTensor& parameter : item.value.named_parameters(/*recurse=*/false)) {
      if (parameter.value.requires_grad()) segment.parameters.push_back(parameter.value);
    }
    if (!segment.parameters.empty()) segments.push_back(std::move(segment));
  }
  return segments;
}

// A TorchScript module whose trainable parameters are views into its binding's flat buffer, with
// the segments in `order` (names). Used by one thread at a time (the Model contract).
class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(std::string file, torch::jit::Module module, Loss loss, DataShape data,
                   const std::vector<std::string>& order)
      : file_(std::move(file)), module_(std::move(module)), loss_(loss), data_(std::move(data)),
        binding_(ordered_segments(module_, order)) {}

  const Layout& layout() const override { return binding_.layout(); }
  std::span<float> parameters() override { return binding_.parameters(); }

  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& on_ready) override {
    PIPESGD_ASSERT(gradients.size() == binding_.layout().total());
    apply_torch_thread_setting();
    torch::jit::GraphOptimizerEnabledGuard eager_like(false);
    validate(batch, /*allow_empty=*/false);
    StepResult result;
    try {
      Stopwatch forward_watch;
      module_.train(true);
      const torch::Tensor output = run(input_rows(batch, 0, batch.size));
      const torch::Tensor loss = loss_of(output, batch, 0, batch.size, torch::Reduction::Mean);
      result.forward_seconds = forward_watch.seconds();
      result.correct = correct_of(output, batch, 0, batch.size);
      Stopwatch backward_watch;
      binding_.backward(loss, gradients, on_ready);
      result.backward_seconds = backward_watch.seconds();
      result.loss = loss.item<double>();
    } catch (...) {
      rethrow_as_usage_error(concat("model file '", file_, "': training step failed"));
    }
    return result;
  }

  Evaluation evaluate(const Batch& batch) override {
    apply_torch_thread_setting();
    torch::jit::GraphOptimizerEnabledGuard eager_like(false);
    validate(batch, /*allow_empty=*/true);
    torch::NoGradGuard no_grad;
    Evaluation evaluation;
    evaluation.count = batch.size;
    try {
      module_.eval();
      for (std::size_t first = 0; first < batch.size; first += kEvaluationChunkRows) {
        const std::size_t rows = std::min(kEvaluationChunkRows, batch.size - first);
        const torch::Tensor output = run(input_rows(batch, first, rows));
        evaluation.loss_sum += loss_of(output, batch, first, rows, torch::Reduction::Sum).item<double>();
        evaluation.correct += correct_of(output, batch, first, rows);
      }
    } catch (...) {
      rethrow_as_usage_error(concat("model file '", file_, "': evaluation failed"));
    }
    return evaluation;
  }

  // For the factory's probe: the forward on `input` in train mode, with its output checked against
  // the loss.
  torch::Tensor checked_output(const torch::Tensor& input) {
    torch::Tensor output;
    try {
      output = run(input);
    } catch (...) {
      rethrow_as_usage_error(
          concat("model file '", file_, "': forward on an input of shape ", shape_text(input.sizes()), " failed"));
    }
    check_output(output, input.size(0));
    return output;
  }

  // The module's buffers (e.g. BatchNorm's running statistics), recursively, in named_buffers order.
  std::vector<std::byte> buffers() override { return buffer_bytes(buffer_tensors()); }
  void load_buffers(std::span<const std::byte> bytes) override { load_buffer_bytes(buffer_tensors(), bytes); }
  // The loaded module itself: its trainable parameters are the flat buffer's views.
  std::string torchscript() override {
    try {
      return saved_torchscript(module_);
    } catch (...) {
      rethrow_as_usage_error(concat("model file '", file_, "': saving as TorchScript failed"));
    }
  }

  ParameterBinding& binding() { return binding_; }
  torch::jit::Module& module() { return module_; }

  static std::vector<ParameterSegment> ordered_segments(const torch::jit::Module& module,
                                                        const std::vector<std::string>& order) {
    std::vector<ParameterSegment> segments = module_segments(module);
    if (order.empty()) return segments;
    std::map<std::string, ParameterSegment*> by_name;
    for (ParameterSegment& segment : segments) by_name[segment.name] = &segment;
    std::vector<ParameterSegment> ordered;
    for (const std::string& name : order) ordered.push_back(std::move(*by_name.at(name)));
    PIPESGD_ASSERT(ordered.size() == segments.size());
    return ordered;
  }

 private:
  std::vector<torch::Tensor> buffer_tensors() const {
    std::vector<torch::Tensor> tensors;
    for (const torch::Tensor& buffer : module_.buffers(/*recurse=*/true)) tensors.push_back(buffer);
    return tensors;
  }

  torch::Tensor run(const torch::Tensor& input) {
    const c10::IValue value = module_.forward({input});
    if (!value.isTensor()) {
      throw UsageError(concat("model file '", file_, "': forward returned a ", value.tagKind(),
                              ", expected a tensor (", loss_needs(input.size(0)), ")"));
    }
    return value.toTensor();
  }

  std::string loss_needs(std::int64_t rows) const {
    switch (loss_) {
      case Loss::kCrossEntropy:
        return concat("--loss cross-entropy needs logits [", rows, ", C] with C >= ", data_.classes, " classes");
      case Loss::kNll:
        return concat("--loss nll needs log-probabilities [", rows, ", C] with C >= ", data_.classes, " classes");
      case Loss::kMse:
        return data_.target_features == 1
                   ? concat("--loss mse needs the targets' shape [", rows, "] or [", rows, ", 1]")
                   : concat("--loss mse needs the targets' shape [", rows, ", ", data_.target_features, "]");
    }
    return {};
  }

  void check_output(const torch::Tensor& output, std::int64_t rows) const {
    bool fits = output.scalar_type() == torch::kFloat32;
    if (loss_ == Loss::kMse) {
      const auto k = static_cast<std::int64_t>(data_.target_features);
      fits = fits && ((output.dim() == 2 && output.size(0) == rows && output.size(1) == k) ||
                      (k == 1 && output.dim() == 1 && output.size(0) == rows));
    } else {
      fits = fits && output.dim() == 2 && output.size(0) == rows &&
             output.size(1) >= static_cast<std::int64_t>(data_.classes);
    }
    if (!fits) {
      throw UsageError(concat("model file '", file_, "' outputs ", c10::toString(output.scalar_type()), " ",
                              shape_text(output.sizes()), " for a batch of ", rows, " but ", loss_needs(rows),
                              " (float32)"));
    }
  }

  void validate(const Batch& batch, bool allow_empty) const {
    if (batch.size == 0 && !allow_empty) throw UsageError(concat("model file '", file_, "': empty batch"));
    std::size_t features = 1;
    for (std::int64_t d : data_.example_shape) features *= static_cast<std::size_t>(d);
    PIPESGD_ASSERT(batch.features == features && batch.inputs.size() >= batch.size * batch.features);
    if (loss_ == Loss::kMse) {
      PIPESGD_ASSERT(batch.target_features == data_.target_features &&
                     batch.targets.size() >= batch.size * batch.target_features);
    } else {
      PIPESGD_ASSERT(batch.labels.size() >= batch.size);
      for (std::size_t row = 0; row < batch.size; ++row) {
        const std::int32_t label = batch.labels[row];
        if (label < 0 || static_cast<std::size_t>(label) >= data_.classes) {
          throw UsageError(concat("model file '", file_, "': label ", label, " of example ", row,
                                  " is outside [0, ", data_.classes, ")"));
        }
      }
    }
  }

  torch::Tensor input_rows(const Batch& batch, std::size_t first, std::size_t rows) const {
    std::vector<std::int64_t> shape{static_cast<std::int64_t>(rows)};
    shape.insert(shape.end(), data_.example_shape.begin(), data_.example_shape.end());
    auto* data = const_cast<float*>(batch.inputs.data() + first * batch.features);
    return torch::from_blob(data, shape, torch::TensorOptions().dtype(torch::kFloat32)).clone();
  }

  torch::Tensor loss_of(const torch::Tensor& output, const Batch& batch, std::size_t first, std::size_t rows,
                        torch::Reduction::Reduction reduction) const {
    check_output(output, static_cast<std::int64_t>(rows));
    if (loss_ == Loss::kMse) {
      auto* data = const_cast<float*>(batch.targets.data() + first * batch.target_features);
      const torch::Tensor targets =
          torch::from_blob(data, output.sizes(), torch::TensorOptions().dtype(torch::kFloat32));
      torch::Tensor loss = torch::mse_loss(output, targets, reduction);
      // Evaluation sums per-example losses: the mean over an example's target values.
      if (reduction == torch::Reduction::Sum) loss = loss / static_cast<double>(data_.target_features);
      return loss;
    }
    const torch::Tensor labels = label_rows(batch, first, rows);
    if (loss_ == Loss::kNll) return torch::nll_loss(output, labels, /*weight=*/{}, reduction);
    return torch::cross_entropy_loss(output, labels, /*weight=*/{}, reduction);
  }

  std::size_t correct_of(const torch::Tensor& output, const Batch& batch, std::size_t first, std::size_t rows) const {
    if (!loss_has_accuracy(loss_)) return 0;
    torch::NoGradGuard no_grad;
    return static_cast<std::size_t>(
        output.argmax(1).eq(label_rows(batch, first, rows)).sum().item<std::int64_t>());
  }

  static torch::Tensor label_rows(const Batch& batch, std::size_t first, std::size_t rows) {
    auto* data = const_cast<std::int32_t*>(batch.labels.data() + first);
    return torch::from_blob(data, {static_cast<std::int64_t>(rows)}, torch::TensorOptions().dtype(torch::kInt32))
        .to(torch::kInt64);
  }

  std::string file_;
  torch::jit::Module module_;
  Loss loss_;
  DataShape data_;
  ParameterBinding binding_;  // after module_: destroyed first, while the module is alive
};

// Zeros as a probe batch's labels (class 0) or targets.
struct ProbeBatch {
  std::vector<float> inputs;
  std::vector<std::int32_t> labels;
  std::vector<float> targets;
  Batch batch;
};

ProbeBatch probe_batch(const DataShape& train, Loss loss) {
  ProbeBatch probe;
  probe.inputs.assign(probe_rows * train.features, 0.0f);
  Batch& batch = probe.batch;
  batch.size = probe_rows;
  batch.features = train.features;
  batch.inputs = probe.inputs;
  batch.example_shape = train.example_shape;
  if (loss == Loss::kMse) {
    probe.targets.assign(probe_rows * train.target_features, 0.0f);
    batch.targets = probe.targets;
    batch.target_features = train.target_features;
  } else {
    probe.labels.assign(probe_rows, 0);
    batch.labels = probe.labels;
  }
  return probe;
}

// The data's shape as the module sees it: its example shape is the data's, or its flat rows.
DataShape module_data_shape(const DataShape& train) {
  DataShape shape = train;
  if (shape.example_shape.empty()) shape.example_shape = {static_cast<std::int64_t>(train.features)};
  return shape;
}

std::mutex load_mutex;  // torch::jit::load of one replica at a time (deterministic, no shared state worries)

}  // namespace

Loss parse_loss(const std::string& text) {
  if (text == "cross-entropy") return Loss::kCrossEntropy;
  if (text == "nll") return Loss::kNll;
  if (text == "mse") return Loss::kMse;
  throw UsageError(concat("--loss must be cross-entropy, nll or mse, got '", text, "'"));
}

std::string loss_name(Loss loss) {
  switch (loss) {
    case Loss::kCrossEntropy: return "cross-entropy";
    case Loss::kNll: return "nll";
    case Loss::kMse: return "mse";
  }
  return {};
}

bool loss_has_accuracy(Loss loss) { return loss != Loss::kMse; }

bool names_torchscript_file(const std::string& model) {
  return model.find('/') != std::string::npos ||
         (model.size() > 3 && model.compare(model.size() - 3, 3, ".pt") == 0);
}

ModelFactory torchscript_model_factory(const std::string& path, Loss loss, const DataShape& train) {
  apply_torch_thread_setting();
  if (loss == Loss::kMse && !train.regression()) {
    throw UsageError(concat("--loss mse needs regression targets; ", train.name,
                            " is labelled (use --loss cross-entropy or nll)"));
  }
  if (loss != Loss::kMse && train.regression()) {
    throw UsageError(concat("--loss ", loss_name(loss), " needs labels; ", train.name,
                            " has regression targets (use --loss mse)"));
  }
  auto bytes = std::make_shared<const std::string>(read_model_file(path));
  const DataShape shape = module_data_shape(train);
  std::vector<std::string> order;
  {
    std::lock_guard<std::mutex> lock(load_mutex);
    torch::jit::GraphOptimizerEnabledGuard eager_like(false);
    torch::jit::Module module = load_torchscript(*bytes, path);
    if (module_segments(module).empty()) {
      throw UsageError(concat("model file '", path, "' has no trainable parameters"));
    }
    // The probe: one forward and backward in train mode on zeros, on a copy that is then dropped.
    TorchScriptModel probe_model(path, module, loss, shape, {});
    ProbeBatch probe = probe_batch(train, loss);
    std::vector<std::int64_t> input_shape{probe_rows};
    input_shape.insert(input_shape.end(), shape.example_shape.begin(), shape.example_shape.end());
    probe_model.module().train(true);
    const torch::Tensor output = probe_model.checked_output(torch::zeros(input_shape));
    std::vector<float> gradients(probe_model.layout().total());
    (void)probe_model.forward_backward(probe.batch, gradients, SegmentReadyFn{});
    // Layout: segments that never completed, then the completion order reversed.
    const Layout& layout = probe_model.layout();
    const std::vector<std::size_t>& completed = probe_model.binding().segment_readiness_order();
    std::vector<char> seen(layout.segment_count(), 0);
    for (std::size_t s : completed) seen[s] = 1;
    for (std::size_t s = 0; s < layout.segment_count(); ++s) {
      if (!seen[s]) order.push_back(layout.segment(s).name);
    }
    for (auto it = completed.rbegin(); it != completed.rend(); ++it) order.push_back(layout.segment(*it).name);
  }
  return [path, bytes, loss, shape, order](std::uint64_t /*seed*/) -> std::unique_ptr<Model> {
    std::lock_guard<std::mutex> lock(load_mutex);
    return std::make_unique<TorchScriptModel>(path, load_torchscript(*bytes, path), loss, shape, order);
  };
}

std::unique_ptr<Model> torchscript_model_for_export(const std::string& path, const std::vector<std::string>& layers) {
  apply_torch_thread_setting();
  const std::string bytes = read_model_file(path);
  std::lock_guard<std::mutex> lock(load_mutex);
  torch::jit::Module module = load_torchscript(bytes, path);
  std::vector<std::string> own;
  for (const ParameterSegment& segment : module_segments(module)) own.push_back(segment.name);
  std::vector<std::string> sorted_own = own, sorted_layers = layers;
  std::sort(sorted_own.begin(), sorted_own.end());
  std::sort(sorted_layers.begin(), sorted_layers.end());
  if (sorted_own != sorted_layers) {
    const auto list = [](const std::vector<std::string>& names) {
      std::string text;
      for (std::size_t i = 0; i < names.size() && i < 4; ++i) text += concat(i == 0 ? "" : ", ", names[i]);
      return names.size() > 4 ? concat(text, ", ... (", names.size(), ")") : text;
    };
    throw UsageError(concat("model file '", path, "' has the layers ", list(own), "; the checkpoint's model has ",
                            list(layers)));
  }
  return std::make_unique<TorchScriptModel>(path, std::move(module), Loss::kCrossEntropy, DataShape{}, layers);
}

}  // namespace pipesgd
