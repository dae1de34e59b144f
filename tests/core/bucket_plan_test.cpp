// Gradient bucket plans: the timeline against hand-worked values, the optimal plan against brute
// force, MG-WFBP Algorithm 1 against hand-worked Eq. 27 examples (a != b, a layer exactly at the
// threshold) and against an independent implementation of Algorithm 1 on random profiles, the
// DDP-like fixed-size plan, plan names and validation.
#include "pipesgd/timing/bucket_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

std::vector<std::pair<std::size_t, std::size_t>> ranges(const BucketPlan& plan) {
  std::vector<std::pair<std::size_t, std::size_t>> result;
  for (const Bucket& bucket : plan.buckets) result.emplace_back(bucket.begin, bucket.end);
  return result;
}

using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

// The UsageError message `call` throws, or "" if it throws nothing.
template <typename Call>
std::string usage_error_message(Call call) {
  try {
    call();
  } catch (const UsageError& error) {
    return error.what();
  }
  return "";
}

// Every one of the 2^(L-1) plans of contiguous non-empty buckets; bit s-1 of `boundaries` set
// means a bucket begins at segment s (1 <= s < L).
BucketPlan partition_plan(std::size_t layers, std::uint32_t boundaries) {
  BucketPlan plan{"brute", {}};
  std::size_t end = layers;
  for (std::size_t segment = layers - 1; segment >= 1; --segment) {
    if (boundaries & (1u << (segment - 1))) {
      plan.buckets.push_back({segment, end});
      end = segment;
    }
  }
  plan.buckets.push_back({0, end});
  return plan;
}

struct Instance {
  LayerProfile profile;
  LinearCost cost;
};

// Deterministic random instances, L = 1..12, scaled so communication and computation are of the
// same order (some layers hide, some do not); a = 0 and b = 0 occur, as do zero-byte layers and
// zero backward times.
std::vector<Instance> random_instances() {
  std::mt19937 generator(20240611);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Instance> instances;
  for (int round = 0; round < 30; ++round) {
    for (std::size_t layers = 1; layers <= 12; ++layers) {
      Instance instance;
      for (std::size_t segment = 0; segment < layers; ++segment) {
        instance.profile.bytes.push_back(unit(generator) < 0.1 ? 0.0 : 1e6 * unit(generator));
        instance.profile.backward_seconds.push_back(unit(generator) < 0.1 ? 0.0
                                                                          : 1e-2 * unit(generator));
      }
      instance.profile.forward_seconds = 3e-2 * unit(generator);
      const int cost_kind = round % 4;  // 0: a = 0, 1: b = 0, 2 and 3: both positive
      instance.cost.a = cost_kind == 0 ? 0.0 : 5e-3 * unit(generator);
      instance.cost.b = cost_kind == 1 ? 0.0 : 2e-8 * unit(generator);
      instances.push_back(instance);
    }
  }
  return instances;
}

TEST(BucketPlanTimeline, MatchesHandWorkedThreeLayerTimeline) {
  // Segments 0, 1, 2 (forward order): bytes 2, 1, 12; t_b 1, 2, 1; t_f = 1; T(M) = 0.5 + 0.25 M.
  const LayerProfile profile{{2, 1, 12}, {1, 2, 1}, 1};
  const LinearCost cost{0.5, 0.25};

  // WFBP, launch order [2], [1], [0]:
  //   [2]: ready 1 + 1 = 2,  start 2,                     T = 0.5 + 3    = 3.5  -> finish 5.5
  //   [1]: ready 2 + 2 = 4,  start max(5.5, 4) = 5.5,     T = 0.5 + 0.25 = 0.75 -> finish 6.25
  //   [0]: ready 4 + 1 = 5,  start max(6.25, 5) = 6.25,   T = 0.5 + 0.5  = 1    -> finish 7.25
  // backward ends at 5; t_c^no = 7.25 - 5 = 2.25; communication = 3.5 + 0.75 + 1 = 5.25.
  const PlanTimeline wfbp = simulate_plan(profile, cost, wfbp_plan(3));
  EXPECT_EQ(wfbp.ready, (std::vector<double>{2, 4, 5}));
  EXPECT_EQ(wfbp.start, (std::vector<double>{2, 5.5, 6.25}));
  EXPECT_EQ(wfbp.finish, (std::vector<double>{5.5, 6.25, 7.25}));
  EXPECT_EQ(wfbp.backward_end, 5);
  EXPECT_EQ(wfbp.iteration, 7.25);
  EXPECT_EQ(wfbp.non_overlapped, 2.25);
  EXPECT_EQ(wfbp.communication, 5.25);

  // Buckets [1..2], [0]:
  //   [1, 3): ready 1 + 1 + 2 = 4, start 4,                T = 0.5 + 0.25 * 13 = 3.75 -> finish 7.75
  //   [0, 1): ready 5,             start max(7.75, 5),     T = 1                      -> finish 8.75
  const PlanTimeline merged = simulate_plan(profile, cost, BucketPlan{"two", {{1, 3}, {0, 1}}});
  EXPECT_EQ(merged.ready, (std::vector<double>{4, 5}));
  EXPECT_EQ(merged.start, (std::vector<double>{4, 7.75}));
  EXPECT_EQ(merged.finish, (std::vector<double>{7.75, 8.75}));
  EXPECT_EQ(merged.iteration, 8.75);
  EXPECT_EQ(merged.non_overlapped, 3.75);
  EXPECT_EQ(merged.communication, 4.75);

  // Single bucket: ready 5, T = 0.5 + 0.25 * 15 = 4.25 -> 9.25.
  const PlanTimeline single = simulate_plan(profile, cost, single_plan(3));
  EXPECT_EQ(single.ready, (std::vector<double>{5}));
  EXPECT_EQ(single.iteration, 9.25);
  EXPECT_EQ(single.communication, 4.25);
}

