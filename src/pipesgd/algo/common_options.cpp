#include "pipesgd/algo/common_options.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/collective/traced_allreduce.h"
#include "pipesgd/core/error.h"
#include "pipesgd/optim/adam.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {
namespace {

bool is_codec(std::string_view name) {
  const std::vector<std::string> names = codec_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::vector<OptionDeclaration> allreduce_option_declarations(CalibrationUse use) {
  std::vector<OptionDeclaration> options;
  OptionDeclaration codec("--codec", "Gradient codec inside the allreduce: none, bf16 (16-bit truncation), int8 (8-bit quantization)", "none");
  codec.spec_value = is_codec;
  codec.spec_kind = "codec";
  codec.spec_values = join(codec_names());
  options.push_back(codec);

  OptionDeclaration allreduce("--allreduce", concat("Allreduce algorithm: ", join(allreduce_algorithm_names()),
                          ", or auto (least predicted time from --calibration, else the default model)"), "ring");
  options.push_back(allreduce);

  OptionDeclaration segments("--segment-bytes", "Allreduce message segment size: auto (D-Sync 256K, Pipe-SGD 640K), none (unsegmented) or "
                  "a size such as 256K", "auto");
  options.push_back(segments);

  OptionDeclaration calibration("--calibration", "Calibration JSON written by `pipesgd calibrate`: the cost model of --allreduce auto and of "
                     "the bucket plans");
  if (use == CalibrationUse::kWithAllreduceAuto) {
    calibration.applies = [](const OptionValues& given) { return given.text("--allreduce", "ring") == "auto"; };
    calibration.condition = "with --allreduce auto";
  } else if (use == CalibrationUse::kWithAutoOrBuckets) {
    calibration.applies = [](const OptionValues& given) {
      return given.text("--allreduce", "ring") == "auto" || given.has("--buckets");
    };
    calibration.condition = "with --allreduce auto or a bucket plan";
  }
  calibration.rejection = [](const OptionValues&, std::string_view) {
    return std::string("--calibration is only used by --allreduce auto and by the bucket plans of layer-wise methods; "
                       "add --allreduce auto or drop it");
  };
  options.push_back(calibration);
  return options;
}

std::vector<OptionDeclaration> optimizer_option_declarations() {
  std::vector<OptionDeclaration> options;
  OptionDeclaration optimizer("--optimizer", concat("Optimizer: ", join(optimizer_names()), " (Adam's learning rate is --lr, its L2 --weight-decay)"), "sgd");
  options.push_back(optimizer);
  for (const auto& [flag, help, fallback] : {std::tuple{"--adam-beta1", "Adam: first-moment decay", "0.9"},
                                             std::tuple{"--adam-beta2", "Adam: second-moment decay", "0.999"},
                                             std::tuple{"--adam-eps", "Adam: epsilon", "1e-08"}}) {
    OptionDeclaration adam(flag, help, fallback);
    options.push_back(adam);
  }
  return options;
}

std::vector<OptionDeclaration> allreduce_method_declarations(CalibrationUse calibration) {
  std::vector<OptionDeclaration> options = allreduce_option_declarations(calibration);
  for (OptionDeclaration& option : optimizer_option_declarations()) options.push_back(std::move(option));
  return options;
}

std::vector<OptionDeclaration> warmup_declarations(const std::string& what, const std::string& iterations_default) {
  OptionDeclaration epochs("--warmup-epochs", concat("Synchronous epochs first (they ", what, ")"), "0");
  OptionDeclaration iterations("--warmup-iters", concat("Synchronous iterations first, after --warmup-epochs (they ", what, ")"), iterations_default);
  return {epochs, iterations};
}

WarmUp parse_warmup(const OptionValues& given, std::int64_t iterations_default) {
  WarmUp warmup;
  const bool given_any = given.has("--warmup-epochs") || given.has("--warmup-iters");
  warmup.epochs = given.integer("--warmup-epochs", 0);
  warmup.iterations = given.integer("--warmup-iters", given_any ? 0 : iterations_default);
  if (warmup.epochs < 0 || warmup.iterations < 0 || warmup.epochs > kMaxWarmup || warmup.iterations > kMaxWarmup) {
    throw UsageError(concat("--warmup-epochs and --warmup-iters must be in [0, ", kMaxWarmup, "]"));
  }
  return warmup;
}

std::optional<DeferredPhase> warmup_phase(std::int64_t warmup_iterations, std::string event, std::string before) {
  if (warmup_iterations <= 0) return std::nullopt;
  return DeferredPhase{
      warmup_iterations, std::move(event),
      concat("after its warm-up of ", warmup_iterations, " iterations, set by --warmup-epochs and --warmup-iters"),
      std::move(before)};
}

CommonOptions parse_common_options(const OptionValues& given, CommonOptions base) {
  CommonOptions options = std::move(base);
  options.codec = given.text("--codec", options.codec);
  make_codec(options.codec);  // an unknown codec fails here
  options.allreduce = given.text("--allreduce", options.allreduce);
  const std::vector<std::string> algorithms = allreduce_algorithm_names();
  if (options.allreduce != "auto" &&
      std::find(algorithms.begin(), algorithms.end(), options.allreduce) == algorithms.end()) {
    throw UsageError(concat("--allreduce '", options.allreduce, "': expected ", join(algorithms), ", or auto"));
  }
  if (given.has("--segment-bytes")) {
    options.segment_bytes = parse_segment_bytes(given.text("--segment-bytes", ""), "--segment-bytes");
  }
  if (given.has("--calibration")) {
    options.calibration = std::make_shared<const Calibration>(load_calibration(given.text("--calibration", "")));
  }
  OptimizerOptions& optimizer = options.optimizer;
  optimizer.name = given.text("--optimizer", optimizer.name);
  optimizer.adam.beta1 = static_cast<float>(given.real("--adam-beta1", optimizer.adam.beta1));
  optimizer.adam.beta2 = static_cast<float>(given.real("--adam-beta2", optimizer.adam.beta2));
  optimizer.adam.epsilon = static_cast<float>(given.real("--adam-eps", optimizer.adam.epsilon));
  optimizer.adam.learning_rate = optimizer.sgd.learning_rate;
  optimizer.adam.weight_decay = optimizer.sgd.weight_decay;
  check_sgd_options(optimizer.sgd, {"--lr", "--momentum", "--weight-decay"});  // the servers run SGD too
  const std::vector<std::string> optimizers = optimizer_names();
  if (std::find(optimizers.begin(), optimizers.end(), optimizer.name) == optimizers.end()) {
    throw UsageError(concat("unknown optimizer '", optimizer.name, "' (expected ", join(optimizers), ")"));
  }
  if (optimizer.name == "adam") {
    if (optimizer.sgd.momentum != 0) throw UsageError("--momentum is SGD's; Adam's first-moment decay is --adam-beta1");
    check_adam_options(optimizer.adam, {"--lr", "--adam-beta1", "--adam-beta2", "--adam-eps", "--weight-decay"});
  }
  if (options.timeout <= Timeout::zero()) throw UsageError("--comm-timeout must be > 0");
  return options;
}

std::string resolve_allreduce_algorithm(const CommonOptions& options, int world_size, double bytes) {
  if (options.allreduce != "auto") return options.allreduce;
  const std::vector<std::string> candidates = allreduce_algorithm_names();
  if (options.calibration) return choose_allreduce_algorithm(*options.calibration, world_size, bytes, candidates);
  return choose_allreduce_algorithm(default_link_parameters(), world_size, bytes, candidates);
}

AllreduceOptions method_allreduce_options(const CommonOptions& options, std::size_t default_segment_bytes) {
  AllreduceOptions allreduce{options.timeout, options.segment_bytes};
  if (allreduce.segment_bytes == kAutoSegmentBytes) allreduce.segment_bytes = default_segment_bytes;
  return allreduce;
}

std::unique_ptr<Allreduce> make_method_allreduce(const CommonOptions& options, Transport& transport, std::size_t count,
                                                 const Codec& codec, std::size_t default_segment_bytes) {
  const double bytes = static_cast<double>(count) * sizeof(float);
  return std::make_unique<TracedAllreduce>(
      make_allreduce(resolve_allreduce_algorithm(options, transport.size(), bytes), transport, count, codec,
                     method_allreduce_options(options, default_segment_bytes)),
      codec);
}

std::chrono::microseconds wait_spin_for(int workers) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int cores = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed)
                                                                        : static_cast<int>(std::thread::hardware_concurrency());
  return workers >= 1 && workers <= cores ? kWaitSpin : std::chrono::microseconds(0);
}

std::string fingerprint(const CommonOptions& options) {
  const OptimizerOptions& optimizer = options.optimizer;
  std::string text = concat("codec ", options.codec, ", allreduce ", options.allreduce, ", segments ",
                            describe_segment_bytes(options.segment_bytes), ", optimizer ", optimizer.name, " lr ",
                            optimizer.sgd.learning_rate, " momentum ", optimizer.sgd.momentum, " decay ",
                            optimizer.sgd.weight_decay);
  if (optimizer.name == "adam") {
    text += concat(" betas ", optimizer.adam.beta1, " ", optimizer.adam.beta2, " eps ", optimizer.adam.epsilon);
  }
  // Nothing for the constant schedule: checkpoints written before schedules existed still resume.
  if (!options.lr_schedule.is_constant()) text += concat(", lr schedule ", options.lr_schedule.describe());
  return text;
}

}  // namespace pipesgd
