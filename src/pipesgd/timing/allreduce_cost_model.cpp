#include "pipesgd/timing/allreduce_cost_model.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/json_file.h"

namespace pipesgd {
namespace {

using nlohmann::json;

std::string known_algorithms_text() { return join(cost_model_algorithm_names()); }

bool finite_nonnegative(double value) { return std::isfinite(value) && value >= 0; }

// ---------------------------------------------------------------------------------------------
// Non-negative least squares in up to three variables: minimise |A x - rhs|^2 subject to x >= 0.

constexpr int kMaxVariables = 3;
using Row = std::array<double, kMaxVariables>;

// A subset's columns count as linearly dependent when the determinant of their Gram matrix, after
// scaling every column to unit length, is below this (for two columns: an angle under 1e-5 rad).
constexpr double kDependentDeterminant = 1e-10;

struct NonNegativeSolution {
  std::array<double, kMaxVariables> x{};
  double objective = 0;
  bool full_rank = true;  // the columns of all variables are linearly independent
};

class NonNegativeLeastSquares {
 public:
  NonNegativeLeastSquares(const std::vector<Row>& rows, const std::vector<double>& rhs,
                          int variables)
      : rows_(rows), rhs_(rhs), variables_(variables) {
    PIPESGD_ASSERT(variables >= 1 && variables <= kMaxVariables);
    PIPESGD_ASSERT(rows.size() == rhs.size());
    for (int j = 0; j < variables_; ++j) {
      double sum = 0;
      for (const Row& row : rows_) sum += row[j] * row[j];
      norm_[j] = std::sqrt(sum);
    }
    for (int j = 0; j < variables_; ++j) {
      for (int k = 0; k < variables_; ++k) {
        double sum = 0;
        for (const Row& row : rows_) sum += row[j] * row[k];
        gram_[j][k] = norm_[j] > 0 && norm_[k] > 0 ? sum / (norm_[j] * norm_[k]) : 0;
      }
      double sum = 0;
      for (std::size_t i = 0; i < rows_.size(); ++i) sum += rows_[i][j] * rhs_[i];
      projection_[j] = norm_[j] > 0 ? sum / norm_[j] : 0;
    }
  }

  // True if the columns of the variables in `mask` (bit j = variable j) are linearly dependent.
  bool dependent(unsigned mask) const {
    std::array<double, kMaxVariables> unused{};
    return !solve_subset(mask, unused);
  }

  // Tries every subset of free variables (the others held at zero), largest subsets first and,
  // within a size, subsets of earlier variables first; keeps the first one with the least
  // objective among those whose unconstrained optimum is non-negative. Subsets with dependent
  // columns are skipped: some optimum always has linearly independent free columns, so the least
  // objective is still found, and the order decides among equally good fits.
  NonNegativeSolution solve() const {
    const unsigned all = (1u << variables_) - 1;
    double null_objective = 0;  // objective at x = 0
    for (double value : rhs_) null_objective += value * value;
    const double tie_tolerance = 1e-14 * null_objective;

    NonNegativeSolution best;
    best.objective = null_objective;
    bool have_best = false;
    for (int size = variables_; size >= 0; --size) {
      for (unsigned mask = 0; mask <= all; ++mask) {
        if (std::popcount(mask) != size) continue;
        std::array<double, kMaxVariables> x{};
        if (!solve_subset(mask, x)) continue;
        bool feasible = true;
        for (int j = 0; j < variables_; ++j) feasible = feasible && x[j] >= 0;
        if (!feasible) continue;
        const double value = objective(x);
        if (!have_best || value < best.objective - 1e-9 * best.objective - tie_tolerance) {
          best.x = x;
          best.objective = value;
          have_best = true;
        }
      }
    }
    PIPESGD_ASSERT(have_best);  // the empty subset is always feasible
    best.full_rank = !dependent(all);
    return best;
  }

