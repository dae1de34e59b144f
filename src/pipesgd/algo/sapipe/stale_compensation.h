#pragma once
// SAPipe's compensation of the stale range (algo/sapipe/sapipe.h), with n workers, G(t) the summed
// gradient of iteration t, L(t) this worker's local gradient of iteration t, X the true weights and
// D the last step of X:
//   none  X <- step(X, G(t-2)/n)                                   (vanilla SAPipe, Alg. 1)
//   dc    g = G(t-2)/n; X <- step(X, g + lambda * g * (g . D))      (Alg. 2, Eq. 1, full matrix:
//         the scalar g . D over the whole stale range)
//   wp1|wp2|wp3  X <- step(X, G(t-2)/n); the model computes on the prediction
//         W = predict(X, g~) (Alg. 3 line 11; the optimizer's update without changing its state):
//         wp1 g~ = L(t-1); wp2 g~ = G(t-2)/n;
//         wp3 g~ = DC(G(t-2)/n - L(t-2)/n, D) + L(t-1)/n, with D the step just taken.
// The DC term is Eq. 1 as printed by default. With `bound` (--dc-bound on) its scalar is clamped
// each step: |lambda * (g . D)| <= kDelayCompensationBound = 1 - 1/sqrt(2), the condition
// lambda * eta * V2 <= 1 - 1/sqrt(2) of SAPipe paper Theorem 3 (a condition on the hyper-parameters
// there, not a per-step clip; Theorem 6, wp3, has none) enforced as a safeguard: a loss spike can
// make the factor 1 + lambda * g . D negative, the step then goes uphill and the next D is larger.
// bounded_compensations() counts the clamped updates (always 0 without `bound`); wp3 predicts with
// this worker's local gradients, so its count is per worker.
//
// The update is fused over the flat stale range (optim/fused_update.h), never per tensor: one pass
// that compensates (dc), steps and records the step; for wp one more pass that predicts; and before
// the compensated pass a reduction for the scalar g . D when dc or wp3 needs it.
//
// History: the local gradients (wp) and the last step (dc, wp3) are kept for the whole buffer
// while the partition may still change (any layer may become stale, and its history must be known
// by then); for the stale range only after. Compute thread only.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/algo/sapipe/sapipe_options.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/optim/optimizer.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {

inline constexpr double kDelayCompensationBound = 0.29289321881345254;  // 1 - 1/sqrt(2)

// The stale range's work per iteration with `kind`, in seconds per element, as the trainer times it
// (SaPipe::update_stale_range: step_stale, and for weight prediction predict; "update" for none):
// the median of `repetitions` (>= 1) over a range of `elements` (>= 1) with the optimizer `sgd`.
// What `pipesgd profile` records for the simulator (MethodDescriptor::measure_costs).
double measure_stale_update_seconds(Compensation kind, std::size_t elements, const SgdOptions& sgd, int repetitions);

class StaleCompensation {
 public:
  // `elements`: the flat buffers' size; `gradient_scale` 1/n; `bound`: clamp the DC scalar.
  StaleCompensation(Compensation kind, float lambda, bool bound, float gradient_scale, std::size_t elements);

  Compensation kind() const { return kind_; }
  bool predicts() const { return pipesgd::predicts(kind_); }
  std::int64_t bounded_compensations() const { return bounded_compensations_; }

  // The stale range is now the first `count` elements; between iterations, with nothing in flight,
  // so `weights` (the model's) are the true weights.
  void use_stale_range(std::span<const float> weights, std::size_t count);
  // wp: the stale range's true weights (the model holds the prediction); empty otherwise.
  std::span<const float> true_weights() const { return true_weights_; }

  // Keeps this worker's local gradient of iteration t, elements [offset, offset + count) of `slot`
  // (before their allreduce).
  void record_local_gradient(std::span<const float> slot, std::size_t offset, std::size_t count, std::int64_t t);
  // The synchronous update of elements [offset, offset + count) of `weights` with the reduced
  // `slot`; the step is recorded when `record_step` (the layers may still become stale).
  void step_synchronous(Optimizer& optimizer, std::span<float> weights, std::span<const float> slot,
                        std::size_t offset, std::size_t count, bool record_step);
  // The stale range's true step with the reduced gradient `gradient` (whole slot; nullptr: none),
  // compensated (dc) when `stale`. `model_weights` is the model's buffer.
  void step_stale(Optimizer& optimizer, std::span<float> model_weights, const float* gradient, std::size_t count,
                  bool stale);
  // wp: the model computes on the true weights (nothing in flight to predict past).
  void show_true_weights(std::span<float> model_weights, std::size_t count) const;
  // wp: writes the prediction for iteration t into the model's stale range; `synchronized` is
  // G(t-2) (nullptr when t < 2).
  void predict(Optimizer& optimizer, std::span<float> model_weights, std::size_t count, std::int64_t t,
               const float* synchronized);
  // The history of elements [offset, offset + count) starts from zero (layers that became stale
  // after the history stopped being kept for them).
  void forget(std::size_t offset, std::size_t count);

  // With the caller's optimizer (optim/gradient_handoff.h) a step is known only once the caller
  // applied it: the recorded steps of earlier hand-over rounds become `weights` now minus the
  // weights before (`weights`: the model's, between steps, after the caller's optimizer stepped).
  // step_synchronous and step_stale settle by themselves; call it before save.
  void settle_deferred_steps(std::span<const float> weights);
  // Checkpoint sections `prefix` + ...; load throws DataError for another size, or for clamped
  // updates counted when this run does not bound.
  void save(CheckpointWriter& out, const std::string& prefix) const;
  void load(const CheckpointReader& in, const std::string& prefix);

 private:
  // g . D as used by the DC term: with bound_, clamped so that |lambda * (g . D)| <=
  // kDelayCompensationBound (counted).
  float dc_projection(double dot);
  // Steps recorded in an earlier hand-over round than `optimizer`'s now are settled; then elements
  // [offset, offset + count) of `weights` are remembered as the weights before the update the
  // caller applies after this round (deferred), when `optimizer` defers.
  void settle_earlier_rounds(const Optimizer& optimizer, std::span<const float> weights);
  void defer_step(const Optimizer& optimizer, std::span<const float> weights, std::size_t offset, std::size_t count);

  const Compensation kind_;
  const float lambda_;
  const bool bound_;
  const float gradient_scale_;
  std::vector<float> local_[2];       // wp: L(t) in local_[t % 2], whole buffer
  std::vector<float> true_weights_;   // wp: the stale range's true weights
  std::vector<float> last_step_;      // dc, wp3: the last step of every element
  // Deferred steps (the caller's optimizer applies them): per element, 1 while last_step_ holds
  // the weight before the update instead of the step; the hand-over round they were recorded in.
  std::vector<char> deferred_;
  bool any_deferred_ = false;
  std::uint64_t deferred_round_ = 0;
  std::int64_t bounded_compensations_ = 0;
};

}  // namespace pipesgd
