#pragma once
// Gradient buckets for layer-wise allreduce: which consecutive layers' gradients are allreduced
// together, and the iteration time a choice gives under the MG-WFBP timing model (MG-WFBP paper
// Eq. 6-9, 21). docs/bucket-planner.md states the model and proves the optimal plan.
//
// Model. Segments (layers) are numbered in forward order 0..L-1; the paper's layer l is segment
// l-1. Backward computes segment L-1 first and segment 0 last. A bucket [begin, end) is ready when
// backward has finished its lowest segment `begin`. Buckets are allreduced one at a time, in launch
// order = backward order, on one FIFO channel: a bucket starts at max(its ready time, the previous
// bucket's finish) and takes T(M) = a + b·M for its M bytes.
#include <cstddef>
#include <string>
#include <vector>

#include "pipesgd/timing/allreduce_cost_model.h"

namespace pipesgd {

// Per-layer measurements the plans are computed from (forward order).
struct LayerProfile {
  std::vector<double> bytes;             // per segment: bytes its gradient puts on the wire
  std::vector<double> backward_seconds;  // per segment: t_b, the backward time of that segment alone
  double forward_seconds = 0;  // t_f: everything before backward starts (the timeline's origin is 0)
  // kappa: the backward time an allreduce launched during backward takes from it (its CPU time and
  // wake-ups, where communication shares cores with computation). Every bucket but the last (which
  // is launched when backward has ended) delays the layers after it by kappa. 0 = the paper's model,
  // where communication costs the computation nothing.
  double per_bucket_compute_seconds = 0;
};

// Segments [begin, end), forward order.
struct Bucket {
  std::size_t begin = 0;
  std::size_t end = 0;
};

struct BucketPlan {
  std::string name;             // "wfbp", "single", "mgwfbp", "optimal", "fixed:25"
  std::vector<Bucket> buckets;  // in launch order: backward order, the first bucket ends at L
};

// The timeline of one iteration under a plan.
struct PlanTimeline {
  std::vector<double> ready, start, finish;  // per bucket, launch order
  double backward_end = 0;    // t_f + sum of t_b
  double iteration = 0;       // the last bucket's finish (Eq. 8 / 21); >= backward_end
  double non_overlapped = 0;  // t_c^no = iteration - backward_end
  double communication = 0;   // sum of the buckets' T(M)
};

// Throws UsageError (one line) if the model has no layers, the profile's vectors differ in size, or
// a time or size is negative or not finite.
void validate_layer_profile(const LayerProfile& profile);

// The timeline of `plan`. Throws as validate_layer_profile(), UsageError if the cost's a or b is
// negative or not finite, and UsageError if the plan does not cover segments 0..L-1 exactly with
// non-empty contiguous buckets in backward order.
PlanTimeline simulate_plan(const LayerProfile& profile, const LinearCost& cost,
                           const BucketPlan& plan);

// WFBP: one bucket per layer. Throws UsageError for 0 layers.
BucketPlan wfbp_plan(std::size_t layers);

// One bucket of every layer, allreduced after backward (SyncEASGD). Throws UsageError for 0 layers.
BucketPlan single_plan(std::size_t layers);

// PyTorch DDP-like: fill buckets in backward order and close a bucket as soon as it holds
// >= bucket_bytes; a layer never splits. So a layer of >= bucket_bytes closes the bucket it joins:
// it is a bucket of its own when that bucket was empty (first layer, or the previous one just
// closed), otherwise it ends the partly filled bucket. The last bucket may hold less.
// Throws UsageError for bucket_bytes not > 0 or not finite, or an invalid profile.
BucketPlan fixed_size_plan(const LayerProfile& profile, double bucket_bytes);

// MG-WFBP Algorithm 1 (Theorem 1, Eq. 27): layer l merges into layer l-1 when
// tau_b[l-2] - tau_c[l] < a. Greedy; may be worse than optimal_plan(). Throws as simulate_plan()
// for an invalid profile or cost.
BucketPlan mgwfbp_plan(const LayerProfile& profile, const LinearCost& cost);

// The plan of least iteration time (simulate_plan().iteration), by an exact dynamic programme over
// the last bucket's boundary: O(L^2) time, O(L) memory. Among the plans of least iteration time it
// returns one with the fewest buckets (a second, exact programme over the bucket count, O(L^2) per
// count tried; skipped above 512 layers, where ties go to the longest last bucket): every allreduce
// costs CPU time and wake-ups that the a + b·M model does not charge to the overlapped backward, so
// of equally fast plans the one with fewer calls is the better one in practice. With
// per_bucket_compute_seconds > 0 the ready times depend on the bucket count, and the programme over
// the count (exact for each count) is the optimiser, over every count up to L (O(L^3); above 512
// layers kappa is ignored). Deterministic.
// Throws as simulate_plan() for an invalid profile or cost.
BucketPlan optimal_plan(const LayerProfile& profile, const LinearCost& cost);

// "wfbp" | "single" | "mgwfbp" | "optimal" | "fixed:<MiB>" (e.g. fixed:25, fixed:0.5; MiB = 2^20
// bytes, > 0 and finite). Throws UsageError naming the valid forms for any other name, and as the
// plan's function for an invalid profile or cost.
BucketPlan make_bucket_plan(const std::string& name, const LayerProfile& profile,
                            const LinearCost& cost);

// {"wfbp", "single", "mgwfbp", "optimal", "fixed:<MiB>"}.
std::vector<std::string> bucket_plan_names();

// Throws make_bucket_plan()'s UsageError unless `name` is a plan name (needs no profile).
void check_bucket_plan_name(const std::string& name);

// MG-WFBP Sec. III-A's three cases of WFBP (one bucket per layer), from its timeline:
//   1: every layer's communication hides behind the next layer's backward, t_c(l) <= t_b(l-1) for
//      2 <= l <= L: t_iter = t_f + t_b + t_c(1) (Eq. 11);
//   2: not so, but every layer's communication still ends before layer 1's is ready, so again
//      t_iter = t_f + t_b + t_c(1) (Eq. 12);
//   3: communication-bound from layer C (paper numbering: segment C - 1) down: the channel is busy
//      without a gap from layer C's ready time r_C on, t_iter = r_C + sum_{j <= C} t_c(j) (Eq. 13).
// `iteration` is the equation's value; it equals simulate_plan(wfbp_plan)'s iteration.
struct WfbpCase {
  int number = 1;
  std::size_t communication_bound_layer = 0;  // C for case 3 (paper numbering), else 0
  double iteration = 0;
};
WfbpCase classify_wfbp(const LayerProfile& profile, const LinearCost& cost);

// One line for reports, segments in backward order: "4 buckets: [9..7] [6] [5..2] [1..0]",
// "1 bucket: [0]".
std::string describe_plan(const BucketPlan& plan);

}  // namespace pipesgd
