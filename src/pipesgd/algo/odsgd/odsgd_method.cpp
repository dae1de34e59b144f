#include "pipesgd/algo/odsgd/odsgd_method.h"

#include "pipesgd/algo/odsgd/od_sgd.h"
#include "pipesgd/algo/odsgd/od_sgd_report.h"
#include "pipesgd/algo/odsgd/od_sgd_simulation.h"
#include "pipesgd/algo/ps_methods/parameter_server_methods.h"
#include "pipesgd/algo/ps_methods/parameter_server_report.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

bool compensating(const OptionValues& given) { return given.text("--local-updater", "sgd") != "sgd"; }

std::shared_ptr<const MethodOptions> parse_odsgd_options(const OptionValues& given) {
  auto options = std::make_shared<OdSgdOptions>();
  options->server_count = parse_servers(given);
  options->mode = ServerMode::kSynchronous;
  options->warmup_given = parse_warmup(given, kOdSgdDefaultWarmupIterations);
  options->local_updater = given.text("--local-updater", "sgd");
  const std::vector<std::string> updaters = local_updater_names();
  if (std::find(updaters.begin(), updaters.end(), options->local_updater) == updaters.end()) {
    throw UsageError(concat("--local-updater must be sgd, dcasgd-c or dcasgd-a, got '", options->local_updater, "'"));
  }
  if (given.has("--local-lr")) {
    const double rate = given.real("--local-lr", 0);
    if (!(rate > 0)) throw UsageError(concat("--local-lr must be > 0, got ", given.text("--local-lr", "")));
    options->local_learning_rate = static_cast<float>(rate);
  }
  options->local_compensation = parse_delay_compensation(
      given, options->local_updater == "dcasgd-a" ? DelayCompensationVariant::kAdaptive : DelayCompensationVariant::kConstant);
  return options;
}

}  // namespace

MethodDescriptor odsgd_method() {
  MethodDescriptor method;
  method.name = "odsgd";
  method.commit = "the global weights of t-1 pulled (the local weights are the part's weights), the local "
                  "updater's state (its SGD and DC-ASGD compensation), the version; each server's shard, version and "
                  "DC-ASGD backups (the servers' parts)";
  method.summary = "OD-SGD (the paper's Alg. 1-2): after a synchronous warm-up, train on the global weights of t-1 "
                   "updated locally while the push and pull of t run on the comm thread";
  method.traits.uses_servers = true;
  method.options = parameter_server_declarations();
  for (OptionDeclaration& option : warmup_declarations(
           "train on the servers' synchronous global weights; the last is the switching stage",
           concat(kOdSgdDefaultWarmupIterations, " if neither warm-up flag is given"))) {
    method.options.push_back(std::move(option));
  }
  OptionDeclaration updater("--local-updater", "How a worker updates the pulled weights with its own gradient: sgd, dcasgd-c or dcasgd-a", "sgd");
  method.options.push_back(updater);
  OptionDeclaration local_rate("--local-lr", "The local updater's learning rate [default: --lr]");
  method.options.push_back(local_rate);
  OptionDeclaration lambda = dc_lambda_declaration("Delay compensation lambda of the dcasgd-* local updaters",
                                                   "dcasgd-c", "dcasgd-a");
  lambda.applies = compensating;
  lambda.condition = "with --local-updater dcasgd-c or dcasgd-a";
  method.options.push_back(lambda);
  OptionDeclaration momentum("--dc-momentum", "m of Eq. 6, the decay of the dcasgd-a local updater's mean square", concat(DelayCompensationOptions{}.mean_square_decay));
  momentum.applies = [](const OptionValues& given) { return given.text("--local-updater", "sgd") == "dcasgd-a"; };
  momentum.condition = "--local-updater dcasgd-a";
  method.options.push_back(momentum);
  method.parse = parse_odsgd_options;
  method.make = [](const MethodContext& context) { return std::make_unique<OneStepDelaySgd>(context); };
  method.simulate = simulate_od_sgd;
  method.advise = [](int workers) {
    std::vector<AdvisedVariant> variants;
    for (int servers = 1; servers <= std::max(1, workers / 2) && servers <= 8; servers *= 2) {
      variants.push_back({"odsgd", {{"--servers", std::to_string(servers)}},
                          "one-step delay: each worker trains on the global weights of the previous iteration plus its "
                          "own local update (OD-SGD Sec. 4: accuracy of synchronous SGD in its runs)"});
    }
    return variants;
  };
  method.serve = [](const MethodOptions& options, const CommonOptions& common, int workers) {
    return serve_options(options_as<OdSgdOptions>(options), common.timeout, workers);
  };
  method.tables = {parameter_server_table(), od_sgd_improvement_table()};
  return method;
}

}  // namespace pipesgd
