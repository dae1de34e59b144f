#include "pipesgd/sim/collective_simulation.h"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>
#include <vector>

#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/core/error.h"
#include "pipesgd/sim/isolated_run.h"
#include "pipesgd/sim/sim_transport.h"
#include "pipesgd/sim/timed_codec.h"

namespace pipesgd {
namespace sg4 = simgrid::s4u;
namespace {

// Rank r's element i: small multiples of 1/4, so that every sum is exact in fp32.
float input_value(std::size_t i, int rank) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13) % 17) - 8) * 0.25f;
}

void validate(const CollectiveScenario& scenario) {
  // An unknown algorithm: make_allreduce's UsageError, from the simulation process.
  make_codec(scenario.codec);  // throws UsageError for an unknown codec
  if (scenario.platform.hosts < 1) {
    throw UsageError(concat("a simulated allreduce needs at least 1 rank, got ", scenario.platform.hosts));
  }
  if (scenario.repetitions < 1) throw UsageError("a simulated allreduce needs at least 1 repetition");
}

std::string run_in_simulation(const CollectiveScenario& scenario) {
  sg4::Engine& engine = start_simulation_engine();
  const std::vector<sg4::Host*> hosts = build_platform(engine, scenario.platform);
  const int p = scenario.platform.hosts;
  SimFabric fabric(p);
  const std::unique_ptr<Codec> codec = make_codec(scenario.codec);
  const TimedCodec timed(*codec, scenario.codec_cost);
  std::vector<double> ends(static_cast<std::size_t>(p), 0.0);
  std::vector<double> errors(static_cast<std::size_t>(p), 0.0);
  std::vector<std::uint64_t> sent(static_cast<std::size_t>(p), 0);
  std::exception_ptr failure;
  AllreduceOptions options;
  options.segment_bytes = scenario.segment_bytes;
  options.timeout = std::chrono::hours(24);  // simulated: only a broken schedule could reach it

  for (int r = 0; r < p; ++r) {
    sg4::ActorPtr actor = sg4::Actor::create(concat("rank", r), hosts[static_cast<std::size_t>(r)], [&, r] {
      try {
        Transport& transport = fabric.endpoint(r);
        const auto allreduce = make_allreduce(scenario.algorithm, transport, scenario.count, timed, options);
        std::vector<float> data(scenario.count);
        double error = 0;
        for (int rep = 0; rep < scenario.repetitions; ++rep) {
          for (std::size_t i = 0; i < data.size(); ++i) data[i] = input_value(i, r);
          allreduce->run(data, collective_tag(Channel::kBenchmark, static_cast<std::uint64_t>(rep)));
          for (std::size_t i = 0; i < data.size(); ++i) {
            double exact = 0;
            for (int q = 0; q < p; ++q) exact += input_value(i, q);
            error = std::max(error, std::abs(static_cast<double>(data[i]) - exact));
          }
        }
        ends[static_cast<std::size_t>(r)] = sg4::Engine::get_clock();
        errors[static_cast<std::size_t>(r)] = error;
        sent[static_cast<std::size_t>(r)] = transport.bytes_sent();
      } catch (...) {
        if (!failure) failure = std::current_exception();
        fabric.report_failure(r, "simulated allreduce failed");
      }
    });
    fabric.set_receiver(r, actor.get());
  }
  engine.run();
  if (failure) std::rethrow_exception(failure);
  nlohmann::json result;
  result["simulated_seconds"] = *std::max_element(ends.begin(), ends.end()) / scenario.repetitions;
  result["bytes_sent_per_rank"] = *std::max_element(sent.begin(), sent.end()) / static_cast<std::uint64_t>(scenario.repetitions);
  result["max_abs_error"] = *std::max_element(errors.begin(), errors.end());
  return result.dump();
}

}  // namespace

CollectiveResult simulate_allreduce(const CollectiveScenario& scenario) {
  validate(scenario);
  const std::string text = run_isolated(concat("simulating a ", scenario.algorithm, " allreduce"),
                                        [&] { return run_in_simulation(scenario); });
  const nlohmann::json result = nlohmann::json::parse(text);
  return {result.at("simulated_seconds").get<double>(), result.at("bytes_sent_per_rank").get<std::uint64_t>(),
          result.at("max_abs_error").get<double>()};
}

}  // namespace pipesgd
