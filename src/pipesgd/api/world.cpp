// The public API's world (include/pipesgd/world.h): run_threads, the Worker and its collectives.
#include <array>
#include <atomic>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/api/api_trace.h"
#include "pipesgd/api/server_ranks.h"
#include "pipesgd/api/worker_impl.h"
#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/rank_failures.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/heap_retention.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/world.h"

namespace pipesgd {
namespace {

std::string describe(const torch::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  return concat("a ", c10::toString(tensor.scalar_type()), " tensor on ", tensor.device().str());
}

// A defined CPU tensor.
void check_tensor(const torch::Tensor& tensor, const char* call) {
  if (!tensor.defined() || !tensor.device().is_cpu()) {
    throw UsageError(concat(call, ": expected a CPU tensor, got ", describe(tensor)));
  }
}

void check_root(int root, int size, const char* call) {
  if (root < 0 || root >= size) {
    throw UsageError(concat(call, ": root ", root, " is not a worker rank (0..", size - 1, ")"));
  }
}

std::span<std::byte> bytes_of(torch::Tensor& contiguous) {
  return {static_cast<std::byte*>(contiguous.data_ptr()),
          static_cast<std::size_t>(contiguous.numel()) * contiguous.element_size()};
}

// Root's bytes of `tensor` to every worker (linear: root sends to each).
void broadcast_bytes(Worker::Impl& impl, torch::Tensor& tensor, int root, const char* call) {
  torch::NoGradGuard no_grad;
  const Tag tag = impl.next_collective_tag();
  torch::Tensor work = tensor.contiguous();
  const std::span<std::byte> bytes = bytes_of(work);
  Transport& workers = impl.workers;
  if (workers.rank() == root) {
    std::vector<Request> sends;
    for (int peer = 0; peer < workers.size(); ++peer) {
      if (peer != root) sends.push_back(workers.send(peer, step_tag(tag, 0, 0), bytes, call));
    }
    for (Request& send : sends) send.wait(impl.timeout);
    return;
  }
  const std::size_t received = workers.recv(root, step_tag(tag, 0, 0), bytes, call).wait(impl.timeout);
  if (received != bytes.size()) {
    throw UsageError(concat(call, ": rank ", workers.rank(), "'s tensor has ", bytes.size(), " bytes, root ", root,
                            "'s ", received));
  }
  if (!work.is_same(tensor)) tensor.copy_(work);
}

}  // namespace

void prepare_world(const WorldOptions& options) {
  if (options.servers < 0) throw UsageError(concat("servers must be >= 0, got ", options.servers));
  if (options.timeout.count() <= 0) throw UsageError("timeout must be > 0");
  if (options.keep_freed_memory) keep_freed_memory_in_heap();
}

int local_rank_from_environment(int rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name)) {
      char* end = nullptr;
      const long parsed = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && parsed >= 0) return static_cast<int>(parsed);
    }
  }
  return rank;
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;

int Worker::rank() const { return impl_->world.rank(); }
int Worker::size() const { return impl_->worker_count; }
int Worker::local_rank() const { return impl_->local_rank; }
int Worker::servers() const { return impl_->server_count; }
bool Worker::is_mpi() const { return impl_->mpi; }
std::chrono::milliseconds Worker::timeout() const { return impl_->timeout; }

std::shared_ptr<Work> Worker::submit(Collective call, bool caller_waits) {
  return impl_->engine->submit(std::move(call), caller_waits);
}

std::vector<torch::Tensor> Worker::run(Collective call) { return submit(std::move(call), /*caller_waits=*/true)->wait(); }

namespace {
// An unnamed in-place collective of `tensor` among every worker.
Collective in_place(CollectiveKind kind, torch::Tensor& tensor) {
  Collective call;
  call.kind = kind;
  call.input = tensor;
  call.output = tensor;
  return call;
}
}  // namespace

void Worker::allreduce(torch::Tensor& tensor, ReduceOp op) {
  Collective call = in_place(CollectiveKind::kAllreduce, tensor);
  call.op = op;
  run(std::move(call));
}

void Worker::broadcast(torch::Tensor& tensor, int root) {
  check_root(root, size(), "broadcast");
  Collective call = in_place(CollectiveKind::kBroadcast, tensor);
  call.root = root;
  run(std::move(call));
}

