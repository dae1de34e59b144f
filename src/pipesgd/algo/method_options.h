#pragma once
// How a method is configured. A user names options as flags (`--staleness-k 3`) or, for some, as
// `+value` parts of the method spec (`pipe+int8` = `pipe --codec int8`); each method declares the
// options it takes (OptionDeclaration, in its registry entry) and parses them into its own options
// type, a MethodOptions. The CLI and the tests configure methods this way
// (algo/registry.h), so a flag means the same everywhere and the "applies only to" errors come from
// the declarations.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace pipesgd {

// The options given for one method, as text: flag ("--staleness-k") -> value. Value type.
class OptionValues {
 public:
  OptionValues() = default;
  OptionValues(std::initializer_list<std::pair<const std::string, std::string>> values) : values_(values) {}

  void set(const std::string& flag, std::string value) { values_[flag] = std::move(value); }
  void erase(std::string_view flag);
  bool has(std::string_view flag) const { return values_.find(flag) != values_.end(); }
  const std::map<std::string, std::string, std::less<>>& all() const { return values_; }

  // The value of `flag`, or `fallback` if it was not given. The typed reads throw UsageError
  // ("--staleness-k: 'x' is not an integer") for a value that does not parse as a whole.
  std::string text(std::string_view flag, const std::string& fallback) const;
  std::int64_t integer(std::string_view flag, std::int64_t fallback) const;
  double real(std::string_view flag, double fallback) const;

 private:
  std::map<std::string, std::string, std::less<>> values_;
};

// One option a method takes.
struct OptionDeclaration {
  OptionDeclaration(std::string flag_, std::string help_, std::string default_text_ = {})
      : flag(std::move(flag_)), help(std::move(help_)), default_text(std::move(default_text_)) {}

  std::string flag;          // "--staleness-k"
  std::string help;          // what it does for the declaring method
  std::string default_text;  // the default shown in --help ("" for none)
  // Spec parts: the values a method spec may name after '+' for this option ("int8" for --codec),
  // what such a value is called in messages ("codec") and the list shown ("none, bf16, int8").
  // Empty `spec_value`: the option is a flag only.
  std::function<bool(std::string_view value)> spec_value;
  std::string spec_kind;
  std::string spec_values;
  // Empty `applies`: the option always applies to the method. Otherwise it applies when `applies`
  // returns true for everything else given to the method, and `condition` says when, as it reads
  // after the method's name ("with --local-updater dcasgd-c or dcasgd-a").
  std::function<bool(const OptionValues& given)> applies;
  std::string condition;
  // How "applies only to ..." names the methods that take the option ("the parameter-server
  // methods"; "" = just their names).
  std::string users_label;
  // When set: the message for the option given while `applies` says no (instead of "applies
  // only to ..."), from what was given and the method's name.
  std::function<std::string(const OptionValues& given, std::string_view method)> rejection;
};

// Synchronous iterations a method runs first (pipe, odsgd, sapipe): --warmup-epochs and
// --warmup-iters as given; the trainer turns epochs into iterations with the data set's size.
struct WarmUp {
  std::int64_t epochs = 0;
  std::int64_t iterations = 0;
};

// A phase a method reaches only after some iterations: its warm-up ends, its bucket plan takes
// effect, its pipeline starts. A run that ends before it never runs the method's steady state; the
// trainer warns at its start and its report says so, in these words.
struct DeferredPhase {
  std::int64_t start = 0;  // the phase's first iteration (0-based)
  std::string event;       // what starts then: "the mgwfbp bucket plan takes effect"
  std::string reason;      // why only then: "after 8 start-up and 10 profiling iterations"
  std::string before;      // what the iterations before run: "it allreduces the whole gradient ..."
};

// A method's parsed, validated options (each method derives its own). Immutable once parsed; the
// virtual functions are the facts the trainer and the reports need without knowing the method.
class MethodOptions {
 public:
  virtual ~MethodOptions() = default;
  virtual WarmUp warmup() const { return {}; }
  // The parameter-server ranks the method needs (0: none).
  virtual int servers() const { return 0; }
  // The phase that begins the method's steady state, given its warm-up in iterations; nullopt if
  // the method runs the same way from iteration 0.
  virtual std::optional<DeferredPhase> deferred_phase(std::int64_t warmup_iterations) const {
    (void)warmup_iterations;
    return std::nullopt;
  }
  // The first iteration whose timing shows the method's steady state: the deferred phase's start,
  // else the end of the warm-up.
  std::int64_t steady_state_start(std::int64_t warmup_iterations) const;
  // The iteration dependency K of the reports: an update at t uses the gradient of t - K.
  virtual int staleness() const { return 1; }
  // True if, after its warm-up, the method overlaps communication with computation across
  // iterations, so that Pipe-SGD's Eq. 4 rather than Eq. 2 predicts its iteration time.
  virtual bool pipelined() const { return false; }
  // The allreduce segment size `--segment-bytes auto` stands for (collective/allreduce.h).
  virtual std::size_t default_segment_bytes() const;
  // The options that change the run's math, as text (a checkpoint's fingerprint; "" if none).
  virtual std::string fingerprint() const { return ""; }
  // Why the method needs its optimizer's update rule (e.g. to predict weights), so that it cannot
  // hand its gradients to a caller's optimizer (optim/gradient_handoff.h); "" if it can.
  virtual std::string needs_update_rule() const { return ""; }
};

}  // namespace pipesgd
