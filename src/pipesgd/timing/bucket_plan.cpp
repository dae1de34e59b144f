#include "pipesgd/timing/bucket_plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr double kBytesPerMebibyte = 1024.0 * 1024.0;
constexpr const char* kFixedPrefix = "fixed:";

void require_finite_non_negative(double value, const std::string& what) {
  if (!std::isfinite(value) || value < 0)
    throw UsageError(concat(what, " is ", value, "; it must be finite and >= 0"));
}

void validate_cost(const LinearCost& cost) {
  require_finite_non_negative(cost.a, "allreduce cost: a");
  require_finite_non_negative(cost.b, "allreduce cost: b");
}

void require_layers(std::size_t layers) {
  if (layers == 0) throw UsageError("the model has no layers");
}

// The bytes of segments [begin, end), summed from `begin` upwards. optimal_plan() accumulates in the
// same order, so its values and simulate_plan()'s agree to the last bit.
double bucket_bytes(const LayerProfile& profile, const Bucket& bucket) {
  double bytes = 0;
  for (std::size_t segment = bucket.begin; segment < bucket.end; ++segment)
    bytes += profile.bytes[segment];
  return bytes;
}

void validate_plan(const BucketPlan& plan, std::size_t layers) {
  const auto fail = [&](const std::string& reason) {
    throw UsageError(concat("bucket plan \"", plan.name, "\" does not cover segments 0..",
                            layers - 1, " in backward order: ", reason));
  };
  if (plan.buckets.empty()) fail("it has no buckets");
  std::size_t expected_end = layers;
  for (std::size_t index = 0; index < plan.buckets.size(); ++index) {
    const Bucket& bucket = plan.buckets[index];
    if (bucket.end != expected_end)
      fail(concat("bucket ", index, " is [", bucket.begin, ", ", bucket.end, ") but should end at ",
                  expected_end));
    if (bucket.begin >= bucket.end)
      fail(concat("bucket ", index, " is [", bucket.begin, ", ", bucket.end, "), which is empty"));
    expected_end = bucket.begin;
  }
  if (expected_end != 0) fail(concat("the last bucket begins at ", expected_end, ", not 0"));
}

std::string format_mebibytes(double bucket_bytes) {
  return concat(kFixedPrefix, bucket_bytes / kBytesPerMebibyte);
}

}  // namespace

void validate_layer_profile(const LayerProfile& profile) {
  require_layers(profile.bytes.size());
  if (profile.bytes.size() != profile.backward_seconds.size())
    throw UsageError(concat("layer profile: ", profile.bytes.size(), " gradient sizes but ",
                            profile.backward_seconds.size(), " backward times"));
  for (std::size_t segment = 0; segment < profile.bytes.size(); ++segment) {
    require_finite_non_negative(profile.bytes[segment],
                                concat("layer profile: segment ", segment, "'s gradient bytes"));
    require_finite_non_negative(profile.backward_seconds[segment],
                                concat("layer profile: segment ", segment, "'s backward time"));
  }
  require_finite_non_negative(profile.forward_seconds, "layer profile: the forward time");
  require_finite_non_negative(profile.per_bucket_compute_seconds,
                              "layer profile: the per-bucket compute time");
}

PlanTimeline simulate_plan(const LayerProfile& profile, const LinearCost& cost,
                           const BucketPlan& plan) {
  validate_layer_profile(profile);
  validate_cost(cost);
  validate_plan(plan, profile.bytes.size());

  PlanTimeline timeline;
  double backward_clock = profile.forward_seconds;  // backward runs from t_f, segment L-1 first
  double channel_free = 0;                          // the previous bucket's finish
  for (const Bucket& bucket : plan.buckets) {
    for (std::size_t segment = bucket.end; segment-- > bucket.begin;)
      backward_clock += profile.backward_seconds[segment];
    const double transfer = cost.time(bucket_bytes(profile, bucket));
    const double start = std::max(channel_free, backward_clock);
    channel_free = start + transfer;
    timeline.ready.push_back(backward_clock);
    timeline.start.push_back(start);
    timeline.finish.push_back(channel_free);
    timeline.communication += transfer;
    // The allreduce launched now runs beside the rest of backward and slows it by kappa.
    if (&bucket != &plan.buckets.back()) backward_clock += profile.per_bucket_compute_seconds;
  }
  timeline.backward_end = backward_clock;
  timeline.iteration = channel_free;
  PIPESGD_ASSERT(timeline.iteration >= timeline.backward_end);
  timeline.non_overlapped = timeline.iteration - timeline.backward_end;
  return timeline;
}

