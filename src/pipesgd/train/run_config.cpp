#include "pipesgd/train/run_config.h"

#include "pipesgd/core/error.h"

namespace pipesgd {

std::string methods_where(const std::function<bool(const MethodTraits&)>& has) {
  std::vector<std::string> names;
  for (const MethodDescriptor* method : method_registry()) {
    if (has(method->traits)) names.push_back(method->name);
  }
  return join_and(names);
}

namespace {


// An --inject-fault the run can arm.
void validate_fault(const TrainConfig& config, const FaultInjection& fault) {
  const ReliabilityOptions& r = config.reliability;
  const MethodSelection& method = config.method;
  if (fault.during_checkpoint() && (r.checkpoint_every == 0 || (fault.iteration + 1) % r.checkpoint_every != 0)) {
    throw UsageError(concat("--inject-fault at=checkpoint: no checkpoint is written after iteration ", fault.iteration,
                            " (--checkpoint-every ", r.checkpoint_every, ")"));
  }
  if (fault.point == FaultInjection::Point::kAllreduce && method.traits().uses_servers) {
    throw UsageError(concat("--inject-fault at=allreduce: '", method.name(),
                            "' pushes to parameter servers and runs no allreduce (use at=push)"));
  }
  if (fault.point == FaultInjection::Point::kPush && !method.traits().uses_servers) {
    throw UsageError(concat("--inject-fault at=push: '", method.name(),
                            "' runs no parameter servers (use at=allreduce; at=push is for ",
                            methods_where([](const MethodTraits& t) { return t.uses_servers; }), ")"));
  }
  if (fault.slows_link() && config.network.bits_per_second <= 0) {
    throw UsageError(concat("--inject-fault kind=slow slows worker ", fault.rank,
                            "'s emulated link: it needs --net with a bandwidth (e.g. --net 10gbe; --transport local). ",
                            "Over real links shape them instead (tc)"));
  }
  if (fault.rank >= config.workers) {
    throw UsageError(concat("--inject-fault: rank ", fault.rank, " is not a worker (the run has ", config.workers,
                            " workers: ranks 0-", config.workers - 1, ")"));
  }
}

void validate_reliability(const TrainConfig& config) {
  const ReliabilityOptions& r = config.reliability;
  const MethodSelection& method = config.method;
  if (r.restarts < 0 || r.restarts > kMaxRestarts) {
    throw UsageError(concat("--restarts must be in [0, ", kMaxRestarts, "], got ", r.restarts));
  }
  if (r.checkpoint_every < 0 || r.checkpoint_every > kMaxIterations) {
    throw UsageError(concat("--checkpoint-every must be in [0, ", kMaxIterations, "] (0: never), got ",
                            r.checkpoint_every));
  }
  // With --restarts and no --checkpoint-dir the commits are kept in memory (train/elastic.h), and
  // a rollback's attempt (config.recovery set) resumes from there.
  const bool in_memory = r.restarts > 0 && (r.checkpoint_every > 0 || config.recovery != nullptr);
  if (((r.resume && config.recovery == nullptr) || (r.checkpoint_every > 0 && !in_memory)) && r.checkpoint_dir.empty()) {
    throw UsageError(concat(r.resume ? "--resume" : "--checkpoint-every", " needs --checkpoint-dir DIR"));
  }
  if (!r.checkpoint_dir.empty() && r.checkpoint_every == 0 && !r.resume) {
    throw UsageError("--checkpoint-dir needs --checkpoint-every N (to write checkpoints) or --resume (to read one)");
  }
  if (r.on_nonfinite != "stop" && r.on_nonfinite != "skip") {
    throw UsageError(concat("--on-nonfinite must be stop or skip, got '", r.on_nonfinite, "'"));
  }
  if (r.check_consistency < 0 || r.check_consistency > kMaxIterations) {
    throw UsageError(concat("--check-consistency must be in [0, ", kMaxIterations, "] (0: never), got ",
                            r.check_consistency));
  }
  if (r.check_consistency > 0 && !method.traits().replicas_identical) {
    throw UsageError(concat("--check-consistency: the replicas of '", method.name(),
                            "' differ by design (each worker trains on its own weights); it applies to ",
                            methods_where([](const MethodTraits& t) { return t.replicas_identical; })));
  }
  if (r.restarts > 0 && r.checkpoint_every == 0) {
    throw UsageError("--restarts needs commits to roll back to: --checkpoint-every N (N > 0)");
  }
  if (!r.restart_faults.empty() && r.restarts == 0) {
    throw UsageError(concat("--inject-fault is given ", r.restart_faults.size() + 1,
                            " times: the faults after the first are armed in the restarts, which need --restarts R"));
  }
  if (r.fault.active()) validate_fault(config, r.fault);
  for (const FaultInjection& fault : r.restart_faults) validate_fault(config, fault);
}

}  // namespace

void validate_train_config(const TrainConfig& config) {
  PIPESGD_ASSERT(config.method.descriptor != nullptr && config.method.options != nullptr);
  if (config.workers < 1 || config.workers > kMaxWorkers) {
    throw UsageError(concat("--workers must be in [1, ", kMaxWorkers, "], got ", config.workers));
  }
  if (config.batch < 1 || config.batch > kMaxBatch) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", config.batch));
  }
  if (config.iterations < 0 || config.iterations > kMaxIterations) {
    throw UsageError(concat("--iters must be in [0, ", kMaxIterations, "], got ", config.iterations));
  }
  if (config.iterations == 0 && (config.epochs < 1 || config.epochs > kMaxIterations)) {
    throw UsageError(concat("--epochs must be in [1, ", kMaxIterations, "], got ", config.epochs));
  }
  validate_reliability(config);
}

}  // namespace pipesgd
