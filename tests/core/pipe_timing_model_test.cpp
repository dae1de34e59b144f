// Pipe-SGD's timing models (timing/pipe_timing_model.h, Pipe-SGD paper Eq. 5-7) against the formulas
// worked by hand with concrete numbers, their limits (L = 1 is Eq. 5; SE = 1 when compute-bound), and
// the run summary's Eq. 5 with a calibration's gamma.
#include "pipesgd/timing/pipe_timing_model.h"

#include <gtest/gtest.h>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/report/report.h"
#include "temp_dir.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

// p = 4, n = 1e6 bytes, alpha = 20 us, beta = 0.4 ns/byte, gamma = 0.25 ns/byte, S = 0.1 ms:
//   2(p-1)·α = 120 us, 2(p-1)/p·n·β = 1.5e6 · 0.4 ns = 600 us, (p-1)/p·n·γ = 0.75e6 · 0.25 ns = 187.5 us
//   Eq. 5 (L = 1): 120 + 600 + 187.5 + 100 = 1007.5 us
//   Eq. 6 (L = 5): 5·120 + 600 + 187.5 + 5·100 = 1887.5 us
constexpr RingCostParameters kLink{20e-6, 0.4e-9, 0.25e-9, 100e-6};

TEST(PipeTimingModel, Eq5AndEq6CommunicationByHand) {
  EXPECT_NEAR(ring_allreduce_time(4, 1e6, kLink), 1007.5e-6, 1e-12);
  EXPECT_NEAR(ring_allreduce_time(4, 1e6, kLink, 1), 1007.5e-6, 1e-12);
  EXPECT_NEAR(ring_allreduce_time(4, 1e6, kLink, 5), 1887.5e-6, 1e-12);
  // Eq. 6 - Eq. 5 = (L - 1)(2(p-1)·α + S): the segments' latencies and synchronisations only.
  EXPECT_NEAR(ring_allreduce_time(4, 1e6, kLink, 5) - ring_allreduce_time(4, 1e6, kLink), 4 * (120e-6 + 100e-6), 1e-12);
  EXPECT_EQ(ring_allreduce_time(1, 1e6, kLink, 5), 0.0);  // one worker communicates nothing
}

TEST(PipeTimingModel, GammaAddsExactlyItsTerm) {
  RingCostParameters without = kLink;
  without.gamma = 0;
  for (int p : {2, 3, 4, 7}) {
    for (int L : {1, 3}) {
      const double n = 31400;
      const double term = (p - 1.0) / p * n * kLink.gamma;  // (p-1)/p·n·γ
      EXPECT_NEAR(ring_allreduce_time(p, n, kLink, L) - ring_allreduce_time(p, n, without, L), term, 1e-18)
          << p << " workers, L = " << L;
    }
  }
}

// Compute-bound: up 1 ms + forward 2 ms + backward 3 ms = 6 ms against 1.0075 ms (Eq. 5) and
// 1.8875 ms (Eq. 6, L = 5): Eq. 5 = 6 ms; Eq. 6 with l_b = 0.5 ms: max(6 - 3 + 0.5, 1.8875) = 3.5 ms.
// Communication-bound: up 0.1 + forward 0.4 + backward 0.5 = 1 ms: Eq. 5 = 1.0075 ms; Eq. 6 with
// l_b = 0.1 ms: max(0.6, 1.8875) = 1.8875 ms, more than Eq. 5, as the paper concludes (Sec. 3.1).
TEST(PipeTimingModel, Eq5AndEq6IterationByHand) {
  const double eq5 = ring_allreduce_time(4, 1e6, kLink), eq6 = ring_allreduce_time(4, 1e6, kLink, 5);
  EXPECT_NEAR(predict_pipe_sequential_iteration(6e-3, eq5), 6e-3, 1e-15);
  EXPECT_NEAR(predict_pipe_pipelined_iteration(6e-3, 3e-3, 0.5e-3, eq6), 3.5e-3, 1e-15);
  EXPECT_NEAR(predict_pipe_sequential_iteration(1e-3, eq5), 1007.5e-6, 1e-15);
  EXPECT_NEAR(predict_pipe_pipelined_iteration(1e-3, 0.5e-3, 0.1e-3, eq6), 1887.5e-6, 1e-15);
  EXPECT_GT(predict_pipe_pipelined_iteration(1e-3, 0.5e-3, 0.1e-3, eq6), predict_pipe_sequential_iteration(1e-3, eq5));
}

// L = 1 with the one segment's backward l_b = l_back is Eq. 5.
TEST(PipeTimingModel, Eq6WithOneSegmentIsEq5) {
  for (double compute : {0.5e-3, 1e-3, 6e-3}) {
    for (int p : {2, 4, 8}) {
      const double backward = compute / 2;
      EXPECT_EQ(predict_pipe_pipelined_iteration(compute, backward, backward, ring_allreduce_time(p, 1e6, kLink, 1)),
                predict_pipe_sequential_iteration(compute, ring_allreduce_time(p, 1e6, kLink)))
          << compute << " s compute, " << p << " workers";
    }
  }
}