 private:
  // Unconstrained least squares over the variables in `mask` (others zero), through the normal
  // equations of the unit-length columns (Cholesky). False if the columns are dependent.
  bool solve_subset(unsigned mask, std::array<double, kMaxVariables>& x) const {
    std::array<int, kMaxVariables> index{};
    int size = 0;
    for (int j = 0; j < variables_; ++j) {
      if (mask & (1u << j)) {
        if (norm_[j] == 0) return false;
        index[size++] = j;
      }
    }
    x = {};
    if (size == 0) return true;
    double lower[kMaxVariables][kMaxVariables] = {};
    double determinant = 1;
    for (int r = 0; r < size; ++r) {
      for (int c = 0; c <= r; ++c) {
        double sum = gram_[index[r]][index[c]];
        for (int k = 0; k < c; ++k) sum -= lower[r][k] * lower[c][k];
        if (r == c) {
          if (sum <= 0) return false;
          determinant *= sum;
          lower[r][r] = std::sqrt(sum);
        } else {
          lower[r][c] = sum / lower[c][c];
        }
      }
    }
    if (determinant < kDependentDeterminant) return false;
    double y[kMaxVariables] = {};
    for (int r = 0; r < size; ++r) {  // lower · y = projection
      double sum = projection_[index[r]];
      for (int k = 0; k < r; ++k) sum -= lower[r][k] * y[k];
      y[r] = sum / lower[r][r];
    }
    for (int r = size - 1; r >= 0; --r) {  // lowerᵀ · z = y
      double sum = y[r];
      for (int k = r + 1; k < size; ++k) sum -= lower[k][r] * y[k];
      y[r] = sum / lower[r][r];
    }
    for (int r = 0; r < size; ++r) x[index[r]] = y[r] / norm_[index[r]];
    return true;
  }

  double objective(const std::array<double, kMaxVariables>& x) const {
    double sum = 0;
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      double predicted = 0;
      for (int j = 0; j < variables_; ++j) predicted += rows_[i][j] * x[j];
      const double residual = predicted - rhs_[i];
      sum += residual * residual;
    }
    return sum;
  }

  const std::vector<Row>& rows_;
  const std::vector<double>& rhs_;
  int variables_;
  std::array<double, kMaxVariables> norm_{};
  std::array<std::array<double, kMaxVariables>, kMaxVariables> gram_{};
  std::array<double, kMaxVariables> projection_{};
};

// Scale of the residual of a sample: 1 / measured (relative) or 1 (absolute).
double residual_weight(const TimingSample& sample, ResidualWeighting weighting) {
  return weighting == ResidualWeighting::relative ? 1.0 / sample.seconds : 1.0;
}

std::string describe_sample(const TimingSample& sample, std::size_t index) {
  return concat("timing sample ", index, " (", sample.algorithm, ", ", sample.world_size,
                " ranks, ", sample.bytes, " bytes)");
}

// Throws DataError unless the sample can be fitted.
void check_sample(const TimingSample& sample, std::size_t index, int minimum_world_size,
                  bool known_algorithm_required) {
  const auto fail = [&](const std::string& problem) {
    throw DataError(concat(describe_sample(sample, index), ": ", problem));
  };
  if (known_algorithm_required && !is_cost_model_algorithm(sample.algorithm)) {
    fail(concat("unknown allreduce algorithm (known: ", known_algorithms_text(), ")"));
  }
  if (sample.world_size < minimum_world_size) {
    fail(minimum_world_size == 2
             ? concat("world size must be at least 2 (one rank does not communicate), got ",
                      sample.world_size)
             : concat("world size must be at least ", minimum_world_size, ", got ",
                      sample.world_size));
  }
  if (!finite_nonnegative(sample.bytes)) {
    fail(concat("bytes must be finite and >= 0, got ", sample.bytes));
  }
  if (!std::isfinite(sample.seconds) || sample.seconds <= 0) {
    fail(concat("time must be positive and finite, got ", sample.seconds, " s"));
  }
}

// ---------------------------------------------------------------------------------------------
// Calibration JSON.

[[noreturn]] void calibration_error(const std::string& source, const std::string& problem) {
  throw DataError(concat(source, ": ", problem));
}

std::string describe_json_value(const json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

void reject_unknown_fields(const json& object, std::initializer_list<const char*> allowed,
                           const std::string& where, const std::string& source) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool known = false;
    for (const char* name : allowed) known = known || it.key() == name;
    if (!known) calibration_error(source, concat("unknown field \"", where, it.key(), "\""));
  }
}

