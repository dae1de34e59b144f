#include "pipesgd/timing/partial_staleness.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

void validate(const StalenessProfile& profile, const LinearCost& cost) {
  const std::size_t m = profile.forward_seconds.size();
  if (m == 0) throw UsageError("partial staleness: the model has no layers");
  if (profile.backward_seconds.size() != m || profile.bytes.size() != m) {
    throw UsageError(concat("partial staleness: ", m, " forward times, ", profile.backward_seconds.size(),
                            " backward times and ", profile.bytes.size(), " gradient sizes"));
  }
  auto check = [](double value, const char* what) {
    if (!std::isfinite(value) || value < 0) {
      throw UsageError(concat("partial staleness: ", what, " ", value, " is negative or not finite"));
    }
  };
  for (std::size_t i = 0; i < m; ++i) {
    check(profile.forward_seconds[i], "forward time");
    check(profile.backward_seconds[i], "backward time");
    check(profile.bytes[i], "gradient bytes");
  }
  check(cost.a, "a");
  check(cost.b, "b");
}

}  // namespace

namespace {

// One allreduce of layers [begin, end), launched when backward has finished layer `begin`.
struct CommunicationGroup {
  std::size_t begin = 0, end = 0;
};

// The timeline with the layers' communication in `groups` (backward order, covering 0..m-1).
StalenessTimeline simulate_groups(const StalenessProfile& profile, const LinearCost& cost,
                                  std::size_t stale_layers, const std::vector<CommunicationGroup>& groups,
                                  int iterations) {
  const std::size_t m = profile.forward_seconds.size();
  if (iterations < 3) throw UsageError("partial staleness: simulate at least 3 iterations");
  // group_of[i]: the group holding layer i; group_bytes: each group's bytes.
  std::vector<std::size_t> group_of(m);
  std::vector<double> group_seconds(groups.size(), 0);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    double bytes = 0;
    for (std::size_t i = groups[g].begin; i < groups[g].end; ++i) {
      group_of[i] = g;
      bytes += profile.bytes[i];
    }
    group_seconds[g] = cost.time(bytes);
  }
  // finish[parity][g]: when group g's aggregated gradient of an iteration of that parity is ready
  // (-inf: before the run, i.e. available at once).
  const double never = -std::numeric_limits<double>::infinity();
  std::vector<double> finish[2] = {std::vector<double>(groups.size(), never),
                                   std::vector<double>(groups.size(), never)};
  double clock = 0;          // the computation's time
  double channel_free = 0;   // the comm channel's
  StalenessTimeline result;
  for (double u : profile.forward_seconds) result.compute += u;
  for (double b : profile.backward_seconds) result.compute += b;
  for (int t = 0; t < iterations; ++t) {
    const double start = clock;
    double wait = 0;
    for (std::size_t i = 0; i < m; ++i) {
      // Synchronous layers need iteration t-1's gradient, stale ones t-2's.
      const int needed = i < stale_layers ? t - 2 : t - 1;
      const double ready = needed < 0 ? never : finish[needed % 2][group_of[i]];
      if (ready > clock) {
        wait += ready - clock;
        clock = ready;
      }
      clock += profile.forward_seconds[i];
    }
    std::size_t next_group = 0;
    for (std::size_t i = m; i-- > 0;) {
      clock += profile.backward_seconds[i];
      while (next_group < groups.size() && groups[next_group].begin == i) {
        const double begin = std::max(channel_free, clock);
        channel_free = begin + group_seconds[next_group];
        finish[t % 2][next_group] = channel_free;
        ++next_group;
      }
    }
    result.iteration = clock - start;
    result.wait = wait;
  }
  result.stalls = result.wait > 1e-9 * std::max(result.iteration, 1e-12);
  return result;
}

void check_stale_layers(std::size_t stale_layers, std::size_t m) {
  if (stale_layers > m) {
    throw UsageError(concat("partial staleness: ", stale_layers, " stale layers of ", m));
  }
}

}  // namespace

StalenessTimeline simulate_partial_staleness(const StalenessProfile& profile, const LinearCost& cost,
                                             std::size_t stale_layers, int iterations) {
  validate(profile, cost);
  const std::size_t m = profile.forward_seconds.size();
  check_stale_layers(stale_layers, m);
  std::vector<CommunicationGroup> groups;
  for (std::size_t i = m; i-- > 0;) groups.push_back({i, i + 1});
  return simulate_groups(profile, cost, stale_layers, groups, iterations);
}

