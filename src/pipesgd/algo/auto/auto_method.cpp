// `--algo auto`: the candidates, the decision and the method that switches (algo/auto/auto_method.h).
#include "pipesgd/algo/auto/auto_method.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <ostream>

#include "pipesgd/algo/planning.h"
#include "pipesgd/collective/codec_names.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {
namespace {

// select_method on the run's common options, whose optimizer stays the run's as it is: the public
// API's hand-off to the caller's optimizer ("external") is no name a spec or flag may give.
MethodSelection select_on(std::string_view spec, const OptionValues& flags, const CommonOptions& common) {
  CommonOptions parsed = common;
  if (parsed.optimizer.name == "external") {
    parsed.optimizer.name = "sgd";
    parsed.optimizer.handoff = nullptr;
  }
  MethodSelection selection = select_method(spec, flags, FlagPolicy::kReject, parsed);
  selection.common.optimizer = common.optimizer;
  return selection;
}

constexpr const char* kPolicyNames = "sync, stale, lossy or any";
// The profiling method: every input of every candidate's prediction (algo/registry.h).
constexpr const char* kProfilingSpec = "dsync+optimal";
// The partial-staleness candidate (policies stale and any).
constexpr const char* kSapipeSpec = "sapipe";
// Channel::kPlanning sequences of auto's drift reductions (the planning methods' own start at 0).
constexpr std::uint64_t kDriftSequenceBase = std::uint64_t{1} << 30;
// Consecutive windows off the reference before auto chooses again.
constexpr int kDriftStrikes = 2;
// What the workers average at the end of a drift window: the median of its iterations, the median
// of their compute (the iteration less the wait for communication) and the link probe's time.
constexpr std::size_t kDriftFigures = 3;
// A decision's trial phases at most (trial_order of kMaxTrials contenders).
constexpr std::size_t kMaxTrialPhases = 2 * kMaxTrials - 1;
static_assert(kDriftFigures <= kMaxTrialPhases, "the measurement exchange holds kMaxTrialPhases values");
// The link probe: an allreduce of the whole gradient, at most this many floats (256 KiB: a fraction
// of a millisecond at 10 Gbit/s, 2 ms at 1 Gbit/s), run kLinkProbeRuns times at each drift window's
// end on Channel::kPlanning; its time is the fastest run (the first may wait for a late peer). It
// measures the link itself: the gradients' own allreduce time also holds the wait for the peer.
constexpr std::size_t kLinkProbeFloats = std::size_t{1} << 16;
constexpr int kLinkProbeRuns = 3;
// Values a codec's wire bytes per value are averaged over (int8's per-segment scale is amortized).
constexpr std::size_t kWireBytesSample = std::size_t{1} << 20;

bool allows_staleness(AutoPolicy policy) { return policy == AutoPolicy::kStale || policy == AutoPolicy::kAny; }
bool allows_codecs(AutoPolicy policy) { return policy == AutoPolicy::kLossy || policy == AutoPolicy::kAny; }

AutoPolicy given_policy(const OptionValues& given) {
  return parse_auto_policy(given.text("--auto-policy", "sync")).value_or(AutoPolicy::kSync);
}

std::string ms(double seconds) { return concat(milliseconds(seconds), " ms"); }

// Two predicted iteration times the ranking takes for equal (the same model's figure, up to rounding).
bool equal_predictions(double x, double y) { return std::abs(x - y) <= 1e-9 * std::max(x, y); }

// The median of `values` (the upper one of an even count), reordering them in place.
double median_in_place(std::span<double> values) {
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

// One phase of the run: a method from `start` on.
struct Phase {
  std::int64_t start = 0;
  // What runs: kProfiling (dsync+optimal measuring), kChosen (candidates_[index]), kScheduled
  // (AutoOptions::schedule[index], tests) or kTrial (candidates_[index], measured against the other
  // trials of its decision).
  enum Kind : std::int64_t { kProfiling = 0, kChosen = 1, kScheduled = 2, kTrial = 3 };
  Kind kind = kProfiling;
  std::int64_t index = 0;
  std::string label;
  std::string reason;      // why it runs: the decision's line, "profiling", "scheduled", "trial ..."
  double predicted = 0;    // its predicted iteration (kChosen, kTrial), seconds
  std::string model;       // what predicted it (kChosen): "Pipe-SGD Eq. 4: max(compute, allreduce)"
  std::int64_t window = 0;  // its drift window, iterations (kChosen; drift_window_for)
};

const char* phase_kind_name(Phase::Kind kind) {
  switch (kind) {
    case Phase::kProfiling: return "profiling";
    case Phase::kChosen: return "chosen";
    case Phase::kScheduled: return "scheduled";
    case Phase::kTrial: return "trial";
  }
  return "profiling";
}

// auto's report: its phases (with the measured iteration of each), then the last method's report.
class AutoReport final : public MethodReport {
 public:
  AutoReport(AutoPolicy policy, std::vector<std::string> candidates, std::vector<Phase> phases,
             std::shared_ptr<MethodReport> last)
      : policy_(policy), candidates_(std::move(candidates)), phases_(std::move(phases)), last_(std::move(last)) {}

  void measure(const RunTimings& timings, std::int64_t first_measured) override {
    last_->measure(timings, std::max(first_measured, phases_.back().start));
    measured_.assign(phases_.size(), -1);
    // The run's prediction over [first_measured, end): each chosen phase's prediction, each
    // profiling phase as measured (nothing predicts it), weighted by its measured iterations.
    double weighted = 0, count = 0;
    std::size_t chosen_phases = 0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const std::int64_t end = i + 1 < phases_.size() ? phases_[i + 1].start : timings.iterations();
      if (timings.recorded(phases_[i].start, end) > 0) measured_[i] = timings.mean(phases_[i].start, end).iteration;
      const std::int64_t from = std::max(first_measured, phases_[i].start);
      const auto n = static_cast<double>(timings.recorded(from, end));
      if (n == 0) continue;
      const bool chosen = phases_[i].kind == Phase::kChosen;
      chosen_phases += chosen ? 1 : 0;
      weighted += n * (chosen ? phases_[i].predicted : timings.mean(from, end).iteration);
      count += n;
    }
    predicted_ = chosen_phases > 0 && count > 0 ? weighted / count : 0;
    // What choosing cost: each profiling and trial phase's iterations at its measured time less the
    // time of the method chosen after them; against the whole run's iterations. The start-up is
    // what comes before the first choice.
    profiling_cost_ = startup_cost_ = run_seconds_ = 0;
    bool started = false;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const std::int64_t end = i + 1 < phases_.size() ? phases_[i + 1].start : timings.iterations();
      const auto n = static_cast<double>(timings.recorded(phases_[i].start, end));
      if (measured_[i] >= 0) run_seconds_ += n * measured_[i];
      if (phases_[i].kind == Phase::kChosen) started = true;
      if (phases_[i].kind != Phase::kProfiling && phases_[i].kind != Phase::kTrial) continue;
      std::size_t chosen = i + 1;
      while (chosen < phases_.size() && phases_[chosen].kind != Phase::kChosen) ++chosen;
      if (measured_[i] < 0 || chosen == phases_.size() || measured_[chosen] < 0) continue;
      const double cost = n * std::max(0.0, measured_[i] - measured_[chosen]);
      profiling_cost_ += cost;
      if (!started) startup_cost_ += cost;
    }
    // The report's sentence reads "timing model is X; ... measured R x the X prediction".
    model_ = chosen_phases == 1 && count == static_cast<double>(timings.recorded(first_measured, timings.iterations()))
                 ? chosen_model()
                 : concat("phase by phase (auto: ", chosen_phases, " choices)");
  }
  double predicted_iteration() const override { return predicted_; }
  std::string timing_model() const override { return predicted_ > 0 ? model_ : ""; }
  std::string bucket_plan() const override { return last_->bucket_plan(); }
  std::size_t allreduce_calls() const override { return last_->allreduce_calls(); }
  const PlanningInputs* planning_inputs() const override { return last_->planning_inputs(); }

