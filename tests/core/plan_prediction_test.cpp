// `pipesgd plan`'s predictions (tools/plan_prediction.h) from given planning inputs: every plan's
// timeline plus the update, WFBP's case, and Pipe-SGD's Eq. 5-7 over the same profile.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/timing/pipe_timing_model.h"
#include "pipesgd/tools/plan_prediction.h"

namespace pipesgd {
namespace {

PlanningInputs four_layers() {
  PlanningInputs inputs;
  inputs.profile.bytes = {4000, 400000, 40000, 4000000};
  inputs.profile.backward_seconds = {0.002, 0.001, 0.003, 0.004};
  inputs.profile.forward_seconds = 0.005;
  inputs.profile.per_bucket_compute_seconds = 0.0001;
  inputs.cost = LinearCost{0.0005, 1e-9};
  inputs.update_seconds = 0.0007;
  return inputs;
}

TEST(PlanPrediction, EveryPlanIsItsTimelinePlusTheUpdate) {
  const PlanningInputs inputs = four_layers();
  const std::vector<std::string> names = {"wfbp", "single", "optimal", "fixed:1"};
  const PlanPredictions predicted = predict_plans(inputs, names, CommonOptions{}, NetworkSpec{}, 4);
  EXPECT_DOUBLE_EQ(predicted.gradient_bytes, 4444000);
  EXPECT_DOUBLE_EQ(predicted.backward_seconds, 0.010);
  EXPECT_EQ(predicted.algorithm, "ring");
  EXPECT_FALSE(predicted.cost_source.empty());
  ASSERT_EQ(predicted.plans.size(), names.size());
  double optimal = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const PlanPrediction& plan = predicted.plans[i];
    EXPECT_EQ(plan.name, names[i]);
    const PlanTimeline timeline = simulate_plan(inputs.profile, inputs.cost, plan.plan);
    EXPECT_DOUBLE_EQ(plan.timeline.iteration, timeline.iteration);
    EXPECT_DOUBLE_EQ(plan.iteration, timeline.iteration + inputs.update_seconds);
    if (names[i] == "optimal") optimal = plan.iteration;
  }
  EXPECT_EQ(predicted.plans[0].plan.buckets.size(), 4u);  // wfbp: one per layer
  EXPECT_EQ(predicted.plans[1].plan.buckets.size(), 1u);  // single
  for (const PlanPrediction& plan : predicted.plans) EXPECT_LE(optimal, plan.iteration + 1e-15) << plan.name;
  const WfbpCase wfbp = classify_wfbp(inputs.profile, inputs.cost);
  EXPECT_EQ(predicted.wfbp.number, wfbp.number);
  EXPECT_DOUBLE_EQ(predicted.wfbp.iteration, wfbp.iteration);
}

TEST(PlanPrediction, PipeSgdOverTheSameProfile) {
  const PlanningInputs inputs = four_layers();
  const PlanPredictions predicted = predict_plans(inputs, {"wfbp", "single"}, CommonOptions{}, NetworkSpec{}, 4);
  EXPECT_DOUBLE_EQ(predicted.compute, 0.005 + 0.010 + 0.0007);
  const RingCostParameters ring{predicted.link.alpha, predicted.link.beta, predicted.link.gamma, 0.0};
  EXPECT_DOUBLE_EQ(predicted.sequential_comm, ring_allreduce_time(4, predicted.gradient_bytes, ring));
  EXPECT_DOUBLE_EQ(predicted.sequential_iteration, std::max(predicted.compute, predicted.sequential_comm));
  EXPECT_DOUBLE_EQ(predicted.scaling_efficiency, pipe_scaling_efficiency(predicted.compute, predicted.sequential_comm));
  EXPECT_FALSE(predicted.link_source.empty());
  ASSERT_EQ(predicted.pipelined.size(), 2u);
  const PipelinedPrediction& wfbp = predicted.pipelined[0];
  EXPECT_EQ(wfbp.plan, "wfbp");
  EXPECT_EQ(wfbp.segments, 4);
  EXPECT_DOUBLE_EQ(wfbp.first_segment_backward, 0.004);  // the first bucket is the last layer
  EXPECT_DOUBLE_EQ(wfbp.comm, ring_allreduce_time(4, predicted.gradient_bytes, ring, 4));
  for (const PipelinedPrediction& pipelined : predicted.pipelined) {
    EXPECT_GE(pipelined.iteration, predicted.compute) << pipelined.plan;  // the compute thread runs all of it
  }
  EXPECT_DOUBLE_EQ(predicted.pipelined[1].first_segment_backward, 0.010);  // single: all of backward
}

TEST(PlanPrediction, CodecAndNetworkSetTheCostsSources) {
  const PlanningInputs inputs = four_layers();
  CommonOptions int8;
  int8.codec = "int8";
  int8.allreduce = "auto";
  NetworkSpec link;
  link.bits_per_second = 1e9;
  link.latency_seconds = 200e-6;
  link.name = "bw=1Gbit,lat=200us";
  const PlanPredictions predicted = predict_plans(inputs, {"wfbp"}, int8, link, 8);
  EXPECT_NE(predicted.algorithm, "auto");  // resolved for the fp32 gradient
  EXPECT_NE(predicted.link_source.find("bw=1Gbit,lat=200us"), std::string::npos) << predicted.link_source;
  EXPECT_THROW(predict_plans(inputs, {"fastest"}, CommonOptions{}, NetworkSpec{}, 4), UsageError);
}

}  // namespace
}  // namespace pipesgd
