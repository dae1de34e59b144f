// The public API's MPI world (run_mpi), run by ctest under mpirun:
//   api_mpi_main METHOD_SPEC SERVERS
// Every worker checks an allreduce, broadcast and allgather against closed form, trains a user
// module for 6 steps with METHOD_SPEC (the last SERVERS ranks serve), and checks that the
// replicas agree (for methods whose replicas are identical). Exit status 0 only if all held.
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "pipesgd/pipesgd.h"
#include "test_support.h"

using api_mpi_test::check;
using api_mpi_test::Net;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: api_mpi_main METHOD_SPEC SERVERS\n");
    return 2;
  }
  const std::string spec = argv[1];
  pipesgd::WorldOptions world;
  world.servers = std::stoi(argv[2]);
  world.timeout = std::chrono::seconds(60);
  bool identical = false;
  for (const auto& method : pipesgd::available_methods()) {
    if (spec.rfind(method.name, 0) == 0) identical = method.replicas_identical;
  }
  try {
    pipesgd::run_mpi(&argc, &argv, world, [&](pipesgd::Worker& w) {
      torch::set_num_threads(1);
      const int m = w.size();
      check(w.is_mpi(), "is_mpi");
      torch::Tensor sum = torch::full({5}, static_cast<float>(w.rank() + 1));
      w.allreduce(sum, pipesgd::ReduceOp::kSum);
      check(torch::equal(sum, torch::full({5}, m * (m + 1) / 2.0f)), "allreduce");
      torch::Tensor value = torch::full({3}, static_cast<float>(w.rank()));
      w.broadcast(value, m - 1);
      check(torch::equal(value, torch::full({3}, static_cast<float>(m - 1))), "broadcast");
      torch::Tensor gathered = w.allgather(torch::full({1, 2}, static_cast<float>(w.rank())));
      check(gathered.size(0) == m && gathered[m - 1][1].item<float>() == m - 1, "allgather");

      torch::manual_seed(100 + w.rank());  // different starts: the optimizer broadcasts worker 0's
      Net model;
      pipesgd::DistributedOptimizerOptions options;
      options.learning_rate = 0.05f;
      options.timeout = std::chrono::seconds(60);
      pipesgd::DistributedOptimizer opt(w, model, spec, options);
      torch::manual_seed(7);
      const torch::Tensor x = torch::randn({m * 4 * 6, 4});
      const torch::Tensor y = torch::randint(0, 3, {m * 4 * 6}, torch::kInt64);
      for (int t = 0; t < 6; ++t) {
        const std::int64_t first = (t * m + w.rank()) * 4;
        torch::nn::functional::cross_entropy(model->forward(x.slice(0, first, first + 4)), y.slice(0, first, first + 4))
            .backward();
        opt.step();
      }
      opt.finish();
      torch::Tensor flat = opt.flat_parameters().clone();
      torch::Tensor all = w.allgather(flat.unsqueeze(0));
      check(torch::isfinite(all).all().item<bool>(), "finite weights");
      if (identical) check(torch::equal(all[0], all[m - 1]), "identical replicas");
      if (w.rank() == 0) std::printf("%s on %d MPI workers + %d servers: ok\n", spec.c_str(), m, w.servers());
    });
  } catch (const std::exception& error) {
    std::fprintf(stderr, "api_mpi_main: %s\n", error.what());
    return 1;
  }
  return 0;
}
