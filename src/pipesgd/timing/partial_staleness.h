#pragma once
// SAPipe's partial staleness (SAPipe paper Sec. 3.1): the least number k of first layers (forward
// order) that must train on 1-step-stale aggregated gradients so that the training pipeline never
// stalls, i.e. the computation never waits for communication.
//
// Timeline model (per-layer allreduces, one FIFO channel, T(M) = a + b·M): iteration t runs forward
// over layers 1..m, then backward over m..1; each layer's gradient is allreduced as backward
// produces it. The forward of layer i in iteration t needs that layer's aggregated gradient of
// iteration t-1 if i > k (synchronous), of iteration t-2 if i <= k (stale). A stall is any time the
// computation waits. Layers are indexed 0..m-1 here (layer i of the paper is index i-1).
//
// Two answers: the paper's convex program (its two constraints, solved by enumerating k), and the
// least k for which the simulated steady state does not stall. They often disagree (on 258 of the
// test's 400 random profiles): the program assumes communication starts right after layer m's
// backward and runs back to back, checks only the first synchronous layer, and ignores the stale
// gradients still in the channel. The solver uses the simulation.
#include <cstddef>
#include <optional>
#include <vector>

#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/timing/bucket_plan.h"

namespace pipesgd {

struct StalenessProfile {
  std::vector<double> forward_seconds;   // u_i, forward order
  std::vector<double> backward_seconds;  // b_i
  std::vector<double> bytes;             // the gradient bytes of each layer
};

struct StalenessTimeline {
  double iteration = 0;     // steady-state iteration time
  double compute = 0;       // sum of u_i + b_i
  double wait = 0;          // steady-state time the computation waits per iteration
  bool stalls = false;      // wait > a relative 1e-9 of the iteration
};

// Simulates `iterations` iterations with the first `stale_layers` layers stale and reports the
// last one. Throws UsageError for mismatched sizes, a negative or non-finite value, no layers,
// stale_layers > m or iterations < 3.
StalenessTimeline simulate_partial_staleness(const StalenessProfile& profile, const LinearCost& cost,
                                             std::size_t stale_layers, int iterations = 12);

// The same timeline with the communication the sapipe method runs: the first `stale_layers` layers
// as one allreduce launched when backward has finished layer 0, and the synchronous layers in the
// buckets of `sync_plan` (a plan over the m - k synchronous layers, its segment indices relative to
// layer k; ignored when k = m). Throws as above, and UsageError if the plan does not cover the
// synchronous layers exactly in backward order.
StalenessTimeline simulate_bucketed_staleness(const StalenessProfile& profile, const LinearCost& cost,
                                              std::size_t stale_layers, const BucketPlan& sync_plan,
                                              int iterations = 12);

// What the sapipe method runs with: k and the plan of the synchronous layers.
struct StalenessPlan {
  std::size_t stale_layers = 0;
  BucketPlan sync_plan;       // over layers k..m-1 (relative indices); empty when k = m
  bool stalls = false;        // even the chosen k stalls (k = m: no k hides the communication)
  StalenessTimeline timeline; // the chosen k's simulated steady state
};

// Enumerates k = 0..m: for each, the plan `plan_name` (timing/bucket_plan.h) of the synchronous
// layers from their sub-profile (backward times, bytes; t_f = the whole forward), simulated by
// simulate_bucketed_staleness; returns the least k that does not stall, else k = m. Used by sapipe's
// --stale-layers auto. Throws as above or for an unknown plan.
StalenessPlan plan_partial_staleness(const StalenessProfile& profile, const LinearCost& cost,
                                     const std::string& plan_name);

// The sub-profile of layers [first, m) as a LayerProfile (t_f = the whole forward), for the plans.
LayerProfile synchronous_layer_profile(const StalenessProfile& profile, std::size_t first);

// The least k in 0..m for which simulate_partial_staleness does not stall (m if even k = m stalls:
// communication exceeds computation and no k hides it). More stale layers never add a stall
// (Theorem 1), so this is a binary search over k: O(m log m) simulations' worth of work.
std::size_t minimal_stale_layers(const StalenessProfile& profile, const LinearCost& cost);

// The paper's program: the least k with sum v <= sum b + sum u and
// sum_{i>k} v_i <= sum_{i<m} b_i + sum_{i<=k} u_i (v_i = T(bytes_i)); nullopt if the first
// constraint fails (no k hides the communication).
std::optional<std::size_t> paper_stale_layers(const StalenessProfile& profile, const LinearCost& cost);

}  // namespace pipesgd
