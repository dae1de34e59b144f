// A run resumed from the commit of another number of workers (train/elastic.h, RunPlan::shift;
// docs/user-guide.md, "Continuing with another number of workers"): the plan continues the
// committed world's epoch at the closed-form position, the learning rate follows the global batch,
// every method that may change its world trains on with identical replicas, a continued world
// interrupted again resumes bit for bit, and the methods that cannot change world, or another
// run's commit, are refused with one line. (The softmax model over resume_checks.h's data: 600
// examples, batch 5, so 40 iterations per epoch with 3 workers and 60 with 2.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/algo/registry.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/checkpointing.h"
#include "pipesgd/train/run_config.h"
#include "pipesgd/train/run_context.h"
#include "pipesgd/train/trainer.h"
#include "resume_checks.h"
#include "temp_dir.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

namespace fs = std::filesystem;

// `spec` on `workers` workers for 2 epochs (sapipe with one stale layer, as the resume tests).
TrainConfig two_epochs(const std::string& spec, int workers) {
  OptionValues options;
  if (spec == "sapipe") options.set("--stale-layers", "1");
  TrainConfig config = tiny_config(spec, workers, 0, options);
  config.iterations = 0;
  config.epochs = 2;
  return config;
}

// Leaves in `dir` the commits of `config`'s world up to the one after `crash_at` rounded down to
// kEvery: its last worker crashes at `crash_at`.
void commit_until(const TrainConfig& config, const std::string& dir, std::int64_t crash_at) {
  (void)run_crashing(crashing(checkpointing(config, dir), crash_at), data());
}

RunContext prepared(const TrainConfig& config) { return prepare_run(config, data().train, /*leader=*/false); }

struct WorldChange {
  int from_workers;
  int to_workers;
  std::int64_t committed;  // the newest commit the first world leaves
  // Closed form: the committed world's position p = committed (its shift is 0), its epoch
  // e = p / ipe_from, the examples it trained of that epoch x = (p % ipe_from) * from * 5, the new
  // world's position e * ipe_to + x / (to * 5), shift = committed - that.
  std::int64_t shift;
  std::int64_t total;  // shift + 2 * ipe_to
};

void PrintTo(const WorldChange& change, std::ostream* out) {
  *out << change.from_workers << "to" << change.to_workers << "_after" << change.committed;
}

class WorldChangePlan : public ::testing::TestWithParam<WorldChange> {};

TEST_P(WorldChangePlan, ContinuesTheCommittedEpochAtItsPosition) {
  const WorldChange& change = GetParam();
  TempDir dir;
  commit_until(two_epochs("dsync", change.from_workers), dir.path(), change.committed + 7);
  const RunContext run = prepared(resuming(two_epochs("dsync", change.to_workers), dir.path()));
  ASSERT_TRUE(run.resumed_world.has_value());
  EXPECT_EQ(run.resumed_world->workers, change.from_workers);
  EXPECT_EQ(run.resume_from->iteration, change.committed);
  EXPECT_EQ(run.plan.iterations_per_epoch, 600 / (5 * change.to_workers));
  EXPECT_EQ(run.plan.shift, change.shift);
  EXPECT_EQ(run.plan.total_iterations, change.total);
  EXPECT_EQ(run.plan.epochs, 2);
  EXPECT_EQ(run.plan.base_workers, change.from_workers);
  EXPECT_EQ(run.plan.world_scale, static_cast<double>(change.to_workers) / change.from_workers);
  // The learning rate of every iteration after the change is the configured one times the scale.
  const LrSchedule schedule = run_learning_rate_schedule(run);
  EXPECT_EQ(schedule.factor(change.committed), run.plan.world_scale);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, WorldChangePlan,
    ::testing::Values(
        // 3 -> 2 after 50: epoch 1 (40 per epoch), 10 * 15 = 150 examples done; 2 workers: 60 + 150 / 10
        // = 75, shift 50 - 75 = -25 (none seen again), 2 epochs end at -25 + 120 = 95.
        WorldChange{3, 2, 50, -25, 95},
        // 2 -> 3 after 70: epoch 1 (60 per epoch), 10 * 10 = 100 done; 3 workers: 40 + 100 / 15 = 46 (90:
        // 10 examples seen again), shift 24, end 24 + 80 = 104.
        WorldChange{2, 3, 70, 24, 104},
        // 3 -> 1 after 30: epoch 0, 450 done; 1 worker (120 per epoch): 90, shift -60, end -60 + 240 = 180.
        WorldChange{3, 1, 30, -60, 180}),
    [](const auto& info) {
      std::string name;
      name += concat(info.param.from_workers, "to", info.param.to_workers, "_after", info.param.committed);
      return name;
    });

