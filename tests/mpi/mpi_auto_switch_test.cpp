// `--algo auto`'s switches over MpiTransport (ctest runs this with 2, 3, 4 and 5 ranks): dsync ->
// pipe K=2 -> dsync, mgwfbp -> pipe K=3 -> dsync+optimal and dsync -> sapipe (k = 1) -> pipe K=2 lose
// no gradient and keep the momentum,
// against the hand-computed phased sequence (tests/core/phase_oracle.h); every rank ends
// bit-identical.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "../core/phase_oracle.h"
#include "mpi_test_world.h"
#include "pipesgd/algo/auto/auto_method.h"

namespace pipesgd {
namespace {

struct MpiSwitchCase {
  std::string name;
  std::vector<ScheduledMethod> schedule;
  std::vector<OraclePhase> phases;
};

class MpiAutoSwitch : public ::testing::TestWithParam<MpiSwitchCase> {};

TEST_P(MpiAutoSwitch, LosesNoGradientAndKeepsTheMomentum) {
  const MpiSwitchCase& c = GetParam();
  MpiTransport& transport = *test_mpi_transport;
  const int ranks = transport.size(), rank = transport.rank();
  const std::int64_t iterations = 16;
  const SgdOptions sgd{0.3f, 0.9f, 0.01f};
  CommonOptions base;
  base.optimizer.sgd = sgd;
  base.timeout = std::chrono::seconds(60);
  MethodSelection selection = select_method("auto", {}, FlagPolicy::kReject, base);
  auto options = std::make_shared<AutoOptions>(options_as<AutoOptions>(*selection.options));
  options->schedule = c.schedule;
  selection.options = options;

  const SoftmaxBatches data = make_softmax_batches(99, ranks, iterations, kFeatures, kClasses, kBatch);
  SoftmaxRegression model(kFeatures, kClasses, kSeed);
  auto method = make_method(selection, transport, model, 0);
  for (std::int64_t t = 0; t < iterations; ++t) {
    IterationTimes times;
    const std::span<float> gradients = method->begin_iteration(t, times);
    const SegmentReadyFn* ready = method->segment_ready();
    model.forward_backward(data.at(rank, t, ranks), gradients, ready != nullptr ? *ready : SegmentReadyFn{});
    method->end_iteration(t, times);
  }
  IterationTimes times;
  method->finish(times);
  method.reset();

  const OracleRun expected = phased_sgd(sgd, c.phases, ranks, iterations, data, kFeatures, kClasses, kSeed);
  const std::span<const float> weights = model.parameters();
  // EXPECT, never ASSERT, before the collective below: every rank must reach it (mpi_test_main.cpp).
  for (std::size_t i = 0; i < weights.size(); ++i) {
    EXPECT_NEAR(weights[i], expected.final_weights[i], 2e-5 * (1 + std::fabs(expected.final_weights[i])))
        << "element " << i << " on rank " << rank;
  }
  std::vector<float> rank0(weights.begin(), weights.end());
  MPI_Bcast(rank0.data(), static_cast<int>(rank0.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(std::equal(rank0.begin(), rank0.end(), weights.begin())) << "rank " << rank << " differs from rank 0";
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, MpiAutoSwitch,
    ::testing::Values(
        MpiSwitchCase{"dsync_pipe2_dsync",
                      {{0, "dsync", {}}, {5, "pipe", {{"--staleness-k", "2"}}}, {11, "dsync", {}}},
                      {{0, 1}, {5, 2}, {11, 1}}},
        MpiSwitchCase{"mgwfbp_pipe3_optimal",
                      {{0, "mgwfbp", {}}, {4, "pipe", {{"--staleness-k", "3"}}}, {12, "dsync+optimal", {}}},
                      {{0, 1}, {4, 3}, {12, 1}}},
        // SAPipe with the weight matrix (18 elements) stale, the bias synchronous.
        MpiSwitchCase{"dsync_sapipe_pipe2",
                      {{0, "dsync", {}},
                       {4, "sapipe", {{"--stale-layers", "1"}, {"--buckets", "wfbp"}, {"--compensation", "none"}}},
                       {10, "pipe", {{"--staleness-k", "2"}}}},
                      {{0, 1}, {4, 2, kClasses * kFeatures}, {10, 2}}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pipesgd
