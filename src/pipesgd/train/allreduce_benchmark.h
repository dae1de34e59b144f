#pragma once
// `pipesgd bench allreduce`: times the allreduce per message size and codec over LocalTransport
// (optionally with link emulation), median of repeats, and checks every result in the same run.
#include <functional>
#include <string>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/transport.h"

namespace pipesgd {

struct AllreduceBenchmarkConfig {
  int workers = 4;
  NetworkSpec network;
  std::vector<std::string> codecs = {"none", "bf16", "int8"};
  std::vector<std::size_t> sizes_bytes;  // fp32 payload per rank; multiple of 4
  int repeats = 10;                      // timed runs per (size, codec)
  int warmup = 2;                        // untimed runs first
  Timeout timeout = std::chrono::seconds(120);
  std::size_t segment_bytes = kDefaultSegmentBytes;
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
  bool correct = false;    // max_error <= error_bound and all ranks bit-identical
};

// 4 KiB, 16 KiB, ..., 64 MiB.
std::vector<std::size_t> default_benchmark_sizes();
// Parses "4K,1M,64M" (K, M, G = KiB, MiB, GiB); throws UsageError.
std::vector<std::size_t> parse_sizes(const std::string& text);

// Runs the benchmark; `on_row` (may be empty) sees each row as soon as it is measured.
std::vector<AllreduceBenchmarkRow> run_allreduce_benchmark(
    const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row);

}  // namespace pipesgd
