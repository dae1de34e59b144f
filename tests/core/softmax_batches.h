#pragma once
// Deterministic per-(rank, iteration) batches for the pure-C++ softmax model, independent of any
// sampler: the tests of the training methods feed worker `rank` at iteration t the batch at(rank, t).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pipesgd/core/random.h"
#include "pipesgd/data/dataset.h"

namespace pipesgd {

struct SoftmaxBatches {
  std::size_t features = 0;
  std::size_t batch = 0;
  std::vector<float> inputs;          // uniform in [-1, 1)
  std::vector<std::int32_t> labels;   // uniform in [0, classes)

  // Views into this object: it must outlive the Batch.
  Batch at(int rank, std::int64_t t, int ranks) const {
    const std::size_t index = static_cast<std::size_t>(t * ranks + rank);
    Batch out;
    out.inputs = std::span<const float>(inputs).subspan(index * batch * features, batch * features);
    out.labels = std::span<const std::int32_t>(labels).subspan(index * batch, batch);
    out.size = batch;
    out.features = features;
    return out;
  }
};

// ranks x iterations batches of `batch` rows, drawn from Random(seed): inputs first, then labels.
inline SoftmaxBatches make_softmax_batches(std::uint64_t seed, int ranks, std::int64_t iterations, std::size_t features,
                                           std::size_t classes, std::size_t batch) {
  Random random(seed);
  SoftmaxBatches batches;
  batches.features = features;
  batches.batch = batch;
  const std::size_t rows = static_cast<std::size_t>(ranks * iterations) * batch;
  for (std::size_t i = 0; i < rows * features; ++i) batches.inputs.push_back(static_cast<float>(random.uniform() * 2 - 1));
  for (std::size_t i = 0; i < rows; ++i) batches.labels.push_back(static_cast<std::int32_t>(random.uniform_below(classes)));
  return batches;
}

}  // namespace pipesgd
