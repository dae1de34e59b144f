#include "pipesgd/sim/method_simulation.h"

#include <simgrid/Exception.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <span>
#include <vector>

#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/sim/collective_rounds.h"
#include "pipesgd/sim/isolated_run.h"
#include "pipesgd/sim/sim_transport.h"
#include "pipesgd/sim/timed_codec.h"

namespace pipesgd {
namespace sg4 = simgrid::s4u;

CollectiveSimulation parse_collective_simulation(const std::string& text, const char* name) {
  if (text == "auto") return CollectiveSimulation::kAuto;
  if (text == "messages") return CollectiveSimulation::kMessages;
  if (text == "model") return CollectiveSimulation::kModel;
  throw UsageError(concat(name, " '", text, "': expected auto, messages or model"));
}

const char* collective_simulation_name(CollectiveSimulation mode) {
  switch (mode) {
    case CollectiveSimulation::kAuto: return "auto";
    case CollectiveSimulation::kMessages: return "messages";
    case CollectiveSimulation::kModel: return "model";
  }
  return "?";
}

double message_level_cost(int workers, std::size_t parameters, std::size_t layers, std::int64_t iterations) {
  if (workers <= 1) return 0;  // no collective to simulate
  const double n = workers, per_iteration = n * static_cast<double>(parameters) +
                                           kElementsPerMessage * n * 2 * (n - 1) * static_cast<double>(std::max<std::size_t>(1, layers));
  return per_iteration * static_cast<double>(std::max<std::int64_t>(0, iterations));
}

CollectiveLevel choose_collective_level(CollectiveSimulation requested, int workers, std::size_t parameters,
                                        std::size_t layers, std::int64_t iterations) {
  switch (requested) {
    case CollectiveSimulation::kMessages: return {true, "--collectives messages"};
    case CollectiveSimulation::kModel: return {false, "--collectives model"};
    case CollectiveSimulation::kAuto: break;
  }
  if (workers > kMessageLevelWorkers) return {false, concat("auto: modelled above ", kMessageLevelWorkers, " workers")};
  const double cost = message_level_cost(workers, parameters, layers, iterations);
  if (cost > kMessageLevelBudget) {
    return {false, concat("auto: message level would cost ", format_number("%.2g", cost), " element operations (", workers,
                          " workers x ", parameters, " parameters x ", iterations, " iterations), over its budget of ",
                          format_number("%.0g", kMessageLevelBudget), "; --collectives messages forces it")};
  }
  return {true, concat("auto: message level, ", format_number("%.2g", cost), " element operations within its budget of ",
                       format_number("%.0g", kMessageLevelBudget))};
}

namespace {

// u in [0, 1) from (seed, worker, iteration): splitmix64.
double uniform(std::uint64_t seed, int worker, std::int64_t iteration) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (static_cast<std::uint64_t>(worker) * 1000003ULL +
                                                   static_cast<std::uint64_t>(iteration) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// What the run's allreduces are, on the simulated network.
struct CollectivePlan {
  std::string algorithm;
  AllreduceOptions options;
  bool messages = true;
  ModelledAllreduce modelled;  // !messages: the allreduce's rounds on the simulated network
  LinkParameters link;         // for the method's planning
};

// The simulation inside the child process. Actors run one at a time: no locks beyond SimGrid's.
class Simulation {
 public:
  Simulation(const MethodSelection& selection, const ModelProfile& profile, const MethodSimulationOptions& options,
             const CollectivePlan& collectives, std::int64_t warmup_iterations, std::int64_t skip)
      : selection_(selection), profile_(profile), options_(options), collectives_(collectives),
        warmup_iterations_(warmup_iterations), skip_(skip), total_(skip + options.iterations),
        codec_(make_codec(selection.common.codec)),
        timed_codec_(*codec_, profile.codec_cost(selection.common.codec)),
        fabric_(options.workers), workers_(static_cast<std::size_t>(options.workers)) {}

  std::string run() {
    sg4::Engine& engine = start_simulation_engine();
    const SimulationContext context{profile_, options_.workers, selection_.common, *selection_.options,
                                    warmup_iterations_, planning_cost()};
    std::unique_ptr<SimulatedMethod> first = selection_.descriptor->simulate(context);  // worker 0's
    const int servers = first->servers();
    servers_ = servers;
    // Without jitter, servers or messages, every worker's timeline is the same as every other's
    // (the modelled collectives treat them alike): one worker stands for all, which keeps large
    // worlds fast. The collectives' time is still that of the whole world.
    simulated_ = !collectives_.messages && options_.compute_jitter == 0 && servers == 0 ? 1 : options_.workers;
    SimPlatformSpec platform;
    platform.hosts = simulated_ + servers;
    platform.link = options_.link;
    platform.model = options_.model;
    platform.topology = options_.topology;
    platform.cores_per_host = options_.comm_shares_core ? 1 : 2;
    const std::vector<sg4::Host*> hosts = build_platform(engine, platform);
    std::string schedule;
    for (int w = 0; w < simulated_; ++w) {
      Worker& worker = workers_[static_cast<std::size_t>(w)];
      worker.method = w == 0 ? std::move(first) : selection_.descriptor->simulate(context);
      if (w == 0) schedule = worker.method->describe();
      sg4::Host* host = hosts[static_cast<std::size_t>(w)];
      sg4::ActorPtr compute = sg4::Actor::create(concat("worker", w, "-compute"), host, [this, w] { guarded(w, [&] { run_compute(w); }); });
      fabric_.set_receiver(w, compute.get());
      if (worker.method->has_comm_thread()) {
        // Messages to a worker land in its compute actor's mailboxes; either of its actors takes them.
        sg4::Actor::create(concat("worker", w, "-comm"), host, [this, w] {
          guarded(w, [&] {
            Thread thread(*this, w, /*compute=*/false);
            workers_[static_cast<std::size_t>(w)].method->run_comm_thread(total_, thread);
          });
        });
      }
    }
    for (int server = 0; server < servers; ++server) {
      server_methods_.push_back(selection_.descriptor->simulate(context));
      sg4::ActorPtr actor = sg4::Actor::create(
          concat("server", server), hosts[static_cast<std::size_t>(simulated_ + server)], [this, server] {
            guarded(simulated_ + server, [&] {
              Server thread(*this, server);
              server_methods_[static_cast<std::size_t>(server)]->run_server(server, total_, thread);
            });
          });
      request_mailbox(server)->set_receiver(actor);
    }
    for (int w = 0; w < simulated_; ++w) {
      for (int server = 0; server < servers; ++server) reply_mailbox(server, w)->set_receiver(fabric_.receiver(w));
    }
    engine.run();
    if (failure_) std::rethrow_exception(failure_);
    return summarize(schedule).dump();
  }

 private:
  struct Worker {
    std::unique_ptr<SimulatedMethod> method;
    std::set<SimEvent> signalled;
    sg4::MutexPtr mutex = sg4::Mutex::create();
    sg4::ConditionVariablePtr changed = sg4::ConditionVariable::create();
    std::uint64_t next_collective = 0;
    std::unique_ptr<Allreduce> allreduce[2];  // [compute thread, comm thread], built on first use
    std::vector<float> data[2];
    std::int64_t iteration = 0;  // the compute thread's current iteration
    std::vector<double> starts;  // of the measured iterations, then the end of the last
    std::map<std::int64_t, double> comm_done;  // iteration -> the comm thread's last signal of it
    double compute_seconds = 0;    // in the window
    std::vector<std::pair<double, double>> communication_calls;  // [start, end] of each, for the window's share
    SimulatedStages stages;        // the compute thread's, in the window (wait: filled at the end)
  };

  class Thread final : public SimulatedThread {
   public:
    Thread(Simulation& simulation, int worker, bool compute) : simulation_(simulation), worker_(worker), compute_(compute) {}
    ~Thread() override = default;
    int worker() const override { return worker_; }
    int workers() const override { return simulation_.options_.workers; }
    void compute(double seconds, const char* what) override {
      if (seconds <= 0) return;
      Worker& state = simulation_.worker(worker_);
      if (compute_) {
        const double jitter = simulation_.options_.compute_jitter;
        if (jitter > 0) seconds *= 1 + jitter * uniform(simulation_.options_.seed, worker_, state.iteration);
        if (simulation_.in_window(state)) {
          state.compute_seconds += seconds;
          stage(state.stages, what) += seconds;
        }
      }
      if (simulation_.tracing()) {  // every span on its own, to be seen in the trace
        flush();
        const double start = sg4::Engine::get_clock();
        simulate_cpu_work(seconds);
        simulation_.span(pid(), tid(), what, start, {});
        return;
      }
      pending_ += seconds;
    }
    void signal(const SimEvent& event) override {
      flush();
      Worker& state = simulation_.worker(worker_);
      if (!compute_) state.comm_done[event.iteration] = sg4::Engine::get_clock();
      std::unique_lock lock(*state.mutex);
      state.signalled.insert(event);
      state.changed->notify_all();
    }
    void wait(const SimEvent& event) override {
      flush();
      Worker& state = simulation_.worker(worker_);
      std::unique_lock lock(*state.mutex);
      const double start = sg4::Engine::get_clock();
      while (state.signalled.count(event) == 0) state.changed->wait(lock);
      if (simulation_.tracing() && sg4::Engine::get_clock() > start) {
        simulation_.span(pid(), tid(), "wait", start, {{"for_iteration", event.iteration}, {"kind", event.kind}, {"index", event.index}});
      }
    }
    void allreduce(std::size_t elements) override {
      flush();
      const double start = sg4::Engine::get_clock();
      const std::uint64_t sequence = simulation_.allreduce(worker_, compute_ ? 0 : 1, elements);
      if (simulation_.tracing()) {
        simulation_.span(pid(), tid(), "allreduce", start,
                         {{"elements", elements}, {"bytes", simulation_.codec_->encoded_bytes(elements)},
                          {"algorithm", simulation_.collectives_.algorithm}, {"codec", simulation_.selection_.common.codec},
                          {"tag", describe_tag(collective_tag(Channel::kGradients, sequence))}});
      }
    }
    void send_to_server(int server, std::size_t bytes, ServerRequestKind kind) override {
      flush();
      // The server deletes the request when it takes it.
      simulation_.request_mailbox(server)->put_init(new ServerRequest{worker_, kind}, bytes)->detach();
    }
    void receive_reply(int server) override {
      flush();
      Worker& state = simulation_.worker(worker_);
      const double start = sg4::Engine::get_clock();
      delete simulation_.reply_mailbox(server, worker_)->get<int>();
      state.communication_calls.emplace_back(start, sg4::Engine::get_clock());
      if (simulation_.tracing()) simulation_.span(pid(), tid(), "pull", start, {{"server", server}});
    }
    // Executes the compute accumulated since the last synchronisation: consecutive spans cost one
    // SimGrid activity, which keeps large worlds fast.
    void flush() {
      if (pending_ > 0) simulate_cpu_work(pending_);
      pending_ = 0;
    }

   private:
    int pid() const { return worker_; }
    int tid() const { return compute_ ? 0 : 1; }

    Simulation& simulation_;
    int worker_;
    bool compute_;
    double pending_ = 0;
  };

  class Server final : public SimulatedServer {
   public:
    Server(Simulation& simulation, int server) : simulation_(simulation), server_(server) {}
    int server() const override { return server_; }
    int workers() const override { return simulation_.options_.workers; }
    void compute(double seconds, const char* what) override {
      const double start = sg4::Engine::get_clock();
      simulate_cpu_work(seconds);
      if (simulation_.tracing() && seconds > 0) simulation_.span(simulation_.simulated_ + server_, 0, what, start, {});
    }
    ServerRequest receive() override {
      const std::unique_ptr<ServerRequest> request(simulation_.request_mailbox(server_)->get<ServerRequest>());
      return *request;
    }
    void reply(int worker, std::size_t bytes) override {
      simulation_.reply_mailbox(server_, worker)->put_init(new int(0), bytes)->detach();  // the worker deletes it
    }

   private:
    Simulation& simulation_;
    int server_;
  };

  static sg4::Mailbox* request_mailbox(int server) { return sg4::Mailbox::by_name(concat("ps-request-", server)); }
  static sg4::Mailbox* reply_mailbox(int server, int worker) {
    return sg4::Mailbox::by_name(concat("ps-reply-", server, ">", worker));
  }

  Worker& worker(int w) { return workers_[static_cast<std::size_t>(w)]; }
  std::span<const Worker> simulated_workers() const {
    return std::span<const Worker>(workers_.data(), static_cast<std::size_t>(simulated_));
  }

  // The stage a compute span of the schedule or the trainer belongs to.
  static double& stage(SimulatedStages& stages, const char* what) {
    const std::string_view name(what);
    if (name == "data") return stages.data;
    if (name == "forward") return stages.forward;
    // A bucket's launch during backward slows backward: the run measures it there.
    if (name == "backward" || name == "bucket launch") return stages.backward;
    if (name == "compensation") return stages.compensation;
    return stages.update;  // "update", "local update"
  }
  bool in_window(const Worker& state) const { return state.iteration >= skip_; }

  template <typename Body>
  void guarded(int w, Body&& body) {
    try {
      body();
      return;
    } catch (const simgrid::ForcefulKillException&) {
      throw;  // being killed by kill_all: SimGrid's own unwinding
    } catch (...) {
      if (!failure_) failure_ = std::current_exception();
      fabric_.report_failure(w, "simulation failed");
      failed_ = true;
    }
    if (failed_) sg4::Actor::kill_all();  // the others may wait for this actor forever
  }

  // The simulated trainer's loop (train/trainer's order of calls into the method).
  void run_compute(int w) {
    Worker& state = worker(w);
    SimulatedMethod& method = *state.method;
    Thread thread(*this, w, /*compute=*/true);
    const bool hooks = method.wants_forward_hooks();
    const std::size_t layers = profile_.layers.size();
    for (std::int64_t t = 0; t < total_; ++t) {
      state.iteration = t;
      thread.flush();  // one SimGrid activity per iteration boundary: the iteration's start is exact
      if (t >= skip_) state.starts.push_back(sg4::Engine::get_clock());
      method.begin_iteration(t, thread);
      thread.compute(profile_.data_seconds, "data");
      for (std::size_t s = 0; s < layers; ++s) {
        if (hooks) method.before_forward(t, s, s + 1, thread);
        thread.compute(profile_.layers[s].forward_seconds, "forward");
      }
      for (std::size_t s = layers; s-- > 0;) {
        thread.compute(profile_.layers[s].backward_seconds, "backward");
        method.segment_ready(t, s, thread);
      }
      method.end_iteration(t, thread);
    }
    thread.flush();
    state.starts.push_back(sg4::Engine::get_clock());
  }

  // Returns the collective's sequence number (its tag's).
  std::uint64_t allreduce(int w, int slot, std::size_t elements) {
    Worker& state = worker(w);
    const double start = sg4::Engine::get_clock();
    const std::uint64_t sequence = state.next_collective++;
    if (collectives_.messages) {
      if (!state.allreduce[slot]) {
        const std::size_t capacity = profile_.parameters();
        state.allreduce[slot] = make_allreduce(collectives_.algorithm, fabric_.endpoint(w), capacity, timed_codec_,
                                               collectives_.options);
        state.data[slot].assign(capacity, 0.0f);
      }
      state.allreduce[slot]->run(std::span<float>(state.data[slot].data(), elements),
                                 collective_tag(Channel::kGradients, sequence));
    } else {
      auto& barrier = barriers_[sequence];
      if (!barrier) barrier = sg4::Barrier::create(static_cast<unsigned>(simulated_));
      barrier->wait();
      const double seconds = modelled_seconds(elements);
      if (seconds > 0) sg4::this_actor::sleep_for(seconds);
    }
    state.communication_calls.emplace_back(start, sg4::Engine::get_clock());
    return sequence;
  }

  bool tracing() const { return options_.trace; }

  // A complete span ("ph": "X") of the Chrome trace format, from `start` to now, in microseconds.
  void span(int pid, int tid, const char* name, double start, nlohmann::json args) {
    nlohmann::json event = {{"name", name}, {"ph", "X"}, {"pid", pid}, {"tid", tid},
                            {"ts", start * 1e6}, {"dur", (sg4::Engine::get_clock() - start) * 1e6}};
    if (!args.empty()) event["args"] = std::move(args);
    trace_.push_back(std::move(event));
  }

  // The allreduce's rounds played on the simulated network (sim/collective_rounds.h) for its bytes on
  // the wire, plus the reduced fp32 bytes x (the codec's encode + decode-add + decode per byte).
  double modelled_seconds(std::size_t elements) const {
    if (options_.workers <= 1) return 0;
    const CodecCost cost = profile_.codec_cost(selection_.common.codec);
    const double wire = static_cast<double>(codec_->encoded_bytes(elements));
    const double fp32 = 4.0 * static_cast<double>(elements);
    return collectives_.modelled.seconds(wire) +
           collectives_.modelled.reduced_bytes_per_byte * fp32 * (cost.encode + cost.decode_add + cost.decode);
  }

  // a + b·M of the run's allreduce of the whole gradient: what bucket plans are computed from.
  LinearCost planning_cost() const { return allreduce_cost(collectives_.algorithm, options_.workers, collectives_.link); }

  nlohmann::json summarize(const std::string& schedule) const {
    double compute = 0, allreduce_time = 0;
    SimulatedStages stages;
    const double per_iteration = 1.0 / static_cast<double>(options_.iterations);
    for (const Worker& state : simulated_workers()) {
      stages.data += state.stages.data * per_iteration;
      stages.forward += state.stages.forward * per_iteration;
      stages.backward += state.stages.backward * per_iteration;
      stages.update += state.stages.update * per_iteration;
      stages.compensation += state.stages.compensation * per_iteration;
      compute += state.compute_seconds / static_cast<double>(options_.iterations);
      // Time in communication calls within the measured window (calls that straddle its ends count
      // their part inside: a pipeline's calls run across iteration boundaries).
      const double window_start = state.starts.front(), window_end = state.starts.back();
      double inside = 0;
      for (const auto& [start, end] : state.communication_calls) {
        inside += std::max(0.0, std::min(end, window_end) - std::max(start, window_start));
      }
      allreduce_time += inside / static_cast<double>(options_.iterations);
    }
    const double n = static_cast<double>(simulated_);
    const auto [iteration, steady] = steady_iteration();
    compute /= n;
    allreduce_time /= n;
    nlohmann::json result;
    result["schedule"] = schedule;
    result["allreduce"] = collectives_.algorithm;
    result["collectives"] = collectives_.messages ? "messages" : "model";
    result["iteration_seconds"] = iteration;
    result["compute_seconds"] = compute;
    result["exposed_seconds"] = std::max(0.0, iteration - compute);
    result["allreduce_seconds"] = allreduce_time;
    result["samples_per_second"] = iteration > 0 ? options_.workers * profile_.batch / iteration : 0.0;
    result["stages"] = {{"data_s", stages.data / n},       {"forward_s", stages.forward / n},
                        {"backward_s", stages.backward / n}, {"update_s", stages.update / n},
                        {"compensation_s", stages.compensation / n}, {"wait_s", std::max(0.0, iteration - compute)},
                        {"comm_s", allreduce_time}};
    result["measured_iterations"] = options_.iterations;
    // Periodic already: the last iteration took the window's mean (without jitter every iteration
    // of the steady state takes the same time; before it, a pipeline is still filling or draining).
    if (tracing()) {
      nlohmann::json events = trace_;
      for (int w = 0; w < simulated_ + servers_; ++w) {
        const bool server = w >= simulated_;
        events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", w},
                          {"args", {{"name", server ? concat("server ", w - simulated_) : concat("worker ", w)}}}});
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", w}, {"tid", 0},
                          {"args", {{"name", server ? "serve" : "compute"}}}});
        if (!server) {
          events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", w}, {"tid", 1}, {"args", {{"name", "comm"}}}});
        }
      }
      result["trace_events"] = std::move(events);
    }
    result["steady"] = steady;
    return result;
  }

  // The iteration time of the measured window, averaged over the workers, and whether the window is
  // in the steady state: at least its second half repeats with some period q <= 8 (pipelines can
  // settle into a cycle of a few iterations; a pipeline still filling does not repeat). The mean is
  // then taken over whole periods of that periodic end, which is exact. With jitter nothing repeats:
  // the whole window's mean.
  std::pair<double, bool> steady_iteration() const {
    const std::size_t n = static_cast<std::size_t>(options_.iterations);
    // Per measured iteration, averaged over the workers: its duration on the compute thread and,
    // for methods with a comm thread, how long after its start the comm thread last signalled it
    // (a pipeline still filling shows as a growing lag even while the compute thread runs freely).
    std::vector<double> durations(n, 0.0), lags(n, 0.0);
    for (const Worker& state : simulated_workers()) {
      PIPESGD_ASSERT(state.starts.size() == n + 1);
      for (std::size_t i = 0; i < n; ++i) {
        durations[i] += (state.starts[i + 1] - state.starts[i]) / simulated_;
        const auto done = state.comm_done.find(skip_ + static_cast<std::int64_t>(i));
        if (done != state.comm_done.end()) lags[i] += (done->second - state.starts[i]) / simulated_;
      }
    }
    const double mean = std::accumulate(durations.begin(), durations.end(), 0.0) / static_cast<double>(n);
    if (options_.compute_jitter > 0) return {mean, true};
    const double tolerance = 1e-9 * std::max(mean, 1e-12);
    auto same = [&](std::size_t i, std::size_t j) {
      return std::abs(durations[i] - durations[j]) <= tolerance && std::abs(lags[i] - lags[j]) <= tolerance;
    };
    for (std::size_t q = 1; q <= std::min<std::size_t>(8, n / 2); ++q) {
      // The longest suffix of the window that repeats with period q; steady if it is at least half of it.
      std::size_t begin = n;
      while (begin > q && same(begin - 1, begin - 1 - q)) --begin;
      const std::size_t periodic = n - (begin - q);  // iterations [begin - q, n)
      if (begin == n || periodic < std::max(2 * q, (n + 1) / 2)) continue;
      const std::size_t whole = periodic / q * q;
      return {std::accumulate(durations.end() - static_cast<std::ptrdiff_t>(whole), durations.end(), 0.0) /
                  static_cast<double>(whole),
              true};
    }
    return {mean, false};
  }

  const MethodSelection& selection_;
  const ModelProfile& profile_;
  const MethodSimulationOptions& options_;
  const CollectivePlan collectives_;
  const std::int64_t warmup_iterations_;
  const std::int64_t skip_;
  const std::int64_t total_;
  std::unique_ptr<Codec> codec_;
  TimedCodec timed_codec_;
  SimFabric fabric_;
  std::vector<Worker> workers_;
  std::map<std::uint64_t, sg4::BarrierPtr> barriers_;
  std::vector<std::unique_ptr<SimulatedMethod>> server_methods_;
  nlohmann::json trace_ = nlohmann::json::array();
  std::exception_ptr failure_;
  bool failed_ = false;
  int servers_ = 0;
  int simulated_ = 0;  // the workers simulated as hosts (1 stands for all when they are alike)
};