TEST(OptimalBucketPlan, EqualsBruteForceOverAllPartitions) {
  const std::vector<Instance> instances = random_instances();
  ASSERT_GE(instances.size(), 200u);
  int optimal_strictly_better_than_mgwfbp = 0;
  for (std::size_t index = 0; index < instances.size(); ++index) {
    const Instance& instance = instances[index];
    const std::size_t layers = instance.profile.bytes.size();
    double brute_force_minimum = std::numeric_limits<double>::infinity();
    std::size_t fewest_buckets_at_minimum = layers + 1;
    for (std::uint32_t boundaries = 0; boundaries < (1u << (layers - 1)); ++boundaries) {
      const BucketPlan candidate = partition_plan(layers, boundaries);
      const double iteration = simulate_plan(instance.profile, instance.cost, candidate).iteration;
      if (iteration < brute_force_minimum) fewest_buckets_at_minimum = layers + 1;
      brute_force_minimum = std::min(brute_force_minimum, iteration);
      if (iteration == brute_force_minimum) {
        fewest_buckets_at_minimum = std::min(fewest_buckets_at_minimum, candidate.buckets.size());
      }
    }
    const BucketPlan optimal = optimal_plan(instance.profile, instance.cost);
    EXPECT_EQ(optimal.name, "optimal");
    // The dynamic programme sums in simulate_plan()'s order and max(f, r) + T is monotone in f
    // also in floating point, so the equality is exact.
    EXPECT_EQ(simulate_plan(instance.profile, instance.cost, optimal).iteration,
              brute_force_minimum)
        << "instance " << index << " with " << layers << " layers: " << describe_plan(optimal);
    // Of the optimal plans, one with the fewest buckets.
    EXPECT_EQ(optimal.buckets.size(), fewest_buckets_at_minimum)
        << "instance " << index << ": " << describe_plan(optimal);
    if (brute_force_minimum <
        simulate_plan(instance.profile, instance.cost, mgwfbp_plan(instance.profile, instance.cost))
            .iteration)
      ++optimal_strictly_better_than_mgwfbp;
  }
  // The instances are not all trivial: the greedy misses the optimum on some of them.
  EXPECT_GT(optimal_strictly_better_than_mgwfbp, 0);
}

// With kappa > 0 (each bucket launched during backward delays the rest of backward) the programme
// over the bucket count is exact too: the least simulated time over all partitions, up to the
// order of the floating-point additions (ready times summed in another order: 1e-12 relative).
TEST(OptimalBucketPlan, WithPerBucketComputeEqualsBruteForce) {
  std::vector<Instance> instances = random_instances();
  std::mt19937 generator(77);
  std::uniform_real_distribution<double> fraction(0.0, 1.0);
  int kappa_changed_the_plan = 0;
  for (std::size_t index = 0; index < instances.size(); ++index) {
    Instance instance = instances[index];
    const std::size_t layers = instance.profile.bytes.size();
    double backward = 0;
    for (double t : instance.profile.backward_seconds) backward += t;
    instance.profile.per_bucket_compute_seconds = fraction(generator) * (backward + 1e-3) / 4;
    double minimum = std::numeric_limits<double>::infinity();
    for (std::uint32_t boundaries = 0; boundaries < (1u << (layers - 1)); ++boundaries) {
      minimum = std::min(minimum, simulate_plan(instance.profile, instance.cost,
                                                partition_plan(layers, boundaries)).iteration);
    }
    const BucketPlan optimal = optimal_plan(instance.profile, instance.cost);
    const double got = simulate_plan(instance.profile, instance.cost, optimal).iteration;
    EXPECT_NEAR(got, minimum, 1e-12 * minimum) << "instance " << index << ": " << describe_plan(optimal);
    LayerProfile without = instance.profile;
    without.per_bucket_compute_seconds = 0;
    if (optimal_plan(without, instance.cost).buckets.size() != optimal.buckets.size()) ++kappa_changed_the_plan;
  }
  EXPECT_GT(kappa_changed_the_plan, 0);  // not vacuous: kappa matters on some instances
}

