#pragma once
// LibTorch-backed models. This header does not include LibTorch; only torch_models.cpp does.
//
// Models (inputs: flat [batch, 784] floats, 28x28 images with values in [0, 1]; loss: mean
// cross-entropy):
//   mlp  Linear 784-500, ReLU, Linear 500-500, ReLU, Linear 500-10 (648010 parameters);
//        segments fc1, fc2, fc3.
//   cnn  LeNet: Conv2d(1,6,5,pad 2), ReLU, MaxPool 2; Conv2d(6,16,5), ReLU, MaxPool 2;
//        Linear 400-120, ReLU; Linear 120-84, ReLU; Linear 84-10 (61706 parameters);
//        segments conv1, conv2, fc1, fc2, fc3.
//   resnet  ResNet-20 (He et al., the CIFAR variant) for 28x28 inputs: conv3x3(1,16) + BN + ReLU;
//        three stages of 3 basic blocks with 16, 32, 64 channels (the first block of stages 2
//        and 3 has stride 2: 28 -> 14 -> 7); global average pool; Linear 64-10. A basic block is
//        conv3x3 + BN + ReLU + conv3x3 + BN, plus the shortcut, then ReLU. Convolutions have no
//        bias. Shortcuts where the shape changes use option A: stride-2 subsampling and
//        zero-padded channels (half before, half after), no parameters. 269434 parameters in 59
//        tensors; 39 segments, one per layer with parameters, in forward order:
//          conv1, bn1,
//          s1b1.conv1, s1b1.bn1, s1b1.conv2, s1b1.bn2, ... s1b3.bn2,  (stage 1, 16 channels)
//          s2b1.conv1, ... s2b3.bn2,                                (stage 2, 32 channels)
//          s3b1.conv1, ... s3b3.bn2,                                (stage 3, 64 channels)
//          fc.
//        A conv segment holds the weight only (9 * in * out values); a BN segment weight then bias
//        (2 * channels). Init: Kaiming-normal convolutions (fan-out, ReLU gain), BN weight 1 and
//        bias 0, LibTorch's default for fc.
//        BatchNorm: forward_backward runs in train mode (batch statistics; updates the running
//        statistics), evaluate() in eval mode (running statistics). The running statistics are
//        buffers, not parameters: they are not in the flat buffer, never communicated, and stay per
//        replica (like PyTorch DDP with broadcast_buffers=False), so replicas' evaluate() results can
//        differ slightly even with identical parameters.
// Each segment holds one layer's parameters: weight then bias (resnet's conv segments: weight only).
// The parameters of the LibTorch modules are views into the model's flat parameter buffer, and
// backward accumulates straight into the caller's flat gradient buffer; on_ready fires from autograd
// hooks as each layer's gradient becomes final.
// Forward hook (Model::set_forward_hook; reports_forward_progress() is true for all three): called
// from forward_backward only, never from evaluate(). mlp and cnn call hook(s, s + 1) right before the
// layer of segment s (running the Sequential's layers one by one; bit-identical to the plain
// forward). resnet calls it per part: hook(0, 2) before the stem (conv1, bn1), hook(2 + 4b, 6 + 4b)
// before basic block b = 0..8 (its conv1, bn1, conv2, bn2), hook(38, 39) before fc. The hook's time
// counts in forward_seconds. With no hook the plain forward runs.
#include <cstddef>
#include <string>
#include <vector>

#include "pipesgd/core/model.h"

namespace pipesgd {

// Sets LibTorch's intra-op thread count (a process-wide setting that every thread picks up) and, the
// first time only, its inter-op thread count; if inter-op parallel work has already started, that
// part is skipped. Callers running N workers as threads on few cores pass 1. Throws UsageError if
// threads < 1. Call before building models; safe to call again.
void init_torch_runtime(int threads);

// Applies init_torch_runtime's thread count to the calling thread (OpenMP keeps it per thread); every
// model calls it at the start of forward_backward and evaluate. Cheap after the first call.
void apply_torch_thread_setting();

// The rows every model's evaluate() runs through one forward (the built-in models and TorchScript
// files). Large chunks are slow: ResNet-20's eval forward on one thread (LibTorch 1.13, 2-core
// EPYC) takes 0.47 ms per image in chunks of 25 to 200 rows, 3.9 ms at 500 and 9.6 ms at 1000 (at
// 1000 rows one layer's activations are 50 MB).
inline constexpr std::size_t kEvaluationChunkRows = 100;

// The LibTorch version this binary was built with, e.g. "1.13.0".
std::string torch_version();

// Factory for `name`: "mlp", "cnn", "resnet", or "softmax" (SoftmaxRegression(784, 10), so the CLI has
// a single entry point). Throws UsageError("unknown model 'x' (expected mlp, cnn, resnet, softmax)")
// otherwise.
// The returned factory may be called from several threads at once: LibTorch's default initialisation
// draws from its global generator (torch::manual_seed(seed)), so construction is serialised by a
// process-wide mutex; the same seed always gives bit-identical parameters. Note that this reseeds
// LibTorch's global generator.
ModelFactory torch_model_factory(const std::string& name);

// What every built-in model takes: flat examples of 784 features (28x28) and labels 0 to 9.
inline constexpr std::size_t kBuiltinModelFeatures = 784;
inline constexpr std::size_t kBuiltinModelClasses = 10;

// The names torch_model_factory accepts, in the order of the error message.
std::vector<std::string> torch_model_names();

// Diagnostics for models built by torch_model_factory("mlp" | "cnn" | "resnet"); both throw UsageError
// for any other model.
//
// How often a parameter's gradient had to be copied into the caller's gradient buffer because
// LibTorch replaced the gradient tensor instead of accumulating in place. Zero in normal operation.
std::size_t torch_gradient_copy_count(const Model& model);

// For tests of the copy fallback: when enabled, backward builds a double-backward graph, which makes
// LibTorch accumulate out of place (so every parameter takes the copy path). Slower; results stay
// correct.
void set_torch_out_of_place_accumulation_for_testing(Model& model, bool enabled);

}  // namespace pipesgd
