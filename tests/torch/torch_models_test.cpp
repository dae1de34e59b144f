#include "pipesgd/torch/torch_models.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr std::size_t image_features = 784;

// Owns the memory a Batch points into.
struct OwnedBatch {
  std::vector<float> inputs;
  std::vector<std::int32_t> labels;

  Batch view() const { return labelled_batch(inputs, labels, labels.size(), image_features); }
};

// Deterministic "images" with values in [0, 1) and labels in [0, 10).
OwnedBatch make_images(std::size_t rows, std::uint32_t salt) {
  OwnedBatch batch;
  std::uint32_t state = 2463534242u ^ (salt * 2654435761u);
  for (std::size_t i = 0; i < rows * image_features; ++i) {
    state = state * 1664525u + 1013904223u;
    batch.inputs.push_back(static_cast<float>(state >> 8) / static_cast<float>(1u << 24));
  }
  for (std::size_t row = 0; row < rows; ++row) {
    batch.labels.push_back(static_cast<std::int32_t>((row * 7 + salt) % 10));
  }
  return batch;
}

// The same architectures, written independently with plain LibTorch modules.
struct ReferenceMlp : torch::nn::Module {
  torch::nn::Linear fc1{784, 500}, fc2{500, 500}, fc3{500, 10};
  ReferenceMlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1->forward(x));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }
};

struct ReferenceCnn : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 6, 5).padding(2)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(6, 16, 5)};
  torch::nn::Linear fc1{400, 120}, fc2{120, 84}, fc3{84, 10};
  ReferenceCnn() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.reshape({-1, 1, 28, 28});
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = x.flatten(1);
    x = torch::relu(fc1->forward(x));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }
};

// ResNet-20 for 28x28 inputs, spelled out block by block. The option-A shortcut is written as a
// concatenation with zero channels.
struct ReferenceBlock : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  std::int64_t in_channels, out_channels, stride;
  ReferenceBlock(std::int64_t in, std::int64_t out, std::int64_t stride_)
      : in_channels(in), out_channels(out), stride(stride_) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3)
                                                           .stride(stride)
                                                           .padding(1)
                                                           .bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
    conv2 = register_module(
        "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor shortcut = x;
    if (stride != 1 || in_channels != out_channels) {
      using torch::indexing::Slice;
      const torch::Tensor sub = x.index({Slice(), Slice(), Slice(0, torch::indexing::None, stride),
                                         Slice(0, torch::indexing::None, stride)});
      const std::int64_t extra = (out_channels - in_channels) / 2;
      auto zeros = [&](std::int64_t channels) {
        return torch::zeros({sub.size(0), channels, sub.size(2), sub.size(3)});
      };
      shortcut = torch::cat({zeros(extra), sub, zeros(out_channels - in_channels - extra)}, 1);
    }
    const torch::Tensor y = torch::relu(bn1->forward(conv1->forward(x)));
    return torch::relu(bn2->forward(conv2->forward(y)) + shortcut);
  }
};

