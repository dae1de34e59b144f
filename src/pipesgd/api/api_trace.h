#pragma once
// WorldOptions::trace / trace_iterations (include/pipesgd/world.h): a world's optional timeline,
// shared by run_threads (every rank a thread of this process, one recorder) and Session (a rank per
// process under MPI, its events gathered at rank 0 when the world ends; or a world of one).
//
// Threads: the constructor, add_rank and the writes run on the thread that starts or ends the world;
// the ranks' threads record into the tracks add_rank gave them (core/trace.h).
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/world.h"

namespace pipesgd {

class WorldTrace {
 public:
  // Checks options.trace and options.trace_iterations (one-line UsageError naming them). Records
  // nothing without options.trace.
  explicit WorldTrace(const WorldOptions& options);

  bool enabled() const { return recorder_ != nullptr; }

  // Rank `rank`'s track in a world of `workers` workers: process `rank` named "worker R" with a
  // "compute" thread, or "server S" with a "serve" thread (S = rank - workers); nullptr without a
  // trace. Install it on the rank's thread (ScopedThreadTrace) before the rank records.
  ThreadTrace* add_rank(int rank, int workers);

  // Collective over every rank of `world` (servers included), where each rank is a process: rank 0
  // collects everyone's events on its clock for write(), the others keep nothing. Waits time out
  // after `timeout`. Nothing without a trace.
  void gather(Transport& world, Timeout timeout);
  // The file, once every rank stopped recording: what gather() collected at rank 0 (other ranks
  // write nothing), or without a gather this process's recorder (every rank a thread of it). A
  // failure to write throws (the error of core/atomic_file.h); dropped events are a warning on stderr.
  void write();
  // After a failure: this process's events up to it, with `failure` in the file, to the file on
  // rank 0 (or where every rank is a thread of this process) and to FILE.rank-R on rank R > 0 (the
  // ranks can no longer meet). Says where on stderr. Never throws: a failure to write is a warning.
  // Nothing after gather(): rank 0 has this rank's events.
  void write_after_failure(int rank, const std::string& failure) noexcept;

 private:
  std::string path_;
  std::unique_ptr<TraceRecorder> recorder_;
  bool gathered_ = false;
  nlohmann::json gathered_events_;  // rank 0's, after gather()
  bool writes_ = true;              // false on ranks > 0 after gather()
};

}  // namespace pipesgd
