#include "pipesgd/comm/comm_worker.h"

#include <sched.h>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/thread_priority.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {
namespace {

// Runs `job` on the comm thread and returns its failure (nullptr if none), reporting a
// std::exception to the other ranks at once (see comm_worker.h).
std::exception_ptr run_communication_job(Transport& transport, const std::function<void()>& job) {
  try {
    job();
    return nullptr;
  } catch (const std::exception& error) {
    std::exception_ptr failure = std::current_exception();
    transport.report_failure(error.what());
    return failure;
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

CommWorker::CommWorker(Transport& transport, std::string owner, std::size_t capacity, Timeout timeout,
                       Handler handler, std::chrono::microseconds spin)
    : transport_(transport),
      owner_(std::move(owner)),
      timeout_(timeout),
      handler_(std::move(handler)),
      spin_(spin),
      jobs_(capacity),
      seconds_(capacity, 0.0) {
  PIPESGD_ASSERT(capacity > 0 && handler_);
  // --trace: the comm thread gets a track of its own in the process of the thread that built it.
  if (ThreadTrace* creator = current_thread_trace()) {
    trace_ = &creator->recorder().add_thread(creator->process(), "", concat("comm (", owner_, ")"), creator->capacity());
  }
  thread_ = std::thread([this] { run(); });
}

CommWorker::~CommWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  job_submitted_.notify_all();
  thread_.join();
}

void CommWorker::run() {
  // A comm thread that sleeps in its waits may preempt compute the moment its data arrives; one that
  // polls (MPI) must stay at normal priority or it would starve the compute thread.
  mark_communication_thread();
  if (transport_.waits_sleep()) raise_communication_thread_priority();
  const ScopedThreadTrace installed(trace_);
  for (;;) {
    Ticket ticket;
    {
      std::unique_lock lock(mutex_);
      job_submitted_.wait(lock, [&] { return stopping_ || submitted_ > done_; });
      if (stopping_) return;
      ticket = done_;
    }
    const Job& job = jobs_[ticket % jobs_.size()];  // submitted: the compute thread leaves it alone
    // A job is one bucket of an iteration's gradient; its arrow ends at the update that applies it.
    trace_set_iteration(job.iteration);
    TraceArgs args;
    args.iteration = job.iteration;
    args.bucket = static_cast<std::int64_t>(job.index);
    TracedStopwatch running("bucket", kTraceComm, args);
    trace_gradient_flow_start(job.iteration, job.index);
    const std::exception_ptr failure = run_communication_job(transport_, [&] { handler_(job); });
    const double seconds = running.stop();
    {
      std::lock_guard lock(mutex_);
      seconds_[ticket % seconds_.size()] = seconds;
      ++done_;
      done_published_.store(done_, std::memory_order_release);
      if (failure && !failure_) failure_ = failure;
    }
    job_done_.notify_all();
    if (failure) return;
  }
}

CommWorker::Ticket CommWorker::submit(const Job& job) {
  Ticket ticket;
  {
    std::lock_guard lock(mutex_);
    PIPESGD_ASSERT(submitted_ - done_ < jobs_.size());
    ticket = submitted_;
    jobs_[ticket % jobs_.size()] = job;
    ++submitted_;
  }
  job_submitted_.notify_one();
  return ticket;
}

void CommWorker::throw_timeout(const std::string& what) const {
  throw CommTimeoutError(concat(owner_, ": rank ", transport_.rank(), " waited more than ",
                                Seconds(comm_thread_wait(timeout_)).count(), " s for ", what));
}

double CommWorker::wait(Ticket ticket, const char* what, std::int64_t iteration) {
  // Its slot is reused by the capacity-th job submitted after it: wait before submitting that one.
  PIPESGD_ASSERT(ticket < submitted_ && submitted_ - ticket <= jobs_.size());
  if (spin_.count() > 0 && done_published_.load(std::memory_order_acquire) <= ticket) {
    // Poll, yielding, before blocking (see comm_worker.h); a failed job counts as done, so this ends.
    const Clock::time_point until = Clock::now() + spin_;
    while (done_published_.load(std::memory_order_acquire) <= ticket && Clock::now() < until) sched_yield();
  }
  std::unique_lock lock(mutex_);
  const bool done = job_done_.wait_for(lock, comm_thread_wait(timeout_), [&] {
    return done_ > ticket || failure_ != nullptr;
  });
  if (failure_) std::rethrow_exception(failure_);
  if (!done) throw_timeout(concat(what, " of iteration ", iteration));
  return seconds_[ticket % seconds_.size()];
}

void CommWorker::drain(const char* what) {
  std::unique_lock lock(mutex_);
  const bool drained = job_done_.wait_for(lock, comm_thread_wait(timeout_), [&] {
    return done_ == submitted_ || failure_ != nullptr;
  });
  if (failure_) std::rethrow_exception(failure_);
  if (!drained) throw_timeout(what);
}

CommWorker::Ticket CommWorker::completed_ticket() {
  std::lock_guard lock(mutex_);
  PIPESGD_ASSERT(done_ == submitted_);
  const Ticket ticket = submitted_;
  jobs_[ticket % jobs_.size()] = Job{};
  seconds_[ticket % seconds_.size()] = 0;
  ++submitted_;
  ++done_;
  // Published as the comm thread publishes: else a spinning wait() for this ticket polls its whole spin.
  done_published_.store(done_, std::memory_order_release);
  return ticket;
}

}  // namespace pipesgd
