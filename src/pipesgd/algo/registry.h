#pragma once
// The method registry: every training method's descriptor (algo/method_descriptor.h), in the order
// --help lists them, and the one way to select and configure a method from a spec and options.
// Adding a method: a folder under algo/ with its descriptor, plus one line in registry.cpp
// (docs/ARCHITECTURE.md, "Adding a method").
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/method_options.h"

namespace pipesgd {

// Every method, in help order.
const std::vector<const MethodDescriptor*>& method_registry();
// The method called `name`, or nullptr.
const MethodDescriptor* find_method(std::string_view name);
std::vector<std::string> method_names();
// What the CLI offers by default and as examples (method names are the registry's to spell):
// `train`'s method, `compare`'s list, example specs with +options, and example lists to compare.
std::string default_method_spec();
std::string default_compare_list();
std::string example_method_specs();
std::string example_compare_lists();

// The method spec whose profiling `pipesgd plan` runs: layer-wise D-Sync with the optimal plan,
// which measures every input of every bucket plan (per-layer backward times, kappa, a + b·M).
std::string layer_wise_profiling_spec();
// The method a spec names ("pipe" for "pipe+int8"), or nullptr.
const MethodDescriptor* method_of_spec(std::string_view spec);

// One option flag as every method that takes it declares it (for the CLI's flags and help).
struct DeclaredOption {
  std::string flag;
  std::vector<const MethodDescriptor*> methods;         // the methods that take it, registry order
  std::vector<const OptionDeclaration*> declarations;   // theirs, same order
};
// Every method option flag, in the order of first declaration.
std::vector<DeclaredOption> declared_options();
// "--X applies only to A, B with --y z and C, not 'M'": the error for giving `flag` to method `name`.
std::string not_applicable_message(std::string_view flag, std::string_view name);

// A method chosen and configured: what a run or a test builds workers' methods from. Copyable; the options are shared and immutable.
struct MethodSelection {
  std::string spec;  // as given, e.g. "sapipe+wp3+int8"
  const MethodDescriptor* descriptor = nullptr;
  std::shared_ptr<const MethodOptions> options;
  CommonOptions common;
  OptionValues given;  // every option that was set (spec parts and flags)

  const std::string& name() const { return descriptor->name; }
  const MethodTraits& traits() const { return descriptor->traits; }
};

// How select_method treats a flag the method does not take.
enum class FlagPolicy {
  kReject,            // UsageError (train, plan, the tests)
  kApplyWhereItFits,  // left out (compare: a flag goes to the methods of the list that take it)
};

// Selects the method of `spec` ("name[+option]...": each +option a value of one of the method's
// options, e.g. a codec, a bucket plan, a compensation) with the option flags in `flags` (flag ->
// text, only options some method declares) on top of `base` (the run's SGD hyper-parameters and
// timeout). An option named by the spec and given as a flag with another value is rejected
// (kReject) or the spec's value wins (kApplyWhereItFits). Throws UsageError with one line.
MethodSelection select_method(std::string_view spec, const OptionValues& flags, FlagPolicy policy,
                              const CommonOptions& base);

// The methods built for one worker from `selection`, its learning-rate schedule
// (selection.common.lr_schedule) bound to `length` (needed unless the schedule is constant: a
// UsageError says so); `announce`: MethodContext::announce.
std::unique_ptr<TrainingMethod> make_method(const MethodSelection& selection, Transport& transport,
                                            FlatParameters& model, std::int64_t warmup_iterations,
                                            const NetworkSpec& network = {}, LrScheduleLength length = {},
                                            std::function<void(const std::string&)> announce = {});

}  // namespace pipesgd
