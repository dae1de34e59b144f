#include "pipesgd/train/run_description.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// A hyper-parameter (a float) as the decimal it was given as: 0.1, not 0.10000000149011612.
double decimal(float value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof text, value);
  PIPESGD_ASSERT(error == std::errc());
  return std::strtod(std::string(text, end).c_str(), nullptr);
}

nlohmann::json describe_optimizer(const OptimizerOptions& optimizer) {
  if (optimizer.name == "adam") {
    const AdamOptions& adam = optimizer.adam;
    return {{"name", "adam"},
            {"learning_rate", decimal(adam.learning_rate)},
            {"beta1", decimal(adam.beta1)},
            {"beta2", decimal(adam.beta2)},
            {"epsilon", decimal(adam.epsilon)},
            {"weight_decay", decimal(adam.weight_decay)}};
  }
  const SgdOptions& sgd = optimizer.sgd;
  return {{"name", optimizer.name},
          {"learning_rate", decimal(sgd.learning_rate)},
          {"momentum", decimal(sgd.momentum)},
          {"weight_decay", decimal(sgd.weight_decay)}};
}

// The method: its spec, the options given, every option it takes with the value in effect (the
// given one, or its registry default), and the facts the trainer resolved.
nlohmann::json describe_method(const RunContext& run, const FlatParameters& model) {
  const TrainConfig& config = run.config;
  const MethodSelection& method = config.method;
  nlohmann::json given = nlohmann::json::object();
  for (const auto& [flag, value] : method.given.all()) given[flag] = value;
  nlohmann::json options = nlohmann::json::object();
  for (const OptionDeclaration& option : method.descriptor->options) {
    if (option.applies && !option.applies(method.given)) continue;
    if (method.given.has(option.flag)) {
      options[option.flag] = method.given.text(option.flag, "");
    } else if (!option.default_text.empty()) {
      options[option.flag] = concat(option.default_text, " (default)");
    }
  }
  const CommonOptions& common = method.common;
  const bool servers = run.servers > 0;
  const std::string method_options = method.options->fingerprint();
  return {{"spec", method.spec},
          {"name", method.name()},
          {"given", given},
          {"options", options},
          {"resolved", concat(fingerprint(common), method_options.empty() ? "" : ", ", method_options)},
          {"warmup_iterations", run.plan.warmup_iterations},
          {"staleness_k", method.options->staleness()},
          {"pipelined", method.options->pipelined()},
          {"servers", run.servers},
          {"codec", common.codec},
          {"allreduce",
           servers ? std::string("none (parameter server)")
                   : resolve_allreduce_algorithm(common, config.workers,
                                                 static_cast<double>(model.layout().total()) * sizeof(float))},
          {"calibration", common.calibration != nullptr}};
}

}  // namespace

nlohmann::json describe_configuration(const RunContext& run, const FlatParameters& model) {
  const TrainConfig& config = run.config;
  const RunProvenance& provenance = config.provenance;
  const RunPlan& plan = run.plan;
  const ReliabilityOptions& reliability = config.reliability;
  nlohmann::json restart_faults = nlohmann::json::array();
  for (const FaultInjection& fault : reliability.restart_faults) restart_faults.push_back(describe(fault));
  nlohmann::json versions = nlohmann::json::object();
  for (const auto& [name, version] : provenance.versions) versions[name] = version;
  return {
      {"command_line", provenance.command_line},
      {"seed", config.seed},
      {"model", {{"name", config.model}, {"parameters", model.layout().total()}, {"segments", model.layout().segment_count()}}},
      {"data",
       {{"set", provenance.data_set},
        {"source", provenance.data_source},
        {"train_examples", provenance.train_examples},
        {"test_examples", provenance.test_examples}}},
      {"workers", config.workers},
      {"servers", run.servers},
      {"batch_per_worker", config.batch},
      {"global_batch", config.batch * static_cast<std::size_t>(config.workers)},
      {"iterations", plan.total_iterations},
      {"iterations_per_epoch", plan.iterations_per_epoch},
      {"epochs", plan.epochs},
      {"learning_rate", decimal(config.method.common.optimizer.sgd.learning_rate)},
      {"learning_rate_schedule", config.method.common.lr_schedule.text()},
      {"learning_rate_warmup_iterations", config.method.common.lr_schedule.warmup_iterations},
      {"optimizer", describe_optimizer(config.method.common.optimizer)},
      {"method", describe_method(run, model)},
      {"transport", provenance.transport},
      {"trace", provenance.trace_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(provenance.trace_file)},
      {"network",
       {{"spec", config.network.name},
        {"bits_per_second", config.network.bits_per_second},
        {"latency_s", config.network.latency_seconds}}},
      {"comm_timeout_s", static_cast<double>(config.method.common.timeout.count()) / 1000.0},
      {"evaluate", config.evaluate},
      {"reliability",
       {{"checkpoint_dir", reliability.checkpoint_dir},
        {"checkpoint_every", reliability.checkpoint_every},
        {"resume", reliability.resume},
        {"on_nonfinite", reliability.on_nonfinite},
        {"check_consistency", reliability.check_consistency},
        {"inject_fault", describe(reliability.fault)},
        {"restarts", reliability.restarts},
        {"restart_faults", restart_faults}}},
      {"versions", versions},
  };
}

}  // namespace pipesgd