void validate(const MethodSelection& selection, const ModelProfile& profile, const MethodSimulationOptions& options) {
  if (!selection.descriptor->simulate) {
    throw UsageError(concat("method '", selection.name(), "' cannot be simulated yet"));
  }
  validate_model_profile(profile, concat("profile of ", profile.model));
  if (options.workers < 1) throw UsageError(concat("--workers must be at least 1, got ", options.workers));
  if (!(options.link.bits_per_second > 0)) {
    throw UsageError("a simulated network needs a bandwidth (e.g. --net 10gbe or bw=10Gbit,lat=20us)");
  }
  if (options.iterations < 1) throw UsageError(concat("--iters must be at least 1, got ", options.iterations));
  if (!(std::isfinite(options.compute_jitter) && options.compute_jitter >= 0)) {
    throw UsageError(concat("--compute-jitter must be finite and >= 0, got ", options.compute_jitter));
  }
}

// The modelled allreduce of `algorithm` on the workers' platform, simulated once per process for
// each algorithm, world size and network (simulate and advise ask for the same ones many times).
ModelledAllreduce modelled_allreduce(const std::string& algorithm, const MethodSimulationOptions& options) {
  static std::mutex mutex;
  using Key = std::tuple<std::string, int, std::string, SimNetworkModel, double, double>;
  static std::map<Key, ModelledAllreduce> cache;
  const Key key{algorithm, options.workers, options.topology.text, options.model, options.link.bits_per_second,
                options.link.latency_seconds};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto found = cache.find(key); found != cache.end()) return found->second;
  }
  SimPlatformSpec platform;
  platform.hosts = options.workers;
  platform.link = options.link;
  platform.model = options.model;
  platform.topology = options.topology;
  const ModelledAllreduce modelled = model_allreduce(algorithm, platform);
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(key, modelled).first->second;
}

