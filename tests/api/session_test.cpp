// Session::join_alone (include/pipesgd/session.h): a world of one worker for the life of an object.
// join_mpi is tested under mpirun by tests/api_mpi/api_session_main.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "pipesgd/pipesgd.h"
#include "test_modules.h"

namespace {

using pipesgd::Session;

TEST(Session, AloneIsOneWorkerWhoseCollectivesAreIdentities) {
  std::unique_ptr<Session> session = Session::join_alone();
  ASSERT_TRUE(session->is_worker());
  pipesgd::Worker& worker = session->worker();
  EXPECT_EQ(worker.rank(), 0);
  EXPECT_EQ(worker.size(), 1);
  EXPECT_EQ(worker.local_rank(), 0);
  EXPECT_FALSE(worker.is_mpi());
  torch::Tensor value = torch::tensor({1.5f, -2.0f});
  worker.allreduce(value, pipesgd::ReduceOp::kAverage);
  EXPECT_TRUE(torch::equal(value, torch::tensor({1.5f, -2.0f})));
  EXPECT_TRUE(torch::equal(worker.allgather(value), value));
}

// One worker's dsync is plain SGD: the same steps as torch::optim::SGD on the same batches.
TEST(Session, AloneTrainsLikeTorchSgd) {
  std::unique_ptr<Session> session = Session::join_alone();
  torch::manual_seed(3);
  pipesgd_test::ThreeLayerNet ours;
  pipesgd_test::ThreeLayerNet reference;
  {
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < ours->parameters().size(); ++k) reference->parameters()[k].copy_(ours->parameters()[k]);
  }
  pipesgd::DistributedOptimizerOptions options;
  options.learning_rate = 0.1f;
  pipesgd::DistributedOptimizer optimizer(session->worker(), *ours, "dsync", options);
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 4; ++step) {
    const torch::Tensor x = torch::rand({5, 4});
    const torch::Tensor y = torch::rand({5, 3});
    torch::mse_loss(ours->forward(x), y).backward();
    optimizer.step();
    sgd.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    sgd.step();
  }
  optimizer.finish();
  for (std::size_t k = 0; k < ours->parameters().size(); ++k) {
    EXPECT_TRUE(torch::allclose(ours->parameters()[k], reference->parameters()[k], 1e-5, 1e-6)) << "parameter " << k;
  }
}

TEST(Session, AloneRefusesServers) {
  pipesgd::WorldOptions options;
  options.servers = 1;
  try {
    (void)Session::join_alone(options);
    FAIL() << "expected UsageError";
  } catch (const pipesgd::UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("WorldOptions::servers must be 0, got 1"), std::string::npos) << error.what();
  }
}

TEST(Session, WorkerAfterShutdownOrFailureIsAUsageError) {
  std::unique_ptr<Session> session = Session::join_alone();
  session->shutdown();
  session->shutdown();  // idempotent
  EXPECT_FALSE(session->is_worker());
  EXPECT_THROW(session->worker(), pipesgd::UsageError);
  std::unique_ptr<Session> failed = Session::join_alone();
  failed->fail("gave up");
  EXPECT_FALSE(failed->is_worker());
  try {
    failed->worker();
    FAIL() << "expected UsageError";
  } catch (const pipesgd::UsageError& error) {
    EXPECT_STREQ(error.what(), "the session failed earlier");
  }
}

}  // namespace
