#include "pipesgd/train/progress.h"

#include <unistd.h>

#include <cstdio>

namespace pipesgd {

ProgressReporter::ProgressReporter(bool enabled, std::string label)
    : enabled_(enabled), terminal_(isatty(STDERR_FILENO) == 1), label_(std::move(label)) {}

void ProgressReporter::start_epoch(std::int64_t epoch, std::int64_t epochs,
                                   std::int64_t iterations) {
  epoch_ = epoch;
  epochs_ = epochs;
  iterations_ = iterations;
  next_line_at_ = iterations / 4;
}

void ProgressReporter::update(std::int64_t done, double loss, double samples_per_second) {
  if (!enabled_ || iterations_ == 0) return;
  if (terminal_) {
    if (done != iterations_ && last_draw_.seconds() < 0.1) return;
    last_draw_.restart();
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / iterations_);
    std::fprintf(stderr, "\r%s epoch %lld/%lld [%.*s%*s] %lld/%lld loss %.4f %.0f samples/s ",
                 label_.c_str(), static_cast<long long>(epoch_ + 1),
                 static_cast<long long>(epochs_), filled, "==============================",
                 kWidth - filled, "", static_cast<long long>(done),
                 static_cast<long long>(iterations_), loss, samples_per_second);
    std::fflush(stderr);
  } else if (done >= next_line_at_ && done < iterations_) {
    next_line_at_ += std::max<std::int64_t>(1, iterations_ / 4);
    std::fprintf(stderr, "%s epoch %lld/%lld: %lld/%lld iterations, loss %.4f, %.0f samples/s\n",
                 label_.c_str(), static_cast<long long>(epoch_ + 1),
                 static_cast<long long>(epochs_), static_cast<long long>(done),
                 static_cast<long long>(iterations_), loss, samples_per_second);
  }
}

void ProgressReporter::end_epoch(const std::string& result) {
  if (!enabled_) return;
  if (terminal_) std::fprintf(stderr, "\n");
  std::fprintf(stderr, "%s epoch %lld/%lld done: %s\n", label_.c_str(),
               static_cast<long long>(epoch_ + 1), static_cast<long long>(epochs_), result.c_str());
  std::fflush(stderr);
}

void ProgressReporter::interrupt() {
  if (!enabled_ || !terminal_) return;
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace pipesgd