struct ReferenceResNet : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)};
  torch::nn::BatchNorm2d bn1{16};
  std::vector<std::shared_ptr<ReferenceBlock>> blocks;
  torch::nn::Linear fc{nullptr};
  ReferenceResNet() {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    const std::int64_t widths[] = {16, 32, 64};
    std::int64_t in = 16;
    for (int stage = 0; stage < 3; ++stage) {
      for (int block = 0; block < 3; ++block) {
        const std::int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
        blocks.push_back(register_module(
            "s" + std::to_string(stage + 1) + "b" + std::to_string(block + 1),
            std::make_shared<ReferenceBlock>(in, widths[stage], stride)));
        in = widths[stage];
      }
    }
    fc = register_module("fc", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1->forward(conv1->forward(x.reshape({-1, 1, 28, 28}))));
    for (const auto& block : blocks) x = block->forward(x);
    return fc->forward(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
};

// Copies `params` (flat, layout order) into the parameters of `network`.
void load_parameters(torch::nn::Module& network, std::span<const float> params) {
  torch::NoGradGuard no_grad;
  std::size_t offset = 0;
  for (torch::Tensor& parameter : network.parameters()) {
    const auto count = static_cast<std::size_t>(parameter.numel());
    ASSERT_LE(offset + count, params.size());
    std::memcpy(parameter.data_ptr<float>(), params.data() + offset, count * sizeof(float));
    offset += count;
  }
  EXPECT_EQ(offset, params.size());
}

torch::Tensor input_tensor(const OwnedBatch& batch) {
  return torch::tensor(batch.inputs).reshape(
      {static_cast<std::int64_t>(batch.labels.size()), static_cast<std::int64_t>(image_features)});
}

torch::Tensor label_tensor(const OwnedBatch& batch) {
  return torch::tensor(batch.labels).to(torch::kInt64);
}

struct ReferenceResult {
  double loss = 0;
  std::vector<float> gradients;
};

// Loads `params` (flat, layout order) into a fresh reference network and runs loss.backward().
template <typename Network>
ReferenceResult reference_step(std::span<const float> params, const OwnedBatch& batch) {
  Network network;  // train mode: BatchNorm uses batch statistics
  load_parameters(network, params);
  const torch::Tensor loss =
      torch::nn::functional::cross_entropy(network.forward(input_tensor(batch)), label_tensor(batch));
  loss.backward();
  ReferenceResult result;
  result.loss = loss.item<double>();
  for (const torch::Tensor& parameter : network.parameters()) {
    const torch::Tensor grad = parameter.grad().contiguous();
    result.gradients.insert(result.gradients.end(), grad.data_ptr<float>(),
                            grad.data_ptr<float>() + grad.numel());
  }
  return result;
}

ReferenceResult reference_step(const std::string& name, std::span<const float> params,
                               const OwnedBatch& batch) {
  if (name == "mlp") return reference_step<ReferenceMlp>(params, batch);
  if (name == "cnn") return reference_step<ReferenceCnn>(params, batch);
  return reference_step<ReferenceResNet>(params, batch);
}

// Parameter tensors of each architecture (the copy fallback copies each once per backward).
std::size_t parameter_tensor_count(const std::string& name) {
  if (name == "mlp") return 3 * 2;
  if (name == "cnn") return 5 * 2;
  return 19 + 19 * 2 + 2;  // resnet: 19 conv weights, 19 BatchNorms, fc
}

// Elementwise |actual - expected| <= 1e-5 * max(|expected|, floor), where the floor (a thousandth of
// the largest expected magnitude) keeps near-zero entries from demanding absolute exactness.
void expect_close(std::span<const float> actual, const std::vector<float>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  float largest = 0;
  for (float value : expected) largest = std::max(largest, std::abs(value));
  ASSERT_GT(largest, 0.0f);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const float tolerance = 1e-5f * std::max(std::abs(expected[i]), 1e-3f * largest);
    if (!(std::abs(actual[i] - expected[i]) <= tolerance) && ++mismatches <= 5) {
      ADD_FAILURE() << "element " << i << ": " << actual[i] << " vs expected " << expected[i];
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

bool bit_identical(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class TorchModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { init_torch_runtime(1); }
  std::unique_ptr<Model> build(std::uint64_t seed) { return torch_model_factory(GetParam())(seed); }
};

TEST_P(TorchModelTest, LayoutHasOneSegmentPerLayer) {
  const auto model = build(1);
  const Layout& layout = model->layout();
  std::vector<std::string> names;
  std::size_t expected_offset = 0;
  for (const Segment& segment : layout.segments()) {
    names.push_back(segment.name);
    EXPECT_EQ(segment.offset, expected_offset);
    expected_offset += segment.count;
  }
  EXPECT_EQ(layout.total(), expected_offset);
  EXPECT_EQ(model->parameters().size(), layout.total());
  if (GetParam() == "mlp") {
    EXPECT_EQ(layout.total(), 648010u);
    EXPECT_EQ(names, (std::vector<std::string>{"fc1", "fc2", "fc3"}));
    EXPECT_EQ(layout.segment(0).count, 784u * 500 + 500);
  } else if (GetParam() == "resnet") {
    // Computed from the architecture: conv3x3 weights 9*in*out, BatchNorm 2*channels, fc 64*10+10.
    std::vector<std::string> expected_names{"conv1", "bn1"};
    std::vector<std::size_t> expected_counts{9 * 1 * 16, 2 * 16};
    std::size_t in = 16;
    for (std::size_t stage = 1; stage <= 3; ++stage) {
      const std::size_t width = 16u << (stage - 1);
      for (std::size_t block = 1; block <= 3; ++block) {
        const std::string prefix = "s" + std::to_string(stage) + "b" + std::to_string(block) + ".";
        expected_names.insert(expected_names.end(),
                              {prefix + "conv1", prefix + "bn1", prefix + "conv2", prefix + "bn2"});
        expected_counts.insert(expected_counts.end(),
                               {9 * in * width, 2 * width, 9 * width * width, 2 * width});
        in = width;
      }
    }
    expected_names.push_back("fc");
    expected_counts.push_back(64 * 10 + 10);
    std::size_t expected_total = 0;
    for (std::size_t count : expected_counts) expected_total += count;
    EXPECT_EQ(names, expected_names);
    EXPECT_EQ(layout.segment_count(), 39u);
    EXPECT_EQ(layout.total(), expected_total);
    EXPECT_EQ(layout.total(), 269434u);  // the figure documented in torch_models.h
    for (std::size_t segment = 0; segment < expected_counts.size() && segment < layout.segment_count();
         ++segment) {
      EXPECT_EQ(layout.segment(segment).count, expected_counts[segment]) << names[segment];
    }
  } else {
    EXPECT_EQ(layout.total(), 61706u);
    EXPECT_EQ(names, (std::vector<std::string>{"conv1", "conv2", "fc1", "fc2", "fc3"}));
    EXPECT_EQ(layout.segment(0).count, 6u * 25 + 6);
  }
}

TEST_P(TorchModelTest, ParametersAliasTheModuleParameters) {
  const auto model = build(2);
  const OwnedBatch batch = make_images(20, 1);
  std::span<float> params = model->parameters();

  // All-zero parameters: every logit is 0, so the loss is log(10) per example.
  std::fill(params.begin(), params.end(), 0.0f);
  Evaluation evaluation = model->evaluate(batch.view());
  EXPECT_NEAR(evaluation.loss_sum / 20, std::log(10.0), 1e-6);

  // Raising the last layer's bias for class 3 makes every prediction 3.
  const Segment& last = model->layout().segments().back();
  params[last.offset + last.count - 10 + 3] = 5.0f;
  evaluation = model->evaluate(batch.view());
  std::size_t threes = 0;
  for (std::int32_t label : batch.labels) threes += label == 3 ? 1 : 0;
  EXPECT_EQ(evaluation.correct, threes);
  EXPECT_EQ(evaluation.count, 20u);

  std::vector<float> gradients(model->layout().total());
  const StepResult step = model->forward_backward(batch.view(), gradients, {});
  const double expected_loss = std::log(9.0 + std::exp(5.0)) * (20.0 - threes) / 20.0 +
                               (std::log(9.0 + std::exp(5.0)) - 5.0) * threes / 20.0;
  EXPECT_NEAR(step.loss, expected_loss, 1e-5);
}

TEST_P(TorchModelTest, GradientsMatchPlainLibTorch) {
  const auto model = build(3);
  const OwnedBatch batch = make_images(32, 2);
  std::vector<float> gradients(model->layout().total(), std::numeric_limits<float>::quiet_NaN());
  const StepResult step = model->forward_backward(batch.view(), gradients, {});
  const ReferenceResult reference = reference_step(GetParam(), model->parameters(), batch);
  EXPECT_NEAR(step.loss, reference.loss, 1e-5 * reference.loss);
  expect_close(gradients, reference.gradients);
  EXPECT_GE(step.forward_seconds, 0.0);
  EXPECT_GE(step.backward_seconds, 0.0);
  EXPECT_EQ(torch_gradient_copy_count(*model), 0u) << "LibTorch did not accumulate in place";

  // Evaluation agrees with the mean loss of the step (not for resnet: its evaluation uses BatchNorm's
  // running statistics; see the ResNetModel tests).
  if (GetParam() != "resnet") {
    const Evaluation evaluation = model->evaluate(batch.view());
    EXPECT_NEAR(evaluation.loss_sum / 32, step.loss, 1e-5);
  }
}

TEST_P(TorchModelTest, EvaluateChunksLargeBatches) {
  const auto model = build(4);
  // Past one kEvaluationChunkRows-row chunk either way (so are the tenths, but resnet's); resnet
  // only just, to stay fast.
  const std::size_t rows = GetParam() == "resnet" ? kEvaluationChunkRows + 10 : 23 * kEvaluationChunkRows;
  const std::size_t part_rows = rows / 10;
  const OwnedBatch batch = make_images(rows, 3);
  // One training step first: resnet then evaluates with running statistics other than the initial
  // (0, 1).
  std::vector<float> gradients(model->layout().total());
  model->forward_backward(make_images(8, 30).view(), gradients, {});
  const Evaluation whole = model->evaluate(batch.view());
  EXPECT_EQ(whole.count, rows);
  double loss_sum = 0;
  std::size_t correct = 0;
  for (std::size_t first = 0; first < rows; first += part_rows) {
    const Batch part = labelled_batch(
        std::span<const float>(batch.inputs).subspan(first * image_features, part_rows * image_features),
        std::span<const std::int32_t>(batch.labels).subspan(first, part_rows), part_rows, image_features);
    const Evaluation evaluation = model->evaluate(part);
    loss_sum += evaluation.loss_sum;
    correct += evaluation.correct;
  }
  EXPECT_NEAR(whole.loss_sum, loss_sum, 1e-6 * loss_sum);
  EXPECT_EQ(whole.correct, correct);
}

TEST_P(TorchModelTest, AlternatingGradientBuffersStayCorrect) {
  const auto model = build(5);
  const OwnedBatch first_batch = make_images(16, 4);
  const OwnedBatch second_batch = make_images(16, 5);
  const std::size_t total = model->layout().total();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> buffer_a(total, nan);
  std::vector<float> buffer_b(total, nan);

  for (int round = 0; round < 2; ++round) {
    model->forward_backward(first_batch.view(), buffer_a, {});
    const std::vector<float> a_after_first_step = buffer_a;
    model->forward_backward(second_batch.view(), buffer_b, {});
    EXPECT_TRUE(bit_identical(buffer_a, a_after_first_step)) << "writing B changed A";
    expect_close(buffer_a, reference_step(GetParam(), model->parameters(), first_batch).gradients);
    expect_close(buffer_b, reference_step(GetParam(), model->parameters(), second_batch).gradients);
    // Move the parameters so the next round produces different values in the same buffers.
    std::span<float> params = model->parameters();
    for (std::size_t i = 0; i < total; ++i) params[i] -= 0.1f * buffer_a[i];
  }

  // More buffers than the view cache holds, rotating: each still receives exactly its gradient.
  std::vector<std::vector<float>> slots(11, std::vector<float>(total, nan));
  const std::vector<float> expected =
      reference_step(GetParam(), model->parameters(), first_batch).gradients;
  for (int pass = 0; pass < 2; ++pass) {
    for (std::vector<float>& slot : slots) {
      std::fill(slot.begin(), slot.end(), nan);
      model->forward_backward(first_batch.view(), slot, {});
    }
  }
  for (const std::vector<float>& slot : slots) expect_close(slot, expected);
  EXPECT_EQ(torch_gradient_copy_count(*model), 0u);
}

// Checks each segment is reported once, last to first, with times >= 0, and that a reported segment
// already holds its final gradient in the caller's buffer.
void expect_ready_reports_in_backward_order(Model& model, const OwnedBatch& batch) {
  const Layout& layout = model.layout();
  std::vector<float> gradients(layout.total());
  std::vector<std::size_t> order;
  std::vector<double> times;
  std::vector<std::vector<float>> snapshots(layout.segment_count());
  const StepResult step =
      model.forward_backward(batch.view(), gradients, [&](std::size_t segment, double seconds) {
        order.push_back(segment);
        times.push_back(seconds);
        const std::span<const float> values = layout.slice(std::span<const float>(gradients), segment);
        snapshots.at(segment).assign(values.begin(), values.end());
      });
  std::vector<std::size_t> expected_order;
  for (std::size_t segment = layout.segment_count(); segment-- > 0;) expected_order.push_back(segment);
  EXPECT_EQ(order, expected_order);
  double time_sum = 0;
  for (double seconds : times) {
    EXPECT_GE(seconds, 0.0);
    time_sum += seconds;
  }
  // Nested intervals of one clock (each segment's time lies inside the backward pass), not a speed
  // claim.
  EXPECT_GE(step.backward_seconds + 1e-6, time_sum);
  for (std::size_t segment = 0; segment < layout.segment_count(); ++segment) {
    EXPECT_TRUE(bit_identical(snapshots[segment], layout.slice(std::span<const float>(gradients), segment)))
        << "segment " << segment << " changed after it was reported ready";
  }
}

TEST_P(TorchModelTest, ReportsEachSegmentOnceInBackwardOrder) {
  const auto model = build(6);
  const OwnedBatch batch = make_images(8, 6);
  expect_ready_reports_in_backward_order(*model, batch);
  expect_ready_reports_in_backward_order(*model, batch);  // hooks are not re-registered
}

TEST_P(TorchModelTest, CopyFallbackKeepsCallerBufferCorrect) {
  const auto model = build(7);
  const OwnedBatch batch = make_images(8, 7);
  set_torch_out_of_place_accumulation_for_testing(*model, true);
  std::vector<float> gradients(model->layout().total(), std::numeric_limits<float>::quiet_NaN());
  model->forward_backward(batch.view(), gradients, {});
  EXPECT_EQ(torch_gradient_copy_count(*model), parameter_tensor_count(GetParam()));
  expect_close(gradients, reference_step(GetParam(), model->parameters(), batch).gradients);
  expect_ready_reports_in_backward_order(*model, batch);

  set_torch_out_of_place_accumulation_for_testing(*model, false);
  const std::size_t copies = torch_gradient_copy_count(*model);
  model->forward_backward(batch.view(), gradients, {});
  EXPECT_EQ(torch_gradient_copy_count(*model), copies);
  expect_close(gradients, reference_step(GetParam(), model->parameters(), batch).gradients);
}

TEST_P(TorchModelTest, SeedDeterminesParameters) {
  const auto first = build(42);
  const auto second = build(42);
  const auto other = build(43);
  EXPECT_TRUE(bit_identical(first->parameters(), second->parameters()));
  EXPECT_FALSE(bit_identical(first->parameters(), other->parameters()));

  // Concurrent construction is serialised and stays deterministic.
  std::vector<std::unique_ptr<Model>> built(4);
  const ModelFactory factory = torch_model_factory(GetParam());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < built.size(); ++i) {
    threads.emplace_back([&built, &factory, i] { built[i] = factory(i % 2 == 0 ? 42 : 43); });
  }
  for (std::thread& thread : threads) thread.join();
  for (std::size_t i = 0; i < built.size(); ++i) {
    EXPECT_TRUE(bit_identical(built[i]->parameters(),
                              (i % 2 == 0 ? first : other)->parameters()))
        << "model " << i;
  }
}

TEST_P(TorchModelTest, RejectsMalformedBatches) {
  const auto model = build(8);
  std::vector<float> gradients(model->layout().total());
  OwnedBatch batch = make_images(4, 8);

  Batch wrong_features = batch.view();
  wrong_features.features = 100;
  EXPECT_THROW(model->forward_backward(wrong_features, gradients, {}), UsageError);
  EXPECT_THROW(model->evaluate(wrong_features), UsageError);

  OwnedBatch bad_label = batch;
  bad_label.labels[1] = 10;
  EXPECT_THROW(model->forward_backward(bad_label.view(), gradients, {}), UsageError);
  EXPECT_THROW(model->evaluate(bad_label.view()), UsageError);
  bad_label.labels[1] = -1;
  EXPECT_THROW(model->forward_backward(bad_label.view(), gradients, {}), UsageError);

  Batch too_few_inputs = batch.view();
  too_few_inputs.inputs = too_few_inputs.inputs.first(image_features);
  EXPECT_THROW(model->forward_backward(too_few_inputs, gradients, {}), UsageError);

  // The model still works after rejecting input.
  model->forward_backward(batch.view(), gradients, {});
  expect_close(gradients, reference_step(GetParam(), model->parameters(), batch).gradients);
}

TEST_P(TorchModelTest, ExceptionFromReadyCallbackLeavesModelUsable) {
  const auto model = build(9);
  const OwnedBatch batch = make_images(4, 9);
  std::vector<float> gradients(model->layout().total());
  EXPECT_THROW(model->forward_backward(batch.view(), gradients,
                                       [](std::size_t, double) { throw CommError("link down"); }),
               CommError);
  expect_ready_reports_in_backward_order(*model, batch);
  model->forward_backward(batch.view(), gradients, {});
  expect_close(gradients, reference_step(GetParam(), model->parameters(), batch).gradients);
}

INSTANTIATE_TEST_SUITE_P(Architectures, TorchModelTest, ::testing::Values("mlp", "cnn", "resnet"),
                         [](const auto& info) { return info.param; });

TEST(TorchModelFactory, UnknownNameIsAUsageError) {
  try {
    torch_model_factory("vgg");
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_STREQ(error.what(), "unknown model 'vgg' (expected mlp, cnn, resnet, softmax)");
  }
}

TEST(TorchModelFactory, SoftmaxIsServedByTheSameEntryPoint) {
  EXPECT_EQ(torch_model_names(), (std::vector<std::string>{"mlp", "cnn", "resnet", "softmax"}));
  const auto model = torch_model_factory("softmax")(1);
  EXPECT_EQ(model->layout().total(), 784u * 10 + 10);
  EXPECT_THROW(torch_gradient_copy_count(*model), UsageError);
}

// ResNet-specific behaviour: BatchNorm modes and running statistics, and trainability.

// Mean loss and correct count of a reference ResNet in eval mode.
std::pair<double, std::size_t> reference_eval(ReferenceResNet& network, const OwnedBatch& batch) {
  torch::NoGradGuard no_grad;
  network.eval();
  const torch::Tensor logits = network.forward(input_tensor(batch));
  const torch::Tensor labels = label_tensor(batch);
  return {torch::nn::functional::cross_entropy(logits, labels).item<double>(),
          static_cast<std::size_t>(logits.argmax(1).eq(labels).sum().item<std::int64_t>())};
}

TEST(ResNetModel, EvaluateUsesRunningStatisticsAndTrainingUsesBatchStatistics) {
  init_torch_runtime(1);
  const auto model = torch_model_factory("resnet")(11);
  const OwnedBatch train_batch = make_images(8, 11);
  const OwnedBatch test_batch = make_images(6, 12);
  const std::vector<float> initial(model->parameters().begin(), model->parameters().end());
  ReferenceResNet reference;
  load_parameters(reference, initial);

  // Fresh running statistics (mean 0, variance 1); evaluation is repeatable and matches the
  // reference in eval mode.
  const Evaluation first = model->evaluate(test_batch.view());
  const Evaluation second = model->evaluate(test_batch.view());
  EXPECT_EQ(first.loss_sum, second.loss_sum);
  EXPECT_EQ(first.correct, second.correct);
  auto [reference_loss, reference_correct] = reference_eval(reference, test_batch);
  EXPECT_NEAR(first.loss_sum / 6, reference_loss, 1e-5 * reference_loss);
  EXPECT_EQ(first.correct, reference_correct);

  // forward_backward runs in train mode although evaluate() ran last: the loss is the reference's
  // train-mode loss (batch statistics), which differs from the eval-mode loss on the same batch.
  std::vector<float> gradients(model->layout().total());
  const StepResult step = model->forward_backward(train_batch.view(), gradients, {});
  const ReferenceResult train_reference = reference_step<ReferenceResNet>(initial, train_batch);
  EXPECT_NEAR(step.loss, train_reference.loss, 1e-5 * train_reference.loss);
  expect_close(gradients, train_reference.gradients);
  const Evaluation eval_on_train_batch = model->evaluate(train_batch.view());
  EXPECT_GT(std::abs(eval_on_train_batch.loss_sum / 8 - step.loss), 1e-4);

  // The step left the parameters alone (they are only changed by the caller) but moved the
  // running statistics, so the evaluation changes, exactly as the reference's after one train-mode
  // forward pass on the same batch.
  EXPECT_TRUE(bit_identical(model->parameters(), initial));
  const Evaluation after = model->evaluate(test_batch.view());
  EXPECT_GT(std::abs(after.loss_sum - first.loss_sum), 1e-4 * first.loss_sum);
  {
    torch::NoGradGuard no_grad;
    reference.train();
    reference.forward(input_tensor(train_batch));
  }
  std::tie(reference_loss, reference_correct) = reference_eval(reference, test_batch);
  EXPECT_NEAR(after.loss_sum / 6, reference_loss, 1e-5 * reference_loss);
  EXPECT_EQ(after.correct, reference_correct);
  EXPECT_EQ(model->evaluate(test_batch.view()).loss_sum, after.loss_sum);

  // Running statistics are per-replica state, not parameters: a fresh replica with the same
  // parameters still evaluates with the initial statistics.
  const auto untrained = torch_model_factory("resnet")(11);
  EXPECT_TRUE(bit_identical(untrained->parameters(), model->parameters()));
  EXPECT_EQ(untrained->evaluate(test_batch.view()).loss_sum, first.loss_sum);
}

TEST(ResNetModel, SgdStepsReduceTheLossOnAFixedBatch) {
  init_torch_runtime(1);
  const auto model = torch_model_factory("resnet")(12);
  const OwnedBatch batch = make_images(8, 13);
  std::vector<float> gradients(model->layout().total());
  std::span<float> params = model->parameters();
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    losses.push_back(model->forward_backward(batch.view(), gradients, {}).loss);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.05f * gradients[i];
  }
  losses.push_back(model->forward_backward(batch.view(), gradients, {}).loss);
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "first " << losses.front() << ", last "
                                                  << losses.back();
}

TEST(TorchRuntime, RejectsNonPositiveThreadCountAndIsRepeatable) {
  EXPECT_THROW(init_torch_runtime(0), UsageError);
  init_torch_runtime(1);
  init_torch_runtime(1);
  EXPECT_EQ(at::get_num_threads(), 1);
}

}  // namespace
}  // namespace pipesgd
