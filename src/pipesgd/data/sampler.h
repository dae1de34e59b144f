#pragma once
// Turning a Dataset into batches.
//  * ShardedSampler: which examples each worker trains on, per epoch and iteration.
//  * BatchAssembler: copies the chosen rows into a contiguous Batch.
//  * dataset_range / for_each_chunk: zero-copy views for evaluation.
// None of these allocate after construction. Each object is used by one thread at a time.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"

namespace pipesgd {

// Splits each epoch of a dataset of `dataset_size` examples among `workers` workers.
//
// Every epoch has its own permutation of [0, dataset_size), computed with Fisher-Yates from
// (seed, epoch) alone, so every rank computes the same permutation independently. At iteration i,
// worker `rank` gets perm[(i * workers + rank) * batch_per_worker, ... + batch_per_worker); the
// workers together get the contiguous slice perm[i * global_batch, (i + 1) * global_batch). Hence a
// single sampler with workers = 1 and batch_per_worker = global_batch and the same seed sees
// exactly the union of the workers' batches. The last dataset_size % global_batch examples of each
// epoch's permutation are dropped.
class ShardedSampler {
 public:
  // Throws UsageError unless workers >= 1, rank < workers, batch_per_worker >= 1,
  // dataset_size >= workers * batch_per_worker and dataset_size <= 2^32. Starts at epoch 0.
  ShardedSampler(std::size_t dataset_size, std::size_t workers, std::size_t rank,
                 std::size_t batch_per_worker, std::uint64_t seed);

  // Computes the permutation of `epoch` (in place; no allocation). Any epoch order is allowed.
  void start_epoch(std::size_t epoch);

  // The example indices of this rank at `iteration` of the current epoch; a view into the sampler,
  // valid until the next start_epoch. Throws UsageError if iteration >= iterations_per_epoch().
  std::span<const std::uint32_t> batch_indices(std::size_t iteration) const;

  // The current epoch's whole permutation of [0, dataset_size).
  std::span<const std::uint32_t> permutation() const { return permutation_; }

  std::size_t iterations_per_epoch() const { return dataset_size_ / global_batch_; }
  std::size_t dataset_size() const { return dataset_size_; }
  std::size_t workers() const { return workers_; }
  std::size_t rank() const { return rank_; }
  std::size_t batch_per_worker() const { return batch_per_worker_; }
  std::size_t global_batch() const { return global_batch_; }

 private:
  void check_iteration(std::size_t iteration) const;

  std::size_t dataset_size_;
  std::size_t workers_;
  std::size_t rank_;
  std::size_t batch_per_worker_;
  std::size_t global_batch_;
  std::uint64_t seed_;
  std::vector<std::uint32_t> permutation_;  // dataset_size entries, allocated once
};

// Gathers examples of a dataset into contiguous buffers owned by the assembler. The dataset must
// outlive the assembler. The returned Batch points into the assembler and stays valid until the
// next assemble call or the assembler's destruction.
class BatchAssembler {
 public:
  // Throws UsageError if capacity is zero.
  BatchAssembler(const Dataset& dataset, std::size_t capacity);

  // Copies the rows and labels of `indices` (in that order). Throws UsageError if there are more
  // than capacity() indices or an index is >= the dataset size. No allocation.
  Batch assemble(std::span<const std::uint32_t> indices);

  std::size_t capacity() const { return capacity_; }

 private:
  const Dataset& dataset_;
  std::size_t capacity_;
  std::vector<float> inputs_;
  std::vector<std::int32_t> labels_;
  std::vector<float> targets_;
};

// A zero-copy Batch of examples [begin, end) of `dataset`, which must outlive the Batch. Throws
// UsageError unless begin <= end <= dataset.size.
Batch dataset_range(const Dataset& dataset, std::size_t begin, std::size_t end);

// Calls `visit` with consecutive zero-copy batches of at most `chunk_size` examples covering
// [begin, end) of `dataset` in order. Throws UsageError if chunk_size is zero or the range is bad.
void for_each_chunk(const Dataset& dataset, std::size_t begin, std::size_t end,
                    std::size_t chunk_size, const std::function<void(const Batch&)>& visit);

}  // namespace pipesgd
