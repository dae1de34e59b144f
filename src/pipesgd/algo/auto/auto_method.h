#pragma once
// `--algo auto[:POLICY]`: the run chooses its method, and chooses again when the cluster changes.
//
// Start: auto runs layer-wise D-Sync with the optimal plan (dsync+optimal), which profiles in the
// run itself (kAutoProfileWarmupIterations start-up iterations, then --profile-iters P: each layer's
// backward, the forward, the update, the allreduce's a + b·M at a few sizes; averaged over the
// workers, so every worker holds the same numbers). From those numbers every candidate the policy
// allows predicts its iteration (MethodDescriptor::predict), and auto switches to the fastest from
// the next iteration on: every worker computes the same choice, so they switch at the same boundary.
// A candidate that trades accuracy (staleness, a lossy codec) is chosen only if every candidate that
// trades less is --auto-min-gain or more slower than the fastest (choose_measured's rule: of those
// within --auto-min-gain of the fastest, the one that trades least), so auto gives up less than
// --auto-min-gain of speed to trade less accuracy.
//
// Trials: the predictions cannot see everything (a codec's CPU time, communication competing with
// compute for shared cores), so when other candidates are predicted within --auto-trial (relative)
// of the fastest, or the choice trades accuracy on a predicted gain below kTradeCheckGain over the
// fastest that trades less, auto runs the choice and up to kMaxTrials - 1 of them (trial_contenders)
// and keeps the one whose iteration measured shortest (averaged over the workers, so every worker
// keeps the same), under the same --auto-min-gain rule on the measured times. Each contender counts
// trial_counted_iterations (at least P, and at least --auto-trial-seconds of the fastest
// prediction), in the palindromic order of trial_order (A B C B A: the middle one runs once, the
// others in two halves), so that a drift of the machine's speed during the trials (measured: the
// first ~50 iterations of a process slow by up to 30%) weighs on every contender alike. Each phase
// first runs trial_settle_iterations that are not counted (a pipelined method's pipeline fills). The
// trials are part of the start-up.
//
// Drift: every --auto-window W iterations (more if W predicted iterations of the method chosen last
// less than --auto-window-seconds: a short window sees the machine's own swings) the workers time
// a link probe (allreduces of up to 256 KiB of the gradient's size) and average it with their
// median iteration and compute (the iteration less the wait for communication) in one small
// reduction on Channel::kPlanning. The first window after a switch settles, the second is the
// reference. A window strikes when its iteration departs from the reference by more than
// --auto-drift (relative), or when its comm/compute ratio (probe / compute) does and the profile,
// its allreduce cost scaled by the probe and its compute by the compute, predicts another candidate
// more than --auto-min-gain faster (a decision boundary crossed: a slower link that a synchronous
// method hides in part moves its iteration less than the band). Two strikes in a row, with the last switch at least --auto-min-interval iterations old,
// make auto profile again and choose again (it may stay).
//
// A switch is exact: the method left behind finishes (finish(): Pipe-SGD applies its in-flight
// aggregated gradients in iteration order), its optimizer's state (momentum, Adam's moments) goes to
// the method that follows, built with MethodContext::first_iteration at the boundary. No gradient is
// lost or applied twice: the weights follow each method's per-iteration rule, phase by phase.
//
// Policies (what auto may trade): sync (no staleness, no lossy codec: dsync and the layer-wise
// plans), stale (adds sapipe, k chosen from the same profile and --compensation, default wp3, and
// pipe with K = --staleness-k, default 2), lossy (adds the codecs: --codec, or bf16 and int8), any
// (all, sapipe and pipe with the codecs too). SAPipe's prediction is never below Pipe-SGD K=2's (it
// hides no more communication and adds the compensation's compute): it is tried when predicted
// within --auto-trial of the fastest, and kept when measured fastest.
//
// Threads: the worker's compute thread makes every call (as for any TrainingMethod).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/registry.h"

