#pragma once
// CommWorker: a worker's communication thread, the one place that owns one (DESIGN.md's "comm
// engine"). The compute thread submits jobs and gets tickets; the thread runs the jobs one at a
// time, in submission order, with the handler given at construction; the compute thread waits for
// a ticket, or for every job (drain). Methods that communicate off the compute thread (pipe, the
// layer-wise methods, sapipe, odsgd) own one each and no thread, mutex or condition variable of
// their own for it.
//
// Failures: the first exception a job throws is stored, the thread runs no further job, and every
// later wait() or drain() rethrows it on the compute thread. A std::exception is also reported to
// the other ranks at once (Transport::report_failure) so that they stop waiting on this rank; any
// other exception (a silent death injected by tests, --inject-fault) is reported to no one.
// Timeouts: a wait gives up after comm_thread_wait(timeout), longer than the comm thread's own
// waits on its peers, so that a silent peer is reported by the comm thread's transport error, which
// names the peer, the operation and the tag; this bound only catches a comm thread that stopped.
// The bound covers every job queued ahead of the ticket waited for (for drain, the whole queue),
// not one job.
//
// Threads: submit, wait, drain, completed_ticket and the accessors are for one thread, the compute
// thread; the handler runs on the comm thread. A submitted job's data belongs to the comm thread
// until its ticket is done. The hot path does not allocate: jobs live in a ring of `capacity` slots.
// --trace: a worker built on a thread with a trace (core/trace.h) gets a comm track of its own; each
// job is a "bucket" span (iteration, index) from which a gradient arrow starts.
// The comm thread runs at raised priority when the transport's waits sleep (core/thread_priority.h;
// never for a polling transport, whose thread would starve the compute thread).
// Waits follow comm/wait.h's policy. Spinning: with a `spin` bound, wait() first polls the job's
// completion, yielding the processor at every turn, for up to that long, and blocks only then. A core whose compute thread blocks for a
// fraction of a millisecond goes idle, and the compute after it runs measurably slower here (see
// git show d620cdd:docs/results.md, "Close to the limit"); the comm thread, at raised priority, still preempts the
// spinning thread at once. Only where every worker has a core of its own (the trainer decides:
// CommonOptions::wait_spin), else the spin would take processor time from another worker.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/comm/transport.h"

namespace pipesgd {

class ThreadTrace;

// How long a compute thread waits for its own comm thread: longer than the comm thread's waits on
// its peers (`timeout`, --comm-timeout).
inline Timeout comm_thread_wait(Timeout timeout) {
  return std::chrono::duration_cast<Timeout>(2 * timeout + std::chrono::seconds(1));
}

class CommWorker {
 public:
  // What a job is about; the handler gives the fields their meaning.
  struct Job {
    std::span<float> data;       // e.g. the range to allreduce
    std::uint64_t sequence = 0;  // e.g. the tag sequence
    std::int64_t iteration = 0;  // the training iteration the job belongs to
    std::size_t index = 0;       // e.g. a slot or a bucket
  };
  using Handler = std::function<void(const Job& job)>;
  using Ticket = std::uint64_t;  // jobs are numbered 0, 1, 2, ... in submission order

  // Starts the thread. `owner` names the method in messages ("pipe-sgd"); `capacity` is the most
  // jobs in flight at once; `timeout` the peers' timeout (--comm-timeout).
  // `spin`: how long wait() polls before it blocks (0: it blocks at once).
  CommWorker(Transport& transport, std::string owner, std::size_t capacity, Timeout timeout, Handler handler,
             std::chrono::microseconds spin = std::chrono::microseconds(0));
  // Stops the thread: queued jobs are abandoned (a worker being destroyed with work queued is
  // failing, and more communication would only hold up the unwinding), a running one is waited for.
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Queues `job`; at most `capacity` jobs may be in flight (asserted).
  Ticket submit(const Job& job);
  // Blocks until job `ticket` is done and returns the seconds its handler took. Call it before
  // `capacity` later jobs were submitted (their ring slot is the ticket's; asserted). Rethrows the stored
  // failure; throws CommTimeoutError "<owner>: rank R waited more than S s for <what> of iteration
  // <iteration>" after comm_thread_wait(timeout).
  double wait(Ticket ticket, const char* what, std::int64_t iteration);
  // Blocks until every submitted job is done (same failures; the message says "for <what>").
  void drain(const char* what);
  // A ticket that is done at once, without running anything: a job whose result was restored from
  // a checkpoint. Only while no job is in flight (asserted).
  Ticket completed_ticket();
  // The ticket the next submit() returns.
  Ticket next_ticket() const { return submitted_; }

 private:
  struct WaitSite;

  void run();
  [[noreturn]] void throw_timeout(const std::string& what) const;

  Transport& transport_;
  const std::string owner_;
  const Timeout timeout_;
  const Handler handler_;
  const std::chrono::microseconds spin_;
  std::vector<Job> jobs_;        // ring, indexed by ticket % capacity
  std::vector<double> seconds_;  // the handler's time per job, same ring
  std::mutex mutex_;
  std::condition_variable job_submitted_;  // the comm thread waits on it
  std::condition_variable job_done_;       // the compute thread waits on it
  Ticket submitted_ = 0, done_ = 0;        // guarded by mutex_ (submitted_ written by the compute thread only)
  std::atomic<Ticket> done_published_{0};  // done_, stored after it changes: what a spinning wait() polls
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::atomic<bool> failed_published_{false};  // failure_ != nullptr, stored after it is set
  ThreadTrace* trace_ = nullptr;  // --trace: the comm thread's track (set up by the constructing thread)
  std::thread thread_;  // last: started when everything above is ready
};

}  // namespace pipesgd
