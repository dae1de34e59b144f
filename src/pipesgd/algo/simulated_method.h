#pragma once
// A method's schedule for the simulator (pipesgd simulate, advise): what the method does on a
// worker's threads where the trainer calls it, written against the few actions a simulated thread
// has. SimGrid-free: each method writes its schedule in its own folder, next to the code it models,
// and its registry entry builds it (MethodDescriptor::simulate); sim/ runs it on simulated hosts.
//
// The simulated trainer (sim/method_simulation.h) runs the runtime's loop on every worker's compute
// thread, for each iteration t:
//   begin_iteration(t)             the method (e.g. Pipe-SGD waits for g[t-K] and updates)
//   data                           profile.data_seconds
//   forward, layer by layer        before_forward(t, first, end) first, if the method asks for it
//   backward, last layer first     segment_ready(t, s) after each layer
//   end_iteration(t)               the method (e.g. hands g[t] to the comm thread)
// and, if the method has one, the worker's comm thread runs run_comm_thread(iterations).
// Every simulated worker runs its own copy of the method's schedule (one object per worker).
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/algo/method_options.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/timing/model_profile.h"

namespace pipesgd {

// A point of one worker's schedule that one of its threads signals and another waits for, e.g.
// {kReduced, t, bucket}. `kind` is the method's own numbering.
struct SimEvent {
  int kind = 0;
  std::int64_t iteration = 0;
  std::int64_t index = 0;
  auto operator<=>(const SimEvent&) const = default;
};

// What a worker asks a parameter server (ps/parameter_server.h): a push of gradients, or a pull the
// server answers with weights.
enum class ServerRequestKind { kPush, kPull };

// One simulated thread of one worker. Every call takes simulated time and blocks the caller only.
class SimulatedThread {
 public:
  virtual ~SimulatedThread() = default;
  virtual int worker() const = 0;
  virtual int workers() const = 0;
  // `seconds` of work on the worker's processor, a span named `what` ("update", "compensation").
  virtual void compute(double seconds, const char* what) = 0;
  // Marks `event` as happened and wakes this worker's threads waiting for it. Idempotent.
  virtual void signal(const SimEvent& event) = 0;
  // Returns once `event` has been signalled (at once if it was). On the compute thread this is
  // the exposed wait of the iteration.
  virtual void wait(const SimEvent& event) = 0;
  // Allreduce of `elements` fp32 values among every worker, with the run's algorithm, codec and
  // segmenting. Collective: each worker makes the same calls in the same order over its threads.
  virtual void allreduce(std::size_t elements) = 0;
  // Parameter servers: a request of `bytes` (header and payload, as the transport sends it) to server
  // `server`; returns once it is posted (it travels on while the caller goes on).
  virtual void send_to_server(int server, std::size_t bytes, ServerRequestKind kind) = 0;
  // Waits for server `server`'s next reply to this worker.
  virtual void receive_reply(int server) = 0;
};

struct ServerRequest {
  int worker = 0;
  ServerRequestKind kind = ServerRequestKind::kPush;
};

// One simulated parameter server (its own host; MethodOptions::servers() of them).
class SimulatedServer {
 public:
  virtual ~SimulatedServer() = default;
  virtual int server() const = 0;
  virtual int workers() const = 0;
  virtual void compute(double seconds, const char* what) = 0;
  // The next request to arrive, from any worker (arrival order).
  virtual ServerRequest receive() = 0;
  // A reply of `bytes` to `worker`; returns once it is posted.
  virtual void reply(int worker, std::size_t bytes) = 0;
};

struct SimulationContext {
  const ModelProfile& profile;  // the model on the simulated device
  int workers = 1;
  const CommonOptions& common;
  const MethodOptions& options;  // the descriptor's own options type
  std::int64_t warmup_iterations = 0;
  // a + b·M of the run's allreduce of the whole gradient on the simulated network: the cost model
  // bucket plans are computed from (as the runtime computes them from its measurements).
  LinearCost allreduce_cost;
};

class SimulatedMethod {
 public:
  virtual ~SimulatedMethod() = default;
  virtual void begin_iteration(std::int64_t t, SimulatedThread& compute) {}
  // True if the method acts before layers' forward (before_forward is then called per layer).
  virtual bool wants_forward_hooks() const { return false; }
  virtual void before_forward(std::int64_t t, std::size_t first, std::size_t end, SimulatedThread& compute) {}
  virtual void segment_ready(std::int64_t t, std::size_t segment, SimulatedThread& compute) {}
  virtual void end_iteration(std::int64_t t, SimulatedThread& compute) = 0;
  virtual bool has_comm_thread() const { return false; }
  // The comm thread's whole life for a run of `iterations` iterations.
  virtual void run_comm_thread(std::int64_t iterations, SimulatedThread& comm) {}
  // Parameter-server methods: the number of servers and each one's whole life for a run in which
  // every worker runs `iterations` iterations.
  virtual int servers() const { return 0; }
  virtual void run_server(int server, std::int64_t iterations, SimulatedServer& thread) {}
  // What the schedule does, for reports ("4 buckets: [160..97] [96..41] ...", "K = 2").
  virtual std::string describe() const { return ""; }
};

}  // namespace pipesgd
