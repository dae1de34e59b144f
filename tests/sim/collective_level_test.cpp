// The collective level of a simulation (sim/method_simulation.h): --collectives messages and model
// as given; auto by world size and the message level's estimated cost (message_level_cost).
#include <gtest/gtest.h>

#include <string>

#include "pipesgd/algo/registry.h"
#include "pipesgd/sim/method_simulation.h"

namespace pipesgd {
namespace {

// Every simulated iteration, every worker's whole gradient; each message as kElementsPerMessage.
TEST(CollectiveLevel, CostByHand) {
  EXPECT_EQ(message_level_cost(1, 61100840, 8, 24), 0);  // one worker: no collective
  // 16 workers x 1000 parameters + 1000 x 16 x 2 x 15 messages x 2 layers, 10 iterations.
  EXPECT_DOUBLE_EQ(message_level_cost(16, 1000, 2, 10), 10 * (16.0 * 1000 + kElementsPerMessage * 16 * 2 * 15 * 2));
  EXPECT_DOUBLE_EQ(message_level_cost(4, 1000, 0, 10), message_level_cost(4, 1000, 1, 10));  // at least one allreduce
  EXPECT_LT(message_level_cost(2, 1000, 3, 10), message_level_cost(2, 1000, 3, 11));
  EXPECT_LT(message_level_cost(2, 1000, 3, 10), message_level_cost(3, 1000, 3, 10));
}

TEST(CollectiveLevel, ExplicitLevelsAreKept) {
  const CollectiveLevel messages = choose_collective_level(CollectiveSimulation::kMessages, 1024, 138357544, 16, 24);
  EXPECT_TRUE(messages.messages);
  EXPECT_EQ(messages.reason, "--collectives messages");
  const CollectiveLevel model = choose_collective_level(CollectiveSimulation::kModel, 2, 10, 1, 24);
  EXPECT_FALSE(model.messages);
  EXPECT_EQ(model.reason, "--collectives model");
}

TEST(CollectiveLevel, AutoByWorldSizeAndCost) {
  // Small models up to kMessageLevelWorkers workers: messages (the MNIST MLP at 16 workers).
  const CollectiveLevel mlp = choose_collective_level(CollectiveSimulation::kAuto, 16, 648010, 3, 24);
  EXPECT_TRUE(mlp.messages) << mlp.reason;
  EXPECT_NE(mlp.reason.find("within its budget"), std::string::npos) << mlp.reason;
  // Larger worlds: modelled.
  const CollectiveLevel large = choose_collective_level(CollectiveSimulation::kAuto, kMessageLevelWorkers + 1, 10, 1, 24);
  EXPECT_FALSE(large.messages);
  EXPECT_NE(large.reason.find("above 16 workers"), std::string::npos) << large.reason;
  // AlexNet at 16 workers: ~2.4e10 element operations, over the budget: modelled, and says why.
  const CollectiveLevel alexnet = choose_collective_level(CollectiveSimulation::kAuto, 16, 61100840, 8, 24);
  EXPECT_FALSE(alexnet.messages);
  EXPECT_GT(message_level_cost(16, 61100840, 8, 24), kMessageLevelBudget);
  EXPECT_NE(alexnet.reason.find("over its budget"), std::string::npos) << alexnet.reason;
  EXPECT_NE(alexnet.reason.find("--collectives messages forces it"), std::string::npos) << alexnet.reason;
  // The budget is the boundary.
  EXPECT_TRUE(choose_collective_level(CollectiveSimulation::kAuto, 2, 1, 1, 1).messages);
}

// simulated_collective_level counts the iterations simulated before the measured ones (warm-up and
// the pipeline's fill), and simulate_method reports the level it used and why.
TEST(CollectiveLevel, SimulationUsesAndReportsTheLevel) {
  ModelProfile profile;
  profile.model = "hand-built";
  profile.batch = 8;
  profile.update_seconds = 1e-4;
  profile.layers = {{"a", 4096, 1e-3, 2e-3}, {"b", 1024, 1e-3, 2e-3}};
  MethodSimulationOptions options;
  options.workers = 2;
  options.link.bits_per_second = 10e9;
  options.link.latency_seconds = 20e-6;
  options.iterations = 3;
  const MethodSelection pipe = select_method("pipe", {}, FlagPolicy::kReject, CommonOptions{});
  const CollectiveLevel level = simulated_collective_level(pipe, profile, options);
  EXPECT_TRUE(level.messages);
  // pipe (K = 2): 3 measured + the lead-in (no warm-up, staleness K = 2, 2 more) = 7 simulated iterations.
  EXPECT_EQ(level.reason, choose_collective_level(CollectiveSimulation::kAuto, 2, 5120, 2, 7).reason);
  const MethodSimulationResult result = simulate_method(pipe, profile, options);
  EXPECT_EQ(result.collectives, "messages");
  EXPECT_EQ(result.collectives_reason, level.reason);
  options.collectives = CollectiveSimulation::kModel;
  const MethodSimulationResult modelled = simulate_method(pipe, profile, options);
  EXPECT_EQ(modelled.collectives, "model");
  EXPECT_EQ(modelled.collectives_reason, "--collectives model");
}

}  // namespace
}  // namespace pipesgd
