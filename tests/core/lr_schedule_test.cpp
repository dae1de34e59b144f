// Learning-rate schedules (optim/lr_schedule.h) against hand-computed closed forms, and every bad
// spec refused with one line naming the setting and the accepted forms.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numbers>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/optim/adam.h"
#include "pipesgd/optim/lr_schedule.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {
namespace {

LrSchedule schedule(const std::string& text, std::int64_t warmup, std::int64_t per_epoch, std::int64_t total) {
  return LrSchedule(parse_lr_schedule(text, warmup), {per_epoch, total});
}

TEST(LrSchedule, ConstantIsExactlyOneAndLeavesTheRateBitIdentical) {
  const LrSchedule constant = schedule("constant", 0, 7, 100);
  for (std::int64_t t : {0, 1, 6, 7, 99, 1000}) {
    EXPECT_EQ(constant.factor(t), 1.0) << t;
    EXPECT_EQ(constant.learning_rate(0.1f, t), 0.1f) << t;
  }
  EXPECT_EQ(LrSchedule().factor(12345), 1.0);
  EXPECT_TRUE(parse_lr_schedule("constant").is_constant());
  EXPECT_FALSE(parse_lr_schedule("constant", 3).is_constant());
  EXPECT_FALSE(parse_lr_schedule("cosine").is_constant());
}

// External: the factor set for an iteration, shared by every copy of the schedule; an iteration
// not (or no longer) held reads the latest set, 1 before any.
TEST(LrSchedule, ExternalReadsTheFactorSetForEachIterationThroughEveryCopy) {
  auto table = std::make_shared<ExternalLearningRates>();
  LrScheduleSpec spec;
  spec.kind = LrScheduleKind::kExternal;
  const LrSchedule schedule(spec, {0, 0, table});
  const LrSchedule copy = schedule;
  EXPECT_EQ(schedule.factor(0), 1.0);
  table->set(0, 0.5);
  table->set(1, 0.25);
  EXPECT_EQ(copy.factor(0), 0.5);
  EXPECT_EQ(copy.factor(1), 0.25);
  EXPECT_EQ(copy.factor(7), 0.25);  // not set yet: the latest
  EXPECT_EQ(schedule.learning_rate(0.2f, 0), 0.1f);
  for (std::int64_t t = 2; t < 2 + static_cast<std::int64_t>(ExternalLearningRates::kCapacity); ++t) {
    table->set(t, 1.0 / static_cast<double>(t));
  }
  EXPECT_EQ(copy.factor(1), 1.0 / static_cast<double>(1 + ExternalLearningRates::kCapacity));  // overwritten
  EXPECT_EQ(copy.factor(100), 0.01);
  EXPECT_EQ(spec.text(), "external");
}

TEST(LrSchedule, StepDecaysEveryEveryEpochs) {
  // 10 iterations per epoch, step:2:0.5: epochs 0-1 x1, 2-3 x0.5, 4-5 x0.25, ...
  const LrSchedule step = schedule("step:2:0.5", 0, 10, 100);
  EXPECT_EQ(step.factor(0), 1.0);
  EXPECT_EQ(step.factor(19), 1.0);
  EXPECT_EQ(step.factor(20), 0.5);
  EXPECT_EQ(step.factor(39), 0.5);
  EXPECT_EQ(step.factor(40), 0.25);
  EXPECT_EQ(step.factor(99), 0.0625);  // epoch 9: floor(9 / 2) = 4 decays
  EXPECT_EQ(step.learning_rate(0.1f, 45), static_cast<float>(0.1f * 0.25));
  // step:1:0.1 with 3 iterations per epoch: 0.1^epoch.
  const LrSchedule tenth = schedule("step:1:0.1", 0, 3, 9);
  EXPECT_EQ(tenth.factor(2), 1.0);
  EXPECT_DOUBLE_EQ(tenth.factor(3), 0.1);
  EXPECT_DOUBLE_EQ(tenth.factor(8), 0.01);
}

TEST(LrSchedule, MultiStepCountsTheMilestonesPassed) {
  // Milestones at epochs 2 and 5, 4 iterations per epoch, gamma 0.1.
  const LrSchedule multi = schedule("multistep:2,5:0.1", 0, 4, 40);
  EXPECT_EQ(multi.factor(0), 1.0);
  EXPECT_EQ(multi.factor(7), 1.0);   // epoch 1
  EXPECT_DOUBLE_EQ(multi.factor(8), 0.1);   // epoch 2: one milestone passed
  EXPECT_DOUBLE_EQ(multi.factor(19), 0.1);  // epoch 4
  EXPECT_DOUBLE_EQ(multi.factor(20), 0.01);  // epoch 5: both
  EXPECT_DOUBLE_EQ(multi.factor(39), 0.01);
  // A milestone beyond the run never applies: factor 1 throughout.
  const LrSchedule never = schedule("multistep:1000:0.5", 0, 4, 40);
  for (std::int64_t t = 0; t < 40; ++t) EXPECT_EQ(never.factor(t), 1.0) << t;
}

TEST(LrSchedule, CosineAnnealsPerIterationOverTheRun) {
  const std::int64_t total = 10;
  const LrSchedule cosine = schedule("cosine", 0, 3, total);
  EXPECT_EQ(cosine.factor(0), 1.0);
  EXPECT_DOUBLE_EQ(cosine.factor(5), 0.5);  // half way: cos(pi / 2) = 0
  EXPECT_DOUBLE_EQ(cosine.factor(3), (1 + std::cos(std::numbers::pi * 0.3)) / 2);
  // The last iteration: (1 + cos(9 pi / 10)) / 2 = 0.0244717..., not zero.
  EXPECT_DOUBLE_EQ(cosine.factor(9), (1 + std::cos(std::numbers::pi * 0.9)) / 2);
  EXPECT_NEAR(cosine.factor(9), 0.024471741852423, 1e-14);
  EXPECT_NEAR(cosine.factor(total), 0.0, 1e-15);  // eta_min past the end
  EXPECT_NEAR(cosine.factor(total + 5), 0.0, 1e-15);
  // One iteration: lr(0) = base.
  EXPECT_EQ(schedule("cosine", 0, 1, 1).factor(0), 1.0);
}

TEST(LrSchedule, WarmupScalesTheFirstNIterationsByTPlusOneOverN) {
  // Constant with warm-up 4: 1/4, 2/4, 3/4, then 1.
  const LrSchedule constant = schedule("constant", 4, 10, 100);
  EXPECT_EQ(constant.factor(0), 0.25);
  EXPECT_EQ(constant.factor(1), 0.5);
  EXPECT_EQ(constant.factor(2), 0.75);
  EXPECT_EQ(constant.factor(3), 1.0);
  EXPECT_EQ(constant.factor(4), 1.0);
  // Warm-up over an epoch boundary with step:1:0.5 (2 iterations per epoch, warm-up 5).
  const LrSchedule step = schedule("step:1:0.5", 5, 2, 10);
  EXPECT_EQ(step.factor(1), 1.0 * 2 / 5);
  EXPECT_EQ(step.factor(2), 0.5 * 3 / 5);
  EXPECT_EQ(step.factor(4), 0.25 * 5 / 5);
  EXPECT_EQ(step.factor(5), 0.25);
  // multistep with warm-up 3 (1 iteration per epoch, milestone 1).
  const LrSchedule multi = schedule("multistep:1:0.5", 3, 1, 10);
  EXPECT_DOUBLE_EQ(multi.factor(0), 1.0 / 3);
  EXPECT_DOUBLE_EQ(multi.factor(1), 0.5 * 2 / 3);
  EXPECT_EQ(multi.factor(3), 0.5);
  // cosine with warm-up 2 over 8 iterations.
  const LrSchedule cosine = schedule("cosine", 2, 3, 8);
  EXPECT_DOUBLE_EQ(cosine.factor(0), 0.5);
  EXPECT_DOUBLE_EQ(cosine.factor(1), (1 + std::cos(std::numbers::pi / 8)) / 2 * 1.0);
  EXPECT_DOUBLE_EQ(cosine.factor(7), (1 + std::cos(std::numbers::pi * 7 / 8)) / 2);
  // Warm-up 1 changes nothing.
  EXPECT_EQ(schedule("constant", 1, 1, 1).factor(0), 1.0);
}

TEST(LrSchedule, LearningRateIsBaseTimesFactorRoundedOnce) {
  const LrSchedule cosine = schedule("cosine", 0, 3, 7);
  for (std::int64_t t = 0; t < 7; ++t) {
    EXPECT_EQ(cosine.learning_rate(0.05f, t), static_cast<float>(static_cast<double>(0.05f) * cosine.factor(t)));
  }
}

TEST(LrSchedule, TextRoundTripsAndDescribesTheWarmup) {
  EXPECT_EQ(parse_lr_schedule("step:30:0.1").text(), "step:30:0.1");
  EXPECT_EQ(parse_lr_schedule("multistep:3,6,9:0.5").text(), "multistep:3,6,9:0.5");
  EXPECT_EQ(parse_lr_schedule("cosine").text(), "cosine");
  EXPECT_EQ(parse_lr_schedule("constant").describe(), "constant");
  EXPECT_EQ(parse_lr_schedule("cosine", 10).describe(), "cosine, warm-up 10 iterations");
  EXPECT_EQ(parse_lr_schedule("step:1:1").gamma, 1.0);
  EXPECT_EQ(parse_lr_schedule("step:2:0.5"), parse_lr_schedule("step:2:0.50"));
  EXPECT_NE(parse_lr_schedule("step:2:0.5"), parse_lr_schedule("step:2:0.5", 1));
}

TEST(LrSchedule, SchedulesThatNeedTheRunLengthRefuseNone) {
  EXPECT_THROW(LrSchedule(parse_lr_schedule("step:1:0.5"), {0, 10}), UsageError);
  EXPECT_THROW(LrSchedule(parse_lr_schedule("multistep:1:0.5"), {0, 10}), UsageError);
  EXPECT_THROW(LrSchedule(parse_lr_schedule("cosine"), {10, 0}), UsageError);
  EXPECT_NO_THROW(LrSchedule(parse_lr_schedule("constant", 5), {0, 0}));
}

TEST(LrSchedule, OptimizersScaleTheirBaseRateByTheFactor) {
  // SGD: w -= lr * g; with factor 0.25 the step is a quarter.
  Sgd sgd(1, SgdOptions{0.5f, 0.0f, 0.0f});
  std::vector<float> w{1.0f};
  const std::vector<float> g{2.0f};
  sgd.step(w, g, 1.0f, 0);
  EXPECT_EQ(w[0], 0.0f);  // 1 - 0.5 * 2
  sgd.set_learning_rate_factor(0.25);
  EXPECT_EQ(sgd.learning_rate(), 0.125f);
  sgd.step(w, g, 1.0f, 0);
  EXPECT_EQ(w[0], -0.25f);
  sgd.set_learning_rate_factor(1.0);
  EXPECT_EQ(sgd.learning_rate(), 0.5f);
  // Adam's first step moves by lr (m / sqrt(v) = sign(g) after bias correction): the factor scales it.
  Layout layout;
  layout.add("w", 1);
  Adam adam(layout, AdamOptions{0.1f, 0.9f, 0.999f, 1e-8f, 0.0f});
  adam.set_learning_rate_factor(0.5);
  std::vector<float> a{1.0f};
  adam.step(a, g, 1.0f, 0);
  EXPECT_NEAR(a[0], 1.0f - 0.05f, 1e-6);
}

// ---- bad specs -----------------------------------------------------------------------------------

struct BadSpec {
  const char* text;
  std::int64_t warmup;
  const char* fragment;
};

void PrintTo(const BadSpec& spec, std::ostream* out) { *out << "'" << spec.text << "' warm-up " << spec.warmup; }

class LrScheduleRejects : public ::testing::TestWithParam<BadSpec> {};

TEST_P(LrScheduleRejects, WithOneLineNamingTheFlag) {
  const BadSpec& bad = GetParam();
  try {
    parse_lr_schedule(bad.text, bad.warmup, {"--lr-schedule", "--lr-warmup"});
    FAIL() << "accepted";
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(bad.fragment), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    if (bad.warmup >= 0 && bad.warmup <= kMaxLrWarmupIterations) {
      EXPECT_EQ(message.rfind("--lr-schedule '", 0), 0u) << message;
      EXPECT_NE(message.find(kLrScheduleForms), std::string::npos) << message;
    } else {
      EXPECT_EQ(message.rfind("--lr-warmup", 0), 0u) << message;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Specs, LrScheduleRejects,
    ::testing::Values(BadSpec{"linear", 0, "unknown schedule 'linear'"}, BadSpec{"", 0, "unknown schedule ''"},
                      BadSpec{"Cosine", 0, "unknown schedule 'Cosine'"},
                      BadSpec{"cosine:5", 0, "cosine takes no parts"},
                      BadSpec{"constant:1", 0, "constant takes no parts"},
                      BadSpec{"step", 0, "step takes 2 parts"}, BadSpec{"step:2", 0, "step takes 2 parts"},
                      BadSpec{"step:2:0.5:1", 0, "step takes 2 parts"},
                      BadSpec{"step:x:0.5", 0, "EVERY_EPOCHS 'x' is not an integer"},
                      BadSpec{"step:1.5:0.5", 0, "EVERY_EPOCHS '1.5' is not an integer"},
                      BadSpec{"step:0:0.5", 0, "EVERY_EPOCHS must be >= 1, got 0"},
                      BadSpec{"step:-2:0.5", 0, "EVERY_EPOCHS must be >= 1, got -2"},
                      BadSpec{"step:2:abc", 0, "GAMMA 'abc' is not a number"},
                      BadSpec{"step:2:", 0, "GAMMA '' is not a number"},
                      BadSpec{"step:2:0.5x", 0, "GAMMA '0.5x' is not a number"},
                      BadSpec{"step:2:nan", 0, "GAMMA 'nan' is not a number"},
                      BadSpec{"step:2:0", 0, "GAMMA must be in (0, 1], got 0"},
                      BadSpec{"step:2:-0.5", 0, "GAMMA must be in (0, 1], got -0.5"},
                      BadSpec{"step:2:1.5", 0, "GAMMA must be in (0, 1], got 1.5"},
                      BadSpec{"multistep:3", 0, "multistep takes 2 parts"},
                      BadSpec{"multistep::0.5", 0, "milestone '' is not an integer"},
                      BadSpec{"multistep:3,,6:0.5", 0, "milestone '' is not an integer"},
                      BadSpec{"multistep:3,a:0.5", 0, "milestone 'a' is not an integer"},
                      BadSpec{"multistep:0,3:0.5", 0, "milestones are epochs >= 1, got 0"},
                      BadSpec{"multistep:6,3:0.5", 0, "strictly increasing, got 3 after 6"},
                      BadSpec{"multistep:3,3:0.5", 0, "strictly increasing, got 3 after 3"},
                      BadSpec{"multistep:3,6:2", 0, "GAMMA must be in (0, 1], got 2"},
                      BadSpec{"constant", -1, "--lr-warmup must be in [0, 10000000] iterations, got -1"},
                      BadSpec{"cosine", kMaxLrWarmupIterations + 1, "--lr-warmup must be in [0, 10000000]"}));

}  // namespace
}  // namespace pipesgd