namespace pipesgd {

enum class AutoPolicy { kSync, kStale, kLossy, kAny };

// The start-up iterations before auto's profiling (fewer than the planning methods'
// kProfileWarmupIterations): every profiling iteration runs dsync+optimal at full precision, up to
// 4x the iteration of the method chosen after it when communication dominates (mlp at 1 Gbit/s).
// Measured (2 workers, 10gbe): the first iteration takes 1.5x (mlp, resnet) to 14x (cnn) the steady
// one, the second and third at most 1.3x, within the machine's own swings.
inline constexpr std::int64_t kAutoProfileWarmupIterations = 3;
// "sync" | "stale" | "lossy" | "any".
const char* auto_policy_name(AutoPolicy policy);
// The policy named `name`, or nullopt.
std::optional<AutoPolicy> parse_auto_policy(std::string_view name);

// A method a test runs from iteration `start` on, in place of auto's profiling and decisions
// (AutoOptions::schedule; not a flag).
struct ScheduledMethod {
  std::int64_t start = 0;
  std::string spec;
  OptionValues flags;
};

class AutoOptions final : public MethodOptions {
 public:
  AutoPolicy policy = AutoPolicy::kSync;
  std::int64_t profile_iterations = 10;  // --profile-iters of the profiling dsync+optimal
  std::vector<std::string> codecs;       // the lossy candidates' codecs (policies lossy and any)
  int staleness = 2;                     // pipe's K (policies stale and any)
  std::string sapipe_compensation;       // --compensation of the sapipe candidate; "": wp3 (dc with "external")
  double min_gain = 0.02;                // --auto-min-gain
  double trial_margin = 0.1;             // --auto-trial; 0: no trials
  double trial_seconds = 0.05;           // --auto-trial-seconds: a contender's counted iterations last at least this long
  double drift = 0.25;                   // --auto-drift; 0: never choose again
  std::int64_t drift_window = 50;        // --auto-window
  double drift_window_seconds = 2;       // --auto-window-seconds: a window lasts at least this long
  std::int64_t min_interval = 200;       // --auto-min-interval
  // Tests: a fixed sequence of methods (the first starting at 0), no profiling and no decisions.
  std::vector<ScheduledMethod> schedule;