  void add_json(nlohmann::json& summary, const RunFigures& run) const override {
    nlohmann::json phases = nlohmann::json::array();
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      phases.push_back({{"start_iteration", phase.start},
                        {"method", phase.label},
                        {"kind", phase_kind_name(phase.kind)},
                        {"model", phase.model.empty() ? nlohmann::json(nullptr) : nlohmann::json(phase.model)},
                        {"why", phase.reason},
                        {"predicted_iteration_s", phase.kind == Phase::kChosen || phase.kind == Phase::kTrial
                                                      ? nlohmann::json(phase.predicted)
                                                      : nullptr},
                        {"measured_iteration_s",
                         i < measured_.size() && measured_[i] >= 0 ? nlohmann::json(measured_[i]) : nullptr},
                        {"drift_window_iterations", phase.kind == Phase::kChosen ? nlohmann::json(phase.window) : nullptr}});
    }
    auto fraction = [&](double seconds) { return run_seconds_ > 0 ? nlohmann::json(seconds / run_seconds_) : nullptr; };
    summary["auto"] = {{"policy", auto_policy_name(policy_)},
                       {"candidates", candidates_},
                       {"phases", std::move(phases)},
                       {"startup_cost_s", startup_cost_},
                       {"startup_cost_fraction", fraction(startup_cost_)},
                       {"profiling_cost_s", profiling_cost_},
                       {"profiling_cost_fraction", fraction(profiling_cost_)}};
    (void)run;
  }

  void print(std::ostream& out, const RunFigures&) const override {
    out << "\nauto (policy " << auto_policy_name(policy_) << "):\n";
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      out << "  from iteration " << phase.start << ": " << phase.label;
      if (phase.kind == Phase::kChosen || phase.kind == Phase::kTrial) out << ", predicted " << ms(phase.predicted);
      if (i < measured_.size() && measured_[i] >= 0) out << ", measured " << ms(measured_[i]);
      out << " (" << phase.reason << ")\n";
    }
    if (run_seconds_ > 0) {
      out << "  start-up cost " << format_number("%.3f", startup_cost_) << " s, "
          << format_number("%.1f%%", 100 * startup_cost_ / run_seconds_)
          << " of the run's iterations (each profiling and trial iteration before the first choice less one of the "
             "method chosen)\n";
      if (profiling_cost_ > startup_cost_) {
        out << "  with the choices after a drift " << format_number("%.3f", profiling_cost_) << " s, "
            << format_number("%.1f%%", 100 * profiling_cost_ / run_seconds_) << "\n";
      }
    }
  }

 private:
  AutoPolicy policy_;
  std::vector<std::string> candidates_;  // their labels, e.g. "pipe+int8 K=2"
  std::vector<Phase> phases_;
  std::shared_ptr<MethodReport> last_;
  // The one chosen phase's model as the report's sentence names it: "Pipe-SGD Eq. 4 (auto chose pipe
  // K=2)", the model's words before its colon.
  std::string chosen_model() const {
    for (const Phase& phase : phases_) {
      if (phase.kind != Phase::kChosen) continue;
      std::string headline = phase.model.substr(0, phase.model.find(':'));
      if (headline.rfind("the ", 0) == 0) headline.erase(0, 4);
      return concat(headline, " (auto chose ", phase.label, ")");
    }
    return "";
  }

  std::vector<double> measured_;  // per phase, -1: not measured
  double predicted_ = 0;
  std::string model_;
  double profiling_cost_ = 0;  // seconds: every profiling and trial phase
  double startup_cost_ = 0;    // seconds: those before the first choice
  double run_seconds_ = 0;     // the recorded iterations' total
};

class AutoMethod final : public TrainingMethod {
 public:
  explicit AutoMethod(const MethodContext& context)
      : context_(context),
        options_(options_as<AutoOptions>(context.options)),
        workers_(context.transport.size()),
        candidates_(auto_candidates(options_, context.common)),
        profiler_(select_on(kProfilingSpec,
                            {{"--codec", "none"}, {"--profile-iters", std::to_string(options_.profile_iterations)}},
                            context.common)),
        measurement_exchange_(context.transport, kMaxTrialPhases, context.common.timeout),
        link_probe_buffer_(std::max<std::size_t>(1, std::min(context.model.layout().total(), kLinkProbeFloats)), 0.0f),
        link_probe_(context.transport, link_probe_buffer_.size(), context.common.timeout),

        trial_figures_(kMaxTrialPhases, 0.0) {
    for (const ScheduledMethod& scheduled : options_.schedule) {
      scheduled_.push_back(select_on(scheduled.spec, scheduled.flags, context.common));
    }
    forward_ready_ = [this](std::size_t segment, double seconds) {
      if (current_ready_ != nullptr && *current_ready_) (*current_ready_)(segment, seconds);
    };
    if (!options_.schedule.empty()) {
      PIPESGD_ASSERT(options_.schedule.front().start == 0);
      for (std::size_t i = 0; i < options_.schedule.size(); ++i) {
        phases_.push_back({options_.schedule[i].start, Phase::kScheduled, static_cast<std::int64_t>(i),
                           options_.schedule[i].spec, "scheduled", 0, "", 0});
      }
    } else {
      phases_.push_back({0, Phase::kProfiling, 0, kProfilingSpec, "profiling", 0, "", 0});
    }
    build(0, context.first_iteration);
  }

  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override {
    if (next_phase_ == phases_.size() && phases_[current_phase_].kind == Phase::kTrial &&
        t == phases_[current_phase_].start + static_cast<std::int64_t>(trial_seconds_.size())) {
      finish_current(times);
      choose_after_trials(t - 1);
    }
    if (next_phase_ < phases_.size() && phases_[next_phase_].start == t) switch_to(next_phase_, t, times);
    iteration_clock_.restart();
    return current_->begin_iteration(t, times);
  }

  void end_iteration(std::int64_t t, IterationTimes& times) override {
    current_->end_iteration(t, times);
    if (!options_.schedule.empty()) return;
    const Phase& phase = phases_[current_phase_];
    if (phase.kind == Phase::kProfiling) {
      if (t == decision_iteration(phase.start)) choose(t);
      return;
    }
    if (phase.kind == Phase::kTrial) {
      watch_trial(t, iteration_clock_.seconds());
      return;
    }
    watch_drift(t, iteration_clock_.seconds(), times);
  }

