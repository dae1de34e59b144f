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

// The checks every collective makes: a defined CPU tensor, float32 where `float_only`.
void check_tensor(const torch::Tensor& tensor, const char* call, bool float_only) {
  if (!tensor.defined() || !tensor.device().is_cpu() || (float_only && tensor.scalar_type() != torch::kFloat32)) {
    throw UsageError(concat(call, ": expected ", float_only ? "a float32" : "a", " CPU tensor, got ", describe(tensor)));
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

void Worker::allreduce(torch::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce", /*float_only=*/true);
  torch::NoGradGuard no_grad;
  const Tag tag = impl_->next_collective_tag();
  torch::Tensor work = tensor.contiguous();
  const std::span<float> data(work.data_ptr<float>(), static_cast<std::size_t>(work.numel()));
  if (size() > 1 && !data.empty()) {
    const std::unique_ptr<Codec> codec = make_codec("none");
    AllreduceOptions options;
    options.timeout = impl_->timeout;
    const std::unique_ptr<Allreduce> algorithm = make_allreduce("ring", impl_->workers, data.size(), *codec, options);
    algorithm->run(data, tag);
  }
  if (op == ReduceOp::kAverage && size() > 1) work.div_(static_cast<double>(size()));
  if (!work.is_same(tensor)) tensor.copy_(work);
}

void Worker::broadcast(torch::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", /*float_only=*/false);
  check_root(root, size(), "broadcast");
  broadcast_bytes(*impl_, tensor, root, "broadcast");
}

torch::Tensor Worker::allgather(const torch::Tensor& tensor) {
  check_tensor(tensor, "allgather", /*float_only=*/false);
  torch::NoGradGuard no_grad;
  const Tag tag = impl_->next_collective_tag();
  torch::Tensor work = tensor.dim() == 0 ? tensor.reshape({1}).contiguous() : tensor.contiguous();
  // Every worker's (dtype, rank of the shape, rows, elements per row).
  std::int64_t trailing = 1;
  for (std::int64_t d = 1; d < work.dim(); ++d) trailing *= work.size(d);
  const std::array<std::int64_t, 4> own{static_cast<std::int64_t>(work.scalar_type()), work.dim(), work.size(0), trailing};
  Transport& workers = impl_->workers;
  const int me = workers.rank();
  const int count = workers.size();
  std::vector<std::array<std::int64_t, 4>> headers(static_cast<std::size_t>(count));
  headers[static_cast<std::size_t>(me)] = own;
  {
    std::vector<Request> requests;
    for (int peer = 0; peer < count; ++peer) {
      if (peer == me) continue;
      requests.push_back(workers.send(peer, step_tag(tag, 0, 0), std::as_bytes(std::span(own)), "allgather"));
      requests.push_back(workers.recv(peer, step_tag(tag, 0, 0),
                                      std::as_writable_bytes(std::span(headers[static_cast<std::size_t>(peer)])), "allgather"));
    }
    for (Request& request : requests) request.wait(impl_->timeout);
  }
  std::int64_t rows = 0;
  for (int peer = 0; peer < count; ++peer) {
    const auto& header = headers[static_cast<std::size_t>(peer)];
    if (header[0] != own[0] || header[1] != own[1] || header[3] != own[3]) {
      throw UsageError(concat("allgather: rank ", peer, "'s tensor differs from rank ", me,
                              "'s in dtype or in its shape after dimension 0"));
    }
    rows += header[2];
  }
  std::vector<std::int64_t> shape(work.sizes().begin(), work.sizes().end());
  shape[0] = rows;
  torch::Tensor result = torch::empty(shape, work.options());
  const std::size_t row_bytes = static_cast<std::size_t>(trailing) * work.element_size();
  std::byte* base = static_cast<std::byte*>(result.data_ptr());
  std::vector<Request> requests;
  std::size_t offset = 0;
  for (int peer = 0; peer < count; ++peer) {
    const std::size_t bytes = static_cast<std::size_t>(headers[static_cast<std::size_t>(peer)][2]) * row_bytes;
    if (peer == me) {
      if (bytes > 0) std::memcpy(base + offset, work.data_ptr(), bytes);
      for (int other = 0; other < count; ++other) {
        if (other != me) requests.push_back(workers.send(other, step_tag(tag, 1, 0), bytes_of(work), "allgather"));
      }
    } else {
      requests.push_back(workers.recv(peer, step_tag(tag, 1, 0), std::span(base + offset, bytes), "allgather"));
    }
    offset += bytes;
  }
  for (Request& request : requests) request.wait(impl_->timeout);
  return result;
}

void Worker::barrier() {
  torch::Tensor token = torch::zeros({1});
  allreduce(token, ReduceOp::kSum);
}

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
    check_tensor(tensor, "broadcast_parameters", /*float_only=*/false);
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