CollectivePlan plan_collectives(const MethodSelection& selection, const ModelProfile& profile,
                                const MethodSimulationOptions& options, const CollectiveLevel& level) {
  CollectivePlan plan;
  plan.link.alpha = options.link.latency_seconds;
  plan.link.beta = 1.0 / options.link.bytes_per_second();
  plan.link.gamma = profile.codec_cost(selection.common.codec).decode_add;
  const double bytes = 4.0 * static_cast<double>(profile.parameters());
  plan.algorithm = selection.common.allreduce == "auto"
                       ? choose_allreduce_algorithm(plan.link, options.workers, bytes, allreduce_algorithm_names())
                       : selection.common.allreduce;
  plan.options = method_allreduce_options(selection.common, selection.options->default_segment_bytes());
  plan.options.timeout = std::chrono::hours(24);  // simulated time: only a broken schedule reaches it
  plan.messages = level.messages;
  if (!plan.messages && options.workers > 1) plan.modelled = modelled_allreduce(plan.algorithm, options);
  return plan;
}

// The steady state: a warm-up (at most 2 iterations of it: it is not measured) and the pipeline's
// fill (staleness + 2 iterations) run before the measured iterations.
std::int64_t simulated_warmup_iterations(const MethodSelection& selection) {
  const WarmUp warmup = selection.options->warmup();
  return std::min<std::int64_t>(2, warmup.iterations + warmup.epochs);
}
std::int64_t lead_in_iterations(const MethodSelection& selection) {
  return simulated_warmup_iterations(selection) + selection.options->staleness() + 2;
}

}  // namespace