  void finish(IterationTimes& times) override { finish_current(times); }
  const SegmentReadyFn* segment_ready() override { return &forward_ready_; }
  std::shared_ptr<MethodReport> report() const override {
    std::vector<std::string> labels;
    for (const AutoCandidate& candidate : candidates_) labels.push_back(candidate.label);
    return std::make_shared<AutoReport>(options_.policy, std::move(labels), phases_, current_->report());
  }
  std::uint64_t replica_checksum(FlatParameters& model) const override { return current_->replica_checksum(model); }
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return current_->first_message_sequence(t);
  }
  Optimizer* optimizer() override { return current_->optimizer(); }

  void save_state(CheckpointWriter& out) override {
    save_own_state(out);
    current_->save_state(out);
  }
  void save_state_when_ready(CheckpointWriter out, const CommitReady& ready) override {
    save_own_state(out);
    current_->save_state_when_ready(std::move(out), ready);
  }

  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override {
    const std::string prefix = "method.auto.";
    auto refuse = [&](const std::string& why) { return DataError(concat("checkpoint '", in.origin(), "': ", why)); };
    const std::int64_t count = in.integer(prefix + "phases");
    if (count < 1 || count > 1'000'000) throw refuse(concat(count, " auto phases"));
    std::vector<Phase> phases;
    for (std::int64_t i = 0; i < count; ++i) {
      const std::string name = concat(prefix, "phase", i, ".");
      Phase phase;
      phase.start = in.integer(name + "start");
      const std::int64_t kind = in.integer(name + "kind");
      phase.index = in.integer(name + "index");
      const std::size_t limit = kind == Phase::kChosen || kind == Phase::kTrial ? candidates_.size()
                                : kind == Phase::kScheduled                  ? scheduled_.size()
                                                                             : 1;
      // Scheduled phases are the schedule's (all of it, ahead of time); the others are decisions,
      // the last of which may start at next_iteration (a decision's trials, all of them).
      const bool scheduled_here = kind == Phase::kScheduled
                                      ? phase.index == i && static_cast<std::size_t>(i) < options_.schedule.size() &&
                                            phase.start == options_.schedule[static_cast<std::size_t>(i)].start
                                      : options_.schedule.empty() && (phase.start <= next_iteration || kind == Phase::kTrial);
      if (kind < Phase::kProfiling || kind > Phase::kTrial || phase.index < 0 ||
          static_cast<std::size_t>(phase.index) >= limit || phase.start < 0 || !scheduled_here ||
          (i > 0 && phase.start <= phases.back().start) || (i == 0 && phase.start != 0)) {
        throw refuse(concat("auto phase ", i, " is not one this run's options can have (kind ", kind, ", index ",
                            phase.index, ", start ", phase.start, ")"));
      }
      phase.kind = static_cast<Phase::Kind>(kind);
      phase.label = std::string(in.string(name + "label"));
      const std::string expected_label = kind == Phase::kProfiling ? std::string(kProfilingSpec)
                                          : kind == Phase::kScheduled
                                              ? options_.schedule[static_cast<std::size_t>(phase.index)].spec
                                              : candidates_[static_cast<std::size_t>(phase.index)].label;
      if (phase.label != expected_label) {
        throw refuse(concat("auto phase ", i, " ran ", phase.label, ", which this run's candidate ", phase.index,
                            " is not (", expected_label, ")"));
      }
      phase.reason = std::string(in.string(name + "reason"));
      phase.predicted = in.real(name + "predicted");
      phase.model = std::string(in.string(name + "model"));
      phase.window = in.integer(name + "window");
      if (kind == Phase::kChosen && (phase.window < 1 || phase.window > std::max(kMaxDriftWindow, options_.drift_window))) {
        throw refuse(concat("auto phase ", i, " has a drift window of ", phase.window, " iterations"));
      }
      phases.push_back(std::move(phase));
    }
    if (in.integer(prefix + "has_measured") != 0) {
      PlanningInputs measured;
      const std::size_t layers = context_.model.layout().segment_count();
      measured.profile.bytes = in.doubles(prefix + "measured.bytes", layers);
      measured.profile.backward_seconds = in.doubles(prefix + "measured.backward_seconds", layers);
      measured.profile.forward_seconds = in.real(prefix + "measured.forward_seconds");
      measured.profile.per_bucket_compute_seconds = in.real(prefix + "measured.kappa_seconds");
      measured.update_seconds = in.real(prefix + "measured.update_seconds");
      measured.backward_tail_seconds = in.real(prefix + "measured.backward_tail_seconds");
      measured.cost = LinearCost{in.real(prefix + "measured.cost.a"), in.real(prefix + "measured.cost.b")};
      measured_ = std::move(measured);
    } else {
      measured_.reset();
    }
    phases_ = std::move(phases);
    // The state that follows is the method of the phase that ran iteration next - 1; a phase
    // starting at next_iteration is a switch still to make.
    std::size_t running = 0;
    while (running + 1 < phases_.size() && phases_[running + 1].start < next_iteration) ++running;
    build(running, phases_[running].start);
    const std::vector<double> window = in.doubles(prefix + "drift.window_seconds", window_seconds_.size());
    std::copy(window.begin(), window.end(), window_seconds_.begin());
    reference_seconds_ = in.real(prefix + "drift.reference_seconds");
    // The compute window and the references of the comm/compute ratio (a commit written before they
    // were has none: the ratio is not watched until the next switch sets a reference).
    if (in.has(prefix + "drift.window_compute_seconds")) {
      const std::vector<double> compute = in.doubles(prefix + "drift.window_compute_seconds", window_compute_.size());
      std::copy(compute.begin(), compute.end(), window_compute_.begin());
      reference_probe_ = in.real(prefix + "drift.reference_probe_seconds");
      reference_compute_ = in.real(prefix + "drift.reference_compute_seconds");
    }
    strikes_ = static_cast<int>(in.integer(prefix + "drift.strikes"));
    drift_windows_ = in.integer(prefix + "drift.windows");
    measurement_exchanges_ = static_cast<std::uint64_t>(in.integer(prefix + "drift.exchanges"));
    // Only a trial phase's iterations matter (its length, as its phases say); each phase's figure so far.
    const std::vector<double> trial = in.doubles(prefix + "trial.seconds");
    if (phases_[running].kind == Phase::kTrial) {
      if (trial.size() != trial_seconds_.size()) {
        throw refuse(concat("auto's trial phase ", running, " has ", trial.size(), " iterations, its phases say ",
                            trial_seconds_.size()));
      }
      std::copy(trial.begin(), trial.end(), trial_seconds_.begin());
    }
    const std::vector<double> figures = in.doubles(prefix + "trial.figures");
    if (figures.size() > trial_figures_.size()) throw refuse(concat(figures.size(), " auto trial figures"));
    std::fill(trial_figures_.begin(), trial_figures_.end(), 0.0);
    std::copy(figures.begin(), figures.end(), trial_figures_.begin());
    current_->load_state(in, next_iteration);
  }

 private:
  // The first iteration after the profiling that starts at `start` ends: its plan is made then.
  std::int64_t decision_iteration(std::int64_t start) const {
    return (start == 0 ? kAutoProfileWarmupIterations : start) + options_.profile_iterations - 1;
  }

  // Builds phase `phase`'s method, starting at `first` (no state: a fresh method or one loaded next).
  void build(std::size_t phase, std::int64_t first) {
    const Phase& p = phases_[phase];
    const MethodSelection& selection = p.kind == Phase::kProfiling ? profiler_
                                       : p.kind == Phase::kScheduled
                                           ? scheduled_[static_cast<std::size_t>(p.index)]
                                           : candidates_[static_cast<std::size_t>(p.index)].selection;
    MethodContext context{context_.transport, context_.model, selection.common, *selection.options,
                          /*warmup_iterations=*/0, context_.network, context_.learning_rate_schedule};
    context.first_iteration = first;
    context.profile_warmup_iterations = kAutoProfileWarmupIterations;
    if ((p.kind == Phase::kChosen || p.kind == Phase::kTrial) && measured_) context.planned_from = &*measured_;
    current_.reset();  // its comm thread stops before the next one starts
    current_ = selection.descriptor->make(context);
    current_ready_ = current_->segment_ready();
    current_phase_ = phase;
    next_phase_ = phase + 1;
    current_finished_ = false;
    // A chosen phase's drift window (allocated here, at a switch, not per iteration).
    const std::size_t window = p.kind == Phase::kChosen ? static_cast<std::size_t>(p.window) : 0;
    window_seconds_.assign(window, 0.0);
    window_compute_.assign(window, 0.0);
    // A trial phase's iterations and the scratch for its counted ones' median (also at a switch).
    const std::int64_t trial_length = p.kind == Phase::kTrial ? trial_phase_length(phase) : 0;
    const std::int64_t trial_counted = p.kind == Phase::kTrial ? trial_length - trial_settle_iterations(options_) : 0;
    PIPESGD_ASSERT(p.kind != Phase::kTrial || trial_counted > 0);
    trial_seconds_.assign(static_cast<std::size_t>(trial_length), 0.0);
    trial_sorted_.assign(static_cast<std::size_t>(trial_counted), 0.0);
    drift_windows_ = 0;
    reference_seconds_ = reference_probe_ = reference_compute_ = 0;
    strikes_ = 0;
  }

  // At the boundary before iteration t: the method running finishes (what it has in flight is
  // applied), hands its optimizer's state over, and phase `phase`'s method takes over.
  void switch_to(std::size_t phase, std::int64_t t, IterationTimes& times) {
    trace_phase(phases_[phase], t);
    finish_current(times);
    CheckpointWriter optimizer_state;
    Optimizer* before = current_->optimizer();
    if (before != nullptr) before->save_state(optimizer_state, "optimizer.");
    build(phase, t);
    Optimizer* after = current_->optimizer();
    PIPESGD_ASSERT((before == nullptr) == (after == nullptr));
    if (after != nullptr) {
      after->load_state(CheckpointReader::parse(optimizer_state.serialize(), "<auto's switch>"), "optimizer.");
    }
  }

  // An instant "auto switch" at iteration t on the calling thread's trace (if it records t): its
  // detail names the phase's method, kind, prediction and why.
  static void trace_phase(const Phase& phase, std::int64_t t) {
    ThreadTrace* trace = current_thread_trace();
    if (trace == nullptr || !trace->recording()) return;
    TraceArgs args;
    args.iteration = t;
    std::string detail = concat(phase.label, " (", phase_kind_name(phase.kind), ")");
    if (phase.kind == Phase::kChosen || phase.kind == Phase::kTrial) detail += concat(", predicted ", ms(phase.predicted));
    args.detail = trace->recorder().intern(concat(detail, ": ", phase.reason));
    trace_instant("auto switch", kTraceRun, args);
  }

  // The profiling's plan was made at the end of iteration t: choose, and switch at t + 1.
  void choose(std::int64_t t) {
    measured_ = current_->planning_inputs();  // the profiling method planned at the end of iteration t
    PIPESGD_ASSERT(measured_.has_value());
    const AutoDecision decision = decide_method(candidates_, *measured_, workers_, options_.min_gain);
    const std::vector<std::size_t> contenders = trial_contenders(candidates_, decision, options_.trial_margin);
    if (contenders.size() > 1) {
      double fastest = decision.predictions[contenders.front()].seconds;
      for (const std::size_t c : contenders) fastest = std::min(fastest, decision.predictions[c].seconds);
      const std::int64_t counted = trial_counted_iterations(options_, fastest);
      const std::int64_t settle = trial_settle_iterations(options_);
      const std::size_t n = contenders.size();
      const std::vector<std::size_t> order = trial_order(n);
      std::int64_t start = t + 1;
      for (std::size_t position = 0; position < order.size(); ++position) {
        const std::size_t j = order[position];
        const std::size_t c = contenders[j];
        const IterationPrediction& predicted = decision.predictions[c];
        std::string reason = concat("trial ", j + 1, " of ", n);
        if (j + 1 < n) reason += position + 1 < n ? ", first half" : ", second half";
        phases_.push_back({start, Phase::kTrial, static_cast<std::int64_t>(c), candidates_[c].label, reason,
                           predicted.seconds, predicted.model, 0});
        start += settle + (j + 1 < n ? counted / 2 : counted);
      }
      std::vector<std::string> tried;
      for (const std::size_t c : contenders) {
        const IterationPrediction& predicted = decision.predictions[c];
        // Beyond the margin only the trade's check (trial_contenders).
        const bool check = predicted.seconds > decision.predictions[decision.ranking.front()].seconds *
                                                   (1 + options_.trial_margin);
        tried.push_back(concat(candidates_[c].label, " (predicted ", ms(predicted.seconds),
                               check ? ", to measure the trade's gain" : "", ")"));
      }
      std::vector<std::string> sequence;
      for (const std::size_t j : order) sequence.push_back(concat(j + 1));
      next_phase_ = phases_.size() - order.size();
      if (context_.announce) {
        context_.announce(concat("auto:", auto_policy_name(options_.policy), " tries ", join(tried, ", "),
                                 ", predicted within ", format_number("%g%%", 100 * options_.trial_margin),
                                 " (--auto-trial), for ", counted, " counted iterations each (in the order ",
                                 join(sequence, " "), ", ", settle, " settling at each switch, ", start - (t + 1),
                                 " in all) from iteration ", t + 1, "; ", decision.why));
      }
      return;
    }
    const AutoCandidate& chosen = candidates_[decision.chosen];
    std::string line = concat("auto:", auto_policy_name(options_.policy), " chose ", chosen.label, " from iteration ",
                              t + 1, ": predicted ", ms(decision.predictions[decision.chosen].seconds),
                              " per iteration");
    if (decision.runner_up) {
      line += concat(" (runner-up ", candidates_[*decision.runner_up].label, ", ",
                     ms(decision.predictions[*decision.runner_up].seconds), ")");
    }
    line += concat("; ", decision.why);
    const double predicted = decision.predictions[decision.chosen].seconds;
    phases_.push_back({t + 1, Phase::kChosen, static_cast<std::int64_t>(decision.chosen), chosen.label, decision.why,
                       predicted, decision.predictions[decision.chosen].model, drift_window_for(options_, predicted)});
    next_phase_ = phases_.size() - 1;
    if (context_.announce) context_.announce(line);
  }

  // The method running applies what it has in flight, once.
  void finish_current(IterationTimes& times) {
    if (current_finished_) return;
    current_->finish(times);
    current_finished_ = true;
  }

  // The first phase of the trials phase `phase` belongs to (a decision's trials follow each other).
  std::size_t first_trial_phase(std::size_t phase) const {
    std::size_t first = phase;
    while (first > 0 && phases_[first - 1].kind == Phase::kTrial) --first;
    return first;
  }
  std::size_t first_trial_phase() const { return first_trial_phase(current_phase_); }

  // The iterations of trial phase `phase`: to the next phase's start; the last of a decision's
  // trials is its first contender's second half, as long as its first.
  std::int64_t trial_phase_length(std::size_t phase) const {
    if (phase + 1 < phases_.size()) return phases_[phase + 1].start - phases_[phase].start;
    const std::size_t first = first_trial_phase(phase);
    PIPESGD_ASSERT(first < phase);
    return phases_[first + 1].start - phases_[first].start;
  }

  // A trial phase's iteration t took `seconds` on this worker; at the phase's end its figure is
  // trial_figure of them (the settling iterations are not counted: they hold the switch's one-time
  // costs, building the method and its first allreduces, which a short mean would weigh heavily).
  void watch_trial(std::int64_t t, double seconds) {
    const auto since = static_cast<std::size_t>(t - phases_[current_phase_].start);
    PIPESGD_ASSERT(since < trial_seconds_.size());
    trial_seconds_[since] = seconds;
    if (since + 1 < trial_seconds_.size()) return;
    const std::size_t slot = current_phase_ - first_trial_phase();
    PIPESGD_ASSERT(slot < trial_figures_.size());
    trial_figures_[slot] = trial_figure(trial_seconds_, trial_sorted_);
  }

  // The last trial phase ended with iteration t and was drained: the workers average each phase's
  // figure and judge_trials keeps one contender, from t + 1 on.
  void choose_after_trials(std::int64_t t) {
    const std::size_t first = first_trial_phase();
    const std::size_t phase_count = phases_.size() - first;
    const std::size_t count = (phase_count + 1) / 2;
    PIPESGD_ASSERT(phase_count == 2 * count - 1 && count <= kMaxTrials);  // trial_order's length
    std::array<float, kMaxTrialPhases> sums{};
    for (std::size_t p = 0; p < phase_count; ++p) sums[p] = static_cast<float>(trial_figures_[p]);
    measurement_exchange_.sum(std::span<float>(sums.data(), phase_count),
                              kDriftSequenceBase + measurement_exchanges_++);
    std::array<double, kMaxTrialPhases> phase_seconds{};
    for (std::size_t p = 0; p < phase_count; ++p) phase_seconds[p] = sums[p] / static_cast<float>(workers_);
    std::vector<std::size_t> contenders;
    std::vector<double> predicted;
    for (std::size_t j = 0; j < count; ++j) {
      contenders.push_back(static_cast<std::size_t>(phases_[first + j].index));
      predicted.push_back(phases_[first + j].predicted);
    }
    const TrialVerdict verdict = judge_trials(candidates_, contenders, predicted,
                                              std::span<const double>(phase_seconds.data(), phase_count),
                                              options_.min_gain);
    const std::vector<double>& seconds = verdict.seconds;
    const std::size_t keep = verdict.kept, measured = verdict.measured_choice, fastest = verdict.fastest;
    const std::size_t chosen = contenders[keep];
    std::vector<std::string> others;
    for (std::size_t j = 0; j < count; ++j) {
      if (j != keep) others.push_back(concat(candidates_[contenders[j]].label, " ", ms(seconds[j])));
    }
    const auto faster = [&](std::size_t slower, std::size_t than) {
      return format_number("%.1f%%", 100 * (seconds[slower] / seconds[than] - 1));
    };
    std::string why = concat(fastest == keep ? "the shortest iteration in the trials: " : "the iteration in the trials: ",
                             ms(seconds[keep]), " (", join(others, ", "), "; halves ",
                             format_number("%.1f%%", 100 * verdict.spread), " apart at most)");
    if (fastest != measured) {
      why += concat("; ", candidates_[contenders[fastest]].label, " measured ", faster(measured, fastest),
                    " faster but trades more accuracy (", candidates_[contenders[fastest]].accuracy_trade,
                    "), below the ", format_number("%g%%", 100 * options_.min_gain), " minimum (--auto-min-gain)");
    }
    if (measured != keep) {
      why += concat("; ", candidates_[contenders[measured]].label, " measured ", faster(keep, measured),
                    " faster, less than the trials can tell apart (the larger of the ",
                    format_number("%g%%", 100 * options_.min_gain), " minimum, --auto-min-gain, and the halves' ",
                    format_number("%.1f%%", 100 * verdict.spread), "), and is predicted slower (",
                    ms(predicted[measured]), " against ", ms(predicted[keep]), ")");
    }
    const Phase trial = phases_[first + keep];
    // Its drift window from its measured iteration (the same figure on every worker).
    phases_.push_back({t + 1, Phase::kChosen, static_cast<std::int64_t>(chosen), candidates_[chosen].label, why,
                       trial.predicted, trial.model, drift_window_for(options_, seconds[keep])});
    next_phase_ = phases_.size() - 1;
    if (context_.announce) {
      context_.announce(concat("auto:", auto_policy_name(options_.policy), " chose ", candidates_[chosen].label,
                               " from iteration ", t + 1, ": ", why, "; predicted ", ms(trial.predicted)));
    }
  }

  // Every drift_window iterations of a chosen method: the workers' means of their median iteration
  // and compute in the window (a few iterations preempted by another job do not move a median) and
  // of the link probe's time, against the reference (the second window after the switch; the first
  // settles). A window strikes when its iteration is off the reference by more than --auto-drift,
  // or when its comm/compute ratio (probe / compute) is and, with the profile scaled by the probe and
  // the compute, another candidate is predicted faster (decision_boundary_crossed). Two strikes in a
  // row choose again.
  void watch_drift(std::int64_t t, double seconds, const IterationTimes& times) {
    if (options_.drift <= 0) return;
    const std::int64_t since = t + 1 - phases_[current_phase_].start;
    const auto window_length = static_cast<std::int64_t>(window_seconds_.size());
    const auto slot = static_cast<std::size_t>((since - 1) % window_length);
    window_seconds_[slot] = seconds;
    window_compute_[slot] = std::max(0.0, seconds - times.wait);
    if (since % window_length != 0) return;
    std::array<float, kDriftFigures> medians = {static_cast<float>(median_in_place(window_seconds_)),
                                                static_cast<float>(median_in_place(window_compute_)),
                                                static_cast<float>(probe_link())};
    measurement_exchange_.sum(medians, kDriftSequenceBase + measurement_exchanges_++);
    const double window = medians[0] / static_cast<float>(workers_);
    const double compute = medians[1] / static_cast<float>(workers_);
    const double probe = medians[2] / static_cast<float>(workers_);
    if (++drift_windows_ == 1) return;
    if (drift_windows_ == 2) {
      reference_seconds_ = window;
      reference_probe_ = probe;
      reference_compute_ = compute;
      return;
    }
    const auto outside = [&](double ratio) { return ratio > 1 + options_.drift || ratio < 1 / (1 + options_.drift); };
    const double ratio = window / reference_seconds_;
    std::optional<BoundaryCrossing> crossing;
    if (!outside(ratio) && measured_ && workers_ > 1 && reference_probe_ > 0 && reference_compute_ > 0 && probe > 0 &&
        compute > 0 && outside((probe / compute) / (reference_probe_ / reference_compute_))) {
      crossing = decision_boundary_crossed(candidates_, *measured_, workers_, options_.min_gain,
                                           static_cast<std::size_t>(phases_[current_phase_].index),
                                           probe / reference_probe_, compute / reference_compute_);
    }
    strikes_ = outside(ratio) || crossing ? strikes_ + 1 : 0;
    if (strikes_ < kDriftStrikes || since < options_.min_interval) return;
    const std::string band = concat(format_number("x%.2f", 1 / (1 + options_.drift)), " to ",
                                    format_number("x%.2f", 1 + options_.drift), " (--auto-drift ",
                                    format_number("%g", options_.drift), ")");
    const std::string in_a_row = concat(" for ", kDriftStrikes, " windows of ", window_length, " iterations in a row");
    std::string why;
    if (crossing) {
      why = concat("the link probe (an allreduce of ", link_probe_buffer_.size() * sizeof(float), " bytes) moved from ",
                   ms(reference_probe_), " to ", ms(probe), " and the compute from ",
                   ms(reference_compute_), " to ", ms(compute), " per iteration (comm/compute ",
                   format_number("x%.2f", (probe / compute) / (reference_probe_ / reference_compute_)), ", outside ", band,
                   "): with them the profile predicts ", candidates_[crossing->choice].label, " ",
                   ms(crossing->choice_seconds), " against ", phases_[current_phase_].label, " ",
                   ms(crossing->running_seconds), in_a_row);
    } else {
      why = concat("the measured iteration moved from ", ms(reference_seconds_), " to ", ms(window), " (",
                   format_number("x%.2f", ratio), ", outside ", band, ")", in_a_row);
    }
    phases_.push_back({t + 1, Phase::kProfiling, 0, kProfilingSpec, concat("profiling again: ", why), 0, "", 0});
    next_phase_ = phases_.size() - 1;
    if (context_.announce) context_.announce(concat("auto: ", why, "; profiling again from iteration ", t + 1));
  }

  // The link probe (collective: every worker at the same window's end): the fastest of
  // kLinkProbeRuns allreduces of link_probe_buffer_, seconds (0 with one worker).
  double probe_link() {
    if (workers_ < 2) return 0;
    double fastest = 0;
    for (int run = 0; run < kLinkProbeRuns; ++run) {
      const Stopwatch clock;
      link_probe_.sum(link_probe_buffer_, kDriftSequenceBase + measurement_exchanges_++);
      const double seconds = clock.seconds();
      fastest = run == 0 ? seconds : std::min(fastest, seconds);
    }
    return fastest;
  }

  void save_own_state(CheckpointWriter& out) const {
    const std::string prefix = "method.auto.";
    out.add_int(prefix + "phases", static_cast<std::int64_t>(phases_.size()));
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const std::string name = concat(prefix, "phase", i, ".");
      out.add_int(name + "start", phases_[i].start);
      out.add_int(name + "kind", phases_[i].kind);
      out.add_int(name + "index", phases_[i].index);
      out.add_string(name + "label", phases_[i].label);
      out.add_string(name + "reason", phases_[i].reason);
      out.add_double(name + "predicted", phases_[i].predicted);
      out.add_string(name + "model", phases_[i].model);
      out.add_int(name + "window", phases_[i].window);
    }
    out.add_int(prefix + "has_measured", measured_ ? 1 : 0);
    if (measured_) {
      out.add_doubles(prefix + "measured.bytes", measured_->profile.bytes);
      out.add_doubles(prefix + "measured.backward_seconds", measured_->profile.backward_seconds);
      out.add_double(prefix + "measured.forward_seconds", measured_->profile.forward_seconds);
      out.add_double(prefix + "measured.kappa_seconds", measured_->profile.per_bucket_compute_seconds);
      out.add_double(prefix + "measured.update_seconds", measured_->update_seconds);
      out.add_double(prefix + "measured.backward_tail_seconds", measured_->backward_tail_seconds);
      out.add_double(prefix + "measured.cost.a", measured_->cost.a);
      out.add_double(prefix + "measured.cost.b", measured_->cost.b);
    }
    out.add_doubles(prefix + "drift.window_seconds", window_seconds_);
    out.add_double(prefix + "drift.reference_seconds", reference_seconds_);
    out.add_doubles(prefix + "drift.window_compute_seconds", window_compute_);
    out.add_double(prefix + "drift.reference_probe_seconds", reference_probe_);
    out.add_double(prefix + "drift.reference_compute_seconds", reference_compute_);
    out.add_int(prefix + "drift.strikes", strikes_);
    out.add_int(prefix + "drift.windows", drift_windows_);
    out.add_int(prefix + "drift.exchanges", static_cast<std::int64_t>(measurement_exchanges_));
    out.add_doubles(prefix + "trial.seconds", trial_seconds_);
    out.add_doubles(prefix + "trial.figures", trial_figures_);
  }

  const MethodContext context_;  // as built (its references outlive the method); first_iteration 0
  const AutoOptions& options_;
  const int workers_;
  const std::vector<AutoCandidate> candidates_;
  const MethodSelection profiler_;
  std::vector<MethodSelection> scheduled_;
  PlanningExchange measurement_exchange_;  // the workers' sums of drift-window figures and of trial figures
  std::vector<float> link_probe_buffer_;   // what the link probe allreduces: zeros, whose sums stay zero
  PlanningExchange link_probe_;            // the drift windows' link probe (kLinkProbeFloats at most)

  std::vector<Phase> phases_;  // in order of start; the last may start after the current iteration
  std::size_t current_phase_ = 0;
  std::size_t next_phase_ = 1;
  std::unique_ptr<TrainingMethod> current_;
  const SegmentReadyFn* current_ready_ = nullptr;
  SegmentReadyFn forward_ready_;
  std::optional<PlanningInputs> measured_;  // the last profiling's, averaged over the workers
  Stopwatch iteration_clock_;
  // This worker's iterations of the current drift window (the chosen phase's window of them) and
  // their compute (the iteration less IterationTimes::wait).
  std::vector<double> window_seconds_;
  std::vector<double> window_compute_;
  // This worker's iterations of the current trial phase (allocated when it starts), its counted
  // ones' copy to take their median, and each trial phase's figure so far (kMaxTrialPhases).
  std::vector<double> trial_seconds_;
  std::vector<double> trial_sorted_;
  std::vector<double> trial_figures_;
  bool current_finished_ = false;  // current_->finish ran (at a switch or the run's end)
  double reference_seconds_ = 0;  // the workers' mean iteration in the reference window
  double reference_probe_ = 0;    // and their mean link probe and compute per iteration there
  double reference_compute_ = 0;
  int strikes_ = 0;
  std::int64_t drift_windows_ = 0;
  std::uint64_t measurement_exchanges_ = 0;
};

}  // namespace

