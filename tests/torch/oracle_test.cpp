// Oracle: D-Sync with p workers of batch b must follow the same trajectory as one LibTorch process
// training the same MLP with torch::optim::SGD on batches of p*b (the union of the workers' batches),
// also across epoch boundaries, where the sampler reshuffles and drops the incomplete last batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "pipesgd/data/dataset.h"
#include "pipesgd/data/sampler.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/algo/registry.h"
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

constexpr float kLearningRate = 0.05f, kMomentum = 0.9f, kWeightDecay = 1e-4f;

TrainConfig dsync_config(int workers, std::size_t batch, std::int64_t iterations) {
  TrainConfig config;
  CommonOptions common;
  common.optimizer.sgd = SgdOptions{kLearningRate, kMomentum, kWeightDecay};
  config.method = select_method("dsync", {}, FlagPolicy::kReject, common);
  config.workers = workers;
  config.model = "mlp";
  config.batch = batch;
  config.iterations = iterations;
  config.seed = 5;
  config.progress = false;
  config.evaluate = false;
  config.keep_parameters = true;
  return config;
}

std::vector<float> initial_parameters(const TrainConfig& config) {
  const auto model = torch_model_factory("mlp")(config.seed);
  return {model->parameters().begin(), model->parameters().end()};
}

// One LibTorch process with torch::optim::SGD on the global batches: the data sampler's contract
// (data/sampler.h) for the union of the workers' batches: epoch e is a permutation of the training
// set drawn from (seed, e) alone; iteration i of an epoch takes its slice
// [i * global_batch, (i + 1) * global_batch); the last train_size % global_batch examples of each
// epoch are dropped, so an epoch has train_size / global_batch iterations and the next one starts
// on a fresh permutation. `reshuffle` = false keeps epoch 0's permutation forever (a sampler that
// forgot to reshuffle; for the test's own non-vacuity check).
struct Reference {
  std::vector<float> parameters;
  std::vector<double> epoch_loss;  // the mean loss of each epoch's iterations (before their update)
};

// `learning_rate`: when given, the learning rate of iteration t, set on the torch optimizer by hand
// before its step (a schedule's oracle).
Reference train_reference(const Dataset& train, const TrainConfig& config, bool reshuffle = true,
                          const std::function<double(std::int64_t)>& learning_rate = nullptr) {
  PlainMlp reference;
  load_flat(reference, initial_parameters(config));
  torch::optim::SGD sgd(reference.parameters(),
                        torch::optim::SGDOptions(kLearningRate).momentum(kMomentum).weight_decay(kWeightDecay));
  const std::size_t global_batch = static_cast<std::size_t>(config.workers) * config.batch;
  const std::size_t iterations_per_epoch = train.size / global_batch;
  ShardedSampler sampler(train.size, 1, 0, global_batch, config.seed);  // one worker: the global batch
  BatchAssembler assembler(train, global_batch);
  Reference result;
  double loss_sum = 0;
  for (std::int64_t t = 0; t < config.iterations; ++t) {
    const std::size_t epoch = static_cast<std::size_t>(t) / iterations_per_epoch;
    const std::size_t i = static_cast<std::size_t>(t) % iterations_per_epoch;
    if (i == 0) sampler.start_epoch(reshuffle ? epoch : 0);
    const Batch batch = assembler.assemble(sampler.permutation().subspan(i * global_batch, global_batch));
    auto inputs = torch::from_blob(const_cast<float*>(batch.inputs.data()),
                                   {static_cast<long>(batch.size), 784});
    auto labels = torch::from_blob(const_cast<std::int32_t*>(batch.labels.data()),
                                   {static_cast<long>(batch.size)}, torch::kInt32)
                      .to(torch::kInt64);
    sgd.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(reference.forward(inputs), labels);
    loss.backward();
    if (learning_rate) {
      static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options()).lr(learning_rate(t));
    }
    sgd.step();
    loss_sum += loss.item<double>();
    const bool epoch_ends = i + 1 == iterations_per_epoch || t + 1 == config.iterations;
    if (epoch_ends) {
      result.epoch_loss.push_back(loss_sum / static_cast<double>(i + 1));
      loss_sum = 0;
    }
  }
  result.parameters = to_flat(reference);
  return result;
}

TEST(Oracle, DSyncMatchesLibTorchSgdWithGlobalBatch) {
  init_torch_runtime(1);
  constexpr int kWorkers = 4;
  const DataSplits data = make_synthetic(2000, 100, 21);
  const TrainConfig config = dsync_config(kWorkers, 8, 20);
  const RunSummary ours = run_training(config, torch_model_factory("mlp"), data);
  const std::vector<float> expected = train_reference(data.train, config).parameters;
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_LE(relative_error(ours.final_parameters[rank], expected), 1e-5) << "rank " << rank;
  }
  // The comparison is meaningful: training moved the weights by far more than the tolerance.
  EXPECT_GT(relative_error(initial_parameters(config), expected), 1e-3);
}

