// Checkpoints of the parameter-server methods (pssync, asgd, dcasgd, odsgd): the servers' side of
// the protocol (ps/parameter_server.h "Checkpoints": every worker's checkpoint marker, a consistent
// cut, save_state/load_state of a shard) and, through run_training, interrupt-and-resume: a run
// whose worker crashes at iteration 37 and is resumed from its checkpoint of iteration 30 ends with
// exactly (bit for bit, every rank) the weights of the same run never interrupted, for every
// deterministic configuration (synchronous servers; asynchronous ones with a single worker, whose
// order of pushes is fixed). With several asynchronous workers the order of pushes is the
// scheduler's, so there the test is that the resumed run continues from the checkpoint and trains.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <cmath>
#include <filesystem>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/layout.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/ps/shard_plan.h"
#include "pipesgd/train/fault_injection.h"
#include "pipesgd/train/trainer.h"
#include "resume_checks.h"
#include "temp_dir.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "\"" << (text) << "\" lacks \"" << (part) << "\""

constexpr Timeout kWait{10000};

// ---- the protocol ------------------------------------------------------------------------------

Layout three_segments() {
  Layout layout;
  layout.add("a", 3);
  layout.add("b", 2);
  layout.add("c", 4);
  return layout;
}

struct CheckpointSeen {
  std::int64_t iteration = -1;
  std::uint64_t version = 0;
  std::vector<float> weights;
  int calls = 0;
};

// Synchronous: the cut after iteration 1 (marker of iteration 2) is the shard at version 2, on every
// shard, and serving goes on after it.
TEST(ParameterServerCheckpoint, SynchronousCutIsTheVersionOfTheMarkedIteration) {
  for (int servers : {1, 2}) {
    SCOPED_TRACE(servers);
    const Layout layout = three_segments();
    const ShardPlan plan(layout, servers);
    const std::vector<float> initial(layout.total(), 1.0f);
    std::vector<CheckpointSeen> seen(static_cast<std::size_t>(servers));
    std::vector<std::uint64_t> final_versions(static_cast<std::size_t>(servers));
    run_ranks(2 + servers, [&](int rank, Transport& transport) {
      if (rank >= 2) {
        ParameterServerShard shard(transport, plan, 2, initial, SgdOptions{0.5f, 0.9f, 0.0f});
        ServeOptions options;
        options.timeout = kWait;
        options.on_checkpoint = [&](const ParameterServerShard& served, std::int64_t iteration) {
          CheckpointSeen& mine = seen[static_cast<std::size_t>(served.shard_index())];
          mine.iteration = iteration;
          mine.version = served.version();
          mine.weights.assign(served.weights().begin(), served.weights().end());
          ++mine.calls;
        };
        shard.serve(options);
        final_versions[static_cast<std::size_t>(shard.shard_index())] = shard.version();
        return;
      }
      ParameterClient client(transport, plan, 2, kWait);
      std::vector<float> gradients(layout.total(), static_cast<float>(rank + 1));
      std::vector<float> weights(layout.total());
      for (std::uint64_t t = 0; t < 4; ++t) {
        PushHandle push = client.push(gradients, t, static_cast<std::int64_t>(t));
        PullHandle pull = client.pull(weights, t + 1);
        push.wait(kWait);
        EXPECT_EQ(pull.wait(kWait), t + 1);
        if (t == 1) client.mark_checkpoint(2);
      }
      client.close();
    });
    for (int s = 0; s < servers; ++s) {
      const CheckpointSeen& mine = seen[static_cast<std::size_t>(s)];
      EXPECT_EQ(mine.calls, 1);
      EXPECT_EQ(mine.iteration, 2);
      EXPECT_EQ(mine.version, 2u);
      EXPECT_EQ(final_versions[static_cast<std::size_t>(s)], 4u);
      // Two steps of mean gradient 1.5 with momentum 0.9: w = 1 - 0.5 * 1.5 - 0.5 * (0.9 * 1.5 + 1.5).
      for (float w : mine.weights) EXPECT_FLOAT_EQ(w, 1.0f - 0.75f - 0.5f * 2.85f);
    }
  }
}