const char* auto_policy_name(AutoPolicy policy) {
  switch (policy) {
    case AutoPolicy::kSync: return "sync";
    case AutoPolicy::kStale: return "stale";
    case AutoPolicy::kLossy: return "lossy";
    case AutoPolicy::kAny: return "any";
  }
  return "sync";
}

std::optional<AutoPolicy> parse_auto_policy(std::string_view name) {
  for (AutoPolicy policy : {AutoPolicy::kSync, AutoPolicy::kStale, AutoPolicy::kLossy, AutoPolicy::kAny}) {
    if (name == auto_policy_name(policy)) return policy;
  }
  return std::nullopt;
}

std::optional<DeferredPhase> AutoOptions::deferred_phase(std::int64_t) const {
  if (!schedule.empty()) return std::nullopt;
  const std::int64_t start = kAutoProfileWarmupIterations + profile_iterations;
  return DeferredPhase{start, "auto's chosen method takes over",
                       concat("auto chooses it from ", profile_iterations, " profiled iterations after ",
                              kAutoProfileWarmupIterations, " start-up ones"),
                       concat("until then it profiles with ", kProfilingSpec)};
}

std::string AutoOptions::fingerprint() const {
  std::string text = concat("policy ", auto_policy_name(policy), ", profile ", profile_iterations, ", codecs ",
                            join(codecs), ", K ", staleness, ", min gain ", min_gain, ", trial ", trial_margin, " for ", trial_seconds, " s, drift ", drift, " over ",
                            drift_window, " or ", drift_window_seconds, " s min interval ", min_interval,
                            ", sapipe ", sapipe_compensation.empty() ? "wp3 (dc with the caller's optimizer)" : sapipe_compensation);
  for (const ScheduledMethod& scheduled : schedule) text += concat(", ", scheduled.start, ":", scheduled.spec);
  return text;
}

