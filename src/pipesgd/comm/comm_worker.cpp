#include "pipesgd/comm/comm_worker.h"

#include "pipesgd/comm/wait.h"
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
      if (failure && !failure_) {
        failure_ = failure;
        failed_published_.store(true, std::memory_order_release);
      }
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

// The compute thread's side of a wait (comm/wait.h): done once `target` jobs are done; a failed job
// counts as done, and a failure ends every wait. It polls the published counters without the lock
// and blocks on job_done_ under it.
struct CommWorker::WaitSite {
  CommWorker& worker;
  Ticket target;

  bool ready() const { return worker.done_published_.load(std::memory_order_acquire) >= target; }
  bool polling_pays() const { return true; }
  bool failed() const { return worker.failed_published_.load(std::memory_order_acquire); }
  void block(Clock::time_point, Clock::time_point until) {
    std::unique_lock lock(worker.mutex_);
    worker.job_done_.wait_until(lock, until, [this] { return worker.done_ >= target || worker.failure_ != nullptr; });
  }
};

double CommWorker::wait(Ticket ticket, const char* what, std::int64_t iteration) {
  // Its slot is reused by the capacity-th job submitted after it: wait before submitting that one.
  PIPESGD_ASSERT(ticket < submitted_ && submitted_ - ticket <= jobs_.size());
  // Polls, yielding, for up to spin_ before it blocks (see comm_worker.h).
  WaitSite site{*this, ticket + 1};
  const WaitOutcome outcome =
      wait_for(WaitPolicy{.yield_for = spin_, .polls_per_check = 1}, comm_thread_wait(timeout_), site);
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  if (outcome == WaitOutcome::kTimedOut) throw_timeout(concat(what, " of iteration ", iteration));
  return seconds_[ticket % seconds_.size()];
}

void CommWorker::drain(const char* what) {
  WaitSite site{*this, submitted_};
  const WaitOutcome outcome = wait_for(WaitPolicy{}, comm_thread_wait(timeout_), site);
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  if (outcome == WaitOutcome::kTimedOut) throw_timeout(what);
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
