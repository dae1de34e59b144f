#pragma once
// Time to accuracy: how long each compared run took to reach one accuracy (`compare
// --target-accuracy`, `pipesgd report`). Accuracy is measured at the end of each epoch
// (EpochRecord); a run reaches the target at the first epoch whose accuracy is at least the target,
// after that epoch's elapsed_seconds (training wall time, evaluation excluded).
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/report/run_summary.h"

namespace pipesgd {

enum class AccuracyKind { kTest, kTrain };

// "test" or "train".
std::string accuracy_kind_name(AccuracyKind kind);

struct AccuracyTarget {
  double accuracy = 0;  // a fraction in [0, 1] (given: in (0, 1])
  AccuracyKind kind = AccuracyKind::kTest;
  bool given = false;   // --target-accuracy; false: the default (the best accuracy every run reached)
};

// --target-accuracy: a fraction in (0, 1] (0.85 for 85%); UsageError naming the flag otherwise.
void check_target_accuracy(double fraction);

// The accuracy of `kind` that `epoch` measured; nullopt if it measured none (test: --no-eval;
// train: a loss without accuracy, e.g. mse).
std::optional<double> measured_accuracy(const EpochRecord& epoch, AccuracyKind kind);

// The target for comparing `runs` (each run's epoch records): on test accuracy if every run measured
// it at least once, else on train accuracy if every run measured that (--no-eval), else nullopt (no
// common accuracy, or no runs). Its value is `requested` if given, else the least of the runs' best
// accuracies: the highest accuracy every run reached.
std::optional<AccuracyTarget> choose_accuracy_target(const std::vector<std::span<const EpochRecord>>& runs,
                                                     std::optional<double> requested);

// The elapsed seconds of the first epoch of `epochs` whose accuracy reaches `target`; nullopt if
// none does.
std::optional<double> time_to_accuracy(std::span<const EpochRecord> epochs, const AccuracyTarget& target);

// "83.61% test accuracy".
std::string describe_accuracy_target(const AccuracyTarget& target);
// compare's column heading: "time to 83.61% test", or "time to target" without a target.
std::string time_to_accuracy_heading(const std::optional<AccuracyTarget>& target);
// A cell of that column: "12.34 s", or "-" if not reached (or no target).
std::string time_to_accuracy_cell(const std::optional<double>& seconds);

// {"accuracy": 0.8361, "of": "test", "given": false}, or null.
nlohmann::json accuracy_target_to_json(const std::optional<AccuracyTarget>& target);
// The inverse; DataError naming `source` if `json` is neither null nor such an object.
std::optional<AccuracyTarget> accuracy_target_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace pipesgd