WfbpCase classify_wfbp(const LayerProfile& profile, const LinearCost& cost) {
  const std::size_t layers = profile.bytes.size();
  const PlanTimeline timeline = simulate_plan(profile, cost, wfbp_plan(layers));
  WfbpCase result;
  const std::size_t last = layers - 1;  // launch index of segment 0 (paper layer 1)
  if (timeline.start[last] <= timeline.ready[last]) {
    // Layer 1's communication starts as backward ends: Eq. 11 / 12.
    result.number = 2;
    bool hidden = true;  // t_c(l) <= t_b(l-1) for every l >= 2, i.e. segment s >= 1 vs s - 1
    for (std::size_t segment = 1; segment < layers; ++segment) {
      hidden = hidden && cost.time(profile.bytes[segment]) <= profile.backward_seconds[segment - 1];
    }
    if (hidden) result.number = 1;
    result.iteration = timeline.backward_end + cost.time(profile.bytes[0]);
    return result;
  }
  // Case 3: the last launch k whose bucket found the channel idle; from it on the channel is busy.
  std::size_t k = last;
  while (k > 0 && timeline.start[k] > timeline.ready[k]) --k;
  result.number = 3;
  const std::size_t segment = layers - 1 - k;  // wfbp launches segment L-1-k at index k
  result.communication_bound_layer = segment + 1;
  double communication = 0;
  for (std::size_t j = k; j <= last; ++j) communication += timeline.finish[j] - timeline.start[j];
  result.iteration = timeline.ready[k] + communication;
  return result;
}

BucketPlan wfbp_plan(std::size_t layers) {
  require_layers(layers);
  BucketPlan plan{"wfbp", {}};
  for (std::size_t segment = layers; segment-- > 0;) plan.buckets.push_back({segment, segment + 1});
  return plan;
}

BucketPlan single_plan(std::size_t layers) {
  require_layers(layers);
  return BucketPlan{"single", {{0, layers}}};
}

BucketPlan fixed_size_plan(const LayerProfile& profile, double bucket_bytes_cap) {
  validate_layer_profile(profile);
  if (!std::isfinite(bucket_bytes_cap) || bucket_bytes_cap <= 0)
    throw UsageError(concat("the bucket size is ", bucket_bytes_cap,
                            " bytes; it must be finite and > 0"));
  BucketPlan plan{format_mebibytes(bucket_bytes_cap), {}};
  std::size_t end = profile.bytes.size();
  double filled = 0;
  for (std::size_t segment = end; segment-- > 0;) {
    filled += profile.bytes[segment];
    if (filled >= bucket_bytes_cap || segment == 0) {
      plan.buckets.push_back({segment, end});
      end = segment;
      filled = 0;
    }
  }
  return plan;
}