// Asynchronous: whatever the timing, the cut holds exactly the pushes made before each worker's
// marker (1 of worker 0, 2 of worker 1), none after; the held requests are served after it.
TEST(ParameterServerCheckpoint, AsynchronousCutHoldsExactlyThePushesBeforeTheMarkers) {
  for (int repeat = 0; repeat < 5; ++repeat) {
    const Layout layout = three_segments();
    const ShardPlan plan(layout, 1);
    const std::vector<float> initial(layout.total(), 0.0f);
    CheckpointSeen seen;
    std::uint64_t final_version = 0;
    run_ranks(3, [&](int rank, Transport& transport) {
      if (rank == 2) {
        ParameterServerShard shard(transport, plan, 2, initial, SgdOptions{1.0f, 0.0f, 0.0f});
        ServeOptions options;
        options.mode = ServerMode::kAsynchronous;
        options.timeout = kWait;
        options.on_checkpoint = [&](const ParameterServerShard& served, std::int64_t iteration) {
          seen.iteration = iteration;
          seen.version = served.version();
          seen.weights.assign(served.weights().begin(), served.weights().end());
          ++seen.calls;
        };
        shard.serve(options);
        final_version = shard.version();
        return;
      }
      ParameterClient client(transport, plan, 2, kWait);
      // Worker 0 pushes 1s, worker 1 pushes 10s: the cut's weights tell whose pushes it holds.
      std::vector<float> gradients(layout.total(), rank == 0 ? 1.0f : 10.0f);
      std::vector<float> weights(layout.total());
      const int before = rank == 0 ? 1 : 2;
      std::uint64_t version = 0;
      for (int k = 0; k < before + 2; ++k) {
        PushHandle push = client.push(gradients, version, k);
        PullHandle pull = client.pull(weights, 0);
        push.wait(kWait);
        version = pull.wait(kWait);
        if (k + 1 == before) client.mark_checkpoint(7);
      }
      client.close();
    });
    EXPECT_EQ(seen.calls, 1);
    EXPECT_EQ(seen.iteration, 7);
    EXPECT_EQ(seen.version, 3u);
    for (float w : seen.weights) EXPECT_FLOAT_EQ(w, -(1.0f + 2 * 10.0f));
    EXPECT_EQ(final_version, 7u);
  }
}

// Runs one worker's marker against a server and returns the server's error.
std::string server_error(const std::function<void(ParameterClient&, int rank)>& worker, bool with_callback) {
  const Layout layout = three_segments();
  const ShardPlan plan(layout, 1);
  const std::vector<float> initial(layout.total(), 0.0f);
  try {
    run_ranks(3, [&](int rank, Transport& transport) {
      if (rank == 2) {
        ParameterServerShard shard(transport, plan, 2, initial, SgdOptions{});
        ServeOptions options;
        options.timeout = kWait;
        if (with_callback) options.on_checkpoint = [](const ParameterServerShard&, std::int64_t) {};
        shard.serve(options);
        return;
      }
      ParameterClient client(transport, plan, 2, kWait);
      worker(client, rank);
    });
  } catch (const CommError& error) {
    return error.what();
  } catch (const std::exception& error) {
    return std::string("not a CommError: ") + error.what();
  }
  return "no error";
}

TEST(ParameterServerCheckpoint, AMarkerToAServerThatWritesNoCheckpointsIsAProtocolError) {
  const std::string error = server_error([](ParameterClient& client, int) { client.mark_checkpoint(3); }, false);
  EXPECT_CONTAINS(error, "checkpoint marker from rank");
  EXPECT_CONTAINS(error, "writes no checkpoints");
}