// kappa in the timeline, by hand: 3 layers of t_b = 1, t_f = 0, T = 1 per bucket, kappa = 0.5.
// wfbp: layer 3 ready 1, comm [1, 2], the rest of backward delayed 0.5: layer 2 ready 2.5, comm
// [2.5, 3.5], delay 0.5: layer 1 ready 4, comm [4, 5] (the last bucket adds nothing).
TEST(BucketTimeline, PerBucketComputeDelaysTheRestOfBackward) {
  LayerProfile profile;
  profile.bytes = {4, 4, 4};
  profile.backward_seconds = {1, 1, 1};
  profile.per_bucket_compute_seconds = 0.5;
  const PlanTimeline timeline = simulate_plan(profile, LinearCost{1.0, 0.0}, wfbp_plan(3));
  EXPECT_EQ(timeline.ready, (std::vector<double>{1, 2.5, 4}));
  EXPECT_EQ(timeline.finish, (std::vector<double>{2, 3.5, 5}));
  EXPECT_EQ(timeline.backward_end, 4);
  EXPECT_EQ(simulate_plan(profile, LinearCost{1.0, 0.0}, single_plan(3)).iteration, 4);
}

TEST(OptimalBucketPlan, IsNoSlowerThanEveryOtherPlan) {
  for (const Instance& instance : random_instances()) {
    const std::size_t layers = instance.profile.bytes.size();
    const double optimal =
        simulate_plan(instance.profile, instance.cost, optimal_plan(instance.profile, instance.cost))
            .iteration;
    const std::vector<BucketPlan> others = {
        wfbp_plan(layers),
        single_plan(layers),
        mgwfbp_plan(instance.profile, instance.cost),
        fixed_size_plan(instance.profile, 1e6),
        fixed_size_plan(instance.profile, 2.5e5),
        make_bucket_plan("fixed:25", instance.profile, instance.cost),
    };
    for (const BucketPlan& other : others)
      EXPECT_LE(optimal, simulate_plan(instance.profile, instance.cost, other).iteration)
          << other.name << ": " << describe_plan(other);
  }
}

TEST(OptimalBucketPlan, MergesWhenLatencyDominatesAndSplitsWhenOverlapPays) {
  // Three layers of 1 byte, t_b = 1 each, t_f = 0.
  const LayerProfile profile{{1, 1, 1}, {1, 1, 1}, 0};
  // Latency only (a = 10, b = 0): one allreduce is best: 3 + 10 = 13 (WFBP: 1 + 30 = 31).
  EXPECT_EQ(ranges(optimal_plan(profile, {10, 0})), (Ranges{{0, 3}}));
  // Bandwidth only (a = 0, b = 1): per layer, every transfer hides behind the next layer's
  // backward: finishes 2, 3, 4; one bucket would finish at 3 + 3 = 6.
  EXPECT_EQ(ranges(optimal_plan(profile, {0, 1})), (Ranges{{2, 3}, {1, 2}, {0, 1}}));
  // A single layer is one bucket whatever the cost.
  EXPECT_EQ(ranges(optimal_plan(LayerProfile{{5}, {1}, 0}, {1, 1})), (Ranges{{0, 1}}));
}

TEST(MgWfbpPlan, ReproducesHandWorkedMergeDecisionsOfEq27) {
  // Paper layers 1..5 = segments 0..4. p = 1 byte each; t_b = [1, 3, 0.5, 0.5, 1] for layers
  // 1..5; t_f = 0; T(M) = 1 + M, so a = 1 and tc = 2 for every layer at first.
  // tau_b[5] = 0, tau_b[4] = 1, tau_b[3] = 1.5, tau_b[2] = 2, tau_b[1] = 5, tau_b[0] = 6.
  // tau_c: [5] = 0 + 1 = 1; [4] = max(1 + 2, 1 + 0.5) = 3; [3] = max(5, 2) = 5; [2] = max(7, 5) = 7;
  //        [1] = max(9, 6) = 9.
  // l = 5: tau_b[3] - tau_c[5] = 1.5 - 1 = 0.5 < 1 -> merge 5 into 4: tc[5] = 0, p[4] = 2,
  //        tc[4] = 3. tau_c: [5] = 1, [4] = max(1, 1.5) = 1.5, [3] = max(4.5, 2) = 4.5, ...
  // l = 4: tau_b[2] - tau_c[4] = 2 - 1.5 = 0.5 < 1 -> merge 4 into 3 (a chain: 5 -> 4 -> 3):
  //        tc[4] = 0, p[3] = 3, tc[3] = 4. tau_c: [4] = 1.5, [3] = max(1.5, 2) = 2,
  //        [2] = max(2 + 4, 5) = 6, [1] = max(6 + 2, 6) = 8.
  // l = 3: tau_b[1] - tau_c[3] = 5 - 2 = 3 >= 1 -> no merge (layer 2 would finish at
  //        max(2, 5) + T(2) = 10 merged, max(2 + 4, 5) + T(1) = 8 apart).
  // l = 2: tau_b[0] - tau_c[2] = 6 - 6 = 0 < 1 -> merge 2 into 1: tc[2] = 0, p[1] = 2, tc[1] = 3.
  // M = {5, 4, 2}: buckets {5, 4, 3} and {2, 1} = segments [2, 5) and [0, 2).
  const LayerProfile profile{{1, 1, 1, 1, 1}, {1, 3, 0.5, 0.5, 1}, 0};
  const LinearCost cost{1, 1};
  const BucketPlan plan = mgwfbp_plan(profile, cost);
  EXPECT_EQ(plan.name, "mgwfbp");
  EXPECT_EQ(ranges(plan), (Ranges{{2, 5}, {0, 2}}));
  EXPECT_EQ(describe_plan(plan), "2 buckets: [4..2] [1..0]");
  // Its timeline: [2, 5) ready 0 + 1 + 0.5 + 0.5 = 2, T = 4 -> 6; [0, 2) ready 6, T = 3 -> 9.
  const PlanTimeline timeline = simulate_plan(profile, cost, plan);
  EXPECT_EQ(timeline.finish, (std::vector<double>{6, 9}));
  // WFBP would finish at 11: finishes 3, 5, 7 (ready 2), 9 (ready 5), 11 (ready 6).
  EXPECT_EQ(simulate_plan(profile, cost, wfbp_plan(5)).iteration, 11);
}

