#include "pipesgd/algo/pipe/pipe_sgd.h"

#include <algorithm>

#include "pipesgd/algo/synchronous_step.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

const char* final_gradients_name(FinalGradients final_gradients) {
  return final_gradients == FinalGradients::kApply ? "apply" : "drop";
}

FinalGradients parse_final_gradients(const std::string& text) {
  if (text == "apply") return FinalGradients::kApply;
  if (text == "drop") return FinalGradients::kDrop;
  throw UsageError(concat("--final-gradients must be ", kFinalGradientsNames, ", got '", text, "'"));
}

// "K 2" as before --final-gradients existed, so that checkpoints of those runs (which applied) resume.
std::string PipeOptions::fingerprint() const {
  return final_gradients == FinalGradients::kApply ? concat("K ", k) : concat("K ", k, ", final gradients drop");
}

void PipeReport::add_json(nlohmann::json& summary, const RunFigures&) const {
  summary["final_gradients"] = final_gradients_name(final_gradients_);
}

void PipeReport::print(std::ostream& out, const RunFigures&) const {
  out << "\nEnd of training (--final-gradients " << final_gradients_name(final_gradients_) << "): the aggregated "
      << "gradients of the last " << staleness_ << (staleness_ == 1 ? " iteration were " : " iterations were ")
      << (final_gradients_ == FinalGradients::kApply
              ? "applied, so every computed gradient counts (drop is Pipe-SGD paper Alg. 1 as printed)."
              : "dropped, as Pipe-SGD paper Alg. 1 as printed (its comm thread reduces iterations 1..T-K).")
      << "\n";
}

std::optional<DeferredPhase> PipeOptions::deferred_phase(std::int64_t warmup_iterations) const {
  return warmup_phase(warmup_iterations, concat("Pipe-SGD with K = ", k, " starts"),
                      "until then every iteration runs as D-Sync (allreduce, then update)");
}

PipeSgd::PipeSgd(const MethodContext& context)
    : model_(context.model),
      transport_(context.transport),
      codec_(make_codec(context.common.codec)),
      allreduce_(make_method_allreduce(context.common, context.transport, context.model.layout().total(), *codec_,
                                       context.options.default_segment_bytes())),
      optimizer_(make_optimizer(context.common.optimizer, context.model.layout())),
      schedule_(context.learning_rate_schedule),
      staleness_(options_as<PipeOptions>(context.options).k),
      warmup_iterations_(context.warmup_iterations),
      final_gradients_(options_as<PipeOptions>(context.options).final_gradients),
      gradient_scale_(1.0f / static_cast<float>(context.transport.size())),
      next_iteration_(context.first_iteration),
      slots_(static_cast<std::size_t>(staleness_)),
      comm_(context.transport, "pipe-sgd", static_cast<std::size_t>(staleness_), context.common.timeout,
            [this](const CommWorker::Job& job) {
              allreduce_->run(job.data, collective_tag(Channel::kGradients, static_cast<std::uint64_t>(job.iteration)));
              slots_[static_cast<std::size_t>(job.iteration % staleness_)].bytes_sent_after = transport_.bytes_sent();
            },
            context.common.wait_spin) {
  PIPESGD_ASSERT(staleness_ >= 1 && staleness_ <= kMaxStaleness && warmup_iterations_ >= 0);
  for (Slot& slot : slots_) slot.gradient.assign(context.model.layout().total(), 0.0f);
}

void PipeSgd::wait_reduced(Slot& slot, IterationTimes& times) {
  TracedStopwatch waiting("wait");
  slot.comm_seconds = comm_.wait(slot.ticket, "the aggregated gradient", slot.iteration);
  times.wait += waiting.stop();
  slot.state = SlotState::reduced;
  if (pending_commit_) note_reduced(slot);
}

void PipeSgd::note_reduced(const Slot& slot) {
  const int k = static_cast<int>(&slot - slots_.data());
  PendingCommit& pending = *pending_commit_;
  const auto it = std::find(pending.waiting.begin(), pending.waiting.end(), k);
  if (it == pending.waiting.end()) return;
  pending.part.add(concat("method.pipe.slot", k, ".gradient"), std::span<const float>(slot.gradient));
  pending.bytes_sent = std::max(pending.bytes_sent, slot.bytes_sent_after);
  pending.waiting.erase(it);
  if (!pending.waiting.empty()) return;
  PendingCommit done = std::move(pending);
  pending_commit_.reset();
  done.ready(std::move(done.part), done.bytes_sent);
}

void PipeSgd::consume_slot(std::int64_t t, IterationTimes& times, bool apply) {
  Slot& slot = slots_[t % staleness_];
  if (slot.state == SlotState::queued) wait_reduced(slot, times);
  if (slot.state != SlotState::reduced) return;  // nothing in flight for t-K: no update
  PIPESGD_ASSERT(slot.iteration == t - staleness_);
  if (apply) {
    TracedStopwatch update("update");
    trace_gradient_flow_end(slot.iteration, 0);  // the arrow from g_sum[t-K]'s allreduce
    optimizer_->set_learning_rate_factor(schedule_.factor(slot.iteration));  // g_sum[t-K] at lr(t-K)
    optimizer_->step(model_.parameters(), slot.gradient, gradient_scale_, 0);
    times.update += update.stop();
  }
  times.comm += slot.comm_seconds;
  slot.state = SlotState::empty;
}

