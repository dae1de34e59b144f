// The parameter-server methods (algo/ps_methods/ps_methods.h) through run_training on the tiny pure-C++ model:
// PS-Sync against D-Sync, ASGD with one worker against sequential SGD, the run's wiring (server
// threads, control allreduce among workers only), usage errors and failure propagation.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "failing_model.h"
#include "resegmented_model.h"
#include "tiny_run.h"
#include "pipesgd/algo/odsgd/od_sgd.h"
#include "pipesgd/algo/ps_methods/ps_methods.h"
#include "pipesgd/comm/rank_subset_transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/models/softmax_regression.h"
#include "pipesgd/train/trainer.h"
#include "pipesgd/comm/local_transport.h"
#include "test_world.h"

namespace pipesgd {
namespace {

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// PS-Sync computes D-Sync's update, w <- SGD(w, (1/M) * sum_r g_r(w)), with the same
// hyper-parameters, batches and initial weights; only the order of the fp32 gradient sum differs:
// the servers add g_0 + g_1 + ... + g_{M-1} left to right, D-Sync's ring adds each chunk in ring
// order starting at a different rank. Two fp32 sums of the same M terms in different orders differ
// by at most 2 (M - 1) u sum_r |g_r| (u = 2^-24, the standard re-association bound), i.e. ~4e-7
// relative to the gradient's magnitude for M = 4. Scaled by lr = 0.1 and accumulated over 25
// iterations through momentum 0.9 (at most 1 / (1 - 0.9) = 10 times) and the (contracting) SGD
// map, the weights stay within ~25 * 0.1 * 10 * 4e-7 ~ 1e-5 of each other for this model's O(1)
// gradients; the tolerance below, 2e-5 * (1 + |w|), is that bound with a factor ~2 of margin (and a
// real protocol error — a lost, doubled or stale gradient — moves weights by ~1e-2). With M = 2 the
// sums are a + b in both, and fp32 addition is commutative: bit-identical.
void expect_close_to_dsync(int workers, int servers, std::size_t pieces) {
  SCOPED_TRACE(concat(workers, " workers, ", servers, " servers"));
  const DataSplits data = small_data();
  const ModelFactory factory = resegmented_softmax_factory(pieces);
  const RunSummary dsync = run_training(tiny_config("dsync", workers), factory, data);
  const RunSummary pssync =
      run_training(tiny_config("pssync", workers, servers), factory, data);
  EXPECT_EQ(pssync.setup.servers, servers);
  ASSERT_EQ(pssync.final_parameters.size(), static_cast<std::size_t>(workers));
  double largest = 0;
  for (int rank = 0; rank < workers; ++rank) {
    const std::vector<float>& expected = dsync.final_parameters[rank];
    const std::vector<float>& actual = pssync.final_parameters[rank];
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) {
      ASSERT_NEAR(actual[i], expected[i], 2e-5 * (1 + std::fabs(expected[i]))) << "rank " << rank << " element " << i;
      largest = std::max(largest, std::fabs(double(actual[i]) - expected[i]));
    }
    EXPECT_TRUE(bit_identical(actual, pssync.final_parameters[0])) << "replicas diverged at rank " << rank;
  }
  if (workers == 2) {
    EXPECT_TRUE(bit_identical(pssync.final_parameters[0], dsync.final_parameters[0]));
  }
  // The runs moved the weights (so the comparison is not vacuous).
  const std::vector<float> initial = [&] {
    auto model = resegmented_softmax_factory(pieces)(11);
    auto p = model->parameters();
    return std::vector<float>(p.begin(), p.end());
  }();
  double moved = 0;
  for (std::size_t i = 0; i < initial.size(); ++i) {
    moved = std::max(moved, std::fabs(double(pssync.final_parameters[0][i]) - initial[i]));
  }
  EXPECT_GT(moved, 1e-2);
  EXPECT_LT(largest, 2e-5);
  std::printf("[ pssync ] %d workers, %d servers: largest |pssync - dsync| = %.3g\n", workers, servers, largest);
}

TEST(PsSync, MatchesDSyncOneServer) { expect_close_to_dsync(4, 1, 1); }
TEST(PsSync, MatchesDSyncTwoWorkersBitForBit) { expect_close_to_dsync(2, 1, 1); }
TEST(PsSync, MatchesDSyncThreeServers) { expect_close_to_dsync(4, 3, 4); }
TEST(PsSync, MatchesDSyncThreeWorkersTwoServers) { expect_close_to_dsync(3, 2, 1); }

TEST(PsSync, DefaultsToOneServer) {
  const TrainConfig config = tiny_config("pssync", 2);
  EXPECT_EQ(server_ranks(config), 1);
  const RunSummary summary = run_training(config, softmax_factory(), small_data());
  EXPECT_EQ(summary.setup.servers, 1);
  EXPECT_EQ(summary.setup.allreduce, "none (parameter server)");
  EXPECT_EQ(summary.setup.segmenting, "none (parameter server)");
  EXPECT_EQ(summary.timing.link_model_comm, 0);  // the ring's Eq. 5 says nothing about a server
}

// One worker: each push is applied at once (with scale 1, the default, which 1/M equals here) and pulled back before the next
// iteration, which is sequential SGD, i.e. D-Sync on one worker (whose allreduce is the identity).
TEST(Asgd, OneWorkerEqualsSequentialSgdBitForBit) {
  const DataSplits data = small_data();
  const RunSummary sgd = run_training(tiny_config("dsync", 1), softmax_factory(), data);
  for (int servers : {1, 2}) {
    const RunSummary asgd = run_training(tiny_config("asgd", 1, servers), softmax_factory(), data);
    EXPECT_TRUE(bit_identical(asgd.final_parameters[0], sgd.final_parameters[0])) << servers << " servers";
    // DC-ASGD too: with one worker every push was computed on the weights it is applied to, so the
    // compensation term is lambda g^2 * 0 = 0 exactly.
    for (const char* variant : {"c", "a"}) {
      const TrainConfig config = tiny_config("dcasgd", 1, servers, {{"--dc-variant", variant}});
      const RunSummary dcasgd = run_training(config, softmax_factory(), data);
      EXPECT_TRUE(bit_identical(dcasgd.final_parameters[0], sgd.final_parameters[0]))
          << "dcasgd-" << variant << ", " << servers << " servers";
    }
  }
  // The comparison is not vacuous: the weights moved.
  auto initial = softmax_factory()(11);
  double moved = 0;
  for (std::size_t i = 0; i < sgd.final_parameters[0].size(); ++i) {
    moved = std::max(moved, std::fabs(double(sgd.final_parameters[0][i]) - initial->parameters()[i]));
  }
  EXPECT_GT(moved, 1e-2);
}

TEST(Asgd, SeveralWorkersTrain) {
  TrainConfig config = tiny_config("asgd", 3, 2);
  config.iterations = 40;
  const DataSplits data = small_data();
  const RunSummary summary = run_training(config, softmax_factory(), data);
  ASSERT_EQ(summary.final_parameters.size(), 3u);
  for (const auto& parameters : summary.final_parameters) {
    for (float w : parameters) ASSERT_TRUE(std::isfinite(w));
  }
  ASSERT_EQ(summary.epochs.size(), 1u);
  EXPECT_GT(summary.epochs[0].train_loss, 0);
  EXPECT_EQ(async_gradient_scale(AsyncScale::kOne, 4), 1.0f);
  EXPECT_EQ(async_gradient_scale(AsyncScale::kInverseWorkers, 4), 0.25f);
}

// The asynchronous servers' scale of each push as the registry configures them (the descriptor's
// `serve`): --async-scale 1, the default (MXNet's dist_async applies every push with the worker's
// own rescale 1/batch, no factor of the worker count), or 1/M. Two workers each push one gradient
// to the server(s); layout of 3 weights, w0 = {1, -2, 0.5}, lr 0.5, no momentum. Dyadic values,
// so every step is exact and the order of arrival does not change the result:
//   g0 = {2, 1, -4}, g1 = {1, -3, 2}, g0 + g1 = {3, -2, -2}
//   scale 1:    w = w0 - 0.5 * (g0 + g1)       = {-0.5, -1, 1.5}
//   scale 1/M:  w = w0 - 0.5 * 0.5 * (g0 + g1) = {0.25, -1.5, 1}
std::vector<float> weights_after_two_pushes(const MethodSelection& method, int servers) {
  Layout layout;
  layout.add("a", 1);
  layout.add("b", 2);
  const ShardPlan plan(layout, servers);
  const std::vector<float> w0 = {1.0f, -2.0f, 0.5f};
  const std::vector<std::vector<float>> pushed = {{2.0f, 1.0f, -4.0f}, {1.0f, -3.0f, 2.0f}};
  const ServeOptions serve = method.descriptor->serve(*method.options, method.common, 2);
  std::vector<float> weights(3, 0.0f);
  run_ranks(2 + servers, [&](int rank, Transport& transport) {
    if (rank >= 2) {
      ParameterServerShard shard(transport, plan, 2, w0, method.common.optimizer.sgd);
      shard.serve(serve);
      std::copy(shard.weights().begin(), shard.weights().end(),
                weights.begin() + static_cast<std::ptrdiff_t>(shard.shard().begin));
      return;
    }
    ParameterClient client(transport, plan, 2, method.common.timeout);
    client.push(pushed[static_cast<std::size_t>(rank)], 0, 0).wait(method.common.timeout);
    client.close();
  });
  return weights;
}

TEST(AsynchronousServers, ScaleEachPushByOneByDefaultOrOneOverM) {
  const SgdOptions sgd{0.5f, 0.0f, 0.0f};
  for (const std::string spec : {"asgd", "dcasgd"}) {
    for (int servers : {1, 2}) {
      SCOPED_TRACE(concat(spec, ", ", servers, " servers"));
      const MethodSelection by_default = select_for_test(spec, {}, sgd);
      EXPECT_EQ(by_default.descriptor->serve(*by_default.options, by_default.common, 4).async_scale, 1.0f);
      const MethodSelection one_over_m = select_for_test(spec, {{"--async-scale", "1/M"}}, sgd);
      EXPECT_EQ(one_over_m.descriptor->serve(*one_over_m.options, one_over_m.common, 4).async_scale, 0.25f);
      if (spec == "dcasgd") continue;  // its second push is compensated, which depends on the arrival order
      EXPECT_EQ(weights_after_two_pushes(by_default, servers), (std::vector<float>{-0.5f, -1.0f, 1.5f}));
      EXPECT_EQ(weights_after_two_pushes(select_for_test(spec, {{"--async-scale", "1"}}, sgd), servers),
                (std::vector<float>{-0.5f, -1.0f, 1.5f}));
      EXPECT_EQ(weights_after_two_pushes(one_over_m, servers), (std::vector<float>{0.25f, -1.5f, 1.0f}));
    }
  }
}

// The synchronous servers (pssync, odsgd's global update) sum the M gradients and step with 1/M,
// D-Sync's update: --async-scale does not apply to them.
TEST(AsynchronousServers, ScaleIsNotAnOptionOfSynchronousServers) {
  for (const std::string spec : {"pssync", "odsgd"}) {
    const MethodSelection method = select_for_test(spec);
    EXPECT_EQ(method.descriptor->serve(*method.options, method.common, 4).mode, ServerMode::kSynchronous);
    try {
      select_for_test(spec, {{"--async-scale", "1/M"}});
      ADD_FAILURE() << spec << ": expected a usage error";
    } catch (const UsageError& error) {
      EXPECT_STREQ(error.what(), concat("--async-scale applies only to asgd and dcasgd, not '", spec, "'").c_str());
    }
  }
  try {
    select_for_test("asgd", {{"--async-scale", "0.5"}});
    ADD_FAILURE() << "expected a usage error";
  } catch (const UsageError& error) {
    EXPECT_STREQ(error.what(), "--async-scale must be 1 or 1/M, got '0.5'");
  }
}

// --dc-lambda's default is the variant's (OD-SGD paper Sec. 4): 0.04 for DC-ASGD-c, 2 for DC-ASGD-a,
// on dcasgd's servers and odsgd's local updaters alike; a given --dc-lambda wins.
TEST(DelayCompensationDefaults, LambdaIsTheVariants) {
  struct Case {
    std::string spec;
    OptionValues options;
    DelayCompensationVariant variant;
    float lambda;
  };
  const std::vector<Case> cases = {
      {"dcasgd", {}, DelayCompensationVariant::kConstant, 0.04f},
      {"dcasgd", {{"--dc-variant", "c"}}, DelayCompensationVariant::kConstant, 0.04f},
      {"dcasgd", {{"--dc-variant", "a"}}, DelayCompensationVariant::kAdaptive, 2.0f},
      {"dcasgd", {{"--dc-variant", "a"}, {"--dc-lambda", "0.04"}}, DelayCompensationVariant::kAdaptive, 0.04f},
      {"dcasgd", {{"--dc-variant", "c"}, {"--dc-lambda", "2"}}, DelayCompensationVariant::kConstant, 2.0f},
      {"odsgd", {{"--local-updater", "dcasgd-c"}}, DelayCompensationVariant::kConstant, 0.04f},
      {"odsgd", {{"--local-updater", "dcasgd-a"}}, DelayCompensationVariant::kAdaptive, 2.0f},
      {"odsgd", {{"--local-updater", "dcasgd-a"}, {"--dc-lambda", "0.5"}}, DelayCompensationVariant::kAdaptive, 0.5f},
  };
  for (const Case& c : cases) {
    const MethodSelection method = select_for_test(c.spec, c.options);
    SCOPED_TRACE(concat(c.spec, " ", method.options->fingerprint()));
    const ServerUpdateSettings settings =
        c.spec == "odsgd" ? od_sgd_update_settings(options_as<OdSgdOptions>(*method.options))
                          : server_update_settings(options_as<ParameterServerOptions>(*method.options));
    ASSERT_TRUE(settings.compensation.has_value());
    EXPECT_EQ(settings.compensation->variant, c.variant);
    EXPECT_EQ(settings.compensation->lambda, c.lambda);
    EXPECT_EQ(settings.compensated_by, c.spec == "odsgd" ? "local updater" : "servers");
  }
  EXPECT_EQ(default_lambda(DelayCompensationVariant::kConstant), 0.04f);
  EXPECT_EQ(default_lambda(DelayCompensationVariant::kAdaptive), 2.0f);
}

TEST(ParameterServerMethods, UsageErrors) {
  const DataSplits data = small_data();
  try {
    run_training(tiny_config("dsync", 2, 2), softmax_factory(), data);
    ADD_FAILURE() << "expected a usage error";
  } catch (const UsageError& error) {
    EXPECT_STREQ(error.what(),
                 "--servers applies only to the parameter-server methods pssync, asgd, dcasgd and odsgd, not 'dsync'");
  }
  // More servers than the model has segments: the ShardPlan's message, before any thread starts.
  EXPECT_THROW(run_training(tiny_config("pssync", 2, 3), softmax_factory(), data), UsageError);
  EXPECT_THROW(validate_train_config(tiny_config("pssync", 2, -1)), UsageError);
  EXPECT_THROW(validate_train_config(tiny_config("pssync+int8", 2, 1)), UsageError);
  TrainConfig config = tiny_config("asgd", 2, 1);
  LocalFabric fabric(2);
  EXPECT_THROW(run_training_rank(config, softmax_factory(), data, fabric.endpoint(0)), UsageError);
}

// One rank per "process" (run_training_rank, as under MPI, here over a LocalFabric): the last S
// ranks serve, and PS-Sync's weights equal those of run_training's threads bit for bit.
TEST(PsSync, RankPerProcessEqualsThreads) {
  const DataSplits data = small_data();
  const TrainConfig config = tiny_config("pssync", 2, 1);
  const RunSummary threads = run_training(config, softmax_factory(), data);
  std::vector<RunSummary> ranks(3);
  run_ranks(3, [&](int rank, Transport& transport) {
    ranks[rank] = run_training_rank(config, softmax_factory(), data, transport);
  });
  EXPECT_EQ(ranks[0].weights_checksum, threads.weights_checksum);
  EXPECT_TRUE(bit_identical(ranks[1].final_parameters[1], threads.final_parameters[1]));
  EXPECT_EQ(ranks[2].setup.servers, 1);  // the server rank's summary
  EXPECT_EQ(ranks[0].setup.servers, 1);
}

TEST(RankSubsetTransport, ShowsTheFirstRanksOnly) {
  LocalFabric fabric(5);
  RankSubsetTransport view = first_ranks(fabric.endpoint(1), 3);
  EXPECT_EQ(view.size(), 3);
  EXPECT_EQ(view.rank(), 1);
  EXPECT_THROW(first_ranks(fabric.endpoint(3), 3), UsageError);
  EXPECT_THROW(first_ranks(fabric.endpoint(0), 6), UsageError);
}

// The servers stop at once and the worker's error is reported (failing_model.h: rank 2's replica
// throws at its 5th forward pass). The timeout is an hour: servers that waited for it instead of
// stopping would hang this test until ctest's own timeout fails it.
TEST(ParameterServerMethods, WorkerFailureStopsServersWithRootCause) {
  const DataSplits data = small_data();
  for (const std::string spec : {"pssync", "asgd", "dcasgd", "odsgd"}) {
    SCOPED_TRACE(spec);
    TrainConfig config = tiny_config(spec, 4, 2);
    set_timeout(config, std::chrono::hours(1));
    expect_failing_rank_is_the_reported_cause(config, data);
  }
}

}  // namespace
}  // namespace pipesgd
