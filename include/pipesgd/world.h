#pragma once
// pipesgd's public C++ API: joining the world of workers and collectives on tensors.
//
// A world is M workers and S parameter-server ranks (S = WorldOptions::servers, 0 unless a
// parameter-server method is used). Workers are ranks 0..M-1, servers M..M+S-1. Two ways to join:
//  * run_threads(options, fn): the M workers (and S servers) as threads of this process over the
//    in-process transport; fn runs once on each worker's own thread. The embedded default.
//  * run_mpi(&argc, &argv, options, fn): one rank per process under mpirun (M = ranks - S); fn runs
//    on the worker ranks, the last S ranks serve. MPI is initialised and finalised inside.
// In both, server ranks run no user code: they wait for a DistributedOptimizer of a parameter-server
// method to send them its layout and initial weights, serve it until every worker finished it, and
// stop when worker 0's fn returned.
//
// Errors: every failure is a C++ exception of pipesgd's checked types (pipesgd/errors.h):
// UsageError / DataError with the same one-line message the CLI prints, CommError (CommTimeoutError,
// PeerFailedError) for a peer. A worker whose fn throws tells every other rank, whose waits then
// throw PeerFailedError; run_threads/run_mpi rethrow the root cause. Every wait has a timeout.
//
// Threads: a Worker belongs to the thread fn runs on; only that thread may use it (and the objects
// built from it). LibTorch's intra-op pool is shared by every thread of the process: set
// OMP_NUM_THREADS / torch::set_num_threads for several thread workers.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pipesgd/collectives.h"
#include "pipesgd/errors.h"

namespace pipesgd {

struct WorldOptions {
  int workers = 1;  // run_threads only (run_mpi: the ranks mpirun started, minus `servers`)
  int servers = 0;  // parameter-server ranks after the workers (pssync, asgd, dcasgd need >= 1)
  // Every wait of a collective on a peer, and a server's wait for a set-up's messages (while serving
  // a DistributedOptimizer, its own DistributedOptimizerOptions::timeout bounds servers and workers).
  std::chrono::milliseconds timeout{120000};
  // Keep freed memory in the heap (glibc malloc: mmap threshold 32 MiB, trim threshold 1 GiB, for
  // the whole process, as the CLI does), so that the temporaries LibTorch allocates and frees every
  // iteration do not cost fresh page faults each time: without it, 4 thread workers of a LeNet
  // iterated 5-15% slower. The price: freed blocks below 32 MiB stay mapped (the process keeps its
  // peak). false: leave the C library's settings as they are (yours).
  bool keep_freed_memory = true;
  // A timeline of the world in the Chrome trace event format (as `pipesgd train --trace`; open it in
  // https://ui.perfetto.dev), written to this file ("" = no trace). Recorded: each worker's compute
  // thread (its DistributedOptimizer's waits, updates and compensation, and each step() as a "step"
  // span, with the step number as their iteration), its comm thread's buckets and allreduces, the
  // servers' push and pull requests, and arrows from each bucket to the update that applies it; a
  // process per rank ("worker R", "server S"). Each thread records into a buffer reserved at world
  // start (no allocation, lock or I/O in the loop; events that do not fit are dropped and counted in
  // the file's otherData.dropped_events: narrow trace_iterations). Written when the world ends:
  // run_threads once every thread joined; a Session at shutdown(), where rank 0 gathers every rank's
  // events on its own clock (so under MPI shutdown() waits up to `timeout` for every rank to shut
  // down). After a failure the events up to it, with the reason in otherData.failure: run_threads
  // writes the file before rethrowing; a failed Session (fail(), or a server rank's error) writes
  // its own rank's, rank R > 0 to "FILE.rank-R". The iterations of every DistributedOptimizer count
  // from its own first step().
  std::string trace;
  // The steps recorded: "A:B" (A <= step < B), "A:" or ":B"; "" = all. Needs `trace`.
  // An invalid window, or a `trace` whose directory cannot be created or written in, is a one-line
  // UsageError when the world starts.
  std::string trace_iterations;
};

class Worker {
 public:
  struct Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int rank() const;        // 0..size()-1
  int size() const;        // the number of workers (servers excluded)
  int local_rank() const;  // rank among the workers of this host (threads: rank())
  int servers() const;     // parameter-server ranks of the world
  bool is_mpi() const;
  std::chrono::milliseconds timeout() const;

