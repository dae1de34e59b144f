// The registry entries of pssync, asgd and dcasgd (algo/ps_methods/parameter_server_methods.h).
#include "pipesgd/algo/ps_methods/parameter_server_methods.h"

#include "pipesgd/algo/ps_methods/parameter_server_report.h"
#include "pipesgd/algo/ps_methods/ps_simulation.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

std::shared_ptr<ParameterServerOptions> parse_server_options(const OptionValues& given, ServerMode mode) {
  auto options = std::make_shared<ParameterServerOptions>();
  options->server_count = parse_servers(given);
  options->mode = mode;
  if (mode == ServerMode::kAsynchronous) {
    options->async_scale = parse_async_scale(given.text("--async-scale", async_scale_name(AsyncScale::kOne)));
  }
  return options;
}

MethodDescriptor server_method(std::string name, std::string summary, ServerMode mode) {
  MethodDescriptor method;
  method.name = std::move(name);
  method.summary = std::move(summary);
  method.commit = "each worker's last version pulled; each server's shard of the weights, its version and, for "
                  "dcasgd, its per-worker weight backups (the servers' parts of the set)";
  method.traits.uses_servers = true;
  method.traits.replicas_identical = mode == ServerMode::kSynchronous;
  method.options = parameter_server_declarations();
  if (mode == ServerMode::kAsynchronous) {
    method.options.emplace_back(
        "--async-scale",
        "The servers' gradient scale of each push: 1 (as MXNet's dist_async, the paper's ASGD baseline, applies "
        "every push) or 1/M (M workers' pushes move the weights as far as one D-Sync step)",
        async_scale_name(AsyncScale::kOne));
  }
  method.parse = [mode](const OptionValues& given) -> std::shared_ptr<const MethodOptions> {
    return parse_server_options(given, mode);
  };
  method.make = [](const MethodContext& context) { return std::make_unique<ParameterServerMethod>(context); };
  method.simulate = simulate_parameter_server;
  method.advise = [mode, name = method.name](int workers) {
    std::vector<AdvisedVariant> variants;
    for (int servers = 1; servers <= std::max(1, workers / 2) && servers <= 8; servers *= 2) {
      const std::string cost =
          mode == ServerMode::kSynchronous
              ? ""
              : concat("asynchronous: each push is applied on weights up to M - 1 updates newer than those it was "
                       "computed on", name == "dcasgd" ? ", compensated (DC-ASGD)" : "",
                       "; OD-SGD Sec. 4 reports lower accuracy than synchronous SGD as workers grow");
      variants.push_back({name, {{"--servers", std::to_string(servers)}}, cost});
    }
    return variants;
  };
  method.serve = [](const MethodOptions& options, const CommonOptions& common, int workers) {
    return serve_options(options_as<ParameterServerOptions>(options), common.timeout, workers);
  };
  method.tables = {parameter_server_table()};
  return method;
}

}  // namespace

std::vector<OptionDeclaration> parameter_server_declarations() {
  OptionDeclaration servers("--servers", "Parameter-server ranks, at least 1 (threads after the workers; under --transport mpi "
                 "the last S ranks of mpirun -np)", "1");
  servers.users_label = "the parameter-server methods";
  OptionDeclaration optimizer("--optimizer", "The servers run sgd", "sgd");
  optimizer.applies = [](const OptionValues& given) { return given.text("--optimizer", "sgd") == "sgd"; };
  optimizer.rejection = [](const OptionValues& given, std::string_view method) {
    return concat("--optimizer ", given.text("--optimizer", ""), ": the parameter-server methods run SGD on their "
                  "servers; use --optimizer sgd with '", method, "'");
  };
  return {servers, optimizer};
}

int parse_servers(const OptionValues& given) {
  const std::int64_t servers = given.integer("--servers", 1);
  if (servers < 1 || servers > kMaxServers) {
    throw UsageError(concat("--servers must be in [1, ", kMaxServers, "], got ", servers,
                            " (the parameter-server methods need a server)"));
  }
  return static_cast<int>(servers);
}

OptionDeclaration dc_lambda_declaration(const std::string& help, const std::string& constant, const std::string& adaptive) {
  return OptionDeclaration("--dc-lambda", help,
                           concat(kConstantDefaultLambda, " with ", constant, ", ", kAdaptiveDefaultLambda, " with ",
                                  adaptive, " (OD-SGD paper Sec. 4)"));
}

DelayCompensationOptions parse_delay_compensation(const OptionValues& given, DelayCompensationVariant variant) {
  DelayCompensationOptions options;
  options.variant = variant;
  options.lambda = static_cast<float>(given.real("--dc-lambda", default_lambda(variant)));
  options.mean_square_decay = static_cast<float>(given.real("--dc-momentum", options.mean_square_decay));
  check_delay_compensation(options, {"--dc-lambda", "--dc-momentum"});
  return options;
}

MethodDescriptor pssync_method() {
  return server_method("pssync", "PS-Sync: push, the servers sum the M gradients and step, pull (Pipe-SGD paper "
                       "Sec. 4's parameter-server baseline)", ServerMode::kSynchronous);
}

MethodDescriptor asgd_method() {
  return server_method("asgd", "ASGD: each push applied by the servers as it arrives, then pull the latest weights",
                       ServerMode::kAsynchronous);
}

MethodDescriptor dcasgd_method() {
  MethodDescriptor method = server_method(
      "dcasgd", "DC-ASGD: ASGD whose servers compensate each push for its delay (OD-SGD paper Eq. 4-6)",
      ServerMode::kAsynchronous);
  OptionDeclaration variant("--dc-variant", "The servers' delay compensation: c (DC-ASGD-c, Eq. 4) or a (DC-ASGD-a, Eq. 5-6)", "c");
  method.options.push_back(variant);
  method.options.push_back(dc_lambda_declaration("Delay compensation lambda", "--dc-variant c", "--dc-variant a"));
  OptionDeclaration momentum("--dc-momentum", "m of Eq. 6, the decay of DC-ASGD-a's mean square", concat(DelayCompensationOptions{}.mean_square_decay));
  momentum.applies = [](const OptionValues& given) { return given.text("--dc-variant", "c") == "a"; };
  momentum.condition = "--dc-variant a";
  method.options.push_back(momentum);
  method.parse = [](const OptionValues& given) -> std::shared_ptr<const MethodOptions> {
    auto options = parse_server_options(given, ServerMode::kAsynchronous);
    options->delay_compensation =
        parse_delay_compensation(given, parse_delay_compensation_variant(given.text("--dc-variant", "c"), "--dc-variant"));
    return options;
  };
  return method;
}

}  // namespace pipesgd