TEST(MgWfbpPlan, KeepsLayersApartWhenBackwardHidesTheirTransfers) {
  // Layers 1..3 = segments 0..2, p = 1, t_b = 5 each, t_f = 0, T(M) = 1 + M (tc = 2 < t_b).
  // tau_b[3] = 0, [2] = 5, [1] = 10, [0] = 15. tau_c[3] = 5, [2] = max(7, 10) = 10, [1] = 15.
  // l = 3: tau_b[1] - tau_c[3] = 10 - 5 = 5 >= 1; l = 2: tau_b[0] - tau_c[2] = 15 - 10 = 5 >= 1.
  // No merges: the plan is WFBP's.
  const LayerProfile profile{{1, 1, 1}, {5, 5, 5}, 0};
  EXPECT_EQ(ranges(mgwfbp_plan(profile, {1, 1})), ranges(wfbp_plan(3)));
  // A single layer: nothing to merge.
  EXPECT_EQ(ranges(mgwfbp_plan(LayerProfile{{1}, {1}, 0}, {1, 1})), (Ranges{{0, 1}}));
}

// MG-WFBP with a != b, so a condition that compares with b instead of a decides differently.
// Paper layers 1..3 = segments 0..2; t_f = 0; T(M) = a + b M; every value below is a small dyadic
// rational, so each sum and comparison is exact in binary floating point.
TEST(MgWfbpPlan, ComparesWithTheLatencyTermAOfTheCostNotTheSlopeB) {
  // a = 2, b = 0.5; p = 2 bytes each, so tc = 3 for every layer at first. t_b = [4, 1, 0.5].
  // tau_b[3] = 0, [2] = 0.5, [1] = 1.5, [0] = 5.5. tau_c[3] = 0 + 0.5 = 0.5, [2] = max(3.5, 1.5) = 3.5.
  // l = 3: tau_b[1] - tau_c[3] = 1.5 - 0.5 = 1, and b = 0.5 <= 1 < a = 2 -> merge 3 into 2:
  //        tc[3] = 0, p[2] = 4, tc[2] = 4. tau_c[2] = max(0.5 + 0, 1.5) = 1.5, [1] = max(5.5, 5.5).
  // l = 2: tau_b[0] - tau_c[2] = 5.5 - 1.5 = 4 >= 2 -> no merge.
  // M = {3}: buckets [1, 3) and [0, 1). (Compared with b: no merge at l = 3, tau_c[2] = 3.5, and
  // at l = 2: 5.5 - 3.5 = 2 >= 0.5: WFBP.)
  const LayerProfile profile{{2, 2, 2}, {4, 1, 0.5}, 0};
  EXPECT_EQ(ranges(mgwfbp_plan(profile, {2, 0.5})), (Ranges{{1, 3}, {0, 1}}));

  // The other way round, a = 0.5 < b = 1.5: a difference in [a, b) must keep the layers apart.
  // p = 1 byte each: tc = 2. t_b = [4, 1, 0.5], t_f = 0: tau_b as above, tau_c[3] = 0.5.
  // l = 3: tau_b[1] - tau_c[3] = 1 >= a = 0.5 -> no merge (compared with b = 1.5 it would merge).
  //        tau_c[2] = max(0.5 + 2, 1.5) = 2.5.
  // l = 2: tau_b[0] - tau_c[2] = 5.5 - 2.5 = 3 >= 0.5 -> no merge. M = {}: WFBP.
  // (Compared with b: l = 3 merges, tc[2] = 0.5 + 1.5 * 2 = 3.5, tau_c[2] = 1.5, and l = 2:
  // 5.5 - 1.5 = 4 >= 1.5: buckets [1, 3), [0, 1).)
  const LayerProfile same_times{{1, 1, 1}, {4, 1, 0.5}, 0};
  EXPECT_EQ(ranges(mgwfbp_plan(same_times, {0.5, 1.5})), ranges(wfbp_plan(3)));
}

