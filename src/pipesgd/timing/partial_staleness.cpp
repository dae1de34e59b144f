#include "pipesgd/timing/partial_staleness.h"

#include <algorithm>
#include <cmath>

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

StalenessTimeline simulate_partial_staleness(const StalenessProfile& profile, const LinearCost& cost,
                                             std::size_t stale_layers, int iterations) {
  validate(profile, cost);
  const std::size_t m = profile.forward_seconds.size();
  if (stale_layers > m) {
    throw UsageError(concat("partial staleness: ", stale_layers, " stale layers of ", m));
  }
  if (iterations < 3) throw UsageError("partial staleness: simulate at least 3 iterations");
  // finish[parity][i]: when layer i's aggregated gradient of an iteration of that parity is ready
  // (-inf: before the run, i.e. available at once).
  const double never = -std::numeric_limits<double>::infinity();
  std::vector<double> finish[2] = {std::vector<double>(m, never), std::vector<double>(m, never)};
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
      const double ready = needed < 0 ? never : finish[needed % 2][i];
      if (ready > clock) {
        wait += ready - clock;
        clock = ready;
      }
      clock += profile.forward_seconds[i];
    }
    for (std::size_t i = m; i-- > 0;) {
      clock += profile.backward_seconds[i];
      const double begin = std::max(channel_free, clock);
      channel_free = begin + cost.time(profile.bytes[i]);
      finish[t % 2][i] = channel_free;
    }
    result.iteration = clock - start;
    result.wait = wait;
  }
  result.stalls = result.wait > 1e-9 * std::max(result.iteration, 1e-12);
  return result;
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
