// Session::join_mpi (include/pipesgd/session.h) under mpirun, run by ctest:
//   api_session_main train METHOD_SPEC SERVERS   every worker checks an allreduce against closed form
//                                               and trains 6 steps with METHOD_SPEC; server ranks
//                                               return from join_mpi when worker 0 shuts down.
//                                               Exit 0 only if all held.
//   api_session_main trace DIR                   (2 workers, 1 server) pssync for 6 steps with
//                                               WorldOptions::trace = DIR/trace.json; after shutdown
//                                               rank 0 checks the merged file: a process per rank
//                                               (worker 0, worker 1, server 0), each worker's
//                                               "compute" track with its 6 steps, the server's
//                                               "serve" track with pushes from both workers.
//   api_session_main fail                        (2 ranks) rank 1 calls fail(); rank 0's next allreduce
//                                               must throw PeerFailedError naming rank 1 and its
//                                               reason: it prints "rank 0 saw rank 1's failure: ..."
//                                               (ctest matches that line; ranks that fail leave MPI
//                                               unfinalised, so mpirun's exit status means nothing).
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
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

// Rank 0: DIR/trace.json as `trace` expects it (see the top).
void check_merged_trace(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), path + " was written");
  const nlohmann::json events = nlohmann::json::parse(in).at("traceEvents");
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  for (const nlohmann::json& event : events) {
    if (event.at("ph") != "M") continue;
    if (event.at("name") == "process_name") processes[event.at("pid")] = event["args"]["name"];
    if (event.at("name") == "thread_name") threads[{event.at("pid"), event.at("tid")}] = event["args"]["name"];
  }
  check(processes == std::map<int, std::string>{{0, "worker 0"}, {1, "worker 1"}, {2, "server 0"}},
        "a process per rank");
  std::map<int, std::set<std::int64_t>> steps;     // by worker
  std::set<std::int64_t> pushes_from;              // the server's pushes: their workers
  for (const nlohmann::json& event : events) {
    if (event.at("ph") != "X") continue;
    const std::string& thread = threads.at({event.at("pid"), event.at("tid")});
    const nlohmann::json& args = event.at("args");
    if (thread == "compute" && event.at("name") == "step") steps[event.at("pid")].insert(args.at("iteration").get<std::int64_t>());
    if (thread == "serve" && event.at("name") == "push") pushes_from.insert(args.at("worker").get<std::int64_t>());
  }
  const std::set<std::int64_t> six = {0, 1, 2, 3, 4, 5};
  check(steps == std::map<int, std::set<std::int64_t>>{{0, six}, {1, six}}, "each worker's 6 steps");
  check(pushes_from == std::set<std::int64_t>{0, 1}, "the server's pushes from both workers");
}

int trace(int argc, char** argv, const std::string& directory) {
  pipesgd::WorldOptions world;
  world.servers = 1;
  world.timeout = std::chrono::seconds(60);
  world.trace = directory + "/trace.json";
  std::unique_ptr<pipesgd::Session> session = pipesgd::Session::join_mpi(&argc, &argv, world);
  if (!session->is_worker()) {
    session->shutdown();
    return 0;
  }
  pipesgd::Worker& w = session->worker();
  const int rank = w.rank();
  if (rank == 0) std::filesystem::remove(world.trace);  // no other rank writes it (none fails)
  w.barrier();
  torch::set_num_threads(1);
  Net model;
  pipesgd::DistributedOptimizerOptions options;
  options.learning_rate = 0.05f;
  options.timeout = std::chrono::seconds(60);
  {
    pipesgd::DistributedOptimizer opt(w, *model, "pssync", options);
    torch::manual_seed(7 + rank);
    for (int step = 0; step < 6; ++step) {
      torch::mse_loss(model->forward(torch::rand({8, 4})), torch::rand({8, 3})).backward();
      opt.step();
    }
    opt.finish();
  }
  session->shutdown();  // rank 0 gathers every rank's events and writes the file
  if (rank == 0) {
    check_merged_trace(world.trace);
    std::printf("rank 0: the merged trace has every rank's process\n");
  }
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
    if (mode == "trace" && argc == 3) return trace(argc, argv, argv[2]);
    if (mode == "fail" && argc == 2) return fail(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "api_session_main: %s\n", error.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::fprintf(stderr, "usage: api_session_main train METHOD_SPEC SERVERS | trace DIR | fail\n");
  return 2;
}
