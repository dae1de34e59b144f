#include "pipesgd/report/metrics_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <limits>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

namespace {
// A float as the shortest decimal that reads back as it (0.05, not 0.05000000074505806).
double shortest_decimal(float value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof text, value);
  PIPESGD_ASSERT(error == std::errc());
  return std::strtod(std::string(text, end).c_str(), nullptr);
}
}  // namespace

nlohmann::json times_to_json(const IterationTimes& t) {
  return {{"update_s", t.update},     {"compensation_s", t.compensation}, {"data_s", t.data},
          {"forward_s", t.forward},   {"backward_s", t.backward},         {"wait_s", t.wait},
          {"comm_s", t.comm},         {"iteration_s", t.iteration},       {"checkpoint_s", t.checkpoint},
          {"comm_cpu_s", t.comm_cpu}, {"comm_bytes", t.comm_bytes},     {"loss", t.loss}};
}

nlohmann::json epoch_to_json(const EpochRecord& e) {
  return {{"epoch", e.epoch},
          {"iterations", e.iterations},
          {"train_loss", e.train_loss},
          // -1: the loss has no accuracy (TrainConfig::has_accuracy).
          {"train_accuracy", e.train_accuracy < 0 ? nlohmann::json(nullptr) : nlohmann::json(e.train_accuracy)},
          {"test_accuracy", e.test_accuracy},
          {"test_loss", e.test_loss},
          {"elapsed_s", e.elapsed_seconds}};
}

std::string MetricsLines::resume(std::int64_t from_iteration) {
  const nlohmann::json record = {{"type", "resume"}, {"from_iteration", from_iteration}};
  return record.dump() + "\n";
}

std::string MetricsLines::iteration(std::int64_t t) const {
  IterationTimes mean;
  const std::size_t index = static_cast<std::size_t>(t);
  for (const auto* worker : times_) mean.add_scaled((*worker)[index], 1.0 / static_cast<double>(times_.size()));
  nlohmann::json record = times_to_json(mean);
  record["type"] = "iteration";
  record["iteration"] = t;
  record["epoch"] = std::max<std::int64_t>(0, t - schedule_.length().first_iteration) / iterations_per_epoch_ + 1;
  record["pipelined"] = (*times_.front())[index].pipelined;
  record["lr"] = shortest_decimal(schedule_.learning_rate(base_learning_rate_, t));
  return record.dump() + "\n";
}

std::string MetricsLines::epoch(const EpochRecord& record) {
  nlohmann::json json = epoch_to_json(record);
  json["type"] = "epoch";
  return json.dump() + "\n";
}

void write_metrics_file(const std::string& dir, const MetricsLines& lines, std::int64_t start, std::int64_t end,
                        std::span<const EpochRecord> epochs, const std::string& prefix) {
  std::string text = !prefix.empty() ? prefix : start > 0 ? MetricsLines::resume(start) : std::string();
  auto epoch = std::find_if(epochs.begin(), epochs.end(), [&](const EpochRecord& e) { return e.iterations > start; });
  for (std::int64_t t = start; t < end; ++t) {
    text += lines.iteration(t);
    for (; epoch != epochs.end() && epoch->iterations == t + 1; ++epoch) text += MetricsLines::epoch(*epoch);
  }
  write_file_atomically(std::filesystem::path(dir) / "metrics.jsonl", text, "metrics");
}

MetricsStream::MetricsStream(const std::string& dir, MetricsLines lines, const WorkerProgress& progress,
                             std::int64_t start, const std::string& prefix, std::chrono::milliseconds interval)
    : path_(std::filesystem::path(dir) / "metrics.jsonl"),
      lines_(std::move(lines)),
      progress_(progress),
      interval_(interval),
      written_(start) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int error_number = errno;
    throw DataError(concat("cannot write metrics '", path_.string(), "': ", std::strerror(error_number)));
  }
  if (!prefix.empty()) {
    append(prefix);
  } else if (start > 0) {
    append(MetricsLines::resume(start));
  }
  thread_ = std::thread([this] { run(); });
}

MetricsStream::~MetricsStream() {
  if (fd_ >= 0) finish();
}

void MetricsStream::add_epoch(const EpochRecord& record) {
  std::lock_guard lock(mutex_);
  epochs_.push_back(record);
}

void MetricsStream::run() {
  std::unique_lock lock(mutex_);
  while (!closing_) {
    wake_.wait_for(lock, interval_, [this] { return closing_; });
    if (closing_) break;
    lock.unlock();
    append(take_due());
    lock.lock();
  }
}

std::string MetricsStream::take_due() {
  std::int64_t end = std::numeric_limits<std::int64_t>::max();
  for (int w = 0; w < static_cast<int>(lines_.workers()); ++w) end = std::min(end, progress_.completed(w));
  std::vector<EpochRecord> epochs;
  {
    std::lock_guard lock(mutex_);
    epochs.swap(epochs_);
  }
  std::string text;
  auto epoch = epochs.begin();
  for (; epoch != epochs.end() && epoch->iterations <= written_; ++epoch) text += MetricsLines::epoch(*epoch);
  for (; written_ < end; ++written_) {
    text += lines_.iteration(written_);
    for (; epoch != epochs.end() && epoch->iterations == written_ + 1; ++epoch) text += MetricsLines::epoch(*epoch);
  }
  if (epoch != epochs.end()) {  // not due yet: back to the front of the queue
    std::lock_guard lock(mutex_);
    epochs_.insert(epochs_.begin(), epoch, epochs.end());
  }
  return text;
}

void MetricsStream::append(const std::string& text) {
  const char* data = text.data();
  std::size_t left = text.size();
  while (left > 0 && error_.empty()) {
    const ssize_t written = ::write(fd_, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      error_ = concat("cannot write metrics '", path_.string(), "': ", std::strerror(written < 0 ? errno : ENOSPC));
      break;
    }
    data += written;
    left -= static_cast<std::size_t>(written);
  }
}

std::string MetricsStream::finish() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  append(take_due());
  if (::close(fd_) != 0 && error_.empty()) error_ = concat("cannot write metrics '", path_.string(), "': ", std::strerror(errno));
  fd_ = -1;
  return error_;
}

void MetricsStream::close() {
  const std::string error = finish();
  if (!error.empty()) throw DataError(error);
}

}  // namespace pipesgd
