#include "pipesgd/optim/gradient_handoff.h"

#include <algorithm>

#include "pipesgd/core/error.h"

namespace pipesgd {

void HandedOverGradients::reset(const Layout& layout) {
  gradient.assign(layout.total(), 0.0f);
  updated.assign(layout.segment_count(), 0);
}

bool HandedOverGradients::any() const {
  return std::any_of(updated.begin(), updated.end(), [](std::uint8_t u) { return u != 0; });
}

GradientHandoff::GradientHandoff(const Layout& layout, std::shared_ptr<HandedOverGradients> into)
    : layout_(layout), into_(std::move(into)) {
  PIPESGD_ASSERT(into_ != nullptr);
  // Sized once: a method built while the caller has yet to apply what its predecessor handed over
  // (auto's switch, algo/auto/) leaves that in place.
  if (into_->gradient.size() != layout_.total() || into_->updated.size() != layout_.segment_count()) {
    into_->reset(layout_);
  }
}

void GradientHandoff::mark_updated(std::size_t offset, std::size_t count) {
  if (count == 0) return;
  const std::size_t end = offset + count;
  auto for_each_segment = [&](auto&& visit) {
    for (std::size_t s = 0; s < layout_.segment_count(); ++s) {
      const Segment& segment = layout_.segment(s);
      if (segment.offset >= end) break;
      if (segment.offset + segment.count <= offset) continue;
      PIPESGD_ASSERT(segment.offset >= offset && segment.offset + segment.count <= end);  // whole segments
      visit(s);
    }
  };
  bool pending = false;
  for_each_segment([&](std::size_t s) { pending = pending || into_->updated[s] != 0; });
  if (pending && into_->apply_pending) into_->apply_pending();
  for_each_segment([&](std::size_t s) { into_->updated[s] = 1; });
}

void GradientHandoff::step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
                           std::size_t offset) {
  PIPESGD_ASSERT(gradients.size() == parameters.size() && offset + gradients.size() <= into_->gradient.size());
  if (const PlainSgd& sgd = into_->plain_sgd; sgd.on) {
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      parameters[i] -= sgd.learning_rate * (gradients[i] * gradient_scale + sgd.weight_decay * parameters[i]);
    }
    return;
  }
  mark_updated(offset, gradients.size());
  float* out = into_->gradient.data() + offset;
  for (std::size_t i = 0; i < gradients.size(); ++i) out[i] = gradients[i] * gradient_scale;
}

void GradientHandoff::predict(std::span<const float>, std::span<const float>, float, std::size_t,
                              std::span<float>) const {
  PIPESGD_ASSERT(!"GradientHandoff cannot predict: the method should have been refused");
}

float GradientHandoff::ElementKernel::predict(std::size_t, float w, float) const {
  PIPESGD_ASSERT(!"GradientHandoff cannot predict: the method should have been refused");
  return w;
}

GradientHandoff::ElementKernel GradientHandoff::element_kernel(std::size_t offset, std::size_t count) {
  if (!into_->plain_sgd.on) mark_updated(offset, count);
  return {into_->gradient.data(), into_->plain_sgd};
}

}  // namespace pipesgd