std::span<float> PipeSgd::begin_iteration(std::int64_t t, IterationTimes& times) {
  PIPESGD_ASSERT(t == next_iteration_);
  if (in_warmup(t)) return slots_[0].gradient;
  times.pipelined = true;
  consume_slot(t, times);
  return slots_[t % staleness_].gradient;
}

void PipeSgd::end_iteration(std::int64_t t, IterationTimes& times) {
  next_iteration_ = t + 1;
  if (in_warmup(t)) {  // D-Sync: allreduce on this thread, then update
    allreduce_then_step(*allreduce_, *optimizer_, schedule_, model_.parameters(), slots_[0].gradient, gradient_scale_, t, times);
    return;
  }
  Slot& slot = slots_[t % staleness_];
  PIPESGD_ASSERT(slot.state == SlotState::empty);
  slot.state = SlotState::queued;
  slot.iteration = t;
  slot.ticket = comm_.submit({slot.gradient, 0, t, 0});
}

void PipeSgd::save_state(CheckpointWriter& out) {
  // The allreduces in flight, in submission order (waited for, not applied).
  IterationTimes untimed;
  for (std::int64_t t = next_iteration_ - staleness_; t < next_iteration_; ++t) {
    Slot& slot = slots_[(t + staleness_) % staleness_];
    if (slot.state == SlotState::queued) wait_reduced(slot, untimed);
  }
  optimizer_->save_state(out, "method.");
  add_slots(out, nullptr);
}

void PipeSgd::add_slots(CheckpointWriter& out, std::vector<int>* queued) const {
  out.add_int("method.pipe.slots", staleness_);
  for (int k = 0; k < staleness_; ++k) {
    const Slot& slot = slots_[static_cast<std::size_t>(k)];
    const std::string name = concat("method.pipe.slot", k, ".");
    const bool in_flight = queued != nullptr && slot.state == SlotState::queued;
    out.add_int(name + "reduced", slot.state == SlotState::reduced || in_flight ? 1 : 0);
    out.add_int(name + "iteration", slot.iteration);
    if (slot.state == SlotState::reduced) out.add(name + "gradient", std::span<const float>(slot.gradient));
    if (in_flight) queued->push_back(k);
  }
}

void PipeSgd::save_state_when_ready(CheckpointWriter out, const CommitReady& ready) {
  if (pending_commit_) {  // an earlier commit still waits: complete it first (its slots' waits)
    IterationTimes untimed;
    for (Slot& slot : slots_) {
      if (slot.state == SlotState::queued) wait_reduced(slot, untimed);
    }
  }
  optimizer_->save_state(out, "method.");
  std::vector<int> queued;
  add_slots(out, &queued);
  if (queued.empty()) {
    ready(std::move(out), std::nullopt);
    return;
  }
  pending_commit_.emplace(PendingCommit{std::move(out), ready, std::move(queued), 0});
}

void PipeSgd::load_state(const CheckpointReader& in, std::int64_t next_iteration) {
  optimizer_->load_state(in, "method.");
  if (in.integer("method.pipe.slots") != staleness_) {
    throw DataError(concat("checkpoint '", in.origin(), "': written with --staleness-k ",
                           in.integer("method.pipe.slots"), ", this run has ", staleness_));
  }
  for (int k = 0; k < staleness_; ++k) {
    Slot& slot = slots_[static_cast<std::size_t>(k)];
    const std::string name = concat("method.pipe.slot", k, ".");
    slot.iteration = in.integer(name + "iteration");
    slot.state = in.integer(name + "reduced") != 0 ? SlotState::reduced : SlotState::empty;
    if (slot.state == SlotState::reduced) {
      // A slot holds g_sum[i] for i in [next - K, next), in slot i % K, after the warm-up.
      if (slot.iteration < std::max<std::int64_t>(warmup_iterations_, next_iteration - staleness_) ||
          slot.iteration >= next_iteration || slot.iteration % staleness_ != k) {
        throw DataError(concat("checkpoint '", in.origin(), "': slot ", k, " holds the gradient of iteration ",
                               slot.iteration, ", which iteration ", next_iteration, " with warm-up ",
                               warmup_iterations_, " cannot have in flight"));
      }
      const std::span<const float> gradient = in.floats(name + "gradient");
      if (gradient.size() != slot.gradient.size()) {
        throw DataError(concat("checkpoint '", in.origin(), "': slot gradient of ", gradient.size(),
                               " values for a model of ", slot.gradient.size()));
      }
      std::copy(gradient.begin(), gradient.end(), slot.gradient.begin());
    }
  }
  next_iteration_ = next_iteration;
}

void PipeSgd::finish(IterationTimes& times) {
  for (int k = 0; k < staleness_; ++k) {
    const std::int64_t t = next_iteration_ + k;
    if (!in_warmup(t)) consume_slot(t, times, final_gradients_ == FinalGradients::kApply);
  }
}

std::shared_ptr<MethodReport> PipeSgd::report() const {
  return std::make_shared<PipeReport>(final_gradients_, staleness_);
}

}  // namespace pipesgd