const json& require_field(const json& object, const char* key, const std::string& where,
                          const std::string& source) {
  const auto it = object.find(key);
  if (it == object.end()) calibration_error(source, concat("missing field \"", where, key, "\""));
  return *it;
}

const json& require_object(const json& object, const char* key, const std::string& where,
                           const std::string& source) {
  const json& value = require_field(object, key, where, source);
  if (!value.is_object()) {
    calibration_error(source, concat("\"", where, key, "\" must be a JSON object, got ",
                                     describe_json_value(value)));
  }
  return value;
}

// Any JSON number; the range is checked by check_calibration().
double read_number(const json& object, const char* key, const std::string& where,
                   const std::string& source) {
  const json& value = require_field(object, key, where, source);
  if (!value.is_number()) {
    calibration_error(
        source, concat("\"", where, key, "\" must be a number, got ", describe_json_value(value)));
  }
  return value.get<double>();
}

int read_world_size(const json& object, const std::string& where, const std::string& source) {
  const json& value = require_field(object, "world_size", where, source);
  const auto fail = [&] {
    calibration_error(source, concat("\"", where, "world_size\" must be an integer >= 1, got ",
                                     describe_json_value(value)));
  };
  if (!value.is_number_integer()) fail();
  if (value.is_number_unsigned()) {
    if (value.get<std::uint64_t>() > static_cast<std::uint64_t>(INT_MAX)) fail();
  } else {
    const std::int64_t signed_value = value.get<std::int64_t>();
    if (signed_value < 1 || signed_value > INT_MAX) fail();
  }
  const int world_size = value.get<int>();
  if (world_size < 1) fail();
  return world_size;
}

std::string read_string(const json& object, const char* key, const std::string& where,
                        const std::string& source) {
  const json& value = require_field(object, key, where, source);
  if (!value.is_string()) {
    calibration_error(
        source, concat("\"", where, key, "\" must be a string, got ", describe_json_value(value)));
  }
  return value.get<std::string>();
}

