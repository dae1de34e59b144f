// SaPipe's checkpoints (algo/sapipe/sapipe.h): what the method itself keeps, and each part's own
// sections (partition, stall checks, compensation).
#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/sapipe/sapipe.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

const std::string kPrefix = "method.sapipe.";

std::string stale_layers_text(std::int64_t value) { return value < 0 ? std::string("auto") : concat(value); }

}  // namespace

void SaPipe::save_state(CheckpointWriter& out) {
  comm_.drain("its allreduces in flight before a checkpoint");
  optimizer_->save_state(out, "method.");
  // What this run was configured with.
  out.add_int(kPrefix + "layers", static_cast<std::int64_t>(layers_));
  out.add_int(kPrefix + "requested_stale_layers", options_.stale_layers);
  out.add_int(kPrefix + "compensation", static_cast<std::int64_t>(options_.compensation));
  out.add_int(kPrefix + "profile_iterations", options_.profile_iterations);
  // Where the pipeline is.
  out.add_int(kPrefix + "pipeline_start", pipeline_start_);
  out.add_int(kPrefix + "drained_iteration", drained_iteration_);
  out.add_int(kPrefix + "stale_job_valid0", stale_job_valid_[0] ? 1 : 0);
  out.add_int(kPrefix + "stale_job_valid1", stale_job_valid_[1] ? 1 : 0);
  out.add_int(kPrefix + "previous_sync_pending", previous_sync_pending_ ? 1 : 0);
  out.add(kPrefix + "slot0", std::span<const float>(slots_[0]));
  out.add(kPrefix + "slot1", std::span<const float>(slots_[1]));
  // The profiling so far.
  out.add_int(kPrefix + "profiled_iterations", profiled_iterations_);
  forward_sums_.save(out, kPrefix + "forward_sums");
  backward_sums_.save(out, kPrefix + "backward_sums");
  partition_.save(out, kPrefix + "partition.");
  monitor_.save(out, kPrefix + "stall.");
  compensation_.settle_deferred_steps(model_.parameters());  // the caller's optimizer stepped (API contract)
  compensation_.save(out, kPrefix + "compensation.");
}

void SaPipe::load_state(const CheckpointReader& in, std::int64_t next_iteration) {
  optimizer_->load_state(in, "method.");
  auto refuse = [&](const std::string& why) { return DataError(concat("checkpoint '", in.origin(), "': ", why)); };
  auto integer = [&](const char* name) { return in.integer(kPrefix + name); };
  auto flag = [&](const char* name) { return in.flag(kPrefix + name); };
  // What this run was configured with.
  if (integer("layers") != static_cast<std::int64_t>(layers_)) {
    throw refuse(concat("written for a model of ", integer("layers"), " layers, this one has ", layers_));
  }
  if (integer("requested_stale_layers") != options_.stale_layers) {
    throw refuse(concat("written with --stale-layers ", stale_layers_text(integer("requested_stale_layers")),
                        ", this run has ", stale_layers_text(options_.stale_layers)));
  }
  const std::vector<std::string> compensations = compensation_names();
  const std::int64_t compensation = integer("compensation");
  if (compensation != static_cast<std::int64_t>(options_.compensation)) {
    const bool known = compensation >= 0 && compensation < static_cast<std::int64_t>(compensations.size());
    throw refuse(concat("written with --compensation ",
                        known ? compensations[static_cast<std::size_t>(compensation)] : concat("#", compensation),
                        ", this run has ", compensations[static_cast<std::size_t>(options_.compensation)]));
  }
  if (integer("profile_iterations") != options_.profile_iterations) {
    throw refuse(concat("written with --profile-iters ", integer("profile_iterations"), ", this run has ",
                        options_.profile_iterations));
  }
  // The partition and the iteration it was saved at: planned at construction, or from then on.
  const bool planned = in.integer(kPrefix + "partition.planned") == 1;
  if (planned != (partition_.planned() || next_iteration >= plan_iteration_)) {
    throw refuse(concat(planned ? "planned" : "not planned", " before iteration ", next_iteration,
                        " (the plan is made before iteration ", plan_iteration_, ")"));
  }
  const std::int64_t pipeline_start = integer("pipeline_start");
  const std::int64_t drained_iteration = integer("drained_iteration");
  // The pipeline starts where this run's configuration says, or later where a stall check of
  // --stale-layers auto drained and restarted it (after the previous iteration).
  const bool restarted = options_.automatic() && drained_iteration >= 0 && drained_iteration == pipeline_start - 1 &&
                         pipeline_start > pipeline_start_ && pipeline_start <= next_iteration;
  if (!(pipeline_start == pipeline_start_ && drained_iteration == first_iteration_ - 1) && !restarted) {
    throw refuse(concat("pipeline started at iteration ", pipeline_start, " (drained after ", drained_iteration,
                        "), this run starts it at ", pipeline_start_, " and resumes at ", next_iteration));
  }
  const std::int64_t profiled_iterations = integer("profiled_iterations");
  if (profiled_iterations < 0 || profiled_iterations > options_.profile_iterations) {
    throw refuse(concat(profiled_iterations, " profiled iterations with --profile-iters ", options_.profile_iterations));
  }
  partition_.load(in, kPrefix + "partition.", options_.stale_layers);
  monitor_.load(in, kPrefix + "stall.", next_iteration, layers_, options_.automatic());
  // Reduced stale gradients still to apply: G(g) in slot g % 2 for pipelined g in [next - 2, next).
  bool stale_valid[2];
  for (int slot = 0; slot < 2; ++slot) {
    stale_valid[slot] = flag(slot == 0 ? "stale_job_valid0" : "stale_job_valid1");
    const std::int64_t g = (next_iteration - 1) % 2 == slot ? next_iteration - 1 : next_iteration - 2;
    if (stale_valid[slot] && (g < pipeline_start || partition_.stale().count == 0)) {
      throw refuse(concat("slot ", slot, " holds a stale gradient of iteration ", g, ", which is not pipelined with k = ",
                          partition_.stale_layers(), " (pipeline start ", pipeline_start, ")"));
    }
  }
  const bool sync_pending = flag("previous_sync_pending");
  if (sync_pending && (next_iteration - 1 < pipeline_start || partition_.stale_layers() == layers_)) {
    throw refuse(concat("synchronous buckets of iteration ", next_iteration - 1, " pending, which is not pipelined"));
  }
  auto load_slot = [&](const char* name, std::vector<float>& slot) {
    const std::span<const float> values = in.floats(kPrefix + name, slot.size());
    std::copy(values.begin(), values.end(), slot.begin());
  };
  load_slot("slot0", slots_[0]);
  load_slot("slot1", slots_[1]);
  forward_sums_.load(in, kPrefix + "forward_sums");
  backward_sums_.load(in, kPrefix + "backward_sums");
  if (partition_.planned()) partition_changed();  // sizes the true weights for the stale range
  compensation_.load(in, kPrefix + "compensation.");

  pipeline_start_ = pipeline_start;
  drained_iteration_ = drained_iteration;
  profiled_iterations_ = profiled_iterations;
  // The reduced gradients still to apply, as jobs already done.
  for (int slot = 0; slot < 2; ++slot) {
    stale_job_valid_[slot] = stale_valid[slot];
    if (stale_valid[slot]) stale_job_[slot] = comm_.completed_ticket();
  }
  previous_sync_pending_ = sync_pending;
  previous_sync_applied_ = 0;
  if (sync_pending) {
    for (std::uint64_t& job : previous_sync_jobs_) job = comm_.completed_ticket();
  }
  next_iteration_ = next_iteration;
}

}  // namespace pipesgd