// Eq. 27's condition is strict: a layer whose tau_b[l-2] - tau_c[l] equals a exactly stays apart
// (C.2: merging gains nothing then; the finish of layer l-1 is the same either way).
TEST(MgWfbpPlan, ALayerExactlyAtTheThresholdIsNotMerged) {
  // a = 2, b = 0.5, t_f = 1; p = [4, 2, 6] (layers 1..3): tc = [4, 3, 5]; t_b = [1, 2, 0.5].
  // tau_b[3] = 1, [2] = 1.5, [1] = 3.5, [0] = 4.5.
  // tau_c[3] = 1 + 0.5 = 1.5, [2] = max(1.5 + 5, 3.5) = 6.5, [1] = max(6.5 + 3, 4.5) = 9.5.
  // l = 3: tau_b[1] - tau_c[3] = 3.5 - 1.5 = 2 = a: not < a -> no merge.
  // l = 2: tau_b[0] - tau_c[2] = 4.5 - 6.5 = -2 < 2 -> merge 2 into 1.
  // M = {2}: buckets [2, 3) and [0, 2).
  // (With <=, l = 3 merges too: tc[2] = 2 + 0.5 * 8 = 6, tau_c[2] = max(1.5, 3.5) = 3.5; l = 2:
  // 4.5 - 3.5 = 1 < 2 -> merge: a single bucket.)
  const LayerProfile profile{{4, 2, 6}, {1, 2, 0.5}, 1};
  const LinearCost cost{2, 0.5};
  EXPECT_EQ(ranges(mgwfbp_plan(profile, cost)), (Ranges{{2, 3}, {0, 2}}));
  // The decision at the threshold, by the timeline of C.2: layer 2's communication finishes at
  // max(tau_c[3], tau_b[1]) + T(p2 + p3) = 3.5 + 6 = 9.5 merged and at
  // max(tau_c[3] + T(p3), tau_b[1]) + T(p2) = 6.5 + 3 = 9.5 apart: a tie.
  EXPECT_EQ(simulate_plan(profile, cost, BucketPlan{"3+2", {{1, 3}, {0, 1}}}).finish[0],
            simulate_plan(profile, cost, wfbp_plan(3)).finish[1]);

  // A quarter less backward time for layer 2 puts layer 3 just below the threshold:
  // t_b = [1, 1.75, 0.5]: tau_b[1] = 3.25, tau_b[0] = 4.25; l = 3: 3.25 - 1.5 = 1.75 < 2 -> merge,
  // tc[2] = 6, tau_c[2] = max(1.5, 3.25) = 3.25; l = 2: 4.25 - 3.25 = 1 < 2 -> merge: one bucket.
  EXPECT_EQ(ranges(mgwfbp_plan(LayerProfile{{4, 2, 6}, {1, 1.75, 0.5}, 1}, cost)), (Ranges{{0, 3}}));
}

// MG-WFBP Algorithm 1, written here from MG-WFBP paper (not from bucket_plan.cpp), in the paper's
// numbering: layer l = 1..L is segment l - 1; arrays are indexed by l. Returns M, the merged-gradient
// layers, in the order Algorithm 1 pushes them (l = L down to 2); `differences`, if given, receives
// tau_b[l-2] - tau_c[l] for each l as line 13 tests it. Two readings of the text:
//  * line 13 prints tc[l]; Eq. 27 and Theorem 1's proof (C.1, C.2) compare tau_b[l-2] with the
//    communication *start* tau_c[l], which is what is implemented;
//  * at l = 2, line 13 reads tau_b[0], which Algorithm 1 never sets (line 9 stops at l = 2); Eq. 6
//    extended one step, tau_b[0] = tau_b[1] + t_b[1], is the end of backward: layer 1's gradient is
//    ready then, as tau_b[l-2] is layer l-1's ready time for every other l.
std::vector<int> algorithm1_merged_layers(const LayerProfile& profile, const LinearCost& cost,
                                          std::vector<double>* differences = nullptr) {
  const int L = static_cast<int>(profile.bytes.size());
  const auto T_ar = [&](double M) { return cost.a + cost.b * M; };  // Eq. 9
  const auto n = static_cast<std::size_t>(L + 1);
  std::vector<double> p(n), tb(n), tc(n), tau_b(n), tau_c(n);
  for (int l = 1; l <= L; ++l) {  // lines 5-7
    p[l] = profile.bytes[l - 1];
    tb[l] = profile.backward_seconds[l - 1];
    tc[l] = T_ar(p[l]);
  }
  tau_b[L] = profile.forward_seconds;                                      // line 8
  for (int l = L - 1; l >= 0; --l) tau_b[l] = tau_b[l + 1] + tb[l + 1];   // lines 9-10 (and Eq. 6)
  const auto calculate_comm_start = [&] {                                  // lines 21-26
    tau_c[L] = tau_b[L] + tb[L];
    for (int l = L - 1; l >= 1; --l) tau_c[l] = std::max(tau_c[l + 1] + tc[l + 1], tau_b[l] + tb[l]);
  };
  const auto merge = [&](int l) {                                          // lines 17-20
    tc[l] = 0;
    p[l - 1] = p[l - 1] + p[l];
    tc[l - 1] = T_ar(p[l - 1]);
  };
  calculate_comm_start();                                                  // line 11
  std::vector<int> M;
  for (int l = L; l >= 2; --l) {                                           // lines 12-16
    if (differences) differences->push_back(tau_b[l - 2] - tau_c[l]);
    if (tau_b[l - 2] - tau_c[l] < cost.a) {
      merge(l);
      calculate_comm_start();
      M.push_back(l);
    }
  }
  return M;
}

// M of a plan: layer l (segment l - 1) is merged with layer l - 1 when it is not the lowest segment
// of its bucket. Listed from l = L down to 2, as Algorithm 1 pushes them.
std::vector<int> merged_layers_of(const BucketPlan& plan, std::size_t layers) {
  std::vector<bool> bucket_begins(layers, false);
  for (const Bucket& bucket : plan.buckets) bucket_begins[bucket.begin] = true;
  std::vector<int> M;
  for (int l = static_cast<int>(layers); l >= 2; --l) {
    if (!bucket_begins[static_cast<std::size_t>(l - 1)]) M.push_back(l);
  }
  return M;
}

