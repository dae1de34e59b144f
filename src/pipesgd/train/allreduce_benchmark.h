#pragma once
// `pipesgd bench allreduce`: times allreduce algorithms per message size and codec, interleaved
// (every repeat runs every candidate once, so machine noise hits them alike), median of repeats,
// and checks every result in the same run: against the exact sum, and bit for bit against the
// reference candidate's result (MPI_Allreduce under MPI) on the same inputs.
//
// The benchmark is collective over a Transport: every rank calls run_allreduce_benchmark_rank with
// the same configuration (threads over a LocalFabric, or MPI processes). Rank 0 collects the
// timings of all ranks (the time of a run is that of its slowest rank) and reports the rows.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/transport.h"

namespace pipesgd {

// One thing to time: builds an allreduce object for `max_count` elements over `transport`.
struct AllreduceCandidate {
  std::string algorithm;  // row name: "ring", ..., or "MPI_Allreduce"
  std::string codec;      // "none", "bf16", "int8"
  bool is_reference = false;  // results of the others are compared with this one's (codec none)
  std::function<std::unique_ptr<Allreduce>(Transport& transport, std::size_t max_count,
                                           const Codec& codec)>
      build;
};

// Our algorithms (collective/allreduce_factory.h) x codecs.
std::vector<AllreduceCandidate> our_allreduce_candidates(const std::vector<std::string>& algorithms,
                                                         const std::vector<std::string>& codecs,
                                                         AllreduceOptions options);

struct AllreduceBenchmarkConfig {
  std::vector<std::size_t> sizes_bytes;  // fp32 payload per rank; multiple of 4
  int repeats = 10;                      // timed runs per (size, candidate)
  int warmup = 2;                        // untimed runs first
  Timeout timeout = std::chrono::seconds(120);
};

struct AllreduceBenchmarkRow {
  std::string algorithm;
  std::string codec;
  int workers = 0;
  std::size_t bytes = 0;
  double median_seconds = 0, min_seconds = 0, max_seconds = 0;
  double algbw = 0;  // bytes / median time, bytes/s
  double busbw = 0;  // algbw * 2(p-1)/p
  double max_error = 0;    // largest |result - exact| over all ranks and repeats
  double error_bound = 0;  // what the codec promises for these values
  bool matches_reference = true;  // bit-identical to the reference result (exact codecs only)
  bool correct = false;    // max_error <= error_bound, all ranks bit-identical, matches reference
};

// 4 KiB, 16 KiB, ..., 64 MiB.
std::vector<std::size_t> default_benchmark_sizes();
// Parses "4K,1M,64M" (K, M, G = KiB, MiB, GiB); throws UsageError.
std::vector<std::size_t> parse_sizes(const std::string& text);

// Runs the benchmark as one rank of `transport`. On rank 0, `on_row` (may be empty) sees each row as
// soon as its size is measured and the rows are returned; other ranks return an empty vector.
std::vector<AllreduceBenchmarkRow> run_allreduce_benchmark_rank(
    Transport& transport, const std::vector<AllreduceCandidate>& candidates,
    const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row);

// The same over `workers` threads of this process on a LocalFabric with `network`.
std::vector<AllreduceBenchmarkRow> run_local_allreduce_benchmark(
    int workers, const NetworkSpec& network, const std::vector<AllreduceCandidate>& candidates,
    const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row);

}  // namespace pipesgd
