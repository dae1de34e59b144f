#pragma once
// metrics.jsonl, one JSON record per line, in this order:
//   {"type": "resume", "from_iteration": R}   first, when the run was resumed from the checkpoint of
//                                             iteration R (the iterations before R were run, and
//                                             recorded, by an earlier process);
//   {"type": "iteration", "iteration": t, "epoch": e, <times>, "loss", "pipelined"}
//                                             for every iteration this process completed, the
//                                             means over the workers whose times it holds;
//   {"type": "epoch", ...}                    after the last iteration of every epoch that ended in
//                                             this process.
// MetricsStream writes the file while the run goes; write_metrics_file writes it at once.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/algo/iteration_times.h"
#include "pipesgd/optim/lr_schedule.h"
#include "pipesgd/report/run_summary.h"
#include "pipesgd/report/worker_progress.h"

namespace pipesgd {

nlohmann::json times_to_json(const IterationTimes& times);
nlohmann::json epoch_to_json(const EpochRecord& epoch);

// The lines of metrics.jsonl (each with its newline) from the per-iteration times of the workers in
// `times` (each indexed by iteration), with `iterations_per_epoch`. An iteration's "lr" is
// schedule.learning_rate(base_learning_rate, t): the rate of the update that applies its gradient.
class MetricsLines {
 public:
  MetricsLines(std::vector<const std::vector<IterationTimes>*> times, std::int64_t iterations_per_epoch,
               float base_learning_rate = 0.1f, LrSchedule schedule = {})
      : times_(std::move(times)),
        iterations_per_epoch_(iterations_per_epoch),
        base_learning_rate_(base_learning_rate),
        schedule_(std::move(schedule)) {}
  std::size_t workers() const { return times_.size(); }
  static std::string resume(std::int64_t from_iteration);
  std::string iteration(std::int64_t t) const;
  static std::string epoch(const EpochRecord& record);

 private:
  std::vector<const std::vector<IterationTimes>*> times_;
  std::int64_t iterations_per_epoch_;
  float base_learning_rate_;
  LrSchedule schedule_;
};

// Writes DIR/metrics.jsonl atomically: the iterations [start, end) and `epochs` (each after its last
// iteration; those that ended before `start` are left out), the resume record first if start > 0.
// Throws UsageError / DataError naming the file.
// `prefix` ("": none): lines of earlier attempts (train/elastic.h, --restarts), written first instead
// of the resume record.
void write_metrics_file(const std::string& dir, const MetricsLines& lines, std::int64_t start, std::int64_t end,
                        std::span<const EpochRecord> epochs, const std::string& prefix = {});

// metrics.jsonl written as the run goes, so that a run that is killed keeps what was written: a
// thread of the leader process appends the records of the iterations that every worker in `lines`
// has completed (WorkerProgress::completed of the workers 0..n-1 of `progress`, in the order of
// `lines`: the trainer's EarlyStop)
// and the epoch records, every `interval` and at close(). The compute threads never wait for it:
// they only publish their progress, and rank 0's hands over each epoch record at the epoch's end.
class MetricsStream {
 public:
  // Creates or truncates DIR/metrics.jsonl; the iterations start at `start` (a resumed run's R).
  // Throws UsageError / DataError naming the file.
  // `prefix` ("": none): the lines an earlier attempt of the run left (--restarts), written first
  // instead of the resume record.
  MetricsStream(const std::string& dir, MetricsLines lines, const WorkerProgress& progress, std::int64_t start,
                const std::string& prefix = {}, std::chrono::milliseconds interval = std::chrono::seconds(1));
  // Writes what is due (as close() does, ignoring write failures: a run that failed keeps the
  // iterations every worker completed) and stops the thread, unless close() did.
  ~MetricsStream();
  MetricsStream(const MetricsStream&) = delete;
  MetricsStream& operator=(const MetricsStream&) = delete;

  // Queues the record of an epoch whose iterations every worker completed (any thread).
  void add_epoch(const EpochRecord& record);
  // Writes everything still due, stops the thread and closes the file. Call (as the destructor)
  // once the workers stopped writing their records. Throws DataError naming the file if a write
  // failed.
  void close();

 private:
  void run();
  // Stops the thread, writes what is due and closes the file; returns the first write failure.
  std::string finish();
  // The lines of the iterations and epochs due since the last call (the stream thread, or close()
  // after it ended).
  std::string take_due();
  void append(const std::string& text);

  std::filesystem::path path_;
  MetricsLines lines_;
  const WorkerProgress& progress_;
  std::chrono::milliseconds interval_;
  int fd_ = -1;
  std::int64_t written_;  // the iterations before this are in the file
  std::string error_;     // the first write failure
  std::mutex mutex_;      // guards epochs_ and closing_
  std::condition_variable wake_;
  std::vector<EpochRecord> epochs_;  // queued, in order
  bool closing_ = false;
  std::thread thread_;
};

}  // namespace pipesgd
