// Session::join_mpi (include/pipesgd/session.h) under mpirun, run by ctest:
//   api_session_main train METHOD_SPEC SERVERS   every worker checks an allreduce against closed form
//                                               and trains 6 steps with METHOD_SPEC; server ranks
//                                               return from join_mpi when worker 0 shuts down.
//                                               Exit 0 only if all held.
//   api_session_main fail                        (2 ranks) rank 1 calls fail(); rank 0's next allreduce
//                                               must throw PeerFailedError naming rank 1 and its
//                                               reason: it prints "rank 0 saw rank 1's failure: ..."
//                                               (ctest matches that line; ranks that fail leave MPI
//                                               unfinalised, so mpirun's exit status means nothing).
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>

#include "pipesgd/pipesgd.h"
#include "test_support.h"

namespace {

using api_mpi_test::check;
using api_mpi_test::Net;

int train(int argc, char** argv, const std::string& spec, int servers) {
  pipesgd::WorldOptions world;
  world.servers = servers;
  world.timeout = std::chrono::seconds(60);
  std::unique_ptr<pipesgd::Session> session = pipesgd::Session::join_mpi(&argc, &argv, world);
  if (!session->is_worker()) {
    try {
      session->worker();
      check(false, "worker() on a server rank throws");
    } catch (const pipesgd::UsageError&) {
    }
    session->shutdown();
    return 0;
  }
  pipesgd::Worker& w = session->worker();
  torch::set_num_threads(1);
  const int m = w.size();
  check(w.is_mpi() && w.servers() == servers, "is_mpi, servers");
  torch::Tensor sum = torch::full({5}, static_cast<float>(w.rank() + 1));
  w.allreduce(sum, pipesgd::ReduceOp::kSum);
  check(torch::equal(sum, torch::full({5}, m * (m + 1) / 2.0f)), "allreduce");
  torch::manual_seed(100 + w.rank());  // different starts: the optimizer broadcasts worker 0's
  Net model;
  pipesgd::DistributedOptimizerOptions options;
  options.learning_rate = 0.05f;
  options.timeout = std::chrono::seconds(60);
  {
    pipesgd::DistributedOptimizer opt(w, *model, spec, options);
    torch::manual_seed(7 + w.rank());
    for (int step = 0; step < 6; ++step) {
      const torch::Tensor x = torch::rand({8, 4});
      const torch::Tensor y = torch::rand({8, 3});
      torch::mse_loss(model->forward(x), y).backward();
      opt.step();
    }
    opt.finish();
  }
  for (const torch::Tensor& parameter : model->parameters()) check(parameter.isfinite().all().item<bool>(), "finite weights");
  const int rank = w.rank();
  session->shutdown();  // `w` is gone from here on
  std::printf("rank %d: %s trained 6 steps\n", rank, spec.c_str());
  return 0;
}

int fail(int argc, char** argv) {
  pipesgd::WorldOptions world;
  world.timeout = std::chrono::seconds(60);
  std::unique_ptr<pipesgd::Session> session = pipesgd::Session::join_mpi(&argc, &argv, world);
  pipesgd::Worker& w = session->worker();
  if (w.rank() == 1) {
    session->fail("rank 1 gave up on purpose");
    return 0;
  }
  torch::Tensor value = torch::ones({3});
  try {
    w.allreduce(value, pipesgd::ReduceOp::kSum);
  } catch (const pipesgd::PeerFailedError& error) {
    const std::string message = error.what();
    if (message.find("rank 1") != std::string::npos && message.find("gave up on purpose") != std::string::npos) {
      std::printf("rank 0 saw rank 1's failure: %s\n", message.c_str());
    }
    session->fail("a peer failed");
    return 0;
  }
  session->fail("no failure seen");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc >= 2 ? argv[1] : "";
  try {
    if (mode == "train" && argc == 4) return train(argc, argv, argv[2], std::stoi(argv[3]));
    if (mode == "fail" && argc == 2) return fail(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "api_session_main: %s\n", error.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::fprintf(stderr, "usage: api_session_main train METHOD_SPEC SERVERS | fail\n");
  return 2;
}