TEST(ParameterServerCheckpoint, MarkersOfDifferentIterationsAreAProtocolError) {
  const std::string error =
      server_error([](ParameterClient& client, int rank) { client.mark_checkpoint(rank == 0 ? 3 : 4); }, true);
  EXPECT_CONTAINS(error, "checkpoint marker of iteration");
  EXPECT_CONTAINS(error, "while other workers marked iteration");
}

// Synchronous workers checkpoint after the same iteration: one pushing the next while another
// marked is a protocol error, whichever of the two the server sees first.
TEST(ParameterServerCheckpoint, APushAndAMarkerOfTheSameVersionAreAProtocolError) {
  const std::string error = server_error(
      [](ParameterClient& client, int rank) {
        std::vector<float> gradients(9, 1.0f);
        if (rank == 0) {
          client.push(gradients, 0, 0).wait(kWait);
        } else {
          client.mark_checkpoint(0);
        }
      },
      true);
  const bool push_first = error.find("while other workers pushed version 0") != std::string::npos;
  const bool marker_first = error.find("other workers marked a checkpoint of iteration 0") != std::string::npos;
  EXPECT_TRUE(push_first || marker_first) << error;
}

TEST(ParameterServerCheckpoint, LoadStateRejectsAnotherShardOrSize) {
  const Layout layout = three_segments();
  const ShardPlan two(layout, 2);
  const std::vector<float> initial(layout.total(), 0.5f);
  std::vector<CheckpointReader> parts;
  run_ranks(4, [&](int rank, Transport& transport) {
    if (rank < 2) return;
    ParameterServerShard shard(transport, two, 2, initial, SgdOptions{0.1f, 0.9f, 0.0f});
    CheckpointWriter out;
    shard.save_state(out);
    const std::vector<std::byte> bytes = out.serialize();
    static std::mutex mutex;
    std::lock_guard lock(mutex);
    parts.push_back(CheckpointReader::parse(bytes, concat("server", rank - 2)));
    std::sort(parts.begin(), parts.end(),
              [](const CheckpointReader& a, const CheckpointReader& b) { return a.origin() < b.origin(); });
  });
  ASSERT_EQ(parts.size(), 2u);
  run_ranks(4, [&](int rank, Transport& transport) {
    if (rank < 2) return;
    ParameterServerShard shard(transport, two, 2, initial, SgdOptions{0.1f, 0.9f, 0.0f});
    const CheckpointReader& other = parts[static_cast<std::size_t>(3 - rank)];
    try {
      shard.load_state(other);
      ADD_FAILURE() << "shard " << rank - 2 << " loaded another shard's checkpoint";
    } catch (const DataError& error) {
      EXPECT_CONTAINS(error.what(), "read by the server of shard");
    }
    shard.load_state(parts[static_cast<std::size_t>(rank - 2)]);  // its own: fine
    EXPECT_EQ(shard.version(), 0u);
  });
  // Another model (one server, all 9 weights) cannot take shard 0's 3 or so weights.
  run_ranks(3, [&](int rank, Transport& transport) {
    if (rank < 2) return;
    ParameterServerShard shard(transport, ShardPlan(layout, 1), 2, initial, SgdOptions{});
    try {
      shard.load_state(parts[0]);
      ADD_FAILURE() << "a shard of another size was loaded";
    } catch (const DataError& error) {
      EXPECT_CONTAINS(error.what(), "weights for shard 0");
    }
  });
}

// ---- interrupt and resume through run_training -------------------------------------------------

struct Variant {
  const char* name;
  const char* spec;
  std::int64_t warmup_iterations = 0;
  const char* local_updater = "sgd";
  DelayCompensationVariant dc = DelayCompensationVariant::kConstant;
  bool deterministic_with_many_workers = true;
  const char* lr_schedule = "constant";  // --lr-schedule, with --lr-warmup lr_warmup
  std::int64_t lr_warmup = 0;
};