std::vector<AutoCandidate> auto_candidates(const AutoOptions& options, const CommonOptions& common) {
  CommonOptions base = common;
  base.codec = "none";
  const bool stale = allows_staleness(options.policy);
  std::vector<std::string> codecs = {"none"};
  if (allows_codecs(options.policy)) codecs.insert(codecs.end(), options.codecs.begin(), options.codecs.end());
  std::vector<AutoCandidate> candidates;
  // SAPipe's compensation: the paper's default (wp3), but dc with the caller's optimizer (the API's
  // "external"), since weight prediction needs the optimizer's own update rule.
  const bool external_optimizer = common.optimizer.name == "external";
  std::string compensation = options.sapipe_compensation.empty() ? (external_optimizer ? "dc" : "wp3")
                                                                 : options.sapipe_compensation;
  auto add = [&](const std::string& name, const std::string& codec) {
    const bool pipe = name == "pipe", sapipe = name == kSapipeSpec;
    OptionValues flags;
    if (pipe) flags.set("--staleness-k", std::to_string(options.staleness));
    if (sapipe) flags.set("--compensation", compensation);
    if (name != "dsync" && !pipe) flags.set("--profile-iters", std::to_string(options.profile_iterations));
    const std::string spec = codec == "none" ? name : concat(name, "+", codec);
    const bool stale_trade = (pipe && options.staleness >= 2) || sapipe;
    // What it trades, in words: "staleness K=2", "partial staleness (...)", "lossy codec int8".
    std::string trade = sapipe ? concat("partial staleness: the first k layers 1 step stale",
                                        compensation == "none" ? std::string() : concat(", compensated by ", compensation))
                        : stale_trade ? concat("staleness K=", options.staleness)
                                      : std::string();
    if (codec != "none") trade += concat(trade.empty() ? "" : ", ", "lossy codec ", codec);
    MethodSelection selection = select_on(spec, flags, base);
    if (external_optimizer && !selection.options->needs_update_rule().empty()) {
      throw UsageError(concat("auto:", auto_policy_name(options.policy), " --compensation ", compensation,
                              ": SAPipe's weight prediction computes the next update with the optimizer's own rule, so "
                              "it cannot hand its gradients to your optimizer: use --compensation dc or none"));
    }
    AutoCandidate candidate{std::move(selection),
                            pipe                                ? concat(spec, " K=", options.staleness)
                            : sapipe && compensation != "wp3" ? concat(spec, "+", compensation)
                                                                : spec,
                            trade, (stale_trade ? 1 : 0) + (codec != "none" ? 1 : 0),
                            static_cast<double>(codec_encoded_bytes(codec, kWireBytesSample)) / kWireBytesSample};
    candidates.push_back(std::move(candidate));
  };
  for (const std::string& codec : codecs) {
    for (const char* name : {"dsync", "dsync+optimal", "mgwfbp", "wfbp"}) add(name, codec);
    if (stale && (codec == "none" || options.policy == AutoPolicy::kAny)) {
      // SAPipe before Pipe-SGD: at an equal prediction it trades less (k layers, compensated).
      add(kSapipeSpec, codec);
      add("pipe", codec);
    }
  }
  return candidates;
}

