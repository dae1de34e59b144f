// Every registered method applies the run's learning-rate schedule (optim/lr_schedule.h), on the
// pure-C++ softmax model over 2 epochs:
//   - a schedule whose factor is 1 throughout (multistep:1000:0.5) trains bit for bit as constant;
//   - step:1:GAMMA with a tiny GAMMA moves the weights in the second epoch about GAMMA times as far
//     as constant does (a method that ignored the schedule would move them as far: ratio ~1).
// D-Sync and Pipe-SGD against hand-computed sequences with a per-iteration learning rate are in
// training_method_test.cpp, OD-SGD's servers and local updater in od_sgd_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>

#include "pipesgd/algo/registry.h"
#include "pipesgd/optim/lr_schedule.h"
#include "pipesgd/train/trainer.h"
#include "pipesgd/models/softmax_regression.h"
#include "resume_checks.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

struct MethodCase {
  const MethodDescriptor* method;
};

void PrintTo(const MethodCase& c, std::ostream* out) { *out << c.method->name; }

std::string case_name(const ::testing::TestParamInfo<MethodCase>& info) { return info.param.method->name; }

std::vector<MethodCase> every_method() {
  std::vector<MethodCase> cases;
  for (const MethodDescriptor* method : method_registry()) cases.push_back({method});
  return cases;
}

// A deterministic configuration of the method: 2 workers (a sum of two floats does not depend on
// the allreduce's order or buckets), 1 for the asynchronous servers (whose arrival order is not
// deterministic with more); a fixed k for sapipe; a short warm-up for odsgd so that its local
// updater runs. Plain SGD, whole epochs.
TrainConfig method_config(const MethodDescriptor& method, std::int64_t epochs, const std::string& schedule) {
  OptionValues options;
  const bool asynchronous = method.name == "asgd" || method.name == "dcasgd";
  if (method.name == "sapipe") options.set("--stale-layers", "1");
  if (method.name == "odsgd") options.set("--warmup-iters", "3");
  TrainConfig config = tiny_config(method.name, asynchronous ? 1 : 2, method.traits.uses_servers ? 1 : 0, options);
  set_sgd(config, SgdOptions{0.1f, 0.0f, 0.0f});
  config.iterations = 0;
  config.epochs = epochs;
  config.warn_short_run = false;
  config.method.common.lr_schedule = parse_lr_schedule(schedule);
  return config;
}

std::vector<float> final_weights(const TrainConfig& config) {
  const RunSummary summary = run_training(config, softmax_factory(), data());
  EXPECT_FALSE(summary.final_parameters.empty());
  return summary.final_parameters.empty() ? std::vector<float>{} : summary.final_parameters[0];
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(sum);
}

class EveryMethodSchedule : public ::testing::TestWithParam<MethodCase> {};

TEST_P(EveryMethodSchedule, AFactorOfOneThroughoutIsConstantBitForBit) {
  const MethodDescriptor& method = *GetParam().method;
  const RunSummary constant = run_training(method_config(method, 2, "constant"), softmax_factory(), data());
  const RunSummary unity = run_training(method_config(method, 2, "multistep:1000:0.5"), softmax_factory(), data());
  EXPECT_TRUE(BitIdentical(constant, unity));
}

TEST_P(EveryMethodSchedule, AStepDecayShrinksTheSecondEpochsMovementByGamma) {
  const MethodDescriptor& method = *GetParam().method;
  constexpr double kGamma = 1e-3;
  // After 1 epoch every method has applied exactly the first epoch's gradients (at factor 1).
  const std::vector<float> one_epoch = final_weights(method_config(method, 1, "constant"));
  const std::vector<float> constant = final_weights(method_config(method, 2, "constant"));
  const std::vector<float> decayed = final_weights(method_config(method, 2, "step:1:0.001"));
  ASSERT_EQ(one_epoch.size(), constant.size());
  ASSERT_EQ(one_epoch.size(), decayed.size());
  const double moved_constant = distance(one_epoch, constant);
  const double moved_decayed = distance(one_epoch, decayed);
  ASSERT_GT(moved_constant, 1e-3);
  const double ratio = moved_decayed / moved_constant;
  EXPECT_GT(ratio, kGamma / 10) << "the second epoch did not move";
  EXPECT_LT(ratio, kGamma * 10) << "the second epoch moved as if the schedule were ignored";
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryMethodSchedule, ::testing::ValuesIn(every_method()), case_name);

// make_method binds the selection's schedule to the run length it is given, and refuses to build a
// method whose schedule needs a length it was not given.
TEST(ScheduleBinding, MakeMethodNeedsTheRunLengthOfAStepSchedule) {
  MethodSelection selection = select_for_test("dsync");
  selection.common.lr_schedule = parse_lr_schedule("step:1:0.5");
  run_ranks(1, [&](int, Transport& transport) {
    SoftmaxRegression model(4, 2, 1);
    EXPECT_THROW(make_method(selection, transport, model, 0), UsageError);
    EXPECT_NO_THROW(make_method(selection, transport, model, 0, {}, LrScheduleLength{10, 20}));
    selection.common.lr_schedule = parse_lr_schedule("constant", 5);
    EXPECT_NO_THROW(make_method(selection, transport, model, 0));
  });
}

}  // namespace
}  // namespace pipesgd