  // The first choice takes effect after the profiling: kAutoProfileWarmupIterations + P.
  std::optional<DeferredPhase> deferred_phase(std::int64_t warmup_iterations) const override;
  std::string fingerprint() const override;
};

MethodDescriptor auto_method();

// One method auto may switch to.
struct AutoCandidate {
  MethodSelection selection;  // e.g. spec "pipe+int8", with --staleness-k and --codec set
  std::string label;          // "pipe+int8 K=2"
  std::string accuracy_trade;  // "" for none, else what it trades ("staleness K=2", "lossy codec int8")
  int trades = 0;              // how many: 0, 1 (staleness or a codec) or 2 (both)
  double wire_bytes_per_value = 4;  // its codec's bytes on the wire per gradient value (4, bf16 2, int8 ~1)
};

// The candidates `options`' policy allows, in order of preference among equals (the synchronous
// uncompressed ones first), built on `common` (the run's optimizer, allreduce, timeout).
std::vector<AutoCandidate> auto_candidates(const AutoOptions& options, const CommonOptions& common);

// A decision: every candidate's prediction, the ranking (fastest first; equals keep candidate
// order), the choice and why, in one line's words.
struct AutoDecision {
  std::vector<IterationPrediction> predictions;  // per candidate
  std::vector<std::size_t> ranking;
  std::size_t chosen = 0;
  std::optional<std::size_t> runner_up;
  std::string why;
};

// Chooses among `candidates` from `measured` (identical on every worker: the decision is too): the
// fastest predicted, under choose_measured's --auto-min-gain rule.
AutoDecision decide_method(const std::vector<AutoCandidate>& candidates, const PlanningInputs& measured, int workers,
                           double min_gain);

// Trials: at most this many candidates. Each trial phase first runs trial_settle_iterations that
// are not measured: at least kTrialSettleIterations, and pipe's K (options.staleness), after which
// its pipeline is full.
inline constexpr std::size_t kMaxTrials = 3;
inline constexpr std::int64_t kTrialSettleIterations = 2;
std::int64_t trial_settle_iterations(const AutoOptions& options);

// The iterations each contender counts in its trial (all its phases together; an even number, split
// in two halves for the contenders that run twice): at least P (options.profile_iterations), and at
// least options.trial_seconds at `fastest_predicted_seconds` (the fastest contender's prediction),
// at most kMaxTrialCounted.
inline constexpr std::int64_t kMaxTrialCounted = 2000;
std::int64_t trial_counted_iterations(const AutoOptions& options, double fastest_predicted_seconds);

// The order in which `contenders` contenders (indices 0..n-1, the choice first) run their trials:
// 0, 1, ..., n-1, ..., 1, 0. The last one (n-1) runs once, counting all its iterations; the others
// run twice, each time counting half: every contender's counted iterations are centred on the same
// moment, so a speed that drifts steadily during the trials favours none.
std::vector<std::size_t> trial_order(std::size_t contenders);

// A trial iteration counts at most this many times the median of the trial's counted iterations.
inline constexpr double kTrialOutlier = 3;

// A trial phase's figure from one worker's `iteration_seconds` (its trial_settle_iterations and
// counted iterations): the mean of the last scratch.size() (the counted), each at most kTrialOutlier times their
// median (an iteration preempted by another job counts as a typical one). From K on, pipe's
// pipeline is full, so each counted iteration waits for its allreduce as every later one will.
// `scratch` is the caller's buffer (the hot path allocates nothing); its contents are overwritten.
double trial_figure(std::span<const double> iteration_seconds, std::span<double> scratch);

// A choice that trades accuracy on a predicted gain below this (relative) over the fastest
// candidate that trades less is tried against it: a pipelined method's prediction does not see its
// communication competing with the compute for a few cores (mlp at 10gbe, 2 workers on 2 cores:
// pipe K=2 predicted 21-30% faster than dsync+optimal; in 1-epoch compares their order changes
// from round to round).
inline constexpr double kTradeCheckGain = 0.5;

// The candidates worth a trial, at most kMaxTrials, with margin > 0 (0: the choice alone): the
// decision's choice first; if it trades accuracy (AutoCandidate::trades), the fastest predicted
// candidate that trades less, when the choice is predicted less than kTradeCheckGain faster than it;
// then, fastest first, those predicted within `margin` (relative) of the fastest prediction; among
// equal predictions, the fewest bytes on the wire first. (Equal predictions are candidates whose
// communication the model sees hidden, a codec on the same method; what the model leaves out, the
// communication's own CPU on cores it shares with compute, shrinks with the bytes: measured on cnn,
// pipe+int8 was up to 16% faster than pipe K=2 predicted equal to it.)
std::vector<std::size_t> trial_contenders(const std::vector<AutoCandidate>& candidates, const AutoDecision& decision,
                                          double margin);

// The comm/compute ratio crossed a decision boundary: with `measured` (the profile chosen from)
// scaled by what a drift window measured against its reference (the allreduce's cost a + b·M by
// `comm_scale`, every compute time by `compute_scale`), the decision is another candidate than the
// one `running`, and `running` is predicted more than `min_gain` (relative) further behind that
// choice than the unscaled profile predicts it behind its own choice (0 when the profile chose it).
struct BoundaryCrossing {
  std::size_t choice = 0;      // the candidate the scaled profile chooses
  double choice_seconds = 0;   // its predicted iteration, and the running method's, scaled
  double running_seconds = 0;
};
PlanningInputs scaled_planning_inputs(const PlanningInputs& measured, double comm_scale, double compute_scale);
std::optional<BoundaryCrossing> decision_boundary_crossed(const std::vector<AutoCandidate>& candidates,
                                                          const PlanningInputs& measured, int workers, double min_gain,
                                                          std::size_t running, double comm_scale, double compute_scale);

// The drift window of a method predicted at `predicted_seconds` per iteration: options.drift_window
// iterations, or as many as last options.drift_window_seconds (at most kMaxDriftWindow).
inline constexpr std::int64_t kMaxDriftWindow = 100'000;
std::int64_t drift_window_for(const AutoOptions& options, double predicted_seconds);

// The contender to keep, given each one's measured iteration (`seconds`, in contenders' order): of
// those less than `min_gain` (relative) slower than the fastest, the one that trades least
// (AutoCandidate::trades), the fastest among equals. So auto gives up less than min_gain to trade
// less, however many tiers of trades there are (staleness, a codec on it). Returns an index into
// `contenders`.
std::size_t choose_measured(const std::vector<AutoCandidate>& candidates, const std::vector<std::size_t>& contenders,
                            std::span<const double> seconds, double min_gain);

// What a decision's trials measured, and the contender kept. `phase_seconds` holds each trial
// phase's figure in trial_order (2n - 1 for n contenders, the workers' mean), `predicted` each
// contender's predicted iteration. A contender's measured iteration is the mean of its phases'
// figures; the trials' spread is how far the two halves of one contender measured apart at most,
// relative to their mean (the machine's own swings during the trials: on this project's shared
// 2-core machine, resnet's dsync and dsync+optimal, 2% apart in 1-epoch runs, measured up to 6.6%
// the wrong way round in 10-iteration trials). The choice is choose_measured's, unless a contender
// that trades as much accuracy is predicted faster (not equal) and measured less than
// max(min_gain, spread) slower: then the fastest predicted of those (the trials cannot tell them
// apart, and the prediction sees what they differ in, such as the overlap of a bucket plan). Like
// choose_measured, it never keeps a contender that trades less than the fastest measured and
// measured min_gain or more slower than it.
struct TrialVerdict {
  std::vector<double> seconds;      // per contender, its measured iteration
  double spread = 0;                // relative; 0 with one contender
  std::size_t fastest = 0;          // the shortest measured, an index into the contenders
  std::size_t measured_choice = 0;  // choose_measured's, an index into the contenders
  std::size_t kept = 0;             // an index into the contenders
};
TrialVerdict judge_trials(const std::vector<AutoCandidate>& candidates, const std::vector<std::size_t>& contenders,
                          std::span<const double> predicted, std::span<const double> phase_seconds, double min_gain);

}  // namespace pipesgd