StalenessTimeline simulate_bucketed_staleness(const StalenessProfile& profile, const LinearCost& cost,
                                              std::size_t stale_layers, const BucketPlan& sync_plan,
                                              int iterations) {
  validate(profile, cost);
  const std::size_t m = profile.forward_seconds.size();
  check_stale_layers(stale_layers, m);
  std::vector<CommunicationGroup> groups;
  if (stale_layers < m) {
    std::size_t expected_end = m;
    for (const Bucket& bucket : sync_plan.buckets) {
      const std::size_t begin = stale_layers + bucket.begin, end = stale_layers + bucket.end;
      if (end != expected_end || begin >= end || begin < stale_layers) {
        throw UsageError(concat("partial staleness: plan '", sync_plan.name,
                                "' does not cover the synchronous layers ", stale_layers, "..", m - 1,
                                " in backward order"));
      }
      groups.push_back({begin, end});
      expected_end = begin;
    }
    if (expected_end != stale_layers) {
      throw UsageError(concat("partial staleness: plan '", sync_plan.name, "' leaves layers ",
                              stale_layers, "..", expected_end - 1, " out"));
    }
  }
  if (stale_layers > 0) groups.push_back({0, stale_layers});
  return simulate_groups(profile, cost, stale_layers, groups, iterations);
}

LayerProfile synchronous_layer_profile(const StalenessProfile& profile, std::size_t first) {
  LayerProfile sub;
  for (double u : profile.forward_seconds) sub.forward_seconds += u;
  for (std::size_t i = first; i < profile.backward_seconds.size(); ++i) {
    sub.bytes.push_back(profile.bytes[i]);
    sub.backward_seconds.push_back(profile.backward_seconds[i]);
  }
  return sub;
}

StalenessPlan plan_partial_staleness(const StalenessProfile& profile, const LinearCost& cost,
                                     const std::string& plan_name) {
  validate(profile, cost);
  check_bucket_plan_name(plan_name);
  const std::size_t m = profile.forward_seconds.size();
  StalenessPlan plan;
  for (std::size_t k = 0; k <= m; ++k) {
    BucketPlan sync_plan;
    if (k < m) sync_plan = make_bucket_plan(plan_name, synchronous_layer_profile(profile, k), cost);
    const StalenessTimeline timeline = simulate_bucketed_staleness(profile, cost, k, sync_plan);
    if (!timeline.stalls || k == m) {
      plan.stale_layers = k;
      plan.sync_plan = std::move(sync_plan);
      plan.stalls = timeline.stalls;
      plan.timeline = timeline;
      return plan;
    }
  }
  return plan;  // not reached: k = m returns
}

std::size_t minimal_stale_layers(const StalenessProfile& profile, const LinearCost& cost) {
  validate(profile, cost);
  std::size_t low = 0, high = profile.forward_seconds.size();  // answer in [low, high]
  while (low < high) {
    const std::size_t middle = (low + high) / 2;
    if (simulate_partial_staleness(profile, cost, middle).stalls) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  return low;
}

std::optional<std::size_t> paper_stale_layers(const StalenessProfile& profile, const LinearCost& cost) {
  validate(profile, cost);
  const std::size_t m = profile.forward_seconds.size();
  double communication = 0, backward = 0, forward = 0;
  for (std::size_t i = 0; i < m; ++i) {
    communication += cost.time(profile.bytes[i]);
    backward += profile.backward_seconds[i];
    forward += profile.forward_seconds[i];
  }
  if (communication > backward + forward) return std::nullopt;
  // sum_{i<m} b_i: every backward time but the last layer's (its communication starts after it).
  const double hidden_by_backward = backward - profile.backward_seconds[m - 1];
  double synchronous = communication;  // sum of v_i over layers k+1..m, k = 0
  double stale_forward = 0;            // sum of u_i over layers 1..k
  for (std::size_t k = 0; k <= m; ++k) {
    if (synchronous <= hidden_by_backward + stale_forward) return k;
    if (k < m) {
      synchronous -= cost.time(profile.bytes[k]);
      stale_forward += profile.forward_seconds[k];
    }
  }
  return m;
}

}  // namespace pipesgd