// Range checks of a calibration, with messages naming the JSON field.
void check_calibration(const Calibration& calibration, const std::string& source) {
  const auto check_nonnegative = [&](double value, const std::string& field) {
    if (!finite_nonnegative(value)) {
      calibration_error(source,
                        concat("\"", field, "\" must be a finite number >= 0, got ", value));
    }
  };
  if (calibration.world_size < 1) {
    calibration_error(
        source, concat("\"world_size\" must be an integer >= 1, got ", calibration.world_size));
  }
  check_nonnegative(calibration.link.alpha, "link.alpha");
  check_nonnegative(calibration.link.beta, "link.beta");
  check_nonnegative(calibration.link.gamma, "link.gamma");
  for (const auto& [algorithm, cost] : calibration.measured) {
    if (!is_cost_model_algorithm(algorithm)) {
      calibration_error(source, concat("\"measured\" has unknown allreduce algorithm \"", algorithm,
                                       "\" (known: ", known_algorithms_text(), ")"));
    }
    check_nonnegative(cost.a, concat("measured.", algorithm, ".a"));
    check_nonnegative(cost.b, concat("measured.", algorithm, ".b"));
  }
  for (std::size_t i = 0; i < calibration.samples.size(); ++i) {
    const TimingSample& sample = calibration.samples[i];
    const std::string field = concat("samples[", i, "]");
    if (!is_cost_model_algorithm(sample.algorithm)) {
      calibration_error(source, concat("\"", field, ".algorithm\" is unknown: \"", sample.algorithm,
                                       "\" (known: ", known_algorithms_text(), ")"));
    }
    if (sample.world_size < 1) {
      calibration_error(source, concat("\"", field, ".world_size\" must be an integer >= 1, got ",
                                       sample.world_size));
    }
    check_nonnegative(sample.bytes, field + ".bytes");
    if (!std::isfinite(sample.seconds) || sample.seconds <= 0) {
      calibration_error(source, concat("\"", field, ".seconds\" must be a finite number > 0, got ",
                                       sample.seconds));
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Model.

std::vector<std::string> cost_model_algorithm_names() { return allreduce_algorithm_names(); }

bool is_cost_model_algorithm(std::string_view algorithm) { return find_allreduce_algorithm(algorithm) != nullptr; }

AllreduceCoefficients allreduce_coefficients(std::string_view algorithm, int world_size) {
  if (!is_cost_model_algorithm(algorithm)) {
    throw UsageError(concat("unknown allreduce algorithm '", algorithm,
                            "' (known: ", known_algorithms_text(), ")"));
  }
  if (world_size < 1) {
    throw UsageError(concat("allreduce cost of '", algorithm,
                            "': world size must be at least 1, got ", world_size));
  }
  if (world_size == 1) return {};
  return find_allreduce_algorithm(algorithm)->coefficients(world_size);
}

LinearCost allreduce_cost(std::string_view algorithm, int world_size, const LinkParameters& link) {
  const AllreduceCoefficients c = allreduce_coefficients(algorithm, world_size);
  return {c.messages * link.alpha, c.transferred * link.beta + c.reduced * link.gamma};
}

LinkParameters default_link_parameters() { return {20e-6, 0.4e-9, 0.25e-9}; }

// ---------------------------------------------------------------------------------------------
// Fits.

LinkFit fit_link_parameters(std::span<const TimingSample> samples, ResidualWeighting weighting) {
  if (samples.size() < 3) {
    throw DataError(
        concat("allreduce timing fit needs at least 3 samples (one per parameter alpha, "
               "beta, gamma), got ",
               samples.size()));
  }
  std::vector<Row> rows;
  std::vector<double> rhs;
  rows.reserve(samples.size());
  rhs.reserve(samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const TimingSample& sample = samples[i];
    check_sample(sample, i, 2, true);
    const AllreduceCoefficients c = allreduce_coefficients(sample.algorithm, sample.world_size);
    const double weight = residual_weight(sample, weighting);
    rows.push_back({c.messages * weight, c.transferred * sample.bytes * weight,
                    c.reduced * sample.bytes * weight});
    rhs.push_back(sample.seconds * weight);
  }
  const NonNegativeLeastSquares problem(rows, rhs, 3);
  const NonNegativeSolution solution = problem.solve();

  LinkFit fit;
  fit.link = {solution.x[0], solution.x[1], solution.x[2]};
  double sum_of_squares = 0;
  for (const TimingSample& sample : samples) {
    const double predicted =
        allreduce_cost(sample.algorithm, sample.world_size, fit.link).time(sample.bytes);
    const double relative = (predicted - sample.seconds) / sample.seconds;
    fit.predicted_seconds.push_back(predicted);
    fit.relative_residuals.push_back(relative);
    sum_of_squares += relative * relative;
  }
  fit.rms_relative_residual = std::sqrt(sum_of_squares / static_cast<double>(samples.size()));
  fit.unique = solution.full_rank;
  if (!fit.unique) {
    constexpr unsigned kBetaAndGamma = 0b110;
    fit.ambiguity =
        problem.dependent(kBetaAndGamma)
            ? "beta and gamma cannot be told apart: every sample transfers and reduces bytes in "
              "the same "
              "proportion (mix recursive-doubling timings with ring, tree or halving-doubling ones)"
            : "alpha, beta and gamma cannot all be told apart from these samples (add message "
              "sizes, world "
              "sizes or algorithms)";
  }
  return fit;
}

LinearCost fit_linear_cost(std::span<const TimingSample> samples, ResidualWeighting weighting) {
  if (samples.empty()) {
    throw DataError(
        "linear allreduce cost fit needs samples at two or more message sizes, got none");
  }
  const TimingSample& first = samples.front();
  std::set<double> sizes;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const TimingSample& sample = samples[i];
    if (sample.algorithm != first.algorithm || sample.world_size != first.world_size) {
      throw UsageError(concat("linear allreduce cost fit: samples mix ", first.algorithm, " on ",
                              first.world_size, " ranks with ", sample.algorithm, " on ",
                              sample.world_size,
                              " ranks (fit one algorithm and world size at a time)"));
    }
    check_sample(sample, i, 1, false);
    sizes.insert(sample.bytes);
  }
  if (sizes.size() < 2) {
    throw DataError(
        concat("linear allreduce cost fit of ", first.algorithm, " on ", first.world_size,
               " ranks needs samples at two or more message sizes, got ", sizes.size()));
  }
  std::vector<Row> rows;
  std::vector<double> rhs;
  for (const TimingSample& sample : samples) {
    const double weight = residual_weight(sample, weighting);
    rows.push_back({weight, sample.bytes * weight, 0});
    rhs.push_back(sample.seconds * weight);
  }
  const NonNegativeSolution solution = NonNegativeLeastSquares(rows, rhs, 2).solve();
  return {solution.x[0], solution.x[1]};
}

// ---------------------------------------------------------------------------------------------
// Calibration file.

nlohmann::json to_json(const Calibration& calibration) {
  json measured = json::object();
  for (const auto& [algorithm, cost] : calibration.measured) {
    measured[algorithm] = {{"a", cost.a}, {"b", cost.b}};
  }
  json samples = json::array();
  for (const TimingSample& sample : calibration.samples) {
    samples.push_back({{"algorithm", sample.algorithm},
                       {"world_size", sample.world_size},
                       {"bytes", sample.bytes},
                       {"seconds", sample.seconds}});
  }
  return {{"format", kCalibrationFormat},
          {"transport", calibration.transport},
          {"world_size", calibration.world_size},
          {"link",
           {{"alpha", calibration.link.alpha},
            {"beta", calibration.link.beta},
            {"gamma", calibration.link.gamma}}},
          {"measured", std::move(measured)},
          {"samples", std::move(samples)}};
}

Calibration calibration_from_json(const nlohmann::json& root, const std::string& source) {
  if (!root.is_object()) {
    calibration_error(source,
                      concat("top level must be a JSON object, got ", describe_json_value(root)));
  }
  reject_unknown_fields(root, {"format", "transport", "world_size", "link", "measured", "samples"},
                        "", source);
  const json& format = require_field(root, "format", "", source);
  if (!format.is_string() || format.get<std::string>() != kCalibrationFormat) {
    calibration_error(source, concat("\"format\" is ", describe_json_value(format), ", expected \"",
                                     kCalibrationFormat, "\""));
  }
  Calibration calibration;
  calibration.transport = read_string(root, "transport", "", source);
  calibration.world_size = read_world_size(root, "", source);
  const json& link = require_object(root, "link", "", source);
  reject_unknown_fields(link, {"alpha", "beta", "gamma"}, "link.", source);
  calibration.link.alpha = read_number(link, "alpha", "link.", source);
  calibration.link.beta = read_number(link, "beta", "link.", source);
  calibration.link.gamma = read_number(link, "gamma", "link.", source);
  if (root.contains("measured")) {
    const json& measured = require_object(root, "measured", "", source);
    for (auto it = measured.begin(); it != measured.end(); ++it) {
      const std::string where = concat("measured.", it.key(), ".");
      if (!it->is_object()) {
        calibration_error(source, concat("\"measured.", it.key(), "\" must be a JSON object, got ",
                                         describe_json_value(*it)));
      }
      reject_unknown_fields(*it, {"a", "b"}, where, source);
      calibration.measured[it.key()] = {read_number(*it, "a", where, source),
                                        read_number(*it, "b", where, source)};
    }
  }
  if (root.contains("samples")) {
    const json& samples = root.at("samples");
    if (!samples.is_array()) {
      calibration_error(
          source, concat("\"samples\" must be a JSON array, got ", describe_json_value(samples)));
    }
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const json& entry = samples[i];
      const std::string where = concat("samples[", i, "].");
      if (!entry.is_object()) {
        calibration_error(source, concat("\"samples[", i, "]\" must be a JSON object, got ",
                                         describe_json_value(entry)));
      }
      reject_unknown_fields(entry, {"algorithm", "world_size", "bytes", "seconds"}, where, source);
      TimingSample sample;
      sample.algorithm = read_string(entry, "algorithm", where, source);
      sample.world_size = read_world_size(entry, where, source);
      sample.bytes = read_number(entry, "bytes", where, source);
      sample.seconds = read_number(entry, "seconds", where, source);
      calibration.samples.push_back(std::move(sample));
    }
  }
  check_calibration(calibration, source);
  return calibration;
}

void save_calibration(const Calibration& calibration, const std::string& path) {
  check_calibration(calibration, concat("cannot save calibration to '", path, "'"));
  const std::string text = to_json(calibration).dump(2) + "\n";
  write_file_atomically(path, text, "calibration file");
}

Calibration load_calibration(const std::string& path) {
  const std::string source = concat("calibration file '", path, "'");
  const json root = read_json_file(path, source);
  return calibration_from_json(root, source);
}

// ---------------------------------------------------------------------------------------------
// Choice.

double predict_allreduce_seconds(const Calibration& calibration, std::string_view algorithm,
                                 int world_size, double bytes) {
  // Validates the algorithm and world size even when a measurement answers.
  const LinearCost model = allreduce_cost(algorithm, world_size, calibration.link);
  if (world_size == calibration.world_size) {
    // Inside the measured range: interpolate the measured times themselves (linearly in log
    // bytes and log time), which follows the curve between the sizes where one straight line
    // a + b*M fitted over four decades is off by tens of percent.
    const TimingSample* below = nullptr;
    const TimingSample* above = nullptr;
    for (const TimingSample& sample : calibration.samples) {
      if (sample.algorithm != algorithm || sample.world_size != world_size) continue;
      if (sample.bytes <= bytes && (!below || sample.bytes > below->bytes)) below = &sample;
      if (sample.bytes >= bytes && (!above || sample.bytes < above->bytes)) above = &sample;
    }
    if (below && above && below->seconds > 0 && above->seconds > 0) {
      if (above->bytes == below->bytes || bytes <= 0) return below->seconds;
      const double position =
          std::log(bytes / below->bytes) / std::log(above->bytes / below->bytes);
      return below->seconds * std::pow(above->seconds / below->seconds, position);
    }
    const auto measured = calibration.measured.find(std::string(algorithm));
    if (measured != calibration.measured.end()) return measured->second.time(bytes);
  }
  return model.time(bytes);
}

namespace {

template <typename Predict>
std::string choose_least(std::span<const std::string> candidates, int world_size, double bytes,
                         const Predict& predict) {
  if (candidates.empty()) throw UsageError("choosing an allreduce algorithm: no candidates given");
  if (world_size < 1) {
    throw UsageError(
        concat("choosing an allreduce algorithm: world size must be at least 1, got ", world_size));
  }
  if (!finite_nonnegative(bytes)) {
    throw UsageError(
        concat("choosing an allreduce algorithm: bytes must be finite and >= 0, got ", bytes));
  }
  const std::string* best = nullptr;
  double best_seconds = 0;
  for (const std::string& candidate : candidates) {
    const double seconds = predict(candidate);
    if (best == nullptr || seconds < best_seconds) {  // strict: ties keep the earlier candidate
      best = &candidate;
      best_seconds = seconds;
    }
  }
  return *best;
}

}  // namespace

std::string choose_allreduce_algorithm(const LinkParameters& link, int world_size, double bytes,
                                       std::span<const std::string> candidates) {
  return choose_least(candidates, world_size, bytes, [&](const std::string& algorithm) {
    return allreduce_cost(algorithm, world_size, link).time(bytes);
  });
}

std::string choose_allreduce_algorithm(const Calibration& calibration, int world_size, double bytes,
                                       std::span<const std::string> candidates) {
  return choose_least(candidates, world_size, bytes, [&](const std::string& algorithm) {
    return predict_allreduce_seconds(calibration, algorithm, world_size, bytes);
  });
}

}  // namespace pipesgd