AutoDecision decide_method(const std::vector<AutoCandidate>& candidates, const PlanningInputs& measured, int workers,
                           double min_gain) {
  PIPESGD_ASSERT(!candidates.empty());
  AutoDecision decision;
  for (const AutoCandidate& candidate : candidates) {
    const MethodSelection& selection = candidate.selection;
    PIPESGD_ASSERT(selection.descriptor->predict);
    decision.predictions.push_back(selection.descriptor->predict(*selection.options, selection.common, measured, workers));
  }
  std::vector<std::size_t>& order = decision.ranking;
  for (std::size_t i = 0; i < candidates.size(); ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double x = decision.predictions[a].seconds, y = decision.predictions[b].seconds;
    return !equal_predictions(x, y) && x < y;
  });
  // The accuracy-trade rule the trials' measurements follow too (choose_measured), on the predictions.
  const std::size_t fastest = order.front();
  std::vector<double> seconds, ranked;
  for (const IterationPrediction& prediction : decision.predictions) seconds.push_back(prediction.seconds);
  for (std::size_t i : order) ranked.push_back(seconds[i]);
  decision.chosen = order[choose_measured(candidates, order, ranked, min_gain)];
  std::string trade_note;
  const AutoCandidate& chosen_candidate = candidates[decision.chosen];
  const auto gain = [&](std::size_t slower, std::size_t faster) {
    return format_number("%.1f%%", 100 * (seconds[slower] / seconds[faster] - 1));
  };
  if (decision.chosen != fastest) {
    trade_note += concat("; ", candidates[fastest].label, " would be ", gain(decision.chosen, fastest),
                         " faster but trades more accuracy (", candidates[fastest].accuracy_trade, "), below the ",
                         format_number("%g%%", 100 * min_gain), " minimum (--auto-min-gain)");
  }
  if (chosen_candidate.trades > 0) {
    // What it gains over the fastest that trades less (min_gain or more slower than the fastest).
    const auto fewer = std::find_if(order.begin(), order.end(),
                                    [&](std::size_t i) { return candidates[i].trades < chosen_candidate.trades; });
    if (fewer != order.end()) {
      trade_note += concat("; it trades accuracy (", chosen_candidate.accuracy_trade, ") for ",
                           gain(*fewer, decision.chosen), " over ", candidates[*fewer].label);
    }
  }
  for (std::size_t i : order) {
    if (i != decision.chosen) {
      decision.runner_up = i;
      break;
    }
  }
  const IterationPrediction& chosen = decision.predictions[decision.chosen];
  decision.why = concat("measured compute ", ms(chosen.compute_seconds), " and an allreduce of the whole gradient ",
                        ms(whole_gradient_allreduce_seconds(measured, "none")), " per iteration; ",
                        candidates[decision.chosen].label, " (", chosen.model, ") leaves ", ms(chosen.exposed_seconds),
                        " of communication exposed", trade_note);
  return decision;
}