void PrintTo(const Variant& variant, std::ostream* out) { *out << variant.name; }

const Variant kVariants[] = {
    {"pssync", "pssync"},
    {"odsgd_warmup5", "odsgd", 5},
    {"odsgd_dcasgd_a", "odsgd", 5, "dcasgd-a", DelayCompensationVariant::kAdaptive},
    {"odsgd_checkpoint_in_warmup", "odsgd", 34},  // checkpoint 30 inside, the crash after the switch
    {"odsgd_no_warmup", "odsgd", 0, "dcasgd-c"},
    {"asgd", "asgd", 0, "sgd", DelayCompensationVariant::kConstant, false},
    {"dcasgd_a", "dcasgd", 0, "sgd", DelayCompensationVariant::kAdaptive, false},
    // Learning-rate schedules whose factor changes every iteration across the crash and the resume:
    // the servers step at the rate of the iteration each push carries, odsgd's local updater too.
    {"pssync_cosine_warmup40", "pssync", 0, "sgd", DelayCompensationVariant::kConstant, true, "cosine", 40},
    {"odsgd_dcasgd_c_cosine", "odsgd", 5, "dcasgd-c", DelayCompensationVariant::kConstant, true, "cosine", 0},
    {"asgd_cosine_warmup35", "asgd", 0, "sgd", DelayCompensationVariant::kConstant, false, "cosine", 35},
};

TrainConfig make_config(const Variant& variant, int workers, int servers) {
  TrainConfig config = tiny_config(variant.spec, workers, servers);
  config.iterations = kIterations;
  // The delay compensation (lambda 0.5) where the method has one: dcasgd's servers (variant
  // `dc`), odsgd's local updater (dcasgd-c or dcasgd-a).
  OptionValues options;
  const std::string spec = variant.spec, updater = variant.local_updater;
  if (spec == "odsgd") {
    options.set("--warmup-iters", std::to_string(variant.warmup_iterations));
    options.set("--local-updater", updater);
    if (updater != "sgd") options.set("--dc-lambda", "0.5");
  } else if (spec == "dcasgd") {
    options.set("--dc-variant", variant_name(variant.dc));
    options.set("--dc-lambda", "0.5");
  }
  set_method_options(config, options);
  config.method.common.lr_schedule = parse_lr_schedule(variant.lr_schedule, variant.lr_warmup);
  return config;
}

class ParameterServerResume : public ::testing::TestWithParam<std::tuple<Variant, int, int>> {};

