#include "pipesgd/algo/registry.h"

#include <algorithm>
#include <map>

#include "pipesgd/algo/auto/auto_method.h"
#include "pipesgd/algo/dsync/dsync_methods.h"
#include "pipesgd/algo/nocomm/nocomm_method.h"
#include "pipesgd/algo/odsgd/odsgd_method.h"
#include "pipesgd/algo/pipe/pipe_method.h"
#include "pipesgd/algo/ps_methods/parameter_server_methods.h"
#include "pipesgd/algo/sapipe/sapipe_method.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The registry: one entry per method, in help order (the papers': Pipe-SGD, MG-WFBP, OD-SGD, SAPipe).
const std::vector<MethodDescriptor>& descriptors() {
  static const std::vector<MethodDescriptor> methods = {
      dsync_method(),
      pipe_method(),
      wfbp_method(),
      synceasgd_method(),
      mgwfbp_method(),
      pssync_method(),
      asgd_method(),
      dcasgd_method(),
      odsgd_method(),
      sapipe_method(/*baseline=*/"pipe"),
      nocomm_method(),
      auto_method(),
  };
  return methods;
}

const OptionDeclaration* declaration_of(const MethodDescriptor& method, std::string_view flag) {
  for (const OptionDeclaration& option : method.options) {
    if (option.flag == flag) return &option;
  }
  return nullptr;
}

// "(options are codecs: none, bf16, int8; bucket plans: ...)" for a method's spec parts.
std::string spec_options_text(const MethodDescriptor& method) {
  std::vector<std::string> kinds;
  for (const OptionDeclaration& option : method.options) {
    if (option.spec_value) kinds.push_back(concat(option.spec_kind, "s: ", option.spec_values));
  }
  if (kinds.empty()) return concat("method '", method.name, "' takes no +options");
  return concat("options are ", join(kinds, "; "));
}

// "name+part+part"; "auto:any" is "auto+any" (a method's first part may follow a colon).
std::vector<std::string> split_spec(std::string_view spec) {
  std::vector<std::string> parts;
  const std::size_t colon = spec.find(':');
  if (colon != std::string_view::npos && colon < spec.find('+')) {
    parts.emplace_back(spec.substr(0, colon));
    spec.remove_prefix(colon + 1);
  }
  std::size_t begin = 0;
  while (true) {
    const std::size_t plus = spec.find('+', begin);
    parts.emplace_back(spec.substr(begin, plus == std::string_view::npos ? std::string_view::npos : plus - begin));
    if (plus == std::string_view::npos) break;
    begin = plus + 1;
  }
  return parts;
}

// The message for a +part no option of `method` takes.
std::string unknown_spec_part(const MethodDescriptor& method, std::string_view spec, const std::string& part) {
  if (method.spec_hint) {
    const std::string hint = method.spec_hint(part);
    if (!hint.empty()) return hint;
  }
  // A value another method takes (a codec given to a parameter-server method): say which do.
  for (const MethodDescriptor* other : method_registry()) {
    for (const OptionDeclaration& option : other->options) {
      if (!option.spec_value || !option.spec_value(part)) continue;
      std::vector<std::string> takers;
      for (const MethodDescriptor* candidate : method_registry()) {
        const OptionDeclaration* declared = declaration_of(*candidate, option.flag);
        if (declared != nullptr && declared->spec_value) takers.push_back(candidate->name);
      }
      return concat("unknown option '", part, "' in method '", spec, "': a ", option.spec_kind, ", which applies only to ",
                    join_and(takers), " (", spec_options_text(method), ")");
    }
  }
  return concat("unknown option '", part, "' in method '", spec, "' (", spec_options_text(method), ")");
}

}  // namespace

const std::vector<const MethodDescriptor*>& method_registry() {
  static const std::vector<const MethodDescriptor*> registry = [] {
    std::vector<const MethodDescriptor*> pointers;
    for (const MethodDescriptor& method : descriptors()) {
      // An entry is complete: it parses and builds, and a method with servers says how they serve.
      PIPESGD_ASSERT(!method.name.empty() && method.parse && method.make);
      PIPESGD_ASSERT(!method.traits.uses_servers || method.serve);
      pointers.push_back(&method);
    }
    return pointers;
  }();
  return registry;
}

const MethodDescriptor* find_method(std::string_view name) {
  for (const MethodDescriptor* method : method_registry()) {
    if (method->name == name) return method;
  }
  return nullptr;
}

std::string layer_wise_profiling_spec() { return "dsync+optimal"; }

std::string default_method_spec() { return "dsync"; }

std::string default_compare_list() { return "dsync,pipe,pipe+int8"; }

std::string example_method_specs() { return "pipe+int8, dsync+optimal, sapipe+wp3"; }

std::string example_compare_lists() {
  return "pssync,asgd,dcasgd,odsgd,dsync,pipe or dsync,wfbp,mgwfbp,dsync+optimal or "
         "dsync,pipe,sapipe+none,sapipe+dc,sapipe+wp1,sapipe";
}