PlanningInputs scaled_planning_inputs(const PlanningInputs& measured, double comm_scale, double compute_scale) {
  PlanningInputs scaled = measured;
  scaled.cost.a *= comm_scale;
  scaled.cost.b *= comm_scale;
  for (double& seconds : scaled.profile.backward_seconds) seconds *= compute_scale;
  scaled.profile.forward_seconds *= compute_scale;
  scaled.profile.per_bucket_compute_seconds *= compute_scale;
  scaled.update_seconds *= compute_scale;
  scaled.backward_tail_seconds *= compute_scale;
  return scaled;
}

std::optional<BoundaryCrossing> decision_boundary_crossed(const std::vector<AutoCandidate>& candidates,
                                                          const PlanningInputs& measured, int workers, double min_gain,
                                                          std::size_t running, double comm_scale,
                                                          double compute_scale) {
  PIPESGD_ASSERT(running < candidates.size());
  const AutoDecision before = decide_method(candidates, measured, workers, min_gain);
  const AutoDecision after =
      decide_method(candidates, scaled_planning_inputs(measured, comm_scale, compute_scale), workers, min_gain);
  if (after.chosen == running) return std::nullopt;
  // How much slower than the decision's choice the running method is predicted: 1 when the profile
  // chose it (trials may have kept another, which the profile predicted slower already).
  const auto behind = [running](const AutoDecision& decision) {
    return decision.predictions[running].seconds / decision.predictions[decision.chosen].seconds;
  };
  if (!(behind(after) > behind(before) * (1 + min_gain))) return std::nullopt;
  return BoundaryCrossing{after.chosen, after.predictions[after.chosen].seconds, after.predictions[running].seconds};
}

std::int64_t drift_window_for(const AutoOptions& options, double predicted_seconds) {
  if (!(predicted_seconds > 0) || options.drift_window_seconds <= 0) return options.drift_window;
  const double lasting = std::ceil(options.drift_window_seconds / predicted_seconds);
  return std::max(options.drift_window, static_cast<std::int64_t>(std::min(lasting, static_cast<double>(kMaxDriftWindow))));
}

std::int64_t trial_counted_iterations(const AutoOptions& options, double fastest_predicted_seconds) {
  double counted = static_cast<double>(options.profile_iterations);
  if (fastest_predicted_seconds > 0 && options.trial_seconds > 0) {
    counted = std::max(counted, std::ceil(options.trial_seconds / fastest_predicted_seconds));
  }
  const auto even = static_cast<std::int64_t>(std::min(counted, static_cast<double>(kMaxTrialCounted)));
  return std::max<std::int64_t>(2, even + even % 2);
}

std::vector<std::size_t> trial_order(std::size_t contenders) {
  std::vector<std::size_t> order;
  for (std::size_t j = 0; j < contenders; ++j) order.push_back(j);
  for (std::size_t j = contenders; j-- > 1;) order.push_back(j - 1);
  return order;
}

double trial_figure(std::span<const double> iteration_seconds, std::span<double> scratch) {
  PIPESGD_ASSERT(!scratch.empty() && scratch.size() <= iteration_seconds.size());
  const std::span<const double> counted = iteration_seconds.last(scratch.size());
  std::copy(counted.begin(), counted.end(), scratch.begin());
  const double cap = kTrialOutlier * median_in_place(scratch);
  double sum = 0;
  for (const double seconds : counted) sum += std::min(seconds, cap);
  return sum / static_cast<double>(counted.size());
}

std::int64_t trial_settle_iterations(const AutoOptions& options) {
  return std::max<std::int64_t>(kTrialSettleIterations, options.staleness);
}

std::vector<std::size_t> trial_contenders(const std::vector<AutoCandidate>& candidates, const AutoDecision& decision,
                                          double margin) {
  std::vector<std::size_t> contenders = {decision.chosen};
  if (margin <= 0 || decision.ranking.empty()) return contenders;
  // A trade chosen on a predicted gain below kTradeCheckGain is measured against the fastest
  // candidate that trades less (its measured time decides whether the trade is worth it).
  const int trades = candidates[decision.chosen].trades;
  if (trades > 0) {
    const auto fewer = std::find_if(decision.ranking.begin(), decision.ranking.end(),
                                    [&](std::size_t i) { return candidates[i].trades < trades; });
    if (fewer != decision.ranking.end() &&
        decision.predictions[*fewer].seconds < decision.predictions[decision.chosen].seconds * (1 + kTradeCheckGain)) {
      contenders.push_back(*fewer);
    }
  }
  const double fastest = decision.predictions[decision.ranking.front()].seconds;
  std::vector<std::size_t> by_prediction_then_bytes = decision.ranking;
  std::stable_sort(by_prediction_then_bytes.begin(), by_prediction_then_bytes.end(), [&](std::size_t a, std::size_t b) {
    const double x = decision.predictions[a].seconds, y = decision.predictions[b].seconds;
    if (!equal_predictions(x, y)) return x < y;
    return candidates[a].wire_bytes_per_value < candidates[b].wire_bytes_per_value;
  });
  for (std::size_t i : by_prediction_then_bytes) {
    if (contenders.size() == kMaxTrials) break;
    if (decision.predictions[i].seconds > fastest * (1 + margin)) break;
    if (std::find(contenders.begin(), contenders.end(), i) == contenders.end()) contenders.push_back(i);
  }
  return contenders;
}

std::size_t choose_measured(const std::vector<AutoCandidate>& candidates, const std::vector<std::size_t>& contenders,
                            std::span<const double> seconds, double min_gain) {
  PIPESGD_ASSERT(!contenders.empty() && seconds.size() == contenders.size());
  std::size_t kept = static_cast<std::size_t>(std::min_element(seconds.begin(), seconds.end()) - seconds.begin());
  const double fastest = seconds[kept];
  for (std::size_t j = 0; j < contenders.size(); ++j) {
    // Gives up min_gain or more: not a choice (one as fast as the fastest always is, also with 0).
    if (seconds[j] > fastest && seconds[j] / fastest - 1 >= min_gain) continue;
    const int trades = candidates[contenders[j]].trades, kept_trades = candidates[contenders[kept]].trades;
    if (trades < kept_trades || (trades == kept_trades && seconds[j] < seconds[kept])) kept = j;
  }
  return kept;
}

TrialVerdict judge_trials(const std::vector<AutoCandidate>& candidates, const std::vector<std::size_t>& contenders,
                          std::span<const double> predicted, std::span<const double> phase_seconds, double min_gain) {
  const std::size_t n = contenders.size();
  PIPESGD_ASSERT(n > 0 && predicted.size() == n && phase_seconds.size() == 2 * n - 1);
  TrialVerdict verdict;
  for (std::size_t j = 0; j < n; ++j) {
    const double first = phase_seconds[j], second = phase_seconds[2 * n - 2 - j];  // the same phase for the last
    verdict.seconds.push_back((first + second) / 2);
    if (j + 1 < n && first + second > 0) {
      verdict.spread = std::max(verdict.spread, std::abs(first - second) / ((first + second) / 2));
    }
  }
  const std::vector<double>& seconds = verdict.seconds;
  verdict.measured_choice = verdict.kept = choose_measured(candidates, contenders, seconds, min_gain);
  const std::size_t measured = verdict.measured_choice;
  const std::size_t fastest = verdict.fastest =
      static_cast<std::size_t>(std::min_element(seconds.begin(), seconds.end()) - seconds.begin());
  const double band = std::max(min_gain, verdict.spread);
  for (std::size_t j = 0; j < n; ++j) {
    const int trades = candidates[contenders[j]].trades;
    if (trades != candidates[contenders[measured]].trades) continue;
    if (seconds[j] >= seconds[measured] * (1 + band)) continue;
    // Trading less than the fastest measured costs less than min_gain, as in choose_measured.
    if (trades < candidates[contenders[fastest]].trades && seconds[j] >= seconds[fastest] * (1 + min_gain)) continue;
    std::size_t& kept = verdict.kept;
    const bool equal = equal_predictions(predicted[j], predicted[kept]);
    if ((!equal && predicted[j] < predicted[kept]) || (equal && seconds[j] < seconds[kept])) kept = j;
  }
  return verdict;
}

