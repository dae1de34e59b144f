#include "pipesgd/sim/platform.h"

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <cstdlib>

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

namespace {

std::vector<unsigned> parse_counts(const std::string& part, const std::string& text, const char* name) {
  std::vector<unsigned> values;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = part.find(',', start);
    const std::string item = part.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const unsigned long value = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 1 || value > 100000) {
      throw UsageError(concat(name, " '", text, "': '", item, "' is not a whole number in [1, 100000]"));
    }
    values.push_back(static_cast<unsigned>(value));
    if (comma == std::string::npos) return values;
    start = comma + 1;
  }
}

}  // namespace

std::size_t SimTopology::leaves() const {
  if (!fat_tree) return 1;
  std::size_t product = 1;
  for (unsigned d : down) product *= d;
  return product;
}

SimTopology parse_sim_topology(const std::string& text, const char* name) {
  SimTopology topology;
  topology.text = text;
  if (text == "flat") return topology;
  const std::string prefix = "fat-tree:";
  const std::string usage = "expected flat or fat-tree:LEVELS;DOWN,..;UP,..;COUNT,.. (e.g. fat-tree:2;16,4;1,4;1,1)";
  if (text.rfind(prefix, 0) != 0) throw UsageError(concat(name, " '", text, "': ", usage));
  std::vector<std::string> parts;
  std::size_t start = prefix.size();
  for (;;) {
    const std::size_t semicolon = text.find(';', start);
    parts.push_back(text.substr(start, semicolon == std::string::npos ? std::string::npos : semicolon - start));
    if (semicolon == std::string::npos) break;
    start = semicolon + 1;
  }
  if (parts.size() != 4) throw UsageError(concat(name, " '", text, "': ", usage));
  const std::vector<unsigned> levels = parse_counts(parts[0], text, name);
  if (levels.size() != 1 || levels[0] > 8) throw UsageError(concat(name, " '", text, "': LEVELS must be 1 to 8"));
  topology.fat_tree = true;
  topology.levels = levels[0];
  topology.down = parse_counts(parts[1], text, name);
  topology.up = parse_counts(parts[2], text, name);
  topology.count = parse_counts(parts[3], text, name);
  for (const auto* list : {&topology.down, &topology.up, &topology.count}) {
    if (list->size() != topology.levels) {
      throw UsageError(concat(name, " '", text, "': DOWN, UP and COUNT need one number per level (", topology.levels, ")"));
    }
  }
  if (topology.leaves() > 1'000'000) throw UsageError(concat(name, " '", text, "': more than a million hosts"));
  return topology;
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
  std::vector<sg4::Host*> hosts;
  hosts.reserve(static_cast<std::size_t>(spec.hosts));
  const double half_latency = spec.link.latency_seconds / 2;
  if (spec.topology.fat_tree) {
    if (spec.topology.leaves() < static_cast<std::size_t>(spec.hosts)) {
      throw UsageError(concat("--topology ", spec.topology.text, " holds ", spec.topology.leaves(), " hosts, fewer than the ",
                              spec.hosts, " to simulate"));
    }
    std::vector<sg4::Host*> leaves(spec.topology.leaves(), nullptr);
    const sg4::ClusterCallbacks callbacks([&](sg4::NetZone* zone, const std::vector<unsigned long>&, unsigned long id) {
      sg4::Host* host = zone->create_host(concat("host", id), kSimHostSpeed)->set_core_count(spec.cores_per_host)->seal();
      leaves.at(id) = host;
      return std::make_pair(host->get_netpoint(), static_cast<simgrid::kernel::routing::NetPoint*>(nullptr));
    });
    sg4::NetZone* zone = sg4::create_fatTree_zone(
        "cluster", nullptr, sg4::FatTreeParams(spec.topology.levels, spec.topology.down, spec.topology.up, spec.topology.count),
        callbacks, spec.link.bytes_per_second(), half_latency, sg4::Link::SharingPolicy::SPLITDUPLEX);
    zone->seal();
    hosts.assign(leaves.begin(), leaves.begin() + spec.hosts);
    return hosts;
  }
  auto* zone = sg4::create_star_zone("cluster");
  for (int h = 0; h < spec.hosts; ++h) {
    auto* host = zone->create_host(concat("host", h), kSimHostSpeed)->set_core_count(spec.cores_per_host);
    auto* nic = zone->create_split_duplex_link(concat("nic", h), spec.link.bytes_per_second())
                    ->set_latency(half_latency)
                    ->seal();
    zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr,
                    {{nic, sg4::LinkInRoute::Direction::UP}}, /*symmetrical=*/true);
    hosts.push_back(host);
  }
  zone->seal();
  return hosts;
}

}  // namespace pipesgd
