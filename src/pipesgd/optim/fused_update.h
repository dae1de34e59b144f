#pragma once
// One fused loop over a flat range for updates that do more than the optimizer's step (SAPipe's
// compensation and weight prediction, algo/sapipe/stale_compensation.h): the caller's body runs once per element with
// a kernel that steps or predicts that element exactly as Optimizer::step / predict would (the same
// float operations: bit-identical results), so compensation, step and prediction share one pass.
//
//   fused_update(optimizer, offset, count, steps, [&](std::size_t i, auto& kernel) {
//     w[i] = kernel.step(i, w[i], g);          // g already scaled; updates the optimizer's state
//     p[i] = kernel.predict(i, w[i], g_hat);   // what a further step would give; no state change
//   });
//
// `i` is the element's index in the flat buffers ([offset, offset + count), whole segments).
// `steps`: the body calls step() on every element (Adam counts the step per segment, and predict()
// then looks one step past it); false: only predict().
#include <cstddef>

#include "pipesgd/core/error.h"
#include "pipesgd/optim/adam.h"
#include "pipesgd/optim/gradient_handoff.h"
#include "pipesgd/optim/optimizer.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {

// sum over i in [0, n) of term(i), in double, with four independent partial sums (a serial double
// sum is bound by the add's latency). The order is fixed: every rank summing the same terms gets
// the same bits.
template <typename Term>
double sum_terms(std::size_t n, Term&& term) {
  double partial[4] = {0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    partial[0] += term(i);
    partial[1] += term(i + 1);
    partial[2] += term(i + 2);
    partial[3] += term(i + 3);
  }
  for (; i < n; ++i) partial[0] += term(i);
  return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

template <typename Body>
void fused_update(Optimizer& optimizer, std::size_t offset, std::size_t count, bool steps, Body&& body) {
  if (count == 0) return;
  if (auto* sgd = dynamic_cast<Sgd*>(&optimizer)) {
    Sgd::ElementKernel kernel = sgd->element_kernel();
    for (std::size_t i = offset; i < offset + count; ++i) body(i, kernel);
    return;
  }
  if (auto* handoff = dynamic_cast<GradientHandoff*>(&optimizer)) {
    PIPESGD_ASSERT(steps);  // it cannot predict
    GradientHandoff::ElementKernel kernel = handoff->element_kernel(offset, count);
    for (std::size_t i = offset; i < offset + count; ++i) body(i, kernel);
    return;
  }
  auto* adam = dynamic_cast<Adam*>(&optimizer);
  PIPESGD_ASSERT(adam != nullptr);
  adam->for_each_segment(offset, count, steps, [&](std::size_t begin, std::size_t end, Adam::ElementKernel& kernel) {
    for (std::size_t i = begin; i < end; ++i) body(i, kernel);
  });
}

}  // namespace pipesgd
