#include "pipesgd/data/sampler.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "pipesgd/core/error.h"
#include "pipesgd/core/random.h"

namespace pipesgd {
namespace {

// Mixed into the user's seed so that shuffling does not reuse the random streams other modules
// derive from the same seed (model initialisation, synthetic data).
constexpr std::uint64_t kShuffleSeedDomain = 0x53485546464C4531ULL;  // "SHUFFLE1"

// Indices are stored as uint32; the largest index is dataset_size - 1.
constexpr std::size_t kMaxDatasetSize = std::size_t{1} << 32;

}  // namespace

ShardedSampler::ShardedSampler(std::size_t dataset_size, std::size_t workers, std::size_t rank,
                               std::size_t batch_per_worker, std::uint64_t seed)
    : dataset_size_(dataset_size),
      workers_(workers),
      rank_(rank),
      batch_per_worker_(batch_per_worker),
      global_batch_(0),
      seed_(seed) {
  if (workers == 0) throw UsageError("sampler: the number of workers must be at least 1, got 0");
  if (rank >= workers) {
    throw UsageError(concat("sampler: rank ", rank, " is out of range for ", workers,
                            " workers (expected 0 to ", workers - 1, ")"));
  }
  if (batch_per_worker == 0)
    throw UsageError("sampler: the batch size per worker must be at least 1, got 0");
  if (dataset_size > kMaxDatasetSize) {
    throw UsageError(concat("sampler: dataset of ", dataset_size, " examples is larger than the ",
                            kMaxDatasetSize, " supported"));
  }
  if (batch_per_worker >
      dataset_size / workers) {  // dataset_size < workers * batch, without overflow
    throw UsageError(concat("sampler: dataset of ", dataset_size,
                            " examples is smaller than one global batch (", workers, " workers x ",
                            batch_per_worker, " per worker)"));
  }
  global_batch_ = workers * batch_per_worker;
  permutation_.resize(dataset_size);
  start_epoch(0);
}

void ShardedSampler::start_epoch(std::size_t epoch) {
  std::iota(permutation_.begin(), permutation_.end(), std::uint32_t{0});
  Random random(seed_ ^ kShuffleSeedDomain, epoch);
  for (std::size_t last = dataset_size_; last > 1; --last) {
    const std::size_t chosen = random.uniform_below(last);  // in [0, last)
    std::swap(permutation_[last - 1], permutation_[chosen]);
  }
}

void ShardedSampler::check_iteration(std::size_t iteration) const {
  if (iteration >= iterations_per_epoch()) {
    throw UsageError(concat("sampler: iteration ", iteration, " is out of range; an epoch has ",
                            iterations_per_epoch(), " iterations"));
  }
}

std::span<const std::uint32_t> ShardedSampler::batch_indices(std::size_t iteration) const {
  check_iteration(iteration);
  const std::size_t first = (iteration * workers_ + rank_) * batch_per_worker_;
  PIPESGD_ASSERT(first + batch_per_worker_ <= permutation_.size());
  return std::span<const std::uint32_t>(permutation_).subspan(first, batch_per_worker_);
}

BatchAssembler::BatchAssembler(const Dataset& dataset, std::size_t capacity)
    : dataset_(dataset), capacity_(capacity) {
  if (capacity == 0) throw UsageError("batch assembler: capacity must be at least 1, got 0");
  PIPESGD_ASSERT(dataset.inputs.size() == dataset.size * dataset.features);
  PIPESGD_ASSERT(dataset.labels.size() == (dataset.regression() ? 0 : dataset.size));
  PIPESGD_ASSERT(dataset.targets.size() == dataset.size * dataset.target_features);
  inputs_.resize(capacity * dataset.features);
  labels_.resize(dataset.regression() ? 0 : capacity);
  targets_.resize(capacity * dataset.target_features);
}

Batch BatchAssembler::assemble(std::span<const std::uint32_t> indices) {
  if (indices.size() > capacity_) {
    throw UsageError(
        concat("batch assembler: ", indices.size(), " indices exceed the capacity of ", capacity_));
  }
  const std::size_t features = dataset_.features;
  for (std::size_t row = 0; row < indices.size(); ++row) {
    const std::size_t example = indices[row];
    if (example >= dataset_.size) {
      throw UsageError(concat("batch assembler: index ", example, " at position ", row,
                              " is out of range for dataset ", dataset_.name, " of ", dataset_.size,
                              " examples"));
    }
    if (features > 0) {
      std::memcpy(inputs_.data() + row * features, dataset_.inputs.data() + example * features,
                  features * sizeof(float));
    }
    if (dataset_.regression()) {
      const std::size_t width = dataset_.target_features;
      std::memcpy(targets_.data() + row * width, dataset_.targets.data() + example * width, width * sizeof(float));
    } else {
      labels_[row] = dataset_.labels[example];
    }
  }
  Batch batch;
  batch.inputs = std::span<const float>(inputs_).first(indices.size() * features);
  batch.labels = std::span<const std::int32_t>(labels_).first(dataset_.regression() ? 0 : indices.size());
  batch.size = indices.size();
  batch.features = features;
  batch.example_shape = dataset_.example_shape;
  batch.targets = std::span<const float>(targets_).first(indices.size() * dataset_.target_features);
  batch.target_features = dataset_.target_features;
  return batch;
}

Batch dataset_range(const Dataset& dataset, std::size_t begin, std::size_t end) {
  if (begin > end || end > dataset.size) {
    throw UsageError(concat("dataset range [", begin, ", ", end, ") is invalid for dataset ",
                            dataset.name, " of ", dataset.size, " examples"));
  }
  PIPESGD_ASSERT(dataset.inputs.size() == dataset.size * dataset.features);
  PIPESGD_ASSERT(dataset.labels.size() == (dataset.regression() ? 0 : dataset.size));
  PIPESGD_ASSERT(dataset.targets.size() == dataset.size * dataset.target_features);
  Batch batch;
  batch.inputs = std::span<const float>(dataset.inputs)
                     .subspan(begin * dataset.features, (end - begin) * dataset.features);
  if (!dataset.regression()) {
    batch.labels = std::span<const std::int32_t>(dataset.labels).subspan(begin, end - begin);
  }
  batch.size = end - begin;
  batch.features = dataset.features;
  batch.example_shape = dataset.example_shape;
  const std::size_t width = dataset.target_features;
  batch.targets = std::span<const float>(dataset.targets).subspan(begin * width, (end - begin) * width);
  batch.target_features = width;
  return batch;
}

void for_each_chunk(const Dataset& dataset, std::size_t begin, std::size_t end,
                    std::size_t chunk_size, const std::function<void(const Batch&)>& visit) {
  if (chunk_size == 0) throw UsageError("dataset chunks: chunk size must be at least 1, got 0");
  // Validates the range even when it is empty.
  dataset_range(dataset, begin, end);
  for (std::size_t first = begin; first < end; first += std::min(chunk_size, end - first)) {
    visit(dataset_range(dataset, first, first + std::min(chunk_size, end - first)));
  }
}

}  // namespace pipesgd