const MethodDescriptor* method_of_spec(std::string_view spec) { return find_method(split_spec(spec).front()); }

std::vector<std::string> method_names() {
  std::vector<std::string> names;
  for (const MethodDescriptor* method : method_registry()) names.push_back(method->name);
  return names;
}

std::vector<DeclaredOption> declared_options() {
  std::vector<DeclaredOption> options;
  for (const MethodDescriptor* method : method_registry()) {
    for (const OptionDeclaration& declaration : method->options) {
      auto found = std::find_if(options.begin(), options.end(),
                                [&](const DeclaredOption& option) { return option.flag == declaration.flag; });
      if (found == options.end()) {
        options.push_back({declaration.flag, {}, {}});
        found = options.end() - 1;
      }
      found->methods.push_back(method);
      found->declarations.push_back(&declaration);
    }
  }
  return options;
}

std::string not_applicable_message(std::string_view flag, std::string_view name) {
  std::vector<std::string> users;
  std::string label;
  for (const MethodDescriptor* method : method_registry()) {
    const OptionDeclaration* declaration = declaration_of(*method, flag);
    if (declaration == nullptr) continue;
    users.push_back(declaration->condition.empty() ? method->name : concat(method->name, " ", declaration->condition));
    if (label.empty()) label = declaration->users_label;
  }
  if (users.empty()) return concat(flag, " applies to no method");
  return concat(flag, " applies only to ", label.empty() ? std::string() : label + " ", join_and(users), ", not '", name,
                "'");
}

MethodSelection select_method(std::string_view spec, const OptionValues& flags, FlagPolicy policy,
                              const CommonOptions& base) {
  const std::vector<std::string> parts = split_spec(spec);
  const MethodDescriptor* method = find_method(parts[0]);
  if (method == nullptr) {
    throw UsageError(concat("unknown algorithm '", parts[0], "' in '", spec, "' (expected ", join(method_names()),
                            ", optionally followed by +options such as a codec: pipe+int8)"));
  }
  // The spec's +parts, each a value of one of the method's options.
  OptionValues given;
  for (std::size_t k = 1; k < parts.size(); ++k) {
    const std::string& part = parts[k];
    const auto takes = std::find_if(method->options.begin(), method->options.end(), [&](const OptionDeclaration& option) {
      return option.spec_value && option.spec_value(part);
    });
    if (takes == method->options.end()) throw UsageError(unknown_spec_part(*method, spec, part));
    if (given.has(takes->flag)) throw UsageError(concat("method '", spec, "' names more than one ", takes->spec_kind));
    given.set(takes->flag, part);
  }
  // The flags, where they belong.
  const OptionValues from_spec = given;
  for (const auto& [flag, value] : flags.all()) {
    const OptionDeclaration* declaration = declaration_of(*method, flag);
    if (declaration == nullptr) {
      if (policy == FlagPolicy::kReject) throw UsageError(not_applicable_message(flag, method->name));
      continue;
    }
    if (from_spec.has(flag)) {
      const std::string named = from_spec.text(flag, "");
      if (named == value) continue;
      if (policy == FlagPolicy::kReject) {
        throw UsageError(concat(flag, " ", value, " and the method's ", declaration->spec_kind, " '", named,
                                "': give one"));
      }
      continue;  // compare: the spec names this entry's value
    }
    given.set(flag, value);
  }
  // Options that apply only with others.
  std::vector<std::string> not_applying;
  for (const auto& [flag, value] : given.all()) {
    const OptionDeclaration* declaration = declaration_of(*method, flag);
    if (!declaration->applies || declaration->applies(given)) continue;
    if (policy == FlagPolicy::kReject || from_spec.has(flag)) {
      throw UsageError(declaration->rejection ? declaration->rejection(given, method->name)
                                              : not_applicable_message(flag, method->name));
    }
    not_applying.push_back(flag);
  }
  for (const std::string& flag : not_applying) given.erase(flag);

  MethodSelection selection;
  selection.spec = std::string(spec);
  selection.descriptor = method;
  selection.common = parse_common_options(given, base);
  selection.options = method->parse(given);
  selection.given = std::move(given);
  return selection;
}

std::unique_ptr<TrainingMethod> make_method(const MethodSelection& selection, Transport& transport,
                                            FlatParameters& model, std::int64_t warmup_iterations,
                                            const NetworkSpec& network, LrScheduleLength length,
                                            std::function<void(const std::string&)> announce) {
  PIPESGD_ASSERT(selection.descriptor != nullptr && selection.options != nullptr);
  MethodContext context{transport,         model,   selection.common,
                        *selection.options, warmup_iterations, network,
                        LrSchedule(selection.common.lr_schedule, length)};
  context.announce = std::move(announce);
  return selection.descriptor->make(context);
}

}  // namespace pipesgd
