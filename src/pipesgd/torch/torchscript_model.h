#pragma once
// TorchScript models: a module saved by torch.jit.save (from Python) trained like the built-in
// models. This header does not include LibTorch.
//
// Layers (segments): the submodules that own trainable parameters (requires_grad) directly, each
// holding them in the module's registration order; the root module's own parameters form a segment
// named "root". Segments are ordered by backward readiness: when the factory is made, one forward and
// backward on a probe batch of zeros ([2, example_shape...]) records the order in which the layers'
// gradients complete; the layout is that order reversed (the layer whose gradient is final first is
// the last segment), so backward reports the segments as soon as they complete. Layers that got no
// gradient in the probe come first. Parameters without requires_grad stay in the module, untouched
// and not communicated.
// Parameters are views into the model's flat buffer (ParameterBinding); buffers (e.g. BatchNorm's
// running statistics) stay per replica, as resnet's (torch_models.h). forward_backward runs in train
// mode, evaluate() in eval mode, both with LibTorch's graph optimizer off (the JIT interprets the
// graph op by op, so autograd runs the same kernels as eager LibTorch and reports layers one by one).
// Inputs: [batch, example_shape...] floats (a copy of the batch; a module may modify its input).
// No forward hook: reports_forward_progress() is false, so a method applies pending updates before
// the next forward starts (SAPipe's synchronous layers included).
// Every replica loads the same bytes, so initial weights are identical and do not depend on the seed.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pipesgd/core/model.h"

namespace pipesgd {

// The training loss of a model. Built-in models are cross-entropy classifiers.
//   cross-entropy: output logits [B, C] with C >= the data's classes; integer labels. Accuracy: arg-max.
//   nll: output log-probabilities [B, C]; integer labels (torch.nn.functional.nll_loss). Accuracy: arg-max.
//   mse: output of the targets' shape ([B, k], or [B] or [B, 1] for k = 1); regression targets. No
//        accuracy (StepResult::correct and Evaluation::correct stay 0; reports show none).
enum class Loss { kCrossEntropy, kNll, kMse };

// "cross-entropy", "nll", "mse" -> Loss; otherwise UsageError naming --loss.
Loss parse_loss(const std::string& text);
std::string loss_name(Loss loss);
// Whether the loss has an accuracy (arg-max against labels).
bool loss_has_accuracy(Loss loss);

// True if --model names a file (ends in ".pt" or contains a '/') rather than a built-in model.
bool names_torchscript_file(const std::string& model);

// Loads the TorchScript module at `path` and checks it against `train` (the training data's shape,
// Dataset::shape: its example shape, classes or targets) and `loss` with a probe forward; learns the
// segment order (above). Throws DataError for a
// missing or unreadable file or bytes that are not a TorchScript module, and UsageError for a module
// with no trainable parameters, a forward that fails on [2, example_shape...], or an output that does
// not fit the loss and data (naming the file, the output shape and what the loss needs). The returned
// factory ignores its seed; it may be called from several threads at once.
ModelFactory torchscript_model_factory(const std::string& path, Loss loss, const DataShape& train);

// The TorchScript module at `path` as a model whose layout holds its trainable layers in the order
// `layers` (a checkpoint's record of the layout, train/checkpointing.h), for `pipesgd export`: no data,
// no probe, and only parameters(), layout(), buffers(), load_buffers() and torchscript() are for
// use. Throws DataError for a missing or unreadable file or bytes that are not TorchScript, and
// UsageError if its trainable layers are not those of `layers`.
std::unique_ptr<Model> torchscript_model_for_export(const std::string& path, const std::vector<std::string>& layers);

// Loads a TorchScript module from `bytes` and discards it; any failure becomes a DataError naming
// `name` (the load path of torchscript_model_factory, for the fuzzer).
void check_torchscript_bytes(std::string_view bytes, const std::string& name);

}  // namespace pipesgd
