#include "pipesgd/sim/platform.h"

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace sg4 = simgrid::s4u;

SimNetworkModel parse_sim_network_model(const std::string& text, const char* name) {
  if (text == "ideal") return SimNetworkModel::kIdeal;
  if (text == "simgrid") return SimNetworkModel::kSimGrid;
  throw UsageError(concat(name, " '", text, "': expected ideal or simgrid"));
}

const char* sim_network_model_name(SimNetworkModel model) {
  return model == SimNetworkModel::kIdeal ? "ideal" : "simgrid";
}

sg4::Engine& start_simulation_engine() {
  PIPESGD_ASSERT(sg4::Engine::is_initialized() == false);
  static int argc = 1;
  static char program[] = "pipesgd-simulate";
  static char* argv[] = {program, nullptr};
  static sg4::Engine engine(&argc, argv);
  xbt_log_control_set("root.thresh:critical");
  return engine;
}

std::vector<sg4::Host*> build_platform(sg4::Engine& engine, const SimPlatformSpec& spec) {
  PIPESGD_ASSERT(spec.cores_per_host >= 1);
  if (spec.hosts < 1) throw UsageError(concat("a simulated cluster needs at least 1 host, got ", spec.hosts));
  if (!(spec.link.bits_per_second > 0)) {
    throw UsageError("a simulated network needs a bandwidth (e.g. --net 10gbe or bw=10Gbit,lat=20us)");
  }
  if (spec.model == SimNetworkModel::kIdeal) {
    engine.set_config("network/model:CM02");
    engine.set_config("network/latency-factor:1");
    engine.set_config("network/bandwidth-factor:1");
    engine.set_config("network/crosstraffic:0");
  }
  auto* zone = sg4::create_star_zone("cluster");
  std::vector<sg4::Host*> hosts;
  hosts.reserve(static_cast<std::size_t>(spec.hosts));
  for (int h = 0; h < spec.hosts; ++h) {
    auto* host = zone->create_host(concat("host", h), kSimHostSpeed)->set_core_count(spec.cores_per_host);
    auto* nic = zone->create_split_duplex_link(concat("nic", h), spec.link.bytes_per_second())
                    ->set_latency(spec.link.latency_seconds / 2)
                    ->seal();
    zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr,
                    {{nic, sg4::LinkInRoute::Direction::UP}}, /*symmetrical=*/true);
    hosts.push_back(host);
  }
  zone->seal();
  return hosts;
}

}  // namespace pipesgd