// Across epoch boundaries: the training set holds 5 global batches and 3 examples more, so each
// epoch has 5 iterations and drops 3 examples, and 12 iterations run epochs 0 and 1 whole and 2
// iterations of epoch 2, each epoch on its own permutation. The reference follows the same batches.
class OracleAcrossEpochs : public ::testing::TestWithParam<int> {};

TEST_P(OracleAcrossEpochs, DSyncFollowsTheReshuffledBatchesOfEveryEpoch) {
  init_torch_runtime(1);
  const int workers = GetParam();
  constexpr std::size_t kBatch = 8;
  const std::size_t global_batch = static_cast<std::size_t>(workers) * kBatch;
  const DataSplits data = make_synthetic(5 * global_batch + 3, 50, 21);
  const TrainConfig config = dsync_config(workers, kBatch, 12);
  const RunSummary ours = run_training(config, torch_model_factory("mlp"), data);
  const Reference expected = train_reference(data.train, config);

  ASSERT_EQ(ours.epochs.size(), 3u);
  EXPECT_EQ(ours.epochs[0].iterations, 5);
  EXPECT_EQ(ours.epochs[1].iterations, 10);
  EXPECT_EQ(ours.epochs[2].iterations, 12);
  ASSERT_EQ(expected.epoch_loss.size(), 3u);
  for (std::size_t epoch = 0; epoch < 3; ++epoch) {
    // The epoch's training loss: the mean over its iterations and workers of the batch means, which
    // for equal batches is the mean of the global batches' losses.
    EXPECT_NEAR(ours.epochs[epoch].train_loss, expected.epoch_loss[epoch], 1e-5 * expected.epoch_loss[epoch])
        << "epoch " << epoch;
  }
  for (int rank = 0; rank < workers; ++rank) {
    EXPECT_LE(relative_error(ours.final_parameters[static_cast<std::size_t>(rank)], expected.parameters), 1e-5)
        << "rank " << rank;
  }
  // Not vacuous: the reshuffle matters (a reference that kept epoch 0's permutation ends far
  // outside the tolerance), and training moved the weights by far more than the tolerance.
  const Reference unshuffled = train_reference(data.train, config, /*reshuffle=*/false);
  EXPECT_GT(relative_error(unshuffled.parameters, expected.parameters), 1e-3);
  EXPECT_GT(relative_error(initial_parameters(config), expected.parameters), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Oracle, OracleAcrossEpochs, ::testing::Values(1, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "workers";
                         });

// A learning-rate schedule: D-Sync with --lr-schedule step:1:0.5 and --lr-warmup 3 (5 iterations per
// epoch, 12 iterations) against torch::optim::SGD whose lr is set by hand before every step to the
// closed form lr(t) = 0.05 * 0.5^floor(t / 5) * min(1, (t + 1) / 3); and cosine over the 12
// iterations, lr(t) = 0.05 * (1 + cos(pi t / 12)) / 2.
class OracleSchedule : public ::testing::TestWithParam<int> {};

TEST_P(OracleSchedule, DSyncMatchesLibTorchSgdWithTheRateSetByHandEveryIteration) {
  init_torch_runtime(1);
  const int workers = GetParam();
  constexpr std::size_t kBatch = 8;
  const std::size_t global_batch = static_cast<std::size_t>(workers) * kBatch;
  const DataSplits data = make_synthetic(5 * global_batch + 3, 50, 21);
  const auto step_rate = [](std::int64_t t) {
    return 0.05 * std::pow(0.5, static_cast<double>(t / 5)) * std::min(1.0, static_cast<double>(t + 1) / 3);
  };
  const auto cosine_rate = [](std::int64_t t) { return 0.05 * (1 + std::cos(M_PI * static_cast<double>(t) / 12)) / 2; };
  for (const auto& [spec, warmup, rate] :
       std::vector<std::tuple<const char*, std::int64_t, std::function<double(std::int64_t)>>>{
           {"step:1:0.5", 3, step_rate}, {"cosine", 0, cosine_rate}}) {
    SCOPED_TRACE(spec);
    TrainConfig config = dsync_config(workers, kBatch, 12);
    config.method.common.lr_schedule = parse_lr_schedule(spec, warmup);
    const RunSummary ours = run_training(config, torch_model_factory("mlp"), data);
    const Reference expected = train_reference(data.train, config, true, rate);
    for (int rank = 0; rank < workers; ++rank) {
      EXPECT_LE(relative_error(ours.final_parameters[static_cast<std::size_t>(rank)], expected.parameters), 1e-5)
          << "rank " << rank;
    }
    // Not vacuous: the same oracle at the constant rate ends far outside the tolerance.
    const Reference constant = train_reference(data.train, config);
    EXPECT_GT(relative_error(constant.parameters, expected.parameters), 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Oracle, OracleSchedule, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "workers";
                         });

}  // namespace
}  // namespace pipesgd
