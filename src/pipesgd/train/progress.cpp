#include "pipesgd/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace pipesgd {

ProgressReporter::ProgressReporter(bool enabled, std::string label)
    : enabled_(enabled), terminal_(isatty(STDERR_FILENO) == 1), label_(std::move(label)) {}

void ProgressReporter::start_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t iterations,
                                   std::int64_t epoch_iterations) {
  epoch_ = epoch;
  epochs_ = epochs;
  iterations_ = iterations;
  epoch_iterations_ = epoch_iterations;
  next_line_at_ = iterations / 4;
}

std::string ProgressReporter::epoch_name() const {
  char text[160];
  if (iterations_ < epoch_iterations_) {  // the run ends inside this epoch
    std::snprintf(text, sizeof text, "%lld (the run ends after %lld of its %lld iterations, --iters)",
                  static_cast<long long>(epoch_ + 1), static_cast<long long>(iterations_),
                  static_cast<long long>(epoch_iterations_));
  } else {
    std::snprintf(text, sizeof text, "%lld/%lld", static_cast<long long>(epoch_ + 1), static_cast<long long>(epochs_));
  }
  return text;
}

void ProgressReporter::update(std::int64_t done, double loss, double samples_per_second) {
  if (!enabled_ || iterations_ == 0) return;
  if (terminal_) {
    if (done != iterations_ && last_draw_.seconds() < 0.1) return;
    last_draw_.restart();
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / iterations_);
    std::fprintf(stderr, "\r%s epoch %s [%.*s%*s] %lld/%lld loss %.4f %.0f samples/s ",
                 label_.c_str(), epoch_name().c_str(), filled, "==============================",
                 kWidth - filled, "", static_cast<long long>(done),
                 static_cast<long long>(iterations_), loss, samples_per_second);
    std::fflush(stderr);
  } else if (done >= next_line_at_ && done < iterations_) {
    next_line_at_ += std::max<std::int64_t>(1, iterations_ / 4);
    std::fprintf(stderr, "%s epoch %s: %lld/%lld iterations, loss %.4f, %.0f samples/s\n",
                 label_.c_str(), epoch_name().c_str(), static_cast<long long>(done),
                 static_cast<long long>(iterations_), loss, samples_per_second);
  }
}

void ProgressReporter::end_epoch(const std::string& result) {
  if (!enabled_) return;
  if (terminal_) std::fprintf(stderr, "\n");
  if (iterations_ < epoch_iterations_) {
    const long long percent = std::max<long long>(1, (100 * iterations_ + epoch_iterations_ / 2) / epoch_iterations_);
    std::fprintf(stderr, "%s stopped after %lld iterations (--iters), %lld%% of epoch %lld: %s\n", label_.c_str(),
                 static_cast<long long>(epoch_ * epoch_iterations_ + iterations_), percent,
                 static_cast<long long>(epoch_ + 1), result.c_str());
  } else {
    std::fprintf(stderr, "%s epoch %lld/%lld done: %s\n", label_.c_str(), static_cast<long long>(epoch_ + 1),
                 static_cast<long long>(epochs_), result.c_str());
  }
  std::fflush(stderr);
}

void ProgressReporter::interrupt() {
  if (!enabled_ || !terminal_) return;
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace pipesgd
