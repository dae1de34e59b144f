#pragma once
// Writing models as TorchScript (Model::torchscript): the built-in models as scripted modules, and a
// module's buffers as bytes. Includes LibTorch, so only code under src/pipesgd/torch/ includes it.
//
// LibTorch 1.13 has no torch.jit.script or torch.jit.trace for C++ nn::Modules, so the built-in
// models are written out as the same network in TorchScript source, compiled by LibTorch
// (torch::jit::Module::define) into a module of submodules with the same parameter and buffer names
// and the same ATen calls as the eager forward (torch.linear, torch.conv2d, torch.max_pool2d,
// torch.batch_norm, ...): torch.jit.load in Python reads it like any scripted module. Inputs:
// [batch, 784] or [batch, 1, 28, 28] (any shape of 784 values per example); output: logits
// [batch, 10].
#include <torch/script.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace pipesgd {

// The built-in model `name` ("mlp", "cnn", "resnet", "softmax": the layers of torch_models.h and
// models/softmax_regression.h) as a scripted module, its parameters zero and its buffers at their
// initial values. Its parameters (named_parameters(), recursively) come in the order of the model's
// flat layout: forward order, weight then bias. Throws UsageError for another name.
torch::jit::Module builtin_torchscript_module(const std::string& name);

// Copies `parameters`, a flat buffer of the model's layout, into the module's parameters in
// named_parameters() order (the built-in modules' order above). Asserts that the sizes add up.
void copy_flat_parameters(torch::jit::Module& module, std::span<const float> parameters);

// The bytes of `buffers` (each contiguous), one after the other, and back: load_buffer_bytes asserts
// that `bytes` has exactly their size.
std::vector<std::byte> buffer_bytes(const std::vector<torch::Tensor>& buffers);
void load_buffer_bytes(const std::vector<torch::Tensor>& buffers, std::span<const std::byte> bytes);

// What torch.jit.save writes for `module`, saved in eval mode (its mode is restored after).
std::string saved_torchscript(torch::jit::Module& module);

}  // namespace pipesgd
