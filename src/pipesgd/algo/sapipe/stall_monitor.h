#pragma once
// SAPipe's stall checks (--stale-layers auto; algo/sapipe/sapipe.h): the timeline's cost is
// measured in isolation, while pipelined the communication shares the cores with computation and
// may take longer. So every window of kStallCheckIterations pipelined iterations (the first after
// 2 to settle) is measured; if the computation waited more than kStallTolerance of the iteration
// time (averaged over the workers, one small allreduce so every worker decides alike), k is raised.
// k only grows, so the checks end by k = m. Compute thread only.
#include <cstdint>
#include <string>
#include <vector>

#include "pipesgd/core/checkpoint.h"

namespace pipesgd {

inline constexpr std::int64_t kStallCheckIterations = 20;
inline constexpr double kStallTolerance = 0.05;
// The pipeline settles for this many iterations before a window starts.
inline constexpr std::int64_t kStallCheckSettle = 2;

// One stall check.
struct StallCheck {
  std::int64_t iteration = 0;      // the check ran at the end of this iteration
  std::size_t stale_layers = 0;    // k checked
  double stall_fraction = 0;       // computation's wait / iteration time (mean over the workers)
  double cost_scale = 1;           // measured / modelled communication
  std::size_t next_stale_layers = 0;  // k after the check (== stale_layers: kept)
};

class StallMonitor {
 public:
  // Starts watching at iteration `start` (a pipeline start + kStallCheckSettle); stop() ends it.
  void watch_from(std::int64_t start) { check_start_ = start; }
  void stop() { check_start_ = -1; }
  bool watching(std::int64_t t) const { return check_start_ >= 0 && t >= check_start_; }
  // True while the first window has not passed: the partition may still change.
  bool first_window_pending() const { return check_start_ >= 0 && !monitoring_; }
  // A check has passed since (later windows go on watching, the history is no longer kept).
  bool monitoring() const { return monitoring_; }

  // Adds pipelined iteration t's wait, iteration time and communication to the window; true when
  // the window is complete (then sums() holds its sums).
  bool add(std::int64_t t, double wait, double iteration, double comm);
  // The window's sums (wait, iteration, comm), to be summed over the workers.
  float* sums() { return sums_; }
  // The planning-exchange sequence of the next check (1, 2, ...).
  std::uint64_t next_sequence() { return static_cast<std::uint64_t>(1 + checks_made_++); }
  // Decides from the window's sums over the workers (iteration t, k checked, the communication the
  // model predicts per iteration over `workers` workers): passed, or stalled with the cost scale.
  StallCheck check(std::int64_t t, std::size_t stale_layers, double modelled_communication, int workers);
  // After a check: a pass is recorded once per k and watching goes on; a raise (to `raised` layers)
  // is recorded, and watching restarts after the new pipeline's start unless every layer is stale.
  void passed(const StallCheck& check, std::int64_t t);
  void raised(StallCheck check, std::int64_t t, std::size_t raised, std::size_t layers);

  const std::vector<StallCheck>& checks() const { return checks_; }

  // Checkpoint sections `prefix` + ...; load checks them against `next_iteration` and `layers`.
  void save(CheckpointWriter& out, const std::string& prefix) const;
  void load(const CheckpointReader& in, const std::string& prefix, std::int64_t next_iteration, std::size_t layers,
            bool automatic);

 private:
  std::int64_t check_start_ = -1;  // -1: not watching
  double wait_ = 0, iteration_ = 0, comm_ = 0;
  float sums_[3] = {0, 0, 0};
  std::int64_t checks_made_ = 0;
  bool monitoring_ = false;
  std::vector<StallCheck> checks_;
};

}  // namespace pipesgd
