#include "pipesgd/report/accuracy_target.h"

#include <algorithm>

#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"

namespace pipesgd {
namespace {

// The best accuracy of `kind` a run measured; nullopt if it measured none.
std::optional<double> best_accuracy(std::span<const EpochRecord> epochs, AccuracyKind kind) {
  std::optional<double> best;
  for (const EpochRecord& epoch : epochs) {
    const std::optional<double> accuracy = measured_accuracy(epoch, kind);
    if (accuracy && (!best || *accuracy > *best)) best = accuracy;
  }
  return best;
}

}  // namespace

std::string accuracy_kind_name(AccuracyKind kind) { return kind == AccuracyKind::kTest ? "test" : "train"; }

void check_target_accuracy(double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    throw UsageError(concat("--target-accuracy must be a fraction in (0, 1], e.g. 0.85 for 85%, got ", fraction));
  }
}

std::optional<double> measured_accuracy(const EpochRecord& epoch, AccuracyKind kind) {
  const double value = kind == AccuracyKind::kTest ? epoch.test_accuracy : epoch.train_accuracy;
  if (!(value >= 0)) return std::nullopt;  // -1 (or NaN): not measured
  return value;
}

std::optional<AccuracyTarget> choose_accuracy_target(const std::vector<std::span<const EpochRecord>>& runs,
                                                     std::optional<double> requested) {
  if (runs.empty()) return std::nullopt;
  for (const AccuracyKind kind : {AccuracyKind::kTest, AccuracyKind::kTrain}) {
    std::optional<double> least_best;
    bool every_run_measured = true;
    for (const std::span<const EpochRecord> run : runs) {
      const std::optional<double> best = best_accuracy(run, kind);
      if (!best) {
        every_run_measured = false;
        break;
      }
      least_best = least_best ? std::min(*least_best, *best) : *best;
    }
    if (!every_run_measured) continue;
    if (requested) return AccuracyTarget{*requested, kind, true};
    return AccuracyTarget{*least_best, kind, false};
  }
  return std::nullopt;
}

std::optional<double> time_to_accuracy(std::span<const EpochRecord> epochs, const AccuracyTarget& target) {
  for (const EpochRecord& epoch : epochs) {
    const std::optional<double> accuracy = measured_accuracy(epoch, target.kind);
    if (accuracy && *accuracy >= target.accuracy) return epoch.elapsed_seconds;
  }
  return std::nullopt;
}

std::string describe_accuracy_target(const AccuracyTarget& target) {
  return concat(format_number("%.2f%%", target.accuracy * 100), " ", accuracy_kind_name(target.kind), " accuracy");
}

std::string time_to_accuracy_heading(const std::optional<AccuracyTarget>& target) {
  if (!target) return "time to target";
  return concat("time to ", format_number("%.2f%%", target->accuracy * 100), " ", accuracy_kind_name(target->kind));
}

std::string time_to_accuracy_cell(const std::optional<double>& seconds) {
  return seconds ? format_number("%.2f s", *seconds) : std::string("-");
}

nlohmann::json accuracy_target_to_json(const std::optional<AccuracyTarget>& target) {
  if (!target) return nullptr;
  return {{"accuracy", target->accuracy}, {"of", accuracy_kind_name(target->kind)}, {"given", target->given}};
}

std::optional<AccuracyTarget> accuracy_target_from_json(const nlohmann::json& json, const std::string& source) {
  if (json.is_null()) return std::nullopt;
  const auto bad = [&] {
    return DataError(concat(source, ": target_accuracy must be null or {\"accuracy\": a fraction in [0, 1], \"of\": "
                            "\"test\" or \"train\", \"given\": true or false}, got ",
                            json.dump()));
  };
  if (!json.is_object() || !json.contains("accuracy") || !json["accuracy"].is_number() || !json.contains("of") ||
      !json["of"].is_string() || !json.contains("given") || !json["given"].is_boolean()) {
    throw bad();
  }
  AccuracyTarget target;
  target.accuracy = json["accuracy"].get<double>();
  const std::string kind = json["of"].get<std::string>();
  // A default target may be 0: the best accuracy of a run that never predicted right.
  if (!(target.accuracy >= 0 && target.accuracy <= 1) || (kind != "test" && kind != "train")) throw bad();
  target.kind = kind == "test" ? AccuracyKind::kTest : AccuracyKind::kTrain;
  target.given = json["given"].get<bool>();
  return target;
}

}  // namespace pipesgd