BucketPlan mgwfbp_plan(const LayerProfile& profile, const LinearCost& cost) {
  validate_layer_profile(profile);
  validate_cost(cost);
  // Algorithm 1 in the paper's numbering: index l = layer l = segment l-1, l = 1..L.
  const std::size_t L = profile.bytes.size();
  std::vector<double> p(L + 1), tb(L + 1), tc(L + 1);
  for (std::size_t l = 1; l <= L; ++l) {
    p[l] = profile.bytes[l - 1];
    tb[l] = profile.backward_seconds[l - 1];
    tc[l] = cost.time(p[l]);
  }
  // tau_b[l]: backward start of layer l (Eq. 6). tau_b[0] = tau_b[1] + tb[1] is the end of
  // backward, which Eq. 27 needs at l = 2 (Algorithm 1 leaves it undefined).
  std::vector<double> tau_b(L + 1);
  tau_b[L] = profile.forward_seconds;
  for (std::size_t l = L; l-- > 0;) tau_b[l] = tau_b[l + 1] + tb[l + 1];

  // CALCULATECOMMSTART (Eq. 7 with the merged layers' tc = 0, i.e. Eq. 15).
  std::vector<double> tau_c(L + 1);
  const auto calculate_comm_start = [&] {
    tau_c[L] = tau_b[L] + tb[L];
    for (std::size_t l = L - 1; l >= 1; --l)
      tau_c[l] = std::max(tau_c[l + 1] + tc[l + 1], tau_b[l] + tb[l]);
  };
  calculate_comm_start();

  std::vector<bool> merged_into_previous(L + 1, false);
  for (std::size_t l = L; l >= 2; --l) {
    // Eq. 27 and the proof of Theorem 1 test tau_b[l-2] - tau_c[l] < a. Algorithm 1's line 13
    // prints tc[l] (the communication time) in place of tau_c[l]; that is a typo: a start time
    // must be compared with tau_b[l-2], the time layer l-1's gradient is ready.
    if (tau_b[l - 2] - tau_c[l] < cost.a) {
      // MERGE: layer l travels with layer l-1 (Eq. 14, 16).
      tc[l] = 0;
      p[l - 1] += p[l];
      tc[l - 1] = cost.time(p[l - 1]);
      calculate_comm_start();
      merged_into_previous[l] = true;
    }
  }

  // Layer l in M joins layer l-1's bucket (transitively); a layer not in M ends its bucket.
  // Layer 1 is never in M, so the last bucket begins at segment 0.
  BucketPlan plan{"mgwfbp", {}};
  std::size_t end = L;
  for (std::size_t segment = L; segment-- > 0;) {
    if (!merged_into_previous[segment + 1]) {
      plan.buckets.push_back({segment, end});
      end = segment;
    }
  }
  PIPESGD_ASSERT(end == 0);
  return plan;
}

namespace {

// Among the plans whose last finish equals `least` (the optimum), one with the fewest buckets: a
// second dynamic programme over the bucket count k, finish[k][j] = the least finish of a k-bucket
// plan of the first j layers (the same monotone recurrence, so exact for each k), stopped at the
// first k that reaches `least`. Returns its last_bucket_after table, or empty if L exceeds
// kMaxLayersForFewestBuckets (O(L^2) per k, O(L^3) at worst).
constexpr std::size_t kMaxLayersForFewestBuckets = 512;

// With least = infinity (kappa > 0): runs every k and returns the table of the least finish over
// all k (the fewest buckets among equals), the ready time of the k-th bucket's layers shifted by
// kappa (k - 1).
std::vector<std::size_t> fewest_buckets_at(const LayerProfile& profile, const LinearCost& cost,
                                           const std::vector<double>& ready, double least) {
  const std::size_t L = profile.bytes.size();
  if (L > kMaxLayersForFewestBuckets) return {};
  const double kappa = profile.per_bucket_compute_seconds;
  const bool search_all = least == std::numeric_limits<double>::infinity();
  double best = std::numeric_limits<double>::infinity();
  std::size_t best_k = 0;
  const double infinity = std::numeric_limits<double>::infinity();
  std::vector<double> previous(L + 1, infinity), current(L + 1, infinity);
  previous[0] = 0;  // zero buckets cover zero layers, channel free
  std::vector<std::vector<std::size_t>> after;  // after[k-1][j]: i of the k-bucket plan's last bucket
  for (std::size_t k = 1; k <= L; ++k) {
    std::fill(current.begin(), current.end(), infinity);
    std::vector<std::size_t> choice(L + 1, 0);
    for (std::size_t j = k; j <= L; ++j) {
      double bytes = 0;
      for (std::size_t i = j; i-- > k - 1;) {
        bytes += profile.bytes[L - (i + 1)];
        if (previous[i] == infinity) continue;
        // The k-th bucket's layers are ready kappa later for each of the k - 1 buckets before it.
        const double shifted = ready[j] + kappa * static_cast<double>(k - 1);
        const double finish = std::max(previous[i], shifted) + cost.time(bytes);
        if (finish <= current[j]) {
          current[j] = finish;
          choice[j] = i;
        }
      }
    }
    after.push_back(std::move(choice));
    if (current[L] < best) {
      best = current[L];
      best_k = k;
    }
    if (!search_all && current[L] <= least) break;
    std::swap(previous, current);
  }
  PIPESGD_ASSERT(best_k > 0);
  // Rebuild the best_k-bucket plan's boundaries as a last_bucket_after table.
  std::vector<std::size_t> table(L + 1, 0);
  std::size_t j = L;
  for (std::size_t buckets = best_k; buckets > 0; --buckets) {
    const std::size_t i = after[buckets - 1][j];
    table[j] = i;
    j = i;
  }
  PIPESGD_ASSERT(j == 0);
  return table;
}

}  // namespace