CollectiveLevel simulated_collective_level(const MethodSelection& selection, const ModelProfile& profile,
                                           const MethodSimulationOptions& options) {
  return choose_collective_level(options.collectives, options.workers, profile.parameters(), profile.layers.size(),
                                 lead_in_iterations(selection) + options.iterations);
}

MethodSimulationResult simulate_method(const MethodSelection& selection, const ModelProfile& profile,
                                       const MethodSimulationOptions& options) {
  validate(selection, profile, options);
  const CollectiveLevel level = simulated_collective_level(selection, profile, options);
  const CollectivePlan collectives = plan_collectives(selection, profile, options, level);
  const std::int64_t warmup_iterations = simulated_warmup_iterations(selection);
  // A pipeline whose communication and computation nearly balance takes many iterations to reach
  // its steady state: the run is repeated (at most twice) with a longer lead-in until the measured
  // iterations repeat. Some schedules never repeat within 8 iterations (asynchronous servers serve
  // the workers in a rotating order): the last run's mean is taken then, over a longer window.
  std::int64_t skip = lead_in_iterations(selection);
  MethodSimulationOptions run_options = options;
  nlohmann::json r;
  for (int attempt = 0;; ++attempt) {
    const std::string text = run_isolated(concat("simulating ", selection.spec), [&] {
      Simulation simulation(selection, profile, run_options, collectives, warmup_iterations, skip);
      return simulation.run();
    });
    r = nlohmann::json::parse(text);
    if (r.at("steady").get<bool>() || attempt == 2) break;
    skip = 4 * skip + run_options.iterations;
    run_options.iterations = std::max<std::int64_t>(run_options.iterations, 32);
  }
  MethodSimulationResult result;
  result.schedule = r.at("schedule").get<std::string>();
  result.allreduce = r.at("allreduce").get<std::string>();
  result.collectives = r.at("collectives").get<std::string>();
  result.collectives_reason = level.reason;
  result.iteration_seconds = r.at("iteration_seconds").get<double>();
  result.compute_seconds = r.at("compute_seconds").get<double>();
  result.exposed_seconds = r.at("exposed_seconds").get<double>();
  result.allreduce_seconds = r.at("allreduce_seconds").get<double>();
  result.samples_per_second = r.at("samples_per_second").get<double>();
  result.measured_iterations = r.at("measured_iterations").get<std::int64_t>();
  result.periodic = r.at("steady").get<bool>();
  if (r.contains("trace_events")) result.trace_events = r.at("trace_events");
  const nlohmann::json& stages = r.at("stages");
  result.stages = {stages.at("data_s").get<double>(),   stages.at("forward_s").get<double>(),
                   stages.at("backward_s").get<double>(), stages.at("update_s").get<double>(),
                   stages.at("compensation_s").get<double>(), stages.at("wait_s").get<double>(),
                   stages.at("comm_s").get<double>()};
  return result;
}