torch::Tensor Worker::allgather(const torch::Tensor& tensor) {
  Collective call;
  call.kind = CollectiveKind::kAllgather;
  call.input = tensor;
  return run(std::move(call)).at(0);
}

void Worker::barrier() {
  Collective call;
  call.kind = CollectiveKind::kBarrier;
  run(std::move(call));
}

int Worker::add_process_set(std::vector<int> ranks) {
  Collective call;
  call.kind = CollectiveKind::kAddProcessSet;
  call.ranks = std::move(ranks);
  return static_cast<int>(run(std::move(call)).at(0).item<std::int64_t>());
}

void Worker::remove_process_set(int id) {
  Collective call;
  call.kind = CollectiveKind::kRemoveProcessSet;
  call.process_set = id;
  run(std::move(call));
}

std::vector<int> Worker::process_set_ranks(int id) const { return impl_->engine->process_set_ranks(id); }

void Worker::new_phase() { impl_->engine->new_phase(); }

void Worker::start_timeline(const std::string& path, bool mark_cycles) {
  impl_->engine->start_timeline(path, mark_cycles);
}

void Worker::stop_timeline() { impl_->engine->stop_timeline(); }

void Worker::broadcast_parameters(torch::nn::Module& module, int root) {
  check_root(root, size(), "broadcast_parameters");
  std::vector<torch::Tensor> tensors = module.parameters();
  for (torch::Tensor& buffer : module.buffers()) tensors.push_back(buffer);
  // Every worker checks its count against root's first, so a mismatch fails before any payload.
  torch::Tensor count = torch::tensor({static_cast<std::int64_t>(tensors.size())}, torch::kInt64);
  torch::Tensor roots = count.clone();
  broadcast_bytes(*impl_, roots, root, "broadcast_parameters");
  if (roots.item<std::int64_t>() != count.item<std::int64_t>()) {
    throw UsageError(concat("broadcast_parameters: rank ", rank(), "'s module has ", tensors.size(),
                            " parameters and buffers, root ", root, "'s ", roots.item<std::int64_t>()));
  }
  for (torch::Tensor& tensor : tensors) {
    check_tensor(tensor, "broadcast_parameters");
    torch::Tensor data = tensor.detach();
    broadcast_bytes(*impl_, data, root, "broadcast_parameters");
  }
}

void broadcast_parameters(Worker& worker, torch::nn::Module& module, int root) {
  worker.broadcast_parameters(module, root);
}

void run_threads(int workers, const std::function<void(Worker&)>& fn) {
  WorldOptions options;
  options.workers = workers;
  run_threads(options, fn);
}

void run_threads(const WorldOptions& options, const std::function<void(Worker&)>& fn) {
  if (options.workers < 1) throw UsageError(concat("workers must be >= 1, got ", options.workers));
  prepare_world(options);
  WorldTrace trace(options);
  const int ranks = options.workers + options.servers;
  std::vector<ThreadTrace*> tracks;
  for (int rank = 0; rank < ranks; ++rank) tracks.push_back(trace.add_rank(rank, options.workers));
  LocalFabric fabric(ranks);
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(ranks));
  std::atomic<bool> worker_failed{false};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      const ScopedThreadTrace installed(tracks[static_cast<std::size_t>(rank)]);
      try {
        if (rank < options.workers) {
          Worker worker(std::make_unique<Worker::Impl>(transport, options.workers, options.servers, rank,
                                                       /*mpi=*/false, options.timeout));
          fn(worker);
          if (rank == 0 && options.servers > 0) {
            send_server_shutdown(transport, options.workers, worker.impl().server_message_sequence, options.timeout);
          }
        } else {
          run_server_rank(transport, options.workers, options.timeout, &worker_failed);
        }
      } catch (const std::exception& error) {
        failures[static_cast<std::size_t>(rank)] = std::current_exception();
        transport.report_failure(error.what());
        worker_failed.store(true, std::memory_order_release);
      } catch (...) {
        failures[static_cast<std::size_t>(rank)] = std::current_exception();
        transport.report_failure("an exception that is not a std::exception");
        worker_failed.store(true, std::memory_order_release);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  try {
    rethrow_root_cause(failures);
  } catch (const std::exception& error) {
    trace.write_after_failure(0, error.what());  // every rank's events: the file itself
    throw;
  } catch (...) {
    trace.write_after_failure(0, "an exception that is not a std::exception");
    throw;
  }
  trace.write();
}

}  // namespace pipesgd