BucketPlan optimal_plan(const LayerProfile& profile, const LinearCost& cost) {
  validate_layer_profile(profile);
  validate_cost(cost);
  // Layers in backward order: the j-th computed (j = 1..L) is segment L-j, ready at
  // ready[j] = t_f + its and the earlier-computed layers' backward times.
  const std::size_t L = profile.bytes.size();
  std::vector<double> ready(L + 1);
  ready[0] = profile.forward_seconds;
  for (std::size_t j = 1; j <= L; ++j) ready[j] = ready[j - 1] + profile.backward_seconds[L - j];

  // best_finish[j]: the least finish of the last bucket over all plans of the first j layers;
  // last_bucket_after[j]: the i of that plan's last bucket (i..j]. best_finish[0] = 0 stands for
  // "the channel is free" (every ready time is >= 0).
  std::vector<double> best_finish(L + 1, std::numeric_limits<double>::infinity());
  std::vector<std::size_t> last_bucket_after(L + 1, 0);
  best_finish[0] = 0;
  for (std::size_t j = 1; j <= L; ++j) {
    double bytes = 0;  // of layers i+1..j, summed from segment L-j upwards as bucket_bytes() does
    for (std::size_t i = j; i-- > 0;) {
      bytes += profile.bytes[L - (i + 1)];
      const double finish = std::max(best_finish[i], ready[j]) + cost.time(bytes);
      // `<=` while i decreases: ties go to the smallest i, the longest last bucket.
      if (finish <= best_finish[j]) {
        best_finish[j] = finish;
        last_bucket_after[j] = i;
      }
    }
  }

  BucketPlan plan{"optimal", {}};
  const std::vector<std::size_t> fewest = fewest_buckets_at(
      profile, cost, ready,
      profile.per_bucket_compute_seconds > 0 ? std::numeric_limits<double>::infinity() : best_finish[L]);
  const std::vector<std::size_t>& after = fewest.empty() ? last_bucket_after : fewest;
  for (std::size_t j = L; j > 0; j = after[j]) plan.buckets.push_back({L - j, L - after[j]});
  std::reverse(plan.buckets.begin(), plan.buckets.end());
  return plan;
}

void check_bucket_plan_name(const std::string& name) {
  LayerProfile one_layer;
  one_layer.bytes = {4};
  one_layer.backward_seconds = {0};
  make_bucket_plan(name, one_layer, LinearCost{});
}

std::vector<std::string> bucket_plan_names() {
  return {"wfbp", "single", "mgwfbp", "optimal", "fixed:<MiB>"};
}

BucketPlan make_bucket_plan(const std::string& name, const LayerProfile& profile,
                            const LinearCost& cost) {
  if (name == "wfbp" || name == "single") {
    validate_layer_profile(profile);
    return name == "wfbp" ? wfbp_plan(profile.bytes.size()) : single_plan(profile.bytes.size());
  }
  if (name == "mgwfbp") return mgwfbp_plan(profile, cost);
  if (name == "optimal") return optimal_plan(profile, cost);
  const std::string prefix = kFixedPrefix;
  if (name.rfind(prefix, 0) == 0) {
    const std::string size = name.substr(prefix.size());
    double mebibytes = 0;
    const auto [end, error] = std::from_chars(size.data(), size.data() + size.size(), mebibytes);
    if (size.empty() || error != std::errc() || end != size.data() + size.size() ||
        !std::isfinite(mebibytes) || mebibytes <= 0)
      throw UsageError(concat("bucket plan \"", name,
                              "\": the size must be a number of MiB > 0, e.g. fixed:25; valid: ",
                              join(bucket_plan_names())));
    return fixed_size_plan(profile, mebibytes * kBytesPerMebibyte);
  }
  throw UsageError(
      concat("unknown bucket plan \"", name, "\"; valid: ", join(bucket_plan_names())));
}

std::string describe_plan(const BucketPlan& plan) {
  std::string text = concat(plan.buckets.size(), plan.buckets.size() == 1 ? " bucket:" : " buckets:");
  for (const Bucket& bucket : plan.buckets) {
    if (bucket.end == bucket.begin + 1)
      text += concat(" [", bucket.begin, "]");
    else
      text += concat(" [", bucket.end - 1, "..", bucket.begin, "]");
  }
  return text;
}

}  // namespace pipesgd