MethodDescriptor auto_method() {
  MethodDescriptor method;
  method.name = "auto";
  method.summary = "the run chooses its method: it profiles, predicts every candidate its policy allows (auto:sync, "
                   "auto:stale, auto:lossy, auto:any), switches to the fastest, and chooses again when the measured "
                   "iteration drifts or the comm/compute ratio crosses a decision boundary";
  method.commit = "its phases (which method from which iteration, and why), the profile it chose from, its drift "
                  "windows, and the state of the method running (as that method commits it)";
  method.traits.replicas_identical = true;
  method.options = allreduce_method_declarations(CalibrationUse::kAlways);
  for (OptionDeclaration& option : method.options) {
    if (option.flag != "--codec") continue;
    option.help = "With auto:lossy or auto:any: the one codec the lossy candidates use (default: bf16 and int8)";
    option.default_text = "";
    option.applies = [](const OptionValues& given) {
      return allows_codecs(given_policy(given)) || given.text("--codec", "none") == "none";
    };
    option.condition = "with policy lossy or any";
    option.rejection = [](const OptionValues& given, std::string_view) {
      return concat("--codec ", given.text("--codec", ""), " trades accuracy (a lossy codec), which auto:",
                    auto_policy_name(given_policy(given)), " does not allow: use auto:lossy or auto:any");
    };
  }
  OptionDeclaration policy("--auto-policy",
                           "What auto may trade for speed: sync (nothing), stale (staleness: sapipe and pipe), lossy (the "
                           "codecs), any; also given as auto:POLICY",
                           "sync");
  policy.spec_value = [](std::string_view value) { return parse_auto_policy(value).has_value(); };
  policy.spec_kind = "policy";
  policy.spec_values = kPolicyNames;
  method.options.push_back(policy);
  method.options.push_back(profile_iterations_declaration(
      concat("Iterations auto profiles (after ", kAutoProfileWarmupIterations,
             " start-up ones) before it chooses, and again after a drift")));
  OptionDeclaration staleness("--staleness-k", "With auto:stale or auto:any: the K of the pipe candidate", "2");
  staleness.applies = [](const OptionValues& given) { return allows_staleness(given_policy(given)); };
  staleness.condition = "with policy stale or any";
  staleness.rejection = [](const OptionValues& given, std::string_view) {
    return concat("--staleness-k ", given.text("--staleness-k", ""), " trades accuracy (stale updates), which auto:",
                  auto_policy_name(given_policy(given)), " does not allow: use auto:stale or auto:any");
  };
  method.options.push_back(staleness);
  OptionDeclaration compensation("--compensation",
                                 "With auto:stale or auto:any: the sapipe candidate's staleness compensation (none, dc, "
                                 "wp1, wp2, wp3; default wp3, or dc with the caller's optimizer)",
                                 "");
  compensation.applies = [](const OptionValues& given) { return allows_staleness(given_policy(given)); };
  compensation.condition = "with policy stale or any";
  compensation.rejection = [](const OptionValues& given, std::string_view) {
    return concat("--compensation ", given.text("--compensation", ""), " is the sapipe candidate's, which auto:",
                  auto_policy_name(given_policy(given)), " does not have: use auto:stale or auto:any");
  };
  method.options.push_back(compensation);
  method.options.emplace_back("--auto-min-gain",
                              "The most speed auto gives up to trade less accuracy: of the candidates predicted (or, in "
                              "trials, measured) less than this fraction slower than the fastest, it chooses the one "
                              "that trades least (0.02: 2%)",
                              "0.02");
  method.options.emplace_back("--auto-trial",
                              "Try the choice and up to 2 candidates predicted within this fraction of the fastest, "
                              "in the order A B C B A, and keep the fastest measured (0: no trials)",
                              "0.1");
  method.options.emplace_back("--auto-trial-seconds",
                              "Each tried candidate counts at least P iterations and at least this long at the "
                              "fastest prediction (at most 2000 iterations; 0: P)",
                              "0.05");
  method.options.emplace_back("--auto-drift",
                              "Choose again when the measured iteration departs from the reference by more than this "
                              "fraction for 2 windows in a row, or the comm/compute ratio does and the profile then "
                              "predicts another method faster by --auto-min-gain (0: never)",
                              "0.25");
  method.options.emplace_back("--auto-window",
                              "Iterations per drift window (the workers average their median iteration, allreduce "
                              "and compute)",
                              "50");
  method.options.emplace_back("--auto-window-seconds",
                              "A drift window lasts at least this long: more iterations than --auto-window if the "
                              "chosen method's predicted iteration is short (at most 100000)",
                              "2");
  method.options.emplace_back("--auto-min-interval", "Iterations at least between two choices", "200");
  method.parse = [](const OptionValues& given) -> std::shared_ptr<const MethodOptions> {
    auto options = std::make_shared<AutoOptions>();
    const std::string policy_text = given.text("--auto-policy", "sync");
    const std::optional<AutoPolicy> policy = parse_auto_policy(policy_text);
    if (!policy) throw UsageError(concat("--auto-policy must be ", kPolicyNames, ", got '", policy_text, "'"));
    options->policy = *policy;
    options->profile_iterations = checked_profile_iterations(given.integer("--profile-iters", options->profile_iterations));
    const std::string codec = given.text("--codec", "none");
    options->codecs = codec == "none" ? std::vector<std::string>{"bf16", "int8"} : std::vector<std::string>{codec};
    const std::int64_t k = given.integer("--staleness-k", options->staleness);
    if (k < 2 || k > 64) throw UsageError(concat("--staleness-k must be in [2, 64] for auto's pipe candidate, got ", k));
    options->staleness = static_cast<int>(k);
    options->sapipe_compensation = given.text("--compensation", "");
    if (!options->sapipe_compensation.empty()) {
      // The sapipe candidate's own parse checks the name (and says which exist).
      OptionValues sapipe;
      sapipe.set("--compensation", options->sapipe_compensation);
      find_method(kSapipeSpec)->parse(sapipe);
    }
    options->min_gain = given.real("--auto-min-gain", options->min_gain);
    if (!(options->min_gain >= 0 && options->min_gain <= 10)) {
      throw UsageError(concat("--auto-min-gain must be in [0, 10], got ", given.text("--auto-min-gain", "")));
    }
    options->trial_margin = given.real("--auto-trial", options->trial_margin);
    if (!(options->trial_margin >= 0 && options->trial_margin <= 10)) {
      throw UsageError(concat("--auto-trial must be in [0, 10] (0: no trials), got ", given.text("--auto-trial", "")));
    }
    options->trial_seconds = given.real("--auto-trial-seconds", options->trial_seconds);
    if (!(options->trial_seconds >= 0 && options->trial_seconds <= 60)) {
      throw UsageError(concat("--auto-trial-seconds must be in [0, 60], got ", given.text("--auto-trial-seconds", "")));
    }
    options->drift = given.real("--auto-drift", options->drift);
    if (!(options->drift >= 0 && options->drift <= 100)) {
      throw UsageError(concat("--auto-drift must be in [0, 100] (0: never choose again), got ",
                              given.text("--auto-drift", "")));
    }
    options->drift_window = given.integer("--auto-window", options->drift_window);
    if (options->drift_window < 1 || options->drift_window > kMaxProfileIterations) {
      throw UsageError(concat("--auto-window must be in [1, ", kMaxProfileIterations, "], got ", options->drift_window));
    }
    options->drift_window_seconds = given.real("--auto-window-seconds", options->drift_window_seconds);
    if (!(options->drift_window_seconds >= 0 && options->drift_window_seconds <= 3600)) {
      throw UsageError(concat("--auto-window-seconds must be in [0, 3600], got ", given.text("--auto-window-seconds", "")));
    }
    options->min_interval = given.integer("--auto-min-interval", options->min_interval);
    if (options->min_interval < 0 || options->min_interval > kMaxProfileIterations) {
      throw UsageError(concat("--auto-min-interval must be in [0, ", kMaxProfileIterations, "], got ",
                              options->min_interval));
    }
    return options;
  };
  method.make = [](const MethodContext& context) -> std::unique_ptr<TrainingMethod> {
    return std::make_unique<AutoMethod>(context);
  };
  method.spec_hint = [](std::string_view part) -> std::string {
    return concat("unknown policy '", part, "' in auto:", part, " (policies: ", kPolicyNames, ")");
  };
  return method;
}

}  // namespace pipesgd