TEST_P(ParameterServerResume, InterruptAndResume) {
  const auto& [variant, workers, servers] = GetParam();
  const TrainConfig config = make_config(variant, workers, servers);
  const bool deterministic = workers == 1 || variant.deterministic_with_many_workers;

  const RunSummary uninterrupted = run_training(config, softmax_factory(), data());
  ASSERT_TRUE(Trained(uninterrupted));
  RunSummary with_checkpoints;
  if (deterministic) {
    TempDir dir;
    with_checkpoints = run_training(checkpointing(config, dir.path()), softmax_factory(), data());
    EXPECT_TRUE(BitIdentical(uninterrupted, with_checkpoints)) << "checkpointing changed the weights";
  }

  TempDir dir;
  interrupt(checkpointing(config, dir.path()), data());
  // The set of iteration 30 is complete: every worker's part, every server's part and the shared part.
  std::vector<std::string> parts{"shared"};
  for (int r = 0; r < workers; ++r) parts.push_back("rank" + std::to_string(r));
  for (int s = 0; s < servers; ++s) parts.push_back("server" + std::to_string(s));
  for (const std::string& part : parts) EXPECT_TRUE(fs::exists(dir.file(name_of(30, part)))) << part;
  for (int s = 0; s < servers; ++s) {
    const CheckpointReader server = CheckpointReader::read_file(dir.file(name_of(30, "server" + std::to_string(s))));
    EXPECT_EQ(server.integer("next_iteration"), 30);
    // Synchronous servers take one step per iteration; asynchronous ones one per push.
    const bool synchronous = std::string(variant.spec) == "pssync" || std::string(variant.spec) == "odsgd";
    EXPECT_EQ(server.integer("server.version"), synchronous ? 30 : 30 * workers) << "server " << s;
  }
  // The crashed worker never wrote 40, so set 40 is incomplete (asynchronous workers that ran on
  // may have written their parts of it; the servers held them at its cut, which never came).
  EXPECT_FALSE(fs::exists(dir.file(name_of(40, "rank" + std::to_string(workers - 1)))));
  for (int s = 0; s < servers; ++s) EXPECT_FALSE(fs::exists(dir.file(name_of(40, "server" + std::to_string(s)))));

  const RunSummary resumed = run_training(resuming(config, dir.path()), softmax_factory(), data());
  EXPECT_EQ(resumed.reliability.resumed_from, 30);
  EXPECT_EQ(resumed.timing.iterations, kIterations);
  ASSERT_TRUE(Trained(resumed));
  if (deterministic) {
    EXPECT_TRUE(BitIdentical(uninterrupted, resumed)) << "the resumed run's weights differ";
    // Its summary says what the run never interrupted says (bytes, with the servers' checkpoint
    // markers, mean loss, epochs, ...).
    EXPECT_TRUE(SameReport(with_checkpoints, resumed));
    ASSERT_EQ(resumed.epochs.size(), uninterrupted.epochs.size());
    for (std::size_t e = 0; e < resumed.epochs.size(); ++e) {
      EXPECT_EQ(resumed.epochs[e].train_loss, uninterrupted.epochs[e].train_loss) << "epoch " << e;
    }
  }
}

std::string resume_name(const ::testing::TestParamInfo<ParameterServerResume::ParamType>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + std::to_string(std::get<1>(info.param)) + "workers_" +
         std::to_string(std::get<2>(info.param)) + "servers";
}

INSTANTIATE_TEST_SUITE_P(Methods, ParameterServerResume,
                         ::testing::Combine(::testing::ValuesIn(kVariants), ::testing::Values(1, 3),
                                            ::testing::Values(1, 2)),
                         resume_name);

// A missing server part makes the newest set incomplete: resume falls back to the previous one,
// still bit-identical.
TEST(ParameterServerResumeTest, AMissingServerPartFallsBackToThePreviousCheckpoint) {
  const TrainConfig config = make_config(kVariants[1], 2, 2);
  const RunSummary uninterrupted = run_training(config, softmax_factory(), data());
  TempDir dir;
  interrupt(checkpointing(config, dir.path()), data());
  ASSERT_TRUE(fs::remove(dir.file(name_of(30, "server1"))));
  ASSERT_TRUE(fs::exists(dir.file(name_of(20, "server1"))));
  const RunSummary resumed = run_training(resuming(config, dir.path()), softmax_factory(), data());
  EXPECT_EQ(resumed.reliability.resumed_from, 20);
  EXPECT_TRUE(BitIdentical(uninterrupted, resumed));
}

// Another server count is another run: its checkpoint is refused with both descriptions.
TEST(ParameterServerResumeTest, AnotherServerCountIsAnotherRun) {
  TempDir dir;
  interrupt(checkpointing(make_config(kVariants[0], 2, 1), dir.path()), data());
  try {
    run_training(resuming(make_config(kVariants[0], 2, 2), dir.path()), softmax_factory(), data());
    ADD_FAILURE() << "a checkpoint of 1 server was resumed with 2";
  } catch (const UsageError& error) {
    EXPECT_CONTAINS(error.what(), "is of another run");
    EXPECT_CONTAINS(error.what(), "1 servers");
    EXPECT_CONTAINS(error.what(), "2 servers");
  }
}

}  // namespace
}  // namespace pipesgd
