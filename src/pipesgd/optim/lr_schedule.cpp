#include "pipesgd/optim/lr_schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <optional>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The whole of `text` as an integer / a finite real, or nullopt.
std::optional<std::int64_t> whole_integer(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> whole_real(std::string_view text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// Shortest text that reads back as `value`.
std::string shortest(double value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof text, value);
  PIPESGD_ASSERT(error == std::errc());
  return std::string(text, end);
}

}  // namespace

std::string LrScheduleSpec::text() const {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kStep:
      return concat("step:", every_epochs, ":", shortest(gamma));
    case LrScheduleKind::kMultiStep: {
      std::vector<std::string> epochs;
      for (std::int64_t milestone : milestones) epochs.push_back(std::to_string(milestone));
      return concat("multistep:", join(epochs, ","), ":", shortest(gamma));
    }
    case LrScheduleKind::kCosine:
      return "cosine";
    case LrScheduleKind::kExternal:
      return "external";
  }
  PIPESGD_ASSERT(false);
  return {};
}

std::string LrScheduleSpec::describe() const {
  if (warmup_iterations == 0) return text();
  return concat(text(), ", warm-up ", warmup_iterations, warmup_iterations == 1 ? " iteration" : " iterations");
}

LrScheduleSpec parse_lr_schedule(std::string_view text, std::int64_t warmup_iterations, const LrScheduleNames& names) {
  auto refuse = [&](const std::string& why) {
    return UsageError(concat(names.schedule, " '", text, "': ", why, " (expected ", kLrScheduleForms, ")"));
  };
  if (warmup_iterations < 0 || warmup_iterations > kMaxLrWarmupIterations) {
    throw UsageError(concat(names.warmup, " must be in [0, ", kMaxLrWarmupIterations, "] iterations, got ",
                            warmup_iterations));
  }
  LrScheduleSpec spec;
  spec.warmup_iterations = warmup_iterations;
  const std::vector<std::string_view> parts = split(text, ':');
  const std::string_view kind = parts[0];
  auto expect_parts = [&](std::size_t count, const char* form) {
    if (parts.size() != count) {
      throw refuse(concat(kind, " takes ", count - 1, count == 2 ? " part" : " parts", " after its name: ", form));
    }
  };
  auto parse_gamma = [&](std::string_view part) {
    const std::optional<double> gamma = whole_real(part);
    if (!gamma) throw refuse(concat("GAMMA '", part, "' is not a number"));
    if (!(*gamma > 0 && *gamma <= 1)) throw refuse(concat("GAMMA must be in (0, 1], got ", part));
    return *gamma;
  };
  if (kind == "constant" || kind == "cosine") {
    if (parts.size() != 1) throw refuse(concat(kind, " takes no parts"));
    spec.kind = kind == "constant" ? LrScheduleKind::kConstant : LrScheduleKind::kCosine;
    return spec;
  }
  if (kind == "step") {
    expect_parts(3, "step:EVERY_EPOCHS:GAMMA");
    const std::optional<std::int64_t> every = whole_integer(parts[1]);
    if (!every) throw refuse(concat("EVERY_EPOCHS '", parts[1], "' is not an integer"));
    if (*every < 1) throw refuse(concat("EVERY_EPOCHS must be >= 1, got ", *every));
    spec.kind = LrScheduleKind::kStep;
    spec.every_epochs = *every;
    spec.gamma = parse_gamma(parts[2]);
    return spec;
  }
  if (kind == "multistep") {
    expect_parts(3, "multistep:E1,E2,...:GAMMA");
    spec.kind = LrScheduleKind::kMultiStep;
    for (std::string_view part : split(parts[1], ',')) {
      const std::optional<std::int64_t> epoch = whole_integer(part);
      if (!epoch) throw refuse(concat("milestone '", part, "' is not an integer"));
      if (*epoch < 1) throw refuse(concat("milestones are epochs >= 1, got ", *epoch));
      if (!spec.milestones.empty() && *epoch <= spec.milestones.back()) {
        throw refuse(concat("milestones must be strictly increasing, got ", *epoch, " after ", spec.milestones.back()));
      }
      spec.milestones.push_back(*epoch);
    }
    spec.gamma = parse_gamma(parts[2]);
    return spec;
  }
  throw refuse(concat("unknown schedule '", kind, "'"));
}

LrSchedule::LrSchedule(LrScheduleSpec spec, LrScheduleLength length) : spec_(std::move(spec)), length_(length) {
  const bool per_epoch = spec_.kind == LrScheduleKind::kStep || spec_.kind == LrScheduleKind::kMultiStep;
  if (per_epoch && length_.iterations_per_epoch < 1) {
    throw UsageError(concat("learning-rate schedule ", spec_.text(), " needs the run's iterations per epoch (>= 1), got ",
                            length_.iterations_per_epoch));
  }
  if (spec_.kind == LrScheduleKind::kCosine && length_.total_iterations < 1) {
    throw UsageError(concat("learning-rate schedule cosine needs the run's total iterations (>= 1), got ",
                            length_.total_iterations));
  }
  PIPESGD_ASSERT(spec_.kind != LrScheduleKind::kExternal || length_.external_factors != nullptr);
}

ExternalLearningRates::ExternalLearningRates() = default;

void ExternalLearningRates::set(std::int64_t t, double factor) {
  PIPESGD_ASSERT(t >= 0);
  Entry& entry = entries_[static_cast<std::size_t>(t) % kCapacity];
  entry.iteration.store(-1, std::memory_order_release);  // a reader of the old iteration misses
  entry.factor.store(factor, std::memory_order_release);
  entry.iteration.store(t, std::memory_order_release);
  latest_.store(factor, std::memory_order_release);
}

double ExternalLearningRates::factor(std::int64_t t) const {
  PIPESGD_ASSERT(t >= 0);
  const Entry& entry = entries_[static_cast<std::size_t>(t) % kCapacity];
  if (entry.iteration.load(std::memory_order_acquire) == t) {
    const double factor = entry.factor.load(std::memory_order_acquire);
    if (entry.iteration.load(std::memory_order_acquire) == t) return factor;  // not rewritten meanwhile
  }
  return latest_.load(std::memory_order_acquire);
}

double LrSchedule::factor(std::int64_t t) const {
  PIPESGD_ASSERT(t >= 0);
  if (spec_.kind == LrScheduleKind::kExternal) return length_.external_factors->factor(t);
  t = std::max<std::int64_t>(0, t - length_.first_iteration);
  double decay = 1.0;
  switch (spec_.kind) {
    case LrScheduleKind::kExternal:
      break;
    case LrScheduleKind::kConstant:
      break;
    case LrScheduleKind::kStep:
      decay = std::pow(spec_.gamma, static_cast<double>(t / length_.iterations_per_epoch / spec_.every_epochs));
      break;
    case LrScheduleKind::kMultiStep: {
      const std::int64_t epoch = t / length_.iterations_per_epoch;
      const auto passed = std::upper_bound(spec_.milestones.begin(), spec_.milestones.end(), epoch) -
                          spec_.milestones.begin();
      decay = std::pow(spec_.gamma, static_cast<double>(passed));
      break;
    }
    case LrScheduleKind::kCosine: {
      const double total = static_cast<double>(length_.total_iterations);
      const double progress = static_cast<double>(std::min(t, length_.total_iterations)) / total;
      decay = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      break;
    }
  }
  if (t < spec_.warmup_iterations) {
    decay *= static_cast<double>(t + 1) / static_cast<double>(spec_.warmup_iterations);
  }
  if (length_.world_scale != 1.0) decay *= length_.world_scale;
  return decay;
}

}  // namespace pipesgd
