// Oracle: D-Sync with p workers of batch b must follow the same trajectory as one LibTorch process
// training the same MLP with torch::optim::SGD on batches of p*b (the union of the workers' batches).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "pipesgd/data/dataset.h"
#include "pipesgd/data/sampler.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {
namespace {

struct PlainMlp : torch::nn::Module {
  PlainMlp()
      : fc1(register_module("fc1", torch::nn::Linear(784, 500))),
        fc2(register_module("fc2", torch::nn::Linear(500, 500))),
        fc3(register_module("fc3", torch::nn::Linear(500, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};

// Copies a flat parameter buffer (per layer: weight then bias) into the module.
void load_flat(PlainMlp& model, std::span<const float> flat) {
  torch::NoGradGuard no_grad;
  std::size_t offset = 0;
  for (auto* layer : {&model.fc1, &model.fc2, &model.fc3}) {
    for (torch::Tensor parameter : {(*layer)->weight, (*layer)->bias}) {
      const auto n = static_cast<std::size_t>(parameter.numel());
      parameter.copy_(torch::from_blob(const_cast<float*>(flat.data() + offset), parameter.sizes()));
      offset += n;
    }
  }
  ASSERT_EQ(offset, flat.size());
}

std::vector<float> to_flat(PlainMlp& model) {
  std::vector<float> flat;
  for (auto* layer : {&model.fc1, &model.fc2, &model.fc3}) {
    for (torch::Tensor parameter : {(*layer)->weight, (*layer)->bias}) {
      auto contiguous = parameter.detach().contiguous();
      flat.insert(flat.end(), contiguous.data_ptr<float>(), contiguous.data_ptr<float>() + contiguous.numel());
    }
  }
  return flat;
}

double relative_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0, norm = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    difference += std::pow(double(actual[i]) - expected[i], 2);
    norm += std::pow(double(expected[i]), 2);
  }
  return std::sqrt(difference / norm);
}

TEST(Oracle, DSyncMatchesLibTorchSgdWithGlobalBatch) {
  init_torch_runtime(1);
  constexpr int kWorkers = 4;
  constexpr std::size_t kBatch = 8;
  constexpr std::int64_t kIterations = 20;
  const DataSplits data = make_synthetic(2000, 100, 21);

  TrainConfig config;
  apply_method_spec("dsync", config);
  config.workers = kWorkers;
  config.model = "mlp";
  config.batch = kBatch;
  config.iterations = kIterations;
  config.seed = 5;
  config.progress = false;
  config.evaluate = false;
  config.keep_parameters = true;
  config.method.sgd = SgdOptions{0.05f, 0.9f, 1e-4f};
  const RunSummary ours = run_training(config, torch_model_factory("mlp"), data);

  PlainMlp reference;
  load_flat(reference, torch_model_factory("mlp")(config.seed)->parameters());
  torch::optim::SGD sgd(reference.parameters(),
                        torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  ShardedSampler sampler(data.train.size, kWorkers, 0, kBatch, config.seed);
  sampler.start_epoch(0);
  BatchAssembler assembler(data.train, kWorkers * kBatch);
  for (std::int64_t i = 0; i < kIterations; ++i) {
    const Batch batch = assembler.assemble(sampler.global_batch_indices(static_cast<std::size_t>(i)));
    auto inputs = torch::from_blob(const_cast<float*>(batch.inputs.data()),
                                   {static_cast<long>(batch.size), 784});
    auto labels = torch::from_blob(const_cast<std::int32_t*>(batch.labels.data()),
                                   {static_cast<long>(batch.size)}, torch::kInt32)
                      .to(torch::kInt64);
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(reference.forward(inputs), labels).backward();
    sgd.step();
  }
  const std::vector<float> expected = to_flat(reference);
  const auto initial_model = torch_model_factory("mlp")(config.seed);
  const std::vector<float> initial(initial_model->parameters().begin(), initial_model->parameters().end());
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_LE(relative_error(ours.final_parameters[rank], expected), 1e-5) << "rank " << rank;
  }
  // The comparison is meaningful: training moved the weights by far more than the tolerance.
  EXPECT_GT(relative_error(initial, expected), 1e-3);
}

}  // namespace
}  // namespace pipesgd