// Eq. 7: SE = compute / max(compute, comm): 1 when compute-bound, compute / comm otherwise; it is
// also the single-worker iteration over Eq. 4's (l_up + l_comp of a worker = a single node's).
TEST(PipeTimingModel, Eq7ScalingEfficiency) {
  EXPECT_EQ(pipe_scaling_efficiency(6e-3, 3e-3), 1.0);
  EXPECT_EQ(pipe_scaling_efficiency(3e-3, 3e-3), 1.0);
  EXPECT_DOUBLE_EQ(pipe_scaling_efficiency(3e-3, 4e-3), 0.75);
  EXPECT_EQ(pipe_scaling_efficiency(0, 0), 0.0);
  StageTimes stages;
  stages.update = 1e-3;
  stages.forward = 1e-3;
  stages.backward = 1e-3;
  stages.comm = 5e-3;
  EXPECT_DOUBLE_EQ(pipe_scaling_efficiency(stages.compute(), stages.comm), stages.compute() / predict_pipe_iteration(stages));
  EXPECT_DOUBLE_EQ(pipe_scaling_efficiency(stages.compute(), stages.comm), 0.6);
}

// The run summary's Eq. 5: the calibration's alpha, beta and gamma without an emulated network; the
// emulated network's alpha and beta with the calibration's gamma; gamma = 0 without a calibration.
// Softmax model: n = 7850 fp32 = 31400 bytes, p = 3 workers.
TEST(PipeTimingModel, RunSummaryEq5UsesTheCalibrationsGamma) {
  TempDir dir;
  Calibration calibration;
  calibration.transport = "local";
  calibration.world_size = 3;
  calibration.link = {1e-5, 1e-9, 2e-9};
  save_calibration(calibration, dir.file("calibration.json"));
  const double n = 31400, p = 3;
  const DataSplits data = small_data();
  ASSERT_EQ(static_cast<double>(softmax_factory()(1)->parameters().size() * sizeof(float)), n);

  TrainConfig calibrated = tiny_config("pipe", 3, 0, {{"--allreduce", "auto"}, {"--calibration", dir.file("calibration.json")}});
  calibrated.iterations = 6;
  const RunSummary a = run_training(calibrated, softmax_factory(), data);
  EXPECT_EQ(a.timing.link_model.alpha, 1e-5);
  EXPECT_EQ(a.timing.link_model.beta, 1e-9);
  EXPECT_EQ(a.timing.link_model.gamma, 2e-9);
  EXPECT_NEAR(a.timing.link_model_comm, 2 * (p - 1) * 1e-5 + 2 * (p - 1) / p * n * 1e-9 + (p - 1) / p * n * 2e-9, 1e-15);
  EXPECT_EQ(a.timing.predicted_pipe_sequential_iteration, std::max(a.timing.stages.compute(), a.timing.link_model_comm));
  EXPECT_EQ(summary_to_json(a)["link_model_gamma_s_per_byte"], 2e-9);

  // Emulated link: 10 Gbit/s (0.8 ns/byte), 5 us; with and without the calibration: the difference is
  // exactly Eq. 5's gamma term (p-1)/p·n·γ.
  TrainConfig emulated = tiny_config("pipe", 3);
  emulated.iterations = 6;
  emulated.network = parse_network_spec("bw=10Gbit,lat=5us", "--net");
  const RunSummary b = run_training(emulated, softmax_factory(), data);
  calibrated.network = emulated.network;
  const RunSummary c = run_training(calibrated, softmax_factory(), data);
  EXPECT_EQ(b.timing.link_model.gamma, 0.0);
  EXPECT_NEAR(b.timing.link_model_comm, 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * n * 0.8e-9, 1e-15);
  EXPECT_EQ(c.timing.link_model.alpha, b.timing.link_model.alpha);
  EXPECT_EQ(c.timing.link_model.beta, b.timing.link_model.beta);
  EXPECT_NEAR(c.timing.link_model_comm - b.timing.link_model_comm, (p - 1) / p * n * 2e-9, 1e-15);

  // No network model and no calibration: no Eq. 5 (the run has no link to model).
  TrainConfig plain = tiny_config("pipe", 3);
  plain.iterations = 6;
  const RunSummary d = run_training(plain, softmax_factory(), data);
  EXPECT_EQ(d.timing.link_model_comm, 0.0);
  EXPECT_TRUE(d.timing.link_model_source.empty());
  EXPECT_GT(d.timing.scaling_efficiency, 0.0);
  EXPECT_LE(d.timing.scaling_efficiency, 1.0);
  EXPECT_EQ(d.timing.scaling_efficiency, pipe_scaling_efficiency(d.timing.stages.compute(), d.timing.stages.comm));
}

}  // namespace
}  // namespace pipesgd
