#pragma once
// Test helpers: a small training run of the pure-C++ softmax model on synthetic data, for tests of
// training methods at the trainer level (every rank's final parameters are kept).
#include <string>

#include "pipesgd/data/dataset.h"
#include "pipesgd/models/softmax_regression.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {

inline DataSplits small_data() { return make_synthetic(600, 100, 3); }

inline ModelFactory softmax_factory() { return softmax_regression_factory(784, 10); }

// 25 iterations, batch 5, SGD with momentum and weight decay, no evaluation or progress output.
inline TrainConfig tiny_config(const std::string& spec, int workers, int servers = 0) {
  TrainConfig config;
  apply_method_spec(spec, config);
  config.workers = workers;
  config.servers = servers;
  config.model = "softmax";
  config.batch = 5;
  config.iterations = 25;
  config.seed = 11;
  config.progress = false;
  config.evaluate = false;
  config.keep_parameters = true;
  config.method.sgd = SgdOptions{0.1f, 0.9f, 1e-4f};
  return config;
}

}  // namespace pipesgd