// Profiles on a grid of small dyadic rationals: every time and sum is exact in double, so ties at
// the threshold (tau_b[l-2] - tau_c[l] == a) happen often and are decided identically by any
// correct evaluation order; a != b almost always.
std::vector<Instance> dyadic_instances(std::size_t count) {
  std::mt19937 generator(4242);
  const auto uniform = [&](int low, int high) { return std::uniform_int_distribution<int>(low, high)(generator); };
  std::vector<Instance> instances;
  for (std::size_t index = 0; index < count; ++index) {
    Instance instance;
    const int layers = uniform(1, 12);
    for (int segment = 0; segment < layers; ++segment) {
      instance.profile.bytes.push_back(uniform(0, 8));
      instance.profile.backward_seconds.push_back(0.25 * uniform(0, 8));
    }
    instance.profile.forward_seconds = 0.25 * uniform(0, 8);
    instance.cost.a = 0.25 * uniform(0, 8);
    instance.cost.b = 0.125 * uniform(0, 8);
    instances.push_back(instance);
  }
  return instances;
}

TEST(MgWfbpPlan, EqualsAnIndependentAlgorithm1OnRandomProfiles) {
  std::vector<Instance> instances = dyadic_instances(3000);
  const std::size_t dyadic = instances.size();
  for (const Instance& instance : random_instances()) instances.push_back(instance);
  int merging = 0, partly_merging = 0, at_threshold = 0, decided_otherwise_by_b = 0;
  for (std::size_t index = 0; index < instances.size(); ++index) {
    const Instance& instance = instances[index];
    const std::size_t layers = instance.profile.bytes.size();
    std::vector<double> differences;
    const std::vector<int> expected = algorithm1_merged_layers(instance.profile, instance.cost, &differences);
    const BucketPlan plan = mgwfbp_plan(instance.profile, instance.cost);
    ASSERT_EQ(merged_layers_of(plan, layers), expected)
        << (index < dyadic ? "dyadic" : "random") << " instance " << index << ": " << describe_plan(plan)
        << ", a = " << instance.cost.a << ", b = " << instance.cost.b;
    merging += !expected.empty();
    partly_merging += !expected.empty() && expected.size() + 1 < layers;
    for (double difference : differences) {
      at_threshold += difference == instance.cost.a;
      decided_otherwise_by_b += (difference < instance.cost.a) != (difference < instance.cost.b);
    }
  }
  // Not vacuous: plans of every kind, conditions exactly at the threshold, and conditions that a
  // comparison with b instead of a would decide the other way.
  EXPECT_GT(merging, 500);
  EXPECT_GT(partly_merging, 500);
  EXPECT_GT(at_threshold, 100);
  EXPECT_GT(decided_otherwise_by_b, 500);
}

TEST(BucketPlanFixedSize, ClosesABucketOnceItReachesTheCap) {
  // Forward bytes [4, 3, 10, 2, 2, 1], cap 5, filled in backward order:
  //   segment 5 (1): 1; segment 4 (2): 3; segment 3 (2): 5 >= 5 -> close [3, 6)
  //   segment 2 (10): 10 >= 5 -> close [2, 3): larger than the cap, a bucket of its own
  //   segment 1 (3): 3; segment 0 (4): 7 >= 5 -> close [0, 2)
  const LayerProfile profile{{4, 3, 10, 2, 2, 1}, {1, 1, 1, 1, 1, 1}, 0};
  EXPECT_EQ(ranges(fixed_size_plan(profile, 5)), (Ranges{{3, 6}, {2, 3}, {0, 2}}));
  // The last bucket may stay under the cap: [2, 6) holds 15 >= 15, then [0, 2) holds only 7.
  EXPECT_EQ(ranges(fixed_size_plan(profile, 15)), (Ranges{{2, 6}, {0, 2}}));
  // A cap below every layer is WFBP; a cap above the whole model is a single bucket.
  EXPECT_EQ(ranges(fixed_size_plan(profile, 0.5)), ranges(wfbp_plan(6)));
  EXPECT_EQ(ranges(fixed_size_plan(profile, 1000)), (Ranges{{0, 6}}));
  // As DDP does, a large layer that meets a partly filled bucket joins it and closes it:
  // segment 2 (2): 2; segment 1 (10): 12 >= 5 -> close [1, 3); segment 0 (1): last bucket [0, 1).
  EXPECT_EQ(ranges(fixed_size_plan(LayerProfile{{1, 10, 2}, {1, 1, 1}, 0}, 5)),
            (Ranges{{1, 3}, {0, 1}}));
  EXPECT_EQ(fixed_size_plan(profile, 5 * 1048576.0).name, "fixed:5");
  EXPECT_THROW(fixed_size_plan(profile, 0), UsageError);
  EXPECT_THROW(fixed_size_plan(profile, std::numeric_limits<double>::infinity()), UsageError);
}

