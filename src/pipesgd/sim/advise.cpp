#include "pipesgd/sim/advise.h"

#include <algorithm>
#include <cmath>

#include "pipesgd/algo/registry.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// What a codec trades (Pipe-SGD Sec. 3.2 and 4; collective/codec.h for the error bounds).
std::string codec_accuracy_cost(const std::string& codec) {
  if (codec == "bf16") {
    return "lossy codec: 16-bit truncation of every gradient message, relative error < 2^-7 (Pipe-SGD Sec. 4: "
           "'+T' kept D-Sync's accuracy but for AlexNet's 0.005)";
  }
  if (codec == "int8") {
    return "lossy codec: 8-bit quantization of every gradient message, error <= max|g|/254 per message (Pipe-SGD "
           "Sec. 4: '+Q' as '+T'; ours, docs/results.md: pipe+int8 within half a point of dsync after 3 epochs "
           "of plain SGD)";
  }
  return "";
}

bool takes_flag(const MethodDescriptor& method, const std::string& flag) {
  return std::any_of(method.options.begin(), method.options.end(),
                     [&](const OptionDeclaration& option) { return option.flag == flag; });
}

}  // namespace

std::vector<AdvisedConfiguration> advised_configurations(const AdviseRequest& request) {
  for (const std::string& codec : request.codecs) make_codec(codec);  // UsageError for an unknown one
  const std::vector<std::string>& methods = request.methods;
  for (const std::string& name : methods) {
    if (!find_method(name)) throw UsageError(concat("--methods: unknown method '", name, "' (known: ", join(method_names()), ")"));
  }
  std::vector<AdvisedConfiguration> result;
  for (const MethodDescriptor* method : method_registry()) {
    if (!method->advise || !method->simulate) continue;
    if (!methods.empty() && std::find(methods.begin(), methods.end(), method->name) == methods.end()) continue;
    for (const AdvisedVariant& variant : method->advise(request.workers)) {
      const bool codec_applies = takes_flag(*method, "--codec");
      for (const std::string& codec : codec_applies ? request.codecs : std::vector<std::string>{"none"}) {
        AdvisedConfiguration configuration;
        const std::string spec = codec == "none" ? variant.spec : concat(variant.spec, "+", codec);
        configuration.job.selection = select_method(spec, variant.flags, FlagPolicy::kReject, CommonOptions{});
        configuration.job.options = request.simulation;
        configuration.job.options.workers = request.workers;
        for (const auto& [flag, value] : variant.flags.all()) configuration.command_flags += concat(" ", flag, " ", value);
        configuration.job.label = spec + configuration.command_flags;
        configuration.servers = configuration.job.selection.options->servers();
        if (!variant.accuracy_cost.empty()) configuration.costs.push_back(variant.accuracy_cost);
        if (!codec_accuracy_cost(codec).empty()) configuration.costs.push_back(codec_accuracy_cost(codec));
        result.push_back(std::move(configuration));
      }
    }
  }
  if (result.empty()) throw UsageError("--methods: no method to advise on");
  // A world that does not fit the topology is the user's to fix; a configuration whose servers make
  // it not fit is skipped.
  for (AdvisedConfiguration& configuration : result) {
    try {
      check_fits_topology(configuration.job);
    } catch (const UsageError& error) {
      if (configuration.servers == 0) throw;
      configuration.unbuildable = error.what();
    }
  }
  return result;
}

double Advice::speedup(std::size_t i) const {
  const double base = throughput(baseline);
  return base > 0 ? throughput(i) / base : 0;
}

Advice advise(const AdviseRequest& request, std::vector<AdvisedConfiguration> configurations,
              const SimulationRunner& simulate) {
  Advice advice;
  advice.configurations = std::move(configurations);
  const std::vector<AdvisedConfiguration>& all = advice.configurations;
  std::vector<std::size_t> simulated;  // the configuration of each job
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].unbuildable.empty()) continue;
    advice.simulated_jobs.push_back(all[i].job);
    simulated.push_back(i);
  }
  // A configuration that cannot be built (e.g. more servers than the model has segments) is skipped.
  advice.simulated_results = simulate(advice.simulated_jobs);
  PIPESGD_ASSERT(advice.simulated_results.size() == advice.simulated_jobs.size());
  std::vector<MethodSimulationResult>& results = advice.results;
  results.resize(all.size());
  for (std::size_t j = 0; j < simulated.size(); ++j) results[simulated[j]] = advice.simulated_results[j];
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].unbuildable.empty()) results[i].unbuildable = all[i].unbuildable;
  }
  std::vector<std::size_t>& order = advice.ranking;
  for (std::size_t i = 0; i < all.size(); ++i) (results[i].unbuildable.empty() ? order : advice.skipped).push_back(i);
  if (order.empty()) {
    throw UsageError(concat("no configuration could be simulated: ", job_label(all.front().job), ": ",
                            results.front().unbuildable));
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double x = results[a].samples_per_second, y = results[b].samples_per_second;
    if (std::abs(x - y) > 1e-9 * std::max(x, y)) return x > y;
    return all[a].costs.size() < all[b].costs.size();
  });
  advice.baseline = *std::min_element(order.begin(), order.end());

  const std::size_t fastest = order.front();
  const auto safe = std::find_if(order.begin(), order.end(), [&](std::size_t i) { return all[i].costs.empty(); });
  advice.recommended = fastest;
  if (safe != order.end()) advice.fastest_without_trade = *safe;
  if (!all[fastest].costs.empty() && safe != order.end()) {
    advice.gain = results[fastest].samples_per_second / results[*safe].samples_per_second - 1;
    if (*advice.gain < request.min_gain) advice.recommended = *safe;
  }
  return advice;
}

}  // namespace pipesgd
