#include "pipesgd/algo/ps_methods/ps_simulation.h"

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/ps_methods/ps_methods.h"
#include "pipesgd/ps/shard_plan.h"

namespace pipesgd {
namespace {

std::size_t push_bytes(std::size_t shard) { return kPsRequestHeaderBytes + 4 * shard; }
std::size_t reply_bytes(std::size_t shard) { return kPsReplyHeaderBytes + 4 * shard; }

class SimulatedParameterServer final : public SimulatedMethod {
 public:
  explicit SimulatedParameterServer(const SimulationContext& context)
      : options_(options_as<ParameterServerOptions>(context.options)),
        shards_(simulated_shard_sizes(context.profile, options_.server_count)), profile_(context.profile) {}

  void end_iteration(std::int64_t, SimulatedThread& compute) override { simulate_push_and_pull(shards_, compute); }

  int servers() const override { return options_.server_count; }

  void run_server(int server, std::int64_t iterations, SimulatedServer& thread) override {
    const std::size_t shard = shards_[static_cast<std::size_t>(server)];
    const double update = profile_.update_seconds_of(shard);
    if (options_.mode == ServerMode::kSynchronous) {
      simulate_synchronous_server(shard, update, iterations, thread);
      return;
    }
    // Asynchronous: each push applied as it arrives (DC-ASGD compensates it first), each pull
    // answered with the latest weights.
    const double compensation = options_.delay_compensation ? update : 0;
    for (std::int64_t requests = 2 * iterations * thread.workers(); requests > 0; --requests) {
      const ServerRequest request = thread.receive();
      if (request.kind == ServerRequestKind::kPush) {
        thread.compute(compensation, "compensation");
        thread.compute(update, "update");
      } else {
        thread.reply(request.worker, reply_bytes(shard));
      }
    }
  }

  std::string describe() const override {
    return concat(options_.server_count, options_.server_count == 1 ? " server, " : " servers, ",
                  options_.mode == ServerMode::kSynchronous ? "synchronous" : "asynchronous");
  }

 private:
  const ParameterServerOptions& options_;
  std::vector<std::size_t> shards_;
  const ModelProfile& profile_;
};

}  // namespace

std::vector<std::size_t> simulated_shard_sizes(const ModelProfile& profile, int servers) {
  const ShardPlan plan(profile_layout(profile), servers);
  std::vector<std::size_t> sizes;
  for (const Shard& shard : plan.shards()) sizes.push_back(shard.count());
  return sizes;
}

void simulate_push_and_pull(const std::vector<std::size_t>& shards, SimulatedThread& thread) {
  for (std::size_t s = 0; s < shards.size(); ++s) {
    thread.send_to_server(static_cast<int>(s), push_bytes(shards[s]), ServerRequestKind::kPush);
  }
  for (std::size_t s = 0; s < shards.size(); ++s) {
    thread.send_to_server(static_cast<int>(s), kPsRequestHeaderBytes, ServerRequestKind::kPull);
  }
  for (std::size_t s = 0; s < shards.size(); ++s) thread.receive_reply(static_cast<int>(s));
}

void simulate_synchronous_server(std::size_t shard, double update_seconds, std::int64_t iterations,
                                 SimulatedServer& server) {
  const int workers = server.workers();
  std::vector<int> waiting_pulls;
  for (std::int64_t t = 0; t < iterations; ++t) {
    int pushes = 0;
    waiting_pulls.clear();
    while (pushes < workers) {  // a worker pulls right after it pushes: pulls may come first
      const ServerRequest request = server.receive();
      if (request.kind == ServerRequestKind::kPush) ++pushes;
      else waiting_pulls.push_back(request.worker);
    }
    server.compute(update_seconds, "update");
    for (int worker : waiting_pulls) server.reply(worker, reply_bytes(shard));
    for (auto answered = static_cast<int>(waiting_pulls.size()); answered < workers; ++answered) {
      server.reply(server.receive().worker, reply_bytes(shard));
    }
  }
}

std::unique_ptr<SimulatedMethod> simulate_parameter_server(const SimulationContext& context) {
  return std::make_unique<SimulatedParameterServer>(context);
}

}  // namespace pipesgd
