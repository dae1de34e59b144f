#pragma once
// `pipesgd bench allreduce`: times allreduce algorithms per message size and codec, interleaved
// (every repeat runs every candidate once, so machine noise hits them alike), median of repeats,
// and checks every result in the same run: against the exact sum, and bit for bit against the
// reference candidate's result (MPI_Allreduce under MPI) on the same inputs.
//
// The benchmark is collective over a Transport: every rank calls run_allreduce_benchmark_rank with
// the same configuration (threads over a LocalFabric, or MPI processes). Rank 0 collects the
// timings of all ranks and reports the rows.
//
// How a run is timed: the ranks meet at a BenchmarkBarrier that does not use the transport being
// measured, each rank times the run from the start the barrier returns to its own finish, and the
// run's time is that of its slowest rank; a row is the median over the repeats. Threads share one
// start (the moment the last rank arrived), so a run costs what it costs from a common start,
// whatever ran before it. A barrier over the measured transport would not do: over links with
// latency L its ranks leave it up to L apart (a tree's root finishes about L before its leaf, and
// the barrier passes that skew on), and the skew would be timed as part of the next run.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/clock.h"

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
  // CPU time a run costs the thread that calls it (its CPU clock), per fp32 byte allreduced: the
  // mean over ranks and timed runs. Waits that sleep cost nothing; copies, codecs and wake-ups do.
  double cpu_seconds_per_byte = 0;
  double max_error = 0;    // largest |result - exact| over all ranks and repeats
  double error_bound = 0;  // what the codec promises for these values
  bool matches_reference = true;  // bit-identical to the reference result (exact codecs only)
  bool correct = false;    // max_error <= error_bound, all ranks bit-identical, matches reference
  // Rank 0's bytes sent over the measured transport per run, barriers included (0 for a candidate
  // that bypasses the transport, such as MPI_Allreduce): the ranks meet outside those links.
  std::uint64_t rank0_bytes_sent_per_run = 0;
};

// 4 KiB, 16 KiB, ..., 64 MiB.
std::vector<std::size_t> default_benchmark_sizes();
// Parses "4K,1M,64M" (K, M, G = KiB, MiB, GiB); throws UsageError.
std::vector<std::size_t> parse_sizes(const std::string& text);

// Lines the ranks up before and after each timed run, outside the transport being measured.
// Collective: each rank's benchmark thread calls it the same number of times. It returns once every
// rank has arrived, with the time this rank's run is timed from: one start common to all ranks where
// they share a clock (threads of one process), else the moment this rank left the barrier. Throws
// CommTimeoutError if the ranks do not all arrive within `timeout`, PeerFailedError if a rank failed.
using BenchmarkBarrier = std::function<Clock::time_point(Timeout timeout)>;

// Runs the benchmark as one rank of `transport`, on one thread of that rank (its benchmark thread,
// which also calls `barrier`). Called by run_local_allreduce_benchmark on each rank's thread, and
// under MPI by every process with an MpiTransport and MpiTransport::barrier. On rank 0, `on_row`
// (may be empty) sees each row on this thread as soon as its size is measured, and the rows are
// returned; other ranks return an empty vector. Throws UsageError for a bad configuration.
std::vector<AllreduceBenchmarkRow> run_allreduce_benchmark_rank(
    Transport& transport, const BenchmarkBarrier& barrier,
    const std::vector<AllreduceCandidate>& candidates, const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row);

// The same over `workers` threads of this process on a LocalFabric with `network`, met at a
// process-local barrier. Call from any thread; it blocks until all ranks are done. `on_row` runs on
// rank 0's thread. If ranks fail, rethrows the root cause, not the others' PeerFailedError.
std::vector<AllreduceBenchmarkRow> run_local_allreduce_benchmark(
    int workers, const NetworkSpec& network, const std::vector<AllreduceCandidate>& candidates,
    const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row);

}  // namespace pipesgd
