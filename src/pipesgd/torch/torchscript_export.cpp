#include "pipesgd/torch/torchscript_export.h"

#include <cstring>
#include <memory>
#include <sstream>
#include <utility>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// Builds one scripted module: every instance its own class (mangled like Python's scripted
// submodules, original name kept), its constants written into its code.
class ScriptBuilder {
 public:
  torch::jit::Module module(const std::string& class_name) {
    torch::jit::Module module(c10::QualifiedName(concat("__torch__.pipesgd.", class_name)), unit_,
                              /*shouldMangle=*/true);
    module.register_attribute("training", c10::BoolType::get(), true);
    return module;
  }

  torch::jit::Module linear(std::int64_t in, std::int64_t out) {
    torch::jit::Module layer = module("Linear");
    layer.register_parameter("weight", torch::zeros({out, in}), false);
    layer.register_parameter("bias", torch::zeros({out}), false);
    layer.define(R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.linear(x, self.weight, self.bias)
)");
    return layer;
  }

  torch::jit::Module conv2d(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                            std::int64_t padding, bool bias) {
    torch::jit::Module layer = module("Conv2d");
    layer.register_parameter("weight", torch::zeros({out, in, kernel, kernel}), false);
    if (bias) layer.register_parameter("bias", torch::zeros({out}), false);
    layer.define(concat(R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.conv2d(x, self.weight, )", bias ? "self.bias" : "None", ", [", stride, ", ", stride, "], [", padding,
                        ", ", padding, R"(], [1, 1], 1)
)"));
    return layer;
  }

  // BatchNorm2d with LibTorch's defaults (eps 1e-5, momentum 0.1, affine, running statistics).
  torch::jit::Module batch_norm(std::int64_t channels) {
    torch::jit::Module layer = module("BatchNorm2d");
    layer.register_parameter("weight", torch::ones({channels}), false);
    layer.register_parameter("bias", torch::zeros({channels}), false);
    layer.register_buffer("running_mean", torch::zeros({channels}));
    layer.register_buffer("running_var", torch::ones({channels}));
    layer.register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
    layer.define(R"(
def forward(self, x: Tensor) -> Tensor:
    if self.training:
        self.num_batches_tracked.add_(1)
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, self.training, 0.1, 1e-05, False)
)");
    return layer;
  }

 private:
  std::shared_ptr<torch::jit::CompilationUnit> unit_ = std::make_shared<torch::jit::CompilationUnit>();
};

torch::jit::Module mlp(ScriptBuilder& builder) {
  torch::jit::Module root = builder.module("Mlp");
  root.register_module("fc1", builder.linear(784, 500));
  root.register_module("fc2", builder.linear(500, 500));
  root.register_module("fc3", builder.linear(500, 10));
  root.define(R"(
def forward(self, x: Tensor) -> Tensor:
    x = x.reshape([x.size(0), 784])
    x = torch.relu(self.fc1.forward(x))
    x = torch.relu(self.fc2.forward(x))
    return self.fc3.forward(x)
)");
  return root;
}

torch::jit::Module cnn(ScriptBuilder& builder) {
  torch::jit::Module root = builder.module("Cnn");
  root.register_module("conv1", builder.conv2d(1, 6, 5, 1, 2, true));
  root.register_module("conv2", builder.conv2d(6, 16, 5, 1, 0, true));
  root.register_module("fc1", builder.linear(400, 120));
  root.register_module("fc2", builder.linear(120, 84));
  root.register_module("fc3", builder.linear(84, 10));
  root.define(R"(
def forward(self, x: Tensor) -> Tensor:
    x = x.reshape([x.size(0), 1, 28, 28])
    x = torch.max_pool2d(torch.relu(self.conv1.forward(x)), [2, 2], [2, 2], [0, 0], [1, 1], False)
    x = torch.max_pool2d(torch.relu(self.conv2.forward(x)), [2, 2], [2, 2], [0, 0], [1, 1], False)
    x = torch.flatten(x, 1)
    x = torch.relu(self.fc1.forward(x))
    x = torch.relu(self.fc2.forward(x))
    return self.fc3.forward(x)
)");
  return root;
}

// torch_models.cpp's BasicBlockImpl: shortcut option A (subsample, zero-pad the new channels).
torch::jit::Module basic_block(ScriptBuilder& builder, std::int64_t in, std::int64_t out, std::int64_t stride) {
  torch::jit::Module block = builder.module("BasicBlock");
  block.register_module("conv1", builder.conv2d(in, out, 3, stride, 1, false));
  block.register_module("bn1", builder.batch_norm(out));
  block.register_module("conv2", builder.conv2d(out, out, 3, 1, 1, false));
  block.register_module("bn2", builder.batch_norm(out));
  const std::int64_t pad_before = (out - in) / 2;
  const std::int64_t pad_after = out - in - pad_before;
  std::string shortcut = "x";
  if (stride != 1) shortcut = concat("x[:, :, ::", stride, ", ::", stride, "]");
  if (pad_before != 0 || pad_after != 0) {
    shortcut = concat("torch.constant_pad_nd(", shortcut, ", [0, 0, 0, 0, ", pad_before, ", ", pad_after, "], 0.0)");
  }
  block.define(concat(R"(
def forward(self, x: Tensor) -> Tensor:
    out = torch.relu(self.bn1.forward(self.conv1.forward(x)))
    out = self.bn2.forward(self.conv2.forward(out))
    return torch.relu(out + )", shortcut, R"()
)"));
  return block;
}

torch::jit::Module resnet(ScriptBuilder& builder) {
  torch::jit::Module root = builder.module("ResNet");
  root.register_module("conv1", builder.conv2d(1, 16, 3, 1, 1, false));
  root.register_module("bn1", builder.batch_norm(16));
  std::string blocks;
  std::int64_t in = 16;
  for (int stage = 1; stage <= 3; ++stage) {
    const std::int64_t width = std::int64_t{16} << (stage - 1);
    for (int block = 1; block <= 3; ++block) {
      const std::string name = concat("s", stage, "b", block);
      root.register_module(name, basic_block(builder, in, width, stage > 1 && block == 1 ? 2 : 1));
      blocks += concat("    x = self.", name, ".forward(x)\n");
      in = width;
    }
  }
  root.register_module("fc", builder.linear(64, 10));
  root.define(concat(R"(
def forward(self, x: Tensor) -> Tensor:
    x = x.reshape([-1, 1, 28, 28])
    x = torch.relu(self.bn1.forward(self.conv1.forward(x)))
)", blocks, R"(    x = x.mean([2, 3])
    return self.fc.forward(x)
)"));
  return root;
}

// SoftmaxRegression(784, 10): one linear layer on the flat example.
torch::jit::Module softmax(ScriptBuilder& builder) {
  torch::jit::Module root = builder.module("SoftmaxRegression");
  root.register_module("linear", builder.linear(784, 10));
  root.define(R"(
def forward(self, x: Tensor) -> Tensor:
    return self.linear.forward(x.reshape([x.size(0), 784]))
)");
  return root;
}

}  // namespace

torch::jit::Module builtin_torchscript_module(const std::string& name) {
  ScriptBuilder builder;
  if (name == "mlp") return mlp(builder);
  if (name == "cnn") return cnn(builder);
  if (name == "resnet") return resnet(builder);
  if (name == "softmax") return softmax(builder);
  throw UsageError(concat("unknown model '", name, "' (expected mlp, cnn, resnet, softmax)"));
}

void copy_flat_parameters(torch::jit::Module& module, std::span<const float> parameters) {
  torch::NoGradGuard no_grad;
  std::size_t offset = 0;
  for (const torch::Tensor& parameter : module.parameters(/*recurse=*/true)) {
    const auto count = static_cast<std::size_t>(parameter.numel());
    PIPESGD_ASSERT(offset + count <= parameters.size() && parameter.is_contiguous() &&
                   parameter.scalar_type() == torch::kFloat32);
    std::memcpy(parameter.data_ptr<float>(), parameters.data() + offset, count * sizeof(float));
    offset += count;
  }
  PIPESGD_ASSERT(offset == parameters.size());
}

std::vector<std::byte> buffer_bytes(const std::vector<torch::Tensor>& buffers) {
  std::vector<std::byte> bytes;
  for (const torch::Tensor& buffer : buffers) {
    const torch::Tensor values = buffer.contiguous();
    const auto* data = static_cast<const std::byte*>(values.data_ptr());
    bytes.insert(bytes.end(), data, data + values.nbytes());
  }
  return bytes;
}

void load_buffer_bytes(const std::vector<torch::Tensor>& buffers, std::span<const std::byte> bytes) {
  std::size_t offset = 0;
  for (const torch::Tensor& buffer : buffers) {
    const std::size_t size = buffer.nbytes();
    PIPESGD_ASSERT(buffer.is_contiguous() && offset + size <= bytes.size());
    std::memcpy(buffer.data_ptr(), bytes.data() + offset, size);
    offset += size;
  }
  PIPESGD_ASSERT(offset == bytes.size());
}

std::string saved_torchscript(torch::jit::Module& module) {
  const bool training = module.is_training();
  module.eval();
  std::ostringstream stream;
  try {
    module.save(stream);
  } catch (...) {
    module.train(training);
    throw;
  }
  module.train(training);
  return std::move(stream).str();
}

}  // namespace pipesgd