std::vector<MethodSimulationResult> simulate_methods(const std::vector<SimulationJob>& jobs, const ModelProfile& profile,
                                                     int parallel, const std::function<void(std::size_t)>& progress,
                                                     bool skip_unbuildable) {
  std::vector<MethodSimulationResult> results(jobs.size());
  std::vector<std::exception_ptr> errors(jobs.size());
  std::vector<std::future<void>> running;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (running.size() >= static_cast<std::size_t>(std::max(1, parallel))) {
      running.front().get();
      running.erase(running.begin());
    }
    if (progress) progress(i);
    running.push_back(std::async(std::launch::async, [&, i] {
      try {
        results[i] = simulate_method(jobs[i].selection, profile, jobs[i].options);
      } catch (const UsageError& error) {
        if (skip_unbuildable) {
          results[i].unbuildable = error.what();
        } else {
          errors[i] = std::current_exception();
        }
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }));
    if (std::any_of(errors.begin(), errors.end(), [](const std::exception_ptr& e) { return e != nullptr; })) break;
  }
  for (auto& job : running) job.get();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return results;
}

void check_fits_topology(const SimulationJob& job) {
  const SimTopology& topology = job.options.topology;
  const std::size_t hosts = static_cast<std::size_t>(job.options.workers + job.selection.options->servers());
  if (topology.fat_tree && topology.leaves() < hosts) {
    throw UsageError(concat("--topology ", topology.text, " holds ", topology.leaves(), " hosts, fewer than the ", hosts,
                            " of ", job_label(job), " at ", job.options.workers, " workers"));
  }
}

}  // namespace pipesgd