TEST(BucketPlanNames, MakesEveryValidPlan) {
  const double mebibyte = 1048576.0;
  const LayerProfile profile{{mebibyte, mebibyte, mebibyte}, {1, 1, 1}, 0};
  const LinearCost cost{1, 1e-9};
  EXPECT_EQ(bucket_plan_names(),
            (std::vector<std::string>{"wfbp", "single", "mgwfbp", "optimal", "fixed:<MiB>"}));
  EXPECT_EQ(ranges(make_bucket_plan("wfbp", profile, cost)), ranges(wfbp_plan(3)));
  EXPECT_EQ(make_bucket_plan("wfbp", profile, cost).name, "wfbp");
  EXPECT_EQ(ranges(make_bucket_plan("single", profile, cost)), (Ranges{{0, 3}}));
  EXPECT_EQ(make_bucket_plan("single", profile, cost).name, "single");
  EXPECT_EQ(ranges(make_bucket_plan("mgwfbp", profile, cost)), ranges(mgwfbp_plan(profile, cost)));
  EXPECT_EQ(ranges(make_bucket_plan("optimal", profile, cost)), ranges(optimal_plan(profile, cost)));
  const BucketPlan two_mebibytes = make_bucket_plan("fixed:2", profile, cost);
  EXPECT_EQ(two_mebibytes.name, "fixed:2");
  EXPECT_EQ(ranges(two_mebibytes), (Ranges{{1, 3}, {0, 1}}));
  const BucketPlan half_mebibyte = make_bucket_plan("fixed:0.5", profile, cost);
  EXPECT_EQ(half_mebibyte.name, "fixed:0.5");
  EXPECT_EQ(ranges(half_mebibyte), ranges(wfbp_plan(3)));
  EXPECT_EQ(make_bucket_plan("fixed:25", profile, cost).name, "fixed:25");
}

TEST(BucketPlanNames, RejectsInvalidNamesWithTheValidForms) {
  const LayerProfile profile{{1, 1}, {1, 1}, 0};
  const LinearCost cost{1, 1};
  const auto message = [&](const std::string& name) {
    return usage_error_message([&] { make_bucket_plan(name, profile, cost); });
  };
  const std::string valid = "valid: wfbp, single, mgwfbp, optimal, fixed:<MiB>";
  for (const std::string name : {"fixed:", "fixed:0", "fixed:-1", "fixed:abc", "fixed:25x",
                                 "fixed:inf", "fixed:nan", "fixed: 25"})
    EXPECT_EQ(message(name), "bucket plan \"" + name +
                                 "\": the size must be a number of MiB > 0, e.g. fixed:25; " + valid);
  EXPECT_EQ(message("bogus"), "unknown bucket plan \"bogus\"; " + valid);
  EXPECT_EQ(message("WFBP"), "unknown bucket plan \"WFBP\"; " + valid);
  EXPECT_EQ(message(""), "unknown bucket plan \"\"; " + valid);
}

TEST(BucketPlanNames, RejectsAModelWithoutLayers) {
  const LayerProfile empty;
  for (const std::string name : {"wfbp", "single", "mgwfbp", "optimal", "fixed:25"})
    EXPECT_EQ(usage_error_message([&] { make_bucket_plan(name, empty, {1, 1}); }),
              "the model has no layers")
        << name;
  EXPECT_EQ(usage_error_message([] { wfbp_plan(0); }), "the model has no layers");
  EXPECT_EQ(usage_error_message([] { single_plan(0); }), "the model has no layers");
}

TEST(BucketPlanNames, DescribesPlansInBackwardOrder) {
  const BucketPlan plan{"example", {{7, 10}, {6, 7}, {2, 6}, {0, 2}}};
  EXPECT_EQ(describe_plan(plan), "4 buckets: [9..7] [6] [5..2] [1..0]");
  EXPECT_EQ(describe_plan(single_plan(1)), "1 bucket: [0]");
  EXPECT_EQ(describe_plan(single_plan(3)), "1 bucket: [2..0]");
  EXPECT_EQ(describe_plan(wfbp_plan(3)), "3 buckets: [2] [1] [0]");
}

TEST(BucketPlanTimeline, RejectsPlansThatDoNotCoverEveryLayerOnce) {
  const LayerProfile profile{{1, 1, 1}, {1, 1, 1}, 0};
  const LinearCost cost{1, 1};
  const auto simulate = [&](std::vector<Bucket> buckets) {
    return usage_error_message([&] { simulate_plan(profile, cost, BucketPlan{"p", buckets}); });
  };
  const std::string prefix = "bucket plan \"p\" does not cover segments 0..2 in backward order: ";
  EXPECT_EQ(simulate({}), prefix + "it has no buckets");
  EXPECT_EQ(simulate({{1, 3}}), prefix + "the last bucket begins at 1, not 0");      // gap
  EXPECT_EQ(simulate({{1, 2}, {0, 1}}), prefix + "bucket 0 is [1, 2) but should end at 3");
  EXPECT_EQ(simulate({{2, 3}, {0, 3}}), prefix + "bucket 1 is [0, 3) but should end at 2");
  EXPECT_EQ(simulate({{0, 1}, {1, 3}}), prefix + "bucket 0 is [0, 1) but should end at 3");
  EXPECT_EQ(simulate({{3, 3}, {0, 3}}), prefix + "bucket 0 is [3, 3), which is empty");
  EXPECT_EQ(simulate({{0, 4}}), prefix + "bucket 0 is [0, 4) but should end at 3");
  // Forward order instead of backward order.
  EXPECT_THROW(simulate_plan(profile, cost, BucketPlan{"p", {{0, 1}, {1, 2}, {2, 3}}}), UsageError);
}

