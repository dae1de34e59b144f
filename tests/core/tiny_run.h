#pragma once
// Test helpers: methods selected as the CLI selects them (algo/registry.h), and a small training run
// of the pure-C++ softmax model on synthetic data, for tests of training methods at the trainer
// level (every rank's final parameters are kept).
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "pipesgd/algo/registry.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/models/softmax_regression.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {

inline DataSplits small_data() { return make_synthetic(600, 100, 3); }

inline ModelFactory softmax_factory() { return softmax_regression_factory(784, 10); }

// A number as an option's text that reads back as the same float ("%.9g").
inline std::string option_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

// The method `spec` with `options` (flags as the CLI takes them: {{"--staleness-k", "3"}}), SGD
// `sgd` and every wait's `timeout`.
inline MethodSelection select_for_test(const std::string& spec, const OptionValues& options = {}, SgdOptions sgd = {},
                                       Timeout timeout = std::chrono::seconds(120)) {
  CommonOptions base;
  base.optimizer.sgd = sgd;
  base.timeout = timeout;
  return select_method(spec, options, FlagPolicy::kReject, base);
}

// `selection` selected again with `options` added (or replaced), and the SGD hyper-parameters or the
// timeout changed where given (its learning-rate schedule kept).
inline MethodSelection reselect(const MethodSelection& selection, const OptionValues& options,
                                std::optional<SgdOptions> sgd = std::nullopt,
                                std::optional<Timeout> timeout = std::nullopt) {
  OptionValues given = selection.given;
  for (const auto& [flag, value] : options.all()) given.set(flag, value);
  MethodSelection reselected = select_for_test(selection.spec, given, sgd.value_or(selection.common.optimizer.sgd),
                                               timeout.value_or(selection.common.timeout));
  reselected.common.lr_schedule = selection.common.lr_schedule;
  return reselected;
}

// Changes `config`'s method options in place (see reselect).
inline void set_method_options(TrainConfig& config, const OptionValues& options) {
  config.method = reselect(config.method, options);
}
inline void set_sgd(TrainConfig& config, SgdOptions sgd) { config.method = reselect(config.method, {}, sgd); }
inline void set_timeout(TrainConfig& config, Timeout timeout) {
  config.method = reselect(config.method, {}, std::nullopt, timeout);
}

// 25 iterations, batch 5, SGD with momentum and weight decay, no evaluation or progress output.
// `servers`: --servers of a parameter-server method (0: not given).
inline TrainConfig tiny_config(const std::string& spec, int workers, int servers = 0, OptionValues options = {}) {
  if (servers != 0) options.set("--servers", std::to_string(servers));
  TrainConfig config;
  config.method = select_for_test(spec, options, SgdOptions{0.1f, 0.9f, 1e-4f});
  config.workers = workers;
  config.model = "softmax";
  config.batch = 5;
  config.iterations = 25;
  config.seed = 11;
  config.progress = false;
  config.evaluate = false;
  config.keep_parameters = true;
  return config;
}

}  // namespace pipesgd
