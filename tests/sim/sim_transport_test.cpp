// SimTransport (sim/sim_transport.h): messages matched by (peer, tag), and the errors of comm/wait.h
// that every transport reports, here with simulated time: a wait that outlasts its timeout, and one
// aborted by a rank's failure (the first failure reported wins). Each simulation runs in a child
// process (run_isolated); the child returns what each rank saw, and the parent asserts.
#include "pipesgd/sim/sim_transport.h"

#include <gtest/gtest.h>
#include <simgrid/s4u.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/sim/isolated_run.h"
#include "pipesgd/sim/platform.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;
namespace sg4 = simgrid::s4u;

using RankBody = std::function<std::string(Transport& transport, SimFabric& fabric)>;

// Runs body(rank) on every rank of a simulated `ranks`-host cluster; returns what each returned (or
// the text of what it threw), joined by '|'.
std::string simulate(int ranks, const RankBody& body) {
  return run_isolated("sim transport test", [&] {
    sg4::Engine& engine = start_simulation_engine();
    SimPlatformSpec spec;
    spec.hosts = ranks;
    spec.link = parse_network_spec("bw=10Gbit,lat=20us");
    spec.model = SimNetworkModel::kIdeal;
    const std::vector<sg4::Host*> hosts = build_platform(engine, spec);
    SimFabric fabric(ranks);
    std::vector<std::string> seen(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      sg4::ActorPtr actor = sg4::Actor::create(concat("rank", r), hosts[static_cast<std::size_t>(r)], [&, r] {
        try {
          seen[static_cast<std::size_t>(r)] = body(fabric.endpoint(r), fabric);
        } catch (const std::exception& error) {
          seen[static_cast<std::size_t>(r)] = error.what();
        }
      });
      fabric.set_receiver(r, actor.get());
    }
    engine.run();
    return join(seen, "|");
  });
}

constexpr const char* test_operation = "sim test";

TEST(SimTransport, MessagesMatchByPeerAndTag) {
  const std::string seen = simulate(2, [](Transport& transport, SimFabric&) -> std::string {
    std::vector<int> values = {0, 0};
    if (transport.rank() == 0) {
      const std::vector<int> a = {1}, b = {2};
      Request first = transport.send(1, 8, std::as_bytes(std::span(a)), test_operation);
      Request second = transport.send(1, 9, std::as_bytes(std::span(b)), test_operation);
      first.wait(1h);
      second.wait(1h);
      return "sent";
    }
    Request nine = transport.recv(0, 9, std::as_writable_bytes(std::span(values).subspan(1, 1)), test_operation);
    Request eight = transport.recv(0, 8, std::as_writable_bytes(std::span(values).first(1)), test_operation);
    nine.wait(1h);
    eight.wait(1h);
    return concat(values[0], ",", values[1]);
  });
  EXPECT_EQ(seen, "sent|1,2");
}

// A recv nobody sends times out after its simulated timeout, named as every transport names it.
TEST(SimTransport, AWaitThatOutlastsItsTimeoutTimesOut) {
  const std::string seen = simulate(2, [](Transport& transport, SimFabric&) -> std::string {
    if (transport.rank() == 1) return "idle";
    std::vector<int> value(1);
    try {
      transport.recv(1, step_tag(collective_tag(Channel::kGradients, 17), 0, 5), std::as_writable_bytes(std::span(value)),
                     test_operation)
          .wait(500ms);
    } catch (const CommTimeoutError& error) {
      return concat(error.what(), " [peer ", error.peer(), "]");
    }
    return "no timeout";
  });
  EXPECT_EQ(seen, "sim test: recv from rank 1 (tag gradients:17 step 0 segment 5) on rank 0 timed out after 0.5 s "
                  "(simulated) [peer 1]|idle");
}

// A failure reported before a wait aborts it, naming the rank that failed first and its reason.
TEST(SimTransport, AReportedFailureAbortsLaterWaitsAndTheFirstReportWins) {
  const std::string seen = simulate(3, [](Transport& transport, SimFabric&) -> std::string {
    if (transport.rank() == 1) {
      transport.report_failure("disk full");
      return "failed";
    }
    if (transport.rank() == 2) {
      sg4::this_actor::sleep_for(0.001);
      transport.report_failure("a later failure");
      return "failed later";
    }
    sg4::this_actor::sleep_for(0.002);
    std::vector<int> value(1);
    transport.recv(2, 3, std::as_writable_bytes(std::span(value)), test_operation).wait(1h);
    return "no abort";
  });
  EXPECT_EQ(seen, "sim test: recv from rank 2 (tag gradients:0 step 0 segment 3) on rank 0 aborted: rank 1 failed: "
                  "disk full|failed|failed later");
}

}  // namespace
}  // namespace pipesgd