  // Collectives among the workers, negotiated and run by the worker's communication thread
  // (collectives.h: the contract, dtypes, reductions, process sets, join).
  // Asynchronous: returns at once; the Work's wait() gives the results. `caller_waits`: the caller
  // waits for it at once (as run() does): the communication thread is not woken for it.
  std::shared_ptr<Work> submit(Collective call, bool caller_waits = false);
  // Blocking: submit, then wait; the results of Work::wait. The calling thread runs the collective
  // itself unless the communication thread is running rounds (no hand-off between threads).
  std::vector<torch::Tensor> run(Collective call);
  // Blocking forms (run) among every worker, unnamed (matched in the order each
  // worker calls them). Tensors on the CPU, of any dtype of collectives.h; a mismatch between the
  // workers (dtype, shape, op, root) is a CollectiveMismatchError on each of them.
  // In place: every worker's `tensor` becomes the element-wise reduction over the workers.
  void allreduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kAverage);
  // In place: every worker's `tensor` becomes root's.
  void broadcast(torch::Tensor& tensor, int root = 0);
  // The workers' tensors concatenated along dimension 0 in rank order (their dimension 0 may
  // differ; a 0-dimensional tensor counts as one row).
  torch::Tensor allgather(const torch::Tensor& tensor);
  // Returns once every worker called it.
  void barrier();
  // A new process set of `ranks` (every worker calls it with the same ranks, in the same order as
  // its other process-set calls); returns its id.
  int add_process_set(std::vector<int> ranks);
  void remove_process_set(int id);
  // The workers of process set `id` (0: every worker); UsageError for an unknown id.
  std::vector<int> process_set_ranks(int id) const;
  // Begins a new phase of the program (collectives.h: names match within a phase; what a peer left
  // behind in an earlier one fails at once).
  void new_phase();
  // Horovod's timeline of the collectives (Chrome trace format, as WorldOptions::trace): rank 0
  // records every collective it takes part in from now on (a track per name: when each rank listed
  // it, the negotiation, the operation; with `mark_cycles` each negotiation round) and writes
  // `path` at stop_timeline(). Any worker may call them; only rank 0's calls record. UsageError for
  // an unwritable path, or start_timeline with another path before stop_timeline (with the same
  // path it goes on); stop_timeline without a timeline does nothing.
  void start_timeline(const std::string& path, bool mark_cycles = false);
  void stop_timeline();
  // Every parameter and buffer (e.g. batch-norm statistics) of `module` becomes root's, so the
  // replicas start identical. Every worker's module must have the same parameters and buffers in
  // the same order and shapes.
  void broadcast_parameters(torch::nn::Module& module, int root = 0);

  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Runs fn(worker) on options.workers threads (plus options.servers server threads) and returns
// once all ended. Throws UsageError for workers < 1 or servers < 0, and the root cause of any
// failure (the first worker's own error rather than the others' PeerFailedError).
void run_threads(const WorldOptions& options, const std::function<void(Worker&)>& fn);
void run_threads(int workers, const std::function<void(Worker&)>& fn);

// Under mpirun: initialises MPI (MPI_THREAD_MULTIPLE), runs fn on this rank if it is a worker or
// serves if it is one of the last options.servers ranks, and finalises MPI. Returns 0. On failure
// it throws (after telling the other ranks) and leaves MPI unfinalised: the process should exit
// with a non-zero status. UsageError if the ranks do not exceed options.servers. Call once per
// process, from the main thread.
int run_mpi(int* argc, char*** argv, const WorldOptions& options, const std::function<void(Worker&)>& fn);

}  // namespace pipesgd
