#include "pipesgd/sim/collective_rounds.h"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <nlohmann/json.hpp>
#include <vector>

#include "pipesgd/collective/allreduce_rounds.h"
#include "pipesgd/core/error.h"
#include "pipesgd/sim/isolated_run.h"

namespace pipesgd {
namespace sg4 = simgrid::s4u;
namespace {

constexpr double kProbeBytes = 16.0 * 1024 * 1024;  // per message, for a round's seconds per byte

// Simulated seconds from the common start until each flow of `flows` has delivered `bytes`, per flow
// in the order of `flows`.
std::vector<double> play_round(const std::vector<AllreduceFlow>& flows, const std::vector<sg4::Host*>& hosts,
                               double bytes) {
  const double start = sg4::Engine::get_clock();
  std::vector<sg4::CommPtr> comms;
  comms.reserve(flows.size());
  for (const AllreduceFlow& flow : flows) {
    comms.push_back(sg4::Comm::sendto_async(hosts[static_cast<std::size_t>(flow.from)],
                                            hosts[static_cast<std::size_t>(flow.to)],
                                            static_cast<std::uint64_t>(bytes)));
  }
  std::vector<double> seconds(flows.size(), 0.0);
  std::vector<std::size_t> open(flows.size());
  for (std::size_t f = 0; f < open.size(); ++f) open[f] = f;
  // Flows of one round end in few distinct instants: collect every flow finished by then.
  while (!comms.empty()) {
    sg4::Comm::wait_any(comms);
    const double now = sg4::Engine::get_clock() - start;
    for (std::size_t k = comms.size(); k-- > 0;) {
      if (comms[k]->get_state() == sg4::Activity::State::FINISHED) {
        seconds[open[k]] = now;
        comms.erase(comms.begin() + static_cast<std::ptrdiff_t>(k));
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
  }
  return seconds;
}

// The cost of `round`'s `repeat` rounds from its flows' times at 1 byte and at kProbeBytes: the
// slowest flow per round, or for a chained round the slowest window of `repeat` consecutive flows
// (the ring's data passes them one after another), the window taken at the probe size.
std::pair<double, double> round_cost(const AllreduceRound& round, const std::vector<double>& small,
                                     const std::vector<double>& full) {
  double small_seconds = 0, full_seconds = 0;
  if (!round.chained) {
    small_seconds = round.repeat * *std::max_element(small.begin(), small.end());
    full_seconds = round.repeat * *std::max_element(full.begin(), full.end());
  } else {
    const std::size_t n = full.size();
    for (std::size_t first = 0; first < n; ++first) {
      double window_small = 0, window_full = 0;
      for (int k = 0; k < round.repeat; ++k) {
        window_small += small[(first + static_cast<std::size_t>(k)) % n];
        window_full += full[(first + static_cast<std::size_t>(k)) % n];
      }
      if (window_full > full_seconds) std::tie(small_seconds, full_seconds) = std::pair(window_small, window_full);
    }
  }
  const double per_byte = (full_seconds - small_seconds) / (kProbeBytes - 1);
  return {small_seconds - per_byte, per_byte};
}

}  // namespace

ModelledAllreduce model_allreduce(const std::string& algorithm, const SimPlatformSpec& platform) {
  const std::vector<AllreduceRound> rounds = allreduce_rounds(algorithm, platform.hosts);  // UsageError
  ModelledAllreduce model;
  for (const AllreduceRound& round : rounds) {
    model.rounds += round.repeat;
    model.reduced_bytes_per_byte += round.repeat * round.reduced;
  }
  if (rounds.empty()) return model;
  // The distinct flow sets, each played once (by index into `distinct`).
  // The distinct flow sets, each played once (by index into `distinct`).
  std::map<std::vector<AllreduceFlow>, std::size_t> index;
  std::vector<const std::vector<AllreduceFlow>*> distinct;
  for (const AllreduceRound& round : rounds) {
    if (index.emplace(round.flows, distinct.size()).second) distinct.push_back(&round.flows);
  }
  const std::string text = run_isolated(concat("simulating the rounds of ", algorithm), [&] {
    sg4::Engine& engine = start_simulation_engine();
    const std::vector<sg4::Host*> hosts = build_platform(engine, platform);
    nlohmann::json small = nlohmann::json::array(), full = nlohmann::json::array();
    sg4::Actor::create("rounds", hosts.front(), [&] {
      for (const std::vector<AllreduceFlow>* flows : distinct) {
        // One byte, not zero: SimGrid completes empty host-to-host messages one latency after another.
        small.push_back(play_round(*flows, hosts, 1));
        full.push_back(play_round(*flows, hosts, kProbeBytes));
      }
    });
    engine.run();
    return nlohmann::json{{"small", small}, {"full", full}}.dump();
  });
  const nlohmann::json played = nlohmann::json::parse(text);
  for (const AllreduceRound& round : rounds) {
    const std::size_t i = index.at(round.flows);
    const auto [latency, per_byte] = round_cost(round, played.at("small").at(i).get<std::vector<double>>(),
                                                played.at("full").at(i).get<std::vector<double>>());
    model.latency_seconds += latency;
    model.seconds_per_byte += round.fraction * per_byte;
  }
  model.distinct_rounds = static_cast<int>(distinct.size());
  return model;
}

}  // namespace pipesgd
