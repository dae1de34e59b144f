#pragma once
// Learning-rate schedules (--lr-schedule, --lr-warmup): the learning rate of the update that applies
// the gradient of iteration t (0-based) is
//
//   learning_rate(base, t) = float(double(base) * factor(t)),   factor(t) = decay(t) * warm(t)
//
// with e = floor(t / iterations_per_epoch) the epoch of t and T the run's total iterations:
//   constant                  decay(t) = 1
//   step:EVERY:GAMMA          decay(t) = GAMMA^floor(e / EVERY)             (torch StepLR stepped per epoch)
//   multistep:E1,E2,..:GAMMA  decay(t) = GAMMA^(number of milestones Ei <= e) (torch MultiStepLR per epoch)
//   cosine                    decay(t) = (1 + cos(pi * min(t, T) / T)) / 2   (torch CosineAnnealingLR stepped
//                                        per iteration, T_max = T, eta_min = 0: decay(0) = 1, never 0 for t < T)
//   warm-up N (--lr-warmup)   warm(t) = (t + 1) / N for t < N, else 1 (torch LinearLR with start_factor 1/N,
//                                        end_factor 1, total_iters N - 1, chained with the schedule)
// The factor is computed in double; factor == 1 exactly for constant past the warm-up, so a constant
// schedule leaves every learning rate bit-identical. A schedule multiplies every base learning rate
// of a run alike (the optimizer's, the parameter servers', OD-SGD's --local-lr): training methods
// apply factor(t) to the update of the gradient of iteration t, whenever that update happens
// (docs/user-guide.md, "Learning-rate schedules").
//
// Usage without the CLI:
//   LrScheduleSpec spec = parse_lr_schedule("step:30:0.1", /*warmup_iterations=*/500);
//   LrSchedule schedule(spec, {iterations_per_epoch, total_iterations});
//   float lr = schedule.learning_rate(0.1f, t);
//
// external (the public API's DistributedOptimizerOptions::lr_schedule "external"; not a CLI form):
// factor(t) is whatever the caller set for iteration t in an ExternalLearningRates table shared by
// every copy of the schedule (the Python front end sets the user's torch optimizer's rate at every
// step, so PyTorch's own schedulers work).
// Pure functions of their arguments (external: of the table); LrSchedule is immutable and may be
// shared between threads.
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pipesgd {

enum class LrScheduleKind { kConstant, kStep, kMultiStep, kCosine, kExternal };

// The accepted forms, for messages and --help.
inline constexpr const char* kLrScheduleForms = "constant, step:EVERY_EPOCHS:GAMMA, multistep:E1,E2,...:GAMMA or cosine";
// Upper bound of the warm-up (the run's iteration bound).
inline constexpr std::int64_t kMaxLrWarmupIterations = 10'000'000;

// What was asked for, before the run's length is known (checkpoint fingerprints and summaries
// compare these).
struct LrScheduleSpec {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  std::int64_t every_epochs = 0;         // step: >= 1
  std::vector<std::int64_t> milestones;  // multistep: epochs, >= 1, strictly increasing
  double gamma = 1.0;                    // step, multistep: in (0, 1]
  std::int64_t warmup_iterations = 0;    // [0, kMaxLrWarmupIterations]

  // The schedule in --lr-schedule's form ("step:2:0.5", "multistep:3,6:0.1"), without the warm-up.
  std::string text() const;
  // constant without warm-up: every factor is 1.
  bool is_constant() const { return kind == LrScheduleKind::kConstant && warmup_iterations == 0; }
  // "step:2:0.5, warm-up 10 iterations" (", warm-up ..." only when there is one).
  std::string describe() const;
  bool operator==(const LrScheduleSpec&) const = default;
};

// The names parse_lr_schedule gives the two settings in its messages (the CLI passes its flags).
struct LrScheduleNames {
  const char* schedule = "learning-rate schedule";
  const char* warmup = "learning-rate warm-up";
};

// Parses `text` (kLrScheduleForms) and the warm-up. Throws UsageError with one line naming the
// setting, the text and the accepted forms for an unknown kind, missing or extra parts, a part that
// is not a number, EVERY_EPOCHS < 1, a milestone < 1 or milestones not strictly increasing, GAMMA
// outside (0, 1] (a schedule decays; GAMMA = 1 is constant), or a warm-up outside
// [0, kMaxLrWarmupIterations].
LrScheduleSpec parse_lr_schedule(std::string_view text, std::int64_t warmup_iterations = 0,
                                 const LrScheduleNames& names = {});

// The factors of an external schedule: the caller sets factor(t) for iteration t before the update
// of t's gradient can happen (before handing the gradient of t to the method); the method reads it
// whenever it applies that update. Holds the last kCapacity iterations: an update lags its gradient
// by far fewer iterations than that in every method. Reading an iteration not (or no longer) held
// gives the factor set last (1 before any), which is what a prediction of a future update and a
// resumed run's in-flight updates use. Threads: one thread sets, any thread reads (lock-free).
class ExternalLearningRates {
 public:
  static constexpr std::size_t kCapacity = 1024;
  ExternalLearningRates();
  void set(std::int64_t t, double factor);
  double factor(std::int64_t t) const;

 private:
  struct Entry {
    std::atomic<std::int64_t> iteration{-1};
    std::atomic<double> factor{1.0};
  };
  std::array<Entry, kCapacity> entries_;
  std::atomic<double> latest_{1.0};
};

// The run lengths a schedule needs: iterations per epoch (step, multistep) and the run's total
// iterations (cosine); for external, the table of factors (shared by every copy of the schedule).
struct LrScheduleLength {
  std::int64_t iterations_per_epoch = 0;
  std::int64_t total_iterations = 0;
  std::shared_ptr<const ExternalLearningRates> external_factors{};
  // A run that continues the commit of another world (train/elastic.h): iteration t is position
  // max(0, t - first_iteration) of these epochs and total_iterations, and every factor is multiplied
  // by world_scale (the linear scaling rule: the workers now over the workers that started the run).
  // 0 and 1 otherwise (every factor as above, bit for bit).
  std::int64_t first_iteration = 0;
  double world_scale = 1.0;
};

// base * factor, rounded once to float: every learning rate a schedule scales.
inline float scaled_learning_rate(float base, double factor) {
  return static_cast<float>(static_cast<double>(base) * factor);
}

class LrSchedule {
 public:
  LrSchedule() = default;  // constant, no warm-up
  // Throws UsageError (naming the schedule) if a step or multistep schedule gets iterations_per_epoch
  // < 1 or a cosine schedule total_iterations < 1; asserts that an external one has its table.
  LrSchedule(LrScheduleSpec spec, LrScheduleLength length);

  // decay(t) * warm(t) as in the header comment; t >= 0.
  double factor(std::int64_t t) const;
  float learning_rate(float base, std::int64_t t) const { return scaled_learning_rate(base, factor(t)); }

  const LrScheduleSpec& spec() const { return spec_; }
  const LrScheduleLength& length() const { return length_; }

 private:
  LrScheduleSpec spec_;
  LrScheduleLength length_;
};

}  // namespace pipesgd