std::vector<const MethodDescriptor*> methods_that_change_world() {
  std::vector<const MethodDescriptor*> methods;
  for (const MethodDescriptor* method : method_registry()) {
    if (continues_another_world(method->traits)) methods.push_back(method);
  }
  return methods;
}

class WorldChangeMethod : public ::testing::TestWithParam<const MethodDescriptor*> {};

// 3 workers commit up to 50, 2 go on; the continued world commits (its shift and base in the shared
// part), crashes at 77 and resumes: bit-identical to the continuation never interrupted.
TEST_P(WorldChangeMethod, TrainsOnAndResumesItsContinuationBitForBit) {
  const std::string name = GetParam()->name;
  TempDir first, second;
  commit_until(two_epochs(name, 3), first.path(), 57);
  fs::copy(first.path(), second.path(), fs::copy_options::recursive);
  const RunSummary continued = run_training(resuming(two_epochs(name, 2), first.path()), softmax_factory(), data());
  ASSERT_TRUE(Trained(continued));
  ASSERT_EQ(continued.final_parameters.size(), 2u);
  EXPECT_EQ(continued.final_parameters[0], continued.final_parameters[1]) << "the replicas differ";
  EXPECT_EQ(continued.reliability.resumed_from, 50);
  EXPECT_EQ(continued.reliability.resumed_from_workers, 3);
  EXPECT_EQ(continued.reliability.learning_rate_scale, 2.0 / 3.0);
  ASSERT_EQ(continued.epochs.size(), 2u);
  EXPECT_EQ(continued.epochs.back().iterations, 95);

  (void)run_crashing(crashing(resuming(two_epochs(name, 2), second.path()), 77), data());
  const RunSummary again = run_training(resuming(two_epochs(name, 2), second.path()), softmax_factory(), data());
  EXPECT_EQ(again.reliability.resumed_from, 70);
  EXPECT_EQ(again.reliability.resumed_from_workers, 0) << "its commit was of its own world";
  EXPECT_EQ(again.reliability.learning_rate_scale, 2.0 / 3.0) << "the world that started the run had 3";
  EXPECT_TRUE(BitIdentical(continued, again));
  EXPECT_TRUE(SameReport(continued, again));
}

INSTANTIATE_TEST_SUITE_P(Methods, WorldChangeMethod, ::testing::ValuesIn(methods_that_change_world()),
                         [](const auto& info) { return std::string(info.param->name); });

