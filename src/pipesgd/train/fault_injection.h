#pragma once
// --inject-fault rank=R,iter=N,kind=crash|hang[,at=iteration|checkpoint|allreduce|push]: makes worker
// R fail at the start of iteration N (at=iteration, the default), or halfway through writing its
// checkpoint after iteration N (at=checkpoint: a torn temporary file is left behind, as a crash
// mid-write would), or in the middle of an operation of iteration N (FaultInjectingTransport below):
//   at=allreduce  (allreduce methods) during the gradient allreduce, after it sent one message of it
//                 (so its peers hold a partial exchange);
//   at=push       (parameter-server methods) during its push: with --servers >= 2 after the push
//                 reached the first shard (on the send to the second), with 1 server on that send;
// for testing what the other workers do (they must exit with one line naming the peer, the operation
// and the iteration within --comm-timeout, never hang).
//   crash  the worker stops without telling anyone, as a killed process: under --transport local
//          its thread ends silently; under mpi the process kills itself (SIGKILL).
//   hang   the worker stops communicating but stays alive: under local its thread blocks until
//          another worker has failed, then ends silently; under mpi the process sleeps until it is
//          killed (mpirun kills it once another rank exits with an error).
// --inject-fault rank=R,iter=N,kind=slow,factor=F is no failure: from the start of iteration N worker
// R's emulated link (both directions) moves its bytes F times slower, as a congested or degraded link
// would (threads with --net only: LocalFabric::slow_link). The run goes on.
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "pipesgd/comm/transport.h"

namespace pipesgd {

struct FaultInjection {
  enum class Kind { kCrash, kHang, kSlow };
  int rank = -1;  // -1: no fault
  std::int64_t iteration = 0;
  Kind kind = Kind::kCrash;
  double factor = 1;  // kSlow: the link's wire time is multiplied by it
  // at=: where in iteration N.
  enum class Point { kIteration, kCheckpoint, kAllreduce, kPush };
  Point point = Point::kIteration;
  bool at_iteration_start() const { return point == Point::kIteration; }
  bool during_checkpoint() const { return point == Point::kCheckpoint; }
  bool in_operation() const { return point == Point::kAllreduce || point == Point::kPush; }
  bool active() const { return rank >= 0; }
  bool slows_link() const { return kind == Kind::kSlow; }
};

// Parses "rank=R,iter=N,kind=crash|hang[,at=P]" or "rank=R,iter=N,kind=slow,factor=F" (keys in any
// order, each once). Throws UsageError naming --inject-fault and the bad part.
FaultInjection parse_fault_injection(const std::string& text);
// "rank=R,iter=N,kind=K,at=P" (kind=slow: "rank=R,iter=N,kind=slow,factor=F"), which parses back to
// `fault`; "" if it is not active.
std::string describe(const FaultInjection& fault);

// Thrown on the faulty worker's own thread to end it silently (not a std::exception: no handler
// reports it to the peers).
struct InjectedFault {};

// How a faulty worker ends: under threads a crash ends the worker's thread silently and a hang
// waits until another worker has failed (any_worker_failed, shared by the run's threads) or twice
// the comm timeout at the latest; where each rank is a process a crash kills it and a hang sleeps
// until it is killed.
struct FaultControl {
  const std::atomic<bool>* any_worker_failed = nullptr;  // threads only
  bool rank_is_process = false;
  Timeout timeout{120000};  // --comm-timeout
  // --restarts: where the moment the fault fires is recorded (Unix-epoch ns; train/elastic.h).
  std::atomic<std::int64_t>* fired_at_ns = nullptr;
  // kind=slow: slows rank's emulated link by factor (threads: the run's LocalFabric); empty where the
  // links are real (validate_train_config refuses kind=slow there).
  std::function<void(int rank, double factor)> slow_link;
};

// The faulty worker fails as `fault` asks. Never returns.
[[noreturn]] void inject_fault(const FaultInjection& fault, const FaultControl& control);

// at=allreduce / at=push: wraps the faulty worker's transport and forwards everything; once armed
// (by the compute thread at the start of iteration N), it counts the sends of the targeted
// operation that belong to iteration N or later, and on the `fire_on`-th (1-based) calls `fire`
// instead of sending (`fire` must not return: it throws InjectedFault or kills the process):
//   kAllreduce  a message on Channel::kGradients whose tag sequence is >= `minimum`;
//   kPush       a push request (Channel::kParameterServer, step 0, header kind push) whose header
//               version is >= `minimum`.
// Fires at most once. Thread-safe as the transport it wraps (the comm thread may send).
class FaultInjectingTransport final : public Transport {
 public:
  FaultInjectingTransport(Transport& inner, FaultInjection::Point point, int fire_on, std::function<void()> fire);
  // Starts counting sends of sequence (kAllreduce) or version (kPush) >= minimum.
  void arm(std::uint64_t minimum);
  bool fired() const { return fired_.load(std::memory_order_acquire); }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Request send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) override;
  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return inner_.recv(peer, tag, buffer, operation);
  }
  void report_failure(const std::string& reason) override { inner_.report_failure(reason); }
  std::uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  std::string describe() const override { return inner_.describe(); }
  bool waits_sleep() const override { return inner_.waits_sleep(); }

 private:
  bool targeted(Tag tag, std::span<const std::byte> bytes) const;
  Transport& inner_;
  FaultInjection::Point point_;
  int fire_on_;
  std::function<void()> fire_;
  std::atomic<bool> armed_{false};
  std::atomic<std::uint64_t> minimum_{0};
  std::atomic<int> counted_{0};
  std::atomic<bool> fired_{false};
};

}  // namespace pipesgd
