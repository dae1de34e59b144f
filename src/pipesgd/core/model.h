#pragma once
// The model interface every training method runs on. Implemented by the LibTorch adapter
// (src/pipesgd/torch) and by the pure-C++ SoftmaxRegression (src/pipesgd/models) used by fast tests.
// Nothing here includes LibTorch.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/core/layout.h"

namespace pipesgd {

// A batch of examples, row-major: inputs has size * features floats; labels has size entries (a
// labelled data set) or targets has size * target_features floats (regression targets; labels is
// then empty). example_shape is one example's shape (product: features), or empty where only the
// flat rows are known. The model reads it; the caller owns the memory.
struct Batch {
  std::span<const float> inputs;
  std::span<const std::int32_t> labels;
  std::size_t size = 0;
  std::size_t features = 0;
  std::span<const std::int64_t> example_shape;
  std::span<const float> targets;
  std::size_t target_features = 0;
};

// What a model is checked against of its data (data/dataset.h's Dataset::shape gives it): one
// example's shape (product: features; empty where only the flat rows are known), the number of
// classes of a labelled data set, or the floats per regression target (0: labelled).
struct DataShape {
  std::size_t features = 0;
  std::vector<std::int64_t> example_shape;
  std::size_t classes = 0;
  std::size_t target_features = 0;
  std::string name;  // for messages, e.g. "fashion-mnist/train"

  bool regression() const { return target_features > 0; }
};

// A labelled batch of flat rows (no example shape, no targets).
inline Batch labelled_batch(std::span<const float> inputs, std::span<const std::int32_t> labels, std::size_t size,
                            std::size_t features) {
  Batch batch;
  batch.inputs = inputs;
  batch.labels = labels;
  batch.size = size;
  batch.features = features;
  return batch;
}

// Called on the compute thread during backward, once per segment, in backward order (last layer
// first), as soon as that segment's gradient is final in the gradient buffer. `backward_seconds` is
// the time spent on that segment alone (since the previous report or the start of backward).
using SegmentReadyFn = std::function<void(std::size_t segment, double backward_seconds)>;

// Called on the compute thread during forward, before forward first reads the parameters of
// segments [first, end). In one forward_backward the calls come in forward order and together cover
// every segment exactly once; the hook may still change those parameters (a method applies their
// update there, so communication overlaps the forward of the earlier layers: SAPipe paper Fig. 2).
using SegmentsNeededFn = std::function<void(std::size_t first, std::size_t end)>;

struct StepResult {
  double loss = 0;              // mean loss over the batch
  std::size_t correct = 0;      // examples whose arg-max prediction (before the update) is the label
  double forward_seconds = 0;   // forward pass incl. the loss
  double backward_seconds = 0;  // whole backward pass
};

struct Evaluation {
  double loss_sum = 0;     // summed (not mean) loss over the examples
  std::size_t correct = 0; // examples whose arg-max prediction equals the label
  std::size_t count = 0;
};

// What a training method needs of a model: its layout, its flat parameter buffer and, if the model
// reports forward progress, a hook before each group of layers' forward. A trained model (below) is
// one; methods see nothing else of it.
class FlatParameters {
 public:
  virtual ~FlatParameters() = default;

  // Segments in forward order; one per layer (weight and bias together).
  virtual const Layout& layout() const = 0;

  // The flat parameter buffer (layout().total() floats), owned by the model. Methods update it in
  // place; the model computes with exactly these values.
  virtual std::span<float> parameters() = 0;

  // True if the forward pass calls the hook of set_forward_hook. A model that does not (the
  // default) reads every parameter at the start of forward: callers must have them final before.
  virtual bool reports_forward_progress() const { return false; }
  // Sets the hook the forward pass calls (an empty function: none). Only for models that report
  // forward progress; evaluation never calls it.
  virtual void set_forward_hook(SegmentsNeededFn hook) { (void)hook; }
};

// A model the trainer trains: forward and backward into a caller's gradient buffer, evaluation.
class Model : public FlatParameters {
 public:
  // Runs forward and backward on `batch` at the current parameters. `gradients` (layout().total()
  // floats, owned by the caller) is overwritten with d(mean loss)/d(parameters). `on_ready` may be
  // empty. Call from one thread at a time.
  virtual StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                                      const SegmentReadyFn& on_ready) = 0;

  // Loss and accuracy of the current parameters on `batch`; no gradients.
  virtual Evaluation evaluate(const Batch& batch) = 0;

  // The state training changes beside the parameters (BatchNorm's running statistics): per
  // replica, never communicated; checkpoints carry it. Its bytes are the buffers' values in a fixed
  // order; load_buffers takes bytes that buffers() gave for the same model (the size must match).
  // Default: none.
  virtual std::vector<std::byte> buffers() { return {}; }
  virtual void load_buffers(std::span<const std::byte> bytes) { (void)bytes; }

  // The model at its current parameters and buffers as a TorchScript module file (the bytes
  // torch.jit.save writes; torch.jit.load reads them), in eval mode; empty if the model cannot be
  // written as TorchScript (the default). The LibTorch models implement it (src/pipesgd/torch).
  virtual std::string torchscript() { return {}; }
};

// Builds one replica. Every call with the same seed must give bit-identical initial parameters.
using ModelFactory = std::function<std::unique_ptr<Model>(std::uint64_t seed)>;

}  // namespace pipesgd