// Epoch 2 began with 3 workers (10 iterations each before the commit at 50) and ended with 2 (45
// each): its training loss is the mean over those 120 worker-iterations, from the commit's parts and
// metrics.jsonl's per-iteration means; every iteration after the change has the new world's epoch
// and the scaled learning rate.
TEST(WorldChange, TheContinuedEpochsRecordCoversBothWorlds) {
  TempDir dir, out;
  commit_until(two_epochs("dsync", 3), dir.path(), 57);
  double loss_sum = 0;
  for (int r = 0; r < 3; ++r) {
    const CheckpointReader part = CheckpointReader::read_file(checkpoint_path(dir.path(), 50, concat("rank", r)));
    EXPECT_EQ(part.real("epoch.iterations"), 10.0);
    loss_sum += part.real("epoch.loss_sum");
  }
  TrainConfig config = resuming(two_epochs("dsync", 2), dir.path(), /*keep_writing=*/false);
  config.out_dir = out.path();
  const RunSummary continued = run_training(config, softmax_factory(), data());
  std::ifstream metrics(fs::path(out.path()) / "metrics.jsonl");
  int seen = 0;
  const float scaled = static_cast<float>(static_cast<double>(0.1f) * (2.0 / 3.0));
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("type", "") != "iteration") continue;
    ++seen;
    EXPECT_EQ(record["epoch"], 2) << line;
    EXPECT_EQ(static_cast<float>(record["lr"].get<double>()), scaled) << line;
    loss_sum += 2 * record["loss"].get<double>();
  }
  EXPECT_EQ(seen, 45);
  ASSERT_EQ(continued.epochs.size(), 2u);
  EXPECT_NEAR(continued.epochs[1].train_loss, loss_sum / 120, 1e-5 * loss_sum / 120);
  EXPECT_LE(continued.epochs[1].train_accuracy, 1.0);
}

// A warm-up of whole epochs ends where the committed world's did (at its epoch 1: iteration 40 of
// 3 workers, which 2 workers' plan maps to -25 + 60 = 35), so the gradients pipe had in flight
// after it (of iterations 48 and 49) carry over.
TEST(WorldChange, AWarmUpOfEpochsKeepsItsPlace) {
  TempDir dir;
  OptionValues options;
  options.set("--warmup-epochs", "1");
  TrainConfig three = two_epochs("pipe", 3);
  set_method_options(three, options);
  commit_until(three, dir.path(), 57);
  TrainConfig two = two_epochs("pipe", 2);
  set_method_options(two, options);
  EXPECT_EQ(prepared(resuming(two, dir.path())).plan.warmup_iterations, 35);
  EXPECT_TRUE(Trained(run_training(resuming(two, dir.path()), softmax_factory(), data())));
}

// A commit torn by the failure (a part of the 3 workers' missing) is skipped whichever part it
// lacks, also rank2, which 2 workers would not read: the run continues the commit before.
TEST(WorldChange, ATornCommitOfTheOtherWorldIsSkipped) {
  for (const char* missing : {"rank2", "rank1"}) {
    TempDir dir;
    commit_until(two_epochs("dsync", 3), dir.path(), 57);
    ASSERT_TRUE(fs::remove(checkpoint_path(dir.path(), 50, missing))) << missing;
    const RunContext run = prepared(resuming(two_epochs("dsync", 2), dir.path()));
    ASSERT_TRUE(run.resumed_world.has_value()) << missing;
    EXPECT_EQ(run.resume_from->iteration, 40) << missing;
    EXPECT_EQ(run.resumed_world->workers, 3) << missing;
  }
}

TEST(WorldChange, MethodsWithWeightsOrShardsOfTheirOwnAreRefused) {
  for (const char* name : {"nocomm", "pssync"}) {
    TempDir dir;
    commit_until(two_epochs(name, 3), dir.path(), 27);
    try {
      (void)prepared(resuming(two_epochs(name, 2), dir.path()));
      ADD_FAILURE() << name << " continued a commit of 3 workers with 2";
    } catch (const UsageError& error) {
      const std::string text = error.what();
      EXPECT_NE(text.find("is of 3 workers and this run has 2"), std::string::npos) << text;
      EXPECT_NE(text.find("relaunch it with 3 workers"), std::string::npos) << text;
      EXPECT_EQ(text.find('\n'), std::string::npos) << text;
    }
  }
}

TEST(WorldChange, AnotherRunsCommitIsRefused) {
  TempDir dir;
  commit_until(two_epochs("dsync", 3), dir.path(), 27);
  TrainConfig other = two_epochs("dsync", 2);
  other.seed = 12;
  try {
    (void)prepared(resuming(other, dir.path()));
    ADD_FAILURE() << "a commit of another seed was continued";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("is of another run"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace pipesgd
