#include "pipesgd/api/server_ranks.h"

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <thread>
#include <vector>

#include "pipesgd/algo/registry.h"
#include "pipesgd/api/worker_impl.h"
#include "pipesgd/core/error.h"
#include "pipesgd/optim/lr_schedule.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/ps/shard_plan.h"

namespace pipesgd {
namespace {

enum Kind : std::uint64_t { kSetup = 1, kShutdown = 2 };
constexpr const char* kOperation = "the API's server control";

void send_to_servers(Transport& world, int workers, std::uint64_t& sequence, std::uint64_t kind,
                     const std::string& description, std::span<const float> weights, Timeout timeout) {
  const Tag tag = collective_tag(Channel::kControl, kServerSequenceBase + sequence++);
  const std::array<std::uint64_t, 2> header{kind, description.size()};
  std::vector<Request> requests;
  for (int server = workers; server < world.size(); ++server) {
    requests.push_back(world.send(server, step_tag(tag, 0, 0), std::as_bytes(std::span(header)), kOperation));
    if (kind != kSetup) continue;
    requests.push_back(world.send(server, step_tag(tag, 1, 0), std::as_bytes(std::span(description)), kOperation));
    requests.push_back(world.send(server, step_tag(tag, 2, 0), std::as_bytes(weights), kOperation));
  }
  for (Request& request : requests) request.wait(timeout);
}

// Waits for `request` with no deadline; a failed rank (or *stop) ends the wait with PeerFailedError.
void wait_idle(Request& request, const std::atomic<bool>* stop) {
  while (true) {
    try {
      request.wait(std::chrono::milliseconds(200));
      return;
    } catch (const PeerFailedError&) {
      throw;
    } catch (const CommTimeoutError&) {
      if (stop != nullptr && stop->load(std::memory_order_acquire)) {
        throw PeerFailedError("a worker failed; the parameter server stops");
      }
    }
  }
}

// Serves one DistributedOptimizer's set-up. Every wait while serving is bounded by the optimizer's own
// timeout (the description's timeout_ms, through the method's ServeOptions), the bound its workers'
// pushes and pulls have too; the world's timeout bounds only the set-up's own messages.
void serve_setup(Transport& world, int workers, const std::string& text, std::span<const float> weights,
                 const std::atomic<bool>* stop) {
  const nlohmann::json description = nlohmann::json::parse(text);
  OptionValues flags;
  for (const auto& [flag, value] : description.at("flags").items()) flags.set(flag, value.get<std::string>());
  CommonOptions base;
  base.optimizer.sgd = SgdOptions{description.at("lr").get<float>(), description.at("momentum").get<float>(),
                                  description.at("weight_decay").get<float>()};
  base.timeout = Timeout(description.at("timeout_ms").get<std::int64_t>());
  // Worker 0 checked the schedule and its length before sending them.
  base.lr_schedule = parse_api_lr_schedule(description.at("lr_schedule").get<std::string>(),
                                           description.at("lr_warmup_iterations").get<std::int64_t>());
  // External: each push carries the workers' factor; the server's own table stays unused.
  const LrScheduleLength length{description.at("iterations_per_epoch").get<std::int64_t>(),
                                description.at("total_iterations").get<std::int64_t>(),
                                std::make_shared<ExternalLearningRates>()};
  const MethodSelection method =
      select_method(description.at("spec").get<std::string>(), flags, FlagPolicy::kReject, base);
  Layout layout;
  for (const auto& segment : description.at("segments")) {
    layout.add(segment.at("name").get<std::string>(), segment.at("count").get<std::size_t>());
  }
  PIPESGD_ASSERT(layout.total() == weights.size());
  const ShardPlan plan(layout, world.size() - workers);
  ParameterServerShard shard(world, plan, workers, weights, method.common.optimizer.sgd);
  PIPESGD_ASSERT(method.descriptor->serve);
  ServeOptions options = method.descriptor->serve(*method.options, method.common, workers);
  options.stop = stop;
  options.learning_rate_schedule = LrSchedule(method.common.lr_schedule, length);
  shard.serve(options);
}

}  // namespace

LrScheduleSpec parse_api_lr_schedule(const std::string& text, std::int64_t warmup_iterations,
                                     const LrScheduleNames& names) {
  if (text != "external") return parse_lr_schedule(text, warmup_iterations, names);
  if (warmup_iterations != 0) {
    throw UsageError(concat(names.schedule, " 'external' takes no ", names.warmup, " (the caller sets every rate), got ",
                            warmup_iterations));
  }
  LrScheduleSpec spec;
  spec.kind = LrScheduleKind::kExternal;
  return spec;
}

void send_server_setup(Transport& world, int workers, std::uint64_t& sequence, const ServerSetup& setup,
                       Timeout timeout) {
  send_to_servers(world, workers, sequence, kSetup, setup.description, setup.weights, timeout);
}

void send_server_shutdown(Transport& world, int workers, std::uint64_t& sequence, Timeout timeout) {
  send_to_servers(world, workers, sequence, kShutdown, {}, {}, timeout);
}

void run_server_rank(Transport& world, int workers, Timeout timeout, const std::atomic<bool>* stop) {
  for (std::uint64_t sequence = 0;; ++sequence) {
    const Tag tag = collective_tag(Channel::kControl, kServerSequenceBase + sequence);
    std::array<std::uint64_t, 2> header{};
    Request request = world.recv(0, step_tag(tag, 0, 0), std::as_writable_bytes(std::span(header)), kOperation);
    wait_idle(request, stop);
    if (header[0] == kShutdown) return;
    PIPESGD_ASSERT(header[0] == kSetup);
    std::string description(header[1], '\0');
    world.recv(0, step_tag(tag, 1, 0), std::as_writable_bytes(std::span(description)), kOperation).wait(timeout);
    const nlohmann::json parsed = nlohmann::json::parse(description);
    std::vector<float> weights(parsed.at("total").get<std::size_t>());
    world.recv(0, step_tag(tag, 2, 0), std::as_writable_bytes(std::span(weights)), kOperation).wait(timeout);
    serve_setup(world, workers, description, weights, stop);
  }
}

}  // namespace pipesgd
