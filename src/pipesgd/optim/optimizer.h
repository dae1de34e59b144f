#pragma once
// The optimizer interface of the allreduce-family methods (dsync, pipe, layer-wise dsync, sapipe):
// an update fused over a flat range of the parameter buffer, and the same update as a prediction that
// changes no state (SAPipe's weight prediction, SAPipe paper Alg. 3 line 11).
//
// Ranges are given as (parameters, gradients, offset): elements [offset, offset + n) of the model's
// flat buffers. Every range must consist of whole segments of the layout the optimizer was built for
// (Adam keeps its step count per segment). One object per replica; not thread-safe (the compute
// thread owns it).
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/core/layout.h"
#include "pipesgd/optim/optimizer_interface.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {

// Adam with torch::optim::Adam's semantics (PyTorch 1.13, amsgrad off):
//   g' = scale * g + weight_decay * w
//   m = beta1 * m + (1 - beta1) * g';  v = beta2 * v + (1 - beta2) * g'^2
//   w -= (learning_rate / (1 - beta1^s)) * m / (sqrt(v) / sqrt(1 - beta2^s) + epsilon)
// with s the number of steps this element's segment has taken (1 on the first).
struct AdamOptions {
  float learning_rate = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
};

struct HandedOverGradients;  // optim/gradient_handoff.h

struct OptimizerOptions {
  std::string name = "sgd";  // "sgd" or "adam"; "external": the caller's optimizer (see handoff)
  SgdOptions sgd;            // name == "sgd"
  AdamOptions adam;          // name == "adam"
  // name == "external" (the public API only, never a CLI flag): the method's updates become
  // gradients handed over here for the caller's own optimizer (optim/gradient_handoff.h).
  std::shared_ptr<HandedOverGradients> handoff;
};

// Names accepted for --optimizer.
std::vector<std::string> optimizer_names();

// class Optimizer: declared in optimizer_interface.h (included above) so optimizers can derive from it.

// Builds the optimizer `options.name` for buffers laid out by `layout`. Throws UsageError for an
// unknown name or invalid options (the message names the flag).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const Layout& layout);

}  // namespace pipesgd