TEST(BucketPlanTimeline, RejectsInvalidProfilesAndCosts) {
  const LinearCost cost{1, 1};
  const BucketPlan plan = wfbp_plan(2);
  const auto simulate = [&](const LayerProfile& profile, const LinearCost& with_cost) {
    return usage_error_message([&] { simulate_plan(profile, with_cost, plan); });
  };
  EXPECT_EQ(simulate({{1, 1}, {1}, 0}, cost), "layer profile: 2 gradient sizes but 1 backward times");
  EXPECT_EQ(simulate({{1, -1}, {1, 1}, 0}, cost),
            "layer profile: segment 1's gradient bytes is -1; it must be finite and >= 0");
  EXPECT_EQ(simulate({{1, 1}, {1, std::nan("")}, 0}, cost),
            "layer profile: segment 1's backward time is nan; it must be finite and >= 0");
  EXPECT_EQ(simulate({{1, 1}, {1, 1}, -2}, cost),
            "layer profile: the forward time is -2; it must be finite and >= 0");
  EXPECT_EQ(simulate({{1, 1}, {1, 1}, 0}, {-1, 1}),
            "allreduce cost: a is -1; it must be finite and >= 0");
  EXPECT_EQ(simulate({{}, {}, 0}, cost), "the model has no layers");
  EXPECT_THROW(mgwfbp_plan({{1, 1}, {1, 1}, 0}, {1, std::numeric_limits<double>::infinity()}),
               UsageError);
  EXPECT_THROW(optimal_plan({{1, 1}, {1}, 0}, cost), UsageError);
}

// MG-WFBP Sec. III-A's cases, by hand. Three layers (segments 0, 1, 2 = paper layers 1, 2, 3),
// t_f = 1, a = 1, b = 0 (every allreduce takes 1).
TEST(MgWfbpCases, ClassifiesTheThreeCasesOfSectionThreeByHand) {
  LayerProfile profile;
  profile.bytes = {4, 4, 4};
  profile.forward_seconds = 1;
  const LinearCost cost{1.0, 0.0};
  // Case 1: t_b = {2, 2, 2}: layer 3 ready at 3, comm [3, 4]; layer 2 ready at 5, comm [5, 6];
  // layer 1 ready at 7, comm [7, 8]. t_c(l) = 1 <= t_b(l-1) = 2: Eq. 11, t_iter = 1 + 6 + 1 = 8.
  profile.backward_seconds = {2, 2, 2};
  WfbpCase c = classify_wfbp(profile, cost);
  EXPECT_EQ(c.number, 1);
  EXPECT_EQ(c.iteration, 8.0);
  // Case 2: t_b = {2, 0.5, 0.5} (segments 0, 1, 2): layer 3 ready at 1.5, comm [1.5, 2.5]; layer 2
  // ready at 2, waits, comm [2.5, 3.5]; layer 1 ready at 4, comm [4, 5]. t_c(3) = 1 > t_b(2) = 0.5,
  // yet all is hidden before layer 1: Eq. 12, t_iter = 1 + 3 + 1 = 5.
  profile.backward_seconds = {2, 0.5, 0.5};
  c = classify_wfbp(profile, cost);
  EXPECT_EQ(c.number, 2);
  EXPECT_EQ(c.iteration, 5.0);
  // Case 3: t_b = {0.5, 0.5, 0.5}: layer 3 ready at 1.5, comm [1.5, 2.5]; layer 2 ready at 2, comm
  // [2.5, 3.5]; layer 1 ready at 2.5, comm [3.5, 4.5]: busy from layer 3 on, C = 3, Eq. 13:
  // t_iter = r_3 + t_c(3) + t_c(2) + t_c(1) = 1.5 + 3 = 4.5.
  profile.backward_seconds = {0.5, 0.5, 0.5};
  c = classify_wfbp(profile, cost);
  EXPECT_EQ(c.number, 3);
  EXPECT_EQ(c.communication_bound_layer, 3u);
  EXPECT_EQ(c.iteration, 4.5);
  EXPECT_EQ(c.iteration, simulate_plan(profile, cost, wfbp_plan(3)).iteration);
  // Case 3 from a lower layer: layer 3's communication hides behind layer 2's long backward, layers
  // 2 and 1's do not. t_b = {0.5, 2, 0.5}: layer 3 ready 1.5, comm [1.5, 2.5]; layer 2 ready 3.5,
  // comm [3.5, 4.5]; layer 1 ready 4, comm [4.5, 5.5]: C = 2, t_iter = r_2 + t_c(2) + t_c(1) = 5.5.
  profile.backward_seconds = {0.5, 2, 0.5};
  c = classify_wfbp(profile, cost);
  EXPECT_EQ(c.number, 3);
  EXPECT_EQ(c.communication_bound_layer, 2u);
  EXPECT_EQ(c.iteration, 5.5);
}

}  // namespace
}  // namespace pipesgd
