#include "pipesgd/algo/sapipe/stall_monitor.h"

#include <algorithm>

#include "pipesgd/core/error.h"

namespace pipesgd {

bool StallMonitor::add(std::int64_t t, double wait, double iteration, double comm) {
  wait_ += wait;
  iteration_ += iteration;
  comm_ += comm;
  if (t + 1 < check_start_ + kStallCheckIterations) return false;
  sums_[0] = static_cast<float>(wait_);
  sums_[1] = static_cast<float>(iteration_);
  sums_[2] = static_cast<float>(comm_);
  wait_ = iteration_ = comm_ = 0;
  return true;
}

StallCheck StallMonitor::check(std::int64_t t, std::size_t stale_layers, double modelled_communication, int workers) {
  StallCheck check;
  check.iteration = t;
  check.stale_layers = stale_layers;
  check.stall_fraction = sums_[1] > 0 ? sums_[0] / sums_[1] : 0.0;
  const double modelled = modelled_communication * kStallCheckIterations * workers;
  check.cost_scale = modelled > 0 ? std::max(1.0, static_cast<double>(sums_[2]) / modelled) : 1.0;
  check.next_stale_layers = stale_layers;
  return check;
}

void StallMonitor::passed(const StallCheck& check, std::int64_t t) {
  // Kept. Reported once per k; the run goes on being watched, window after window.
  if (checks_.empty() || checks_.back().next_stale_layers != check.stale_layers ||
      checks_.back().stale_layers != check.stale_layers) {
    checks_.push_back(check);
  }
  monitoring_ = true;
  check_start_ = t + 1;
}

void StallMonitor::raised(StallCheck check, std::int64_t t, std::size_t raised, std::size_t layers) {
  check.next_stale_layers = raised;
  checks_.push_back(check);
  check_start_ = raised < layers ? t + 1 + kStallCheckSettle : -1;
}

void StallMonitor::save(CheckpointWriter& out, const std::string& prefix) const {
  out.add_int(prefix + "check_start", check_start_);
  out.add_int(prefix + "checks_made", checks_made_);
  out.add_int(prefix + "monitoring", monitoring_ ? 1 : 0);
  out.add_double(prefix + "window.wait", wait_);
  out.add_double(prefix + "window.iteration", iteration_);
  out.add_double(prefix + "window.comm", comm_);
  std::vector<double> iterations, stale, fractions, scales, next;
  for (const StallCheck& check : checks_) {
    iterations.push_back(static_cast<double>(check.iteration));
    stale.push_back(static_cast<double>(check.stale_layers));
    fractions.push_back(check.stall_fraction);
    scales.push_back(check.cost_scale);
    next.push_back(static_cast<double>(check.next_stale_layers));
  }
  out.add_doubles(prefix + "checks.iteration", iterations);
  out.add_doubles(prefix + "checks.stale_layers", stale);
  out.add_doubles(prefix + "checks.stall_fraction", fractions);
  out.add_doubles(prefix + "checks.cost_scale", scales);
  out.add_doubles(prefix + "checks.next_stale_layers", next);
}

void StallMonitor::load(const CheckpointReader& in, const std::string& prefix, std::int64_t next_iteration,
                        std::size_t layers, bool automatic) {
  auto refuse = [&](const std::string& why) { return DataError(concat("checkpoint '", in.origin(), "': ", why)); };
  const std::int64_t check_start = in.integer(prefix + "check_start");
  const std::int64_t checks_made = in.integer(prefix + "checks_made");
  if (check_start < -1 || (check_start >= 0 && (!automatic || check_start > next_iteration + kStallCheckSettle)) ||
      checks_made < 0 || checks_made > next_iteration) {
    throw refuse(concat("stall check state (window from ", check_start, ", ", checks_made,
                        " checks) impossible before iteration ", next_iteration));
  }
  const bool monitoring = in.flag(prefix + "monitoring");
  const std::vector<double> iterations = in.doubles(prefix + "checks.iteration");
  const std::size_t count = iterations.size();
  const std::vector<double> stale = in.doubles(prefix + "checks.stale_layers", count);
  const std::vector<double> fractions = in.doubles(prefix + "checks.stall_fraction", count);
  const std::vector<double> scales = in.doubles(prefix + "checks.cost_scale", count);
  const std::vector<double> next = in.doubles(prefix + "checks.next_stale_layers", count);
  std::vector<StallCheck> checks;
  for (std::size_t c = 0; c < count; ++c) {
    const auto layer_count = static_cast<double>(layers);
    if (iterations[c] < 0 || iterations[c] >= static_cast<double>(next_iteration) || stale[c] < 0 ||
        stale[c] > layer_count || next[c] < 0 || next[c] > layer_count) {
      throw refuse(concat("stall check ", c, " (iteration ", iterations[c], ", k ", stale[c], " -> ", next[c],
                          ") impossible before iteration ", next_iteration));
    }
    checks.push_back({static_cast<std::int64_t>(iterations[c]), static_cast<std::size_t>(stale[c]), fractions[c],
                      scales[c], static_cast<std::size_t>(next[c])});
  }
  check_start_ = check_start;
  checks_made_ = checks_made;
  monitoring_ = monitoring;
  wait_ = in.real(prefix + "window.wait");
  iteration_ = in.real(prefix + "window.iteration");
  comm_ = in.real(prefix + "window.comm");
  checks_ = std::move(checks);
}

}  // namespace pipesgd
