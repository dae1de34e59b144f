#pragma once
// --trace's file: a run's recorder (core/trace.h) written in the Chrome trace event format. Where
// every rank is a thread of this process, the recorder holds them all; under MPI each rank
// records its own, and write_trace gathers them at rank 0 on rank 0's clock.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

// Collective over `ranks` (every rank of an MPI run; a world of one: this process's events).
// Rank r > 0 aligns its clock with rank 0's (the best of 64 ping-pongs: rank 0's midpoint minus
// rank r's stamp, within half a round trip) and sends its events shifted by that offset; rank 0
// returns everyone's events in rank order, the others an empty array. Waits time out after
// `timeout`, naming the peer.
nlohmann::json gather_trace_events(Transport& ranks, const TraceRecorder& recorder, Timeout timeout);

// What a front end calls a trace's two settings, for its messages (the CLI's flags; the API's
// WorldOptions fields).
struct TraceSettingNames {
  std::string_view file = "--trace";
  std::string_view file_usage = "--trace FILE";  // how to give it: "X needs <file_usage>"
  std::string_view iterations = "--trace-iters";
};

// A trace's settings checked: UsageError (one line, naming them) for `iterations` without `file`, a
// malformed window (parse_trace_window), or a file whose directory cannot be created or written in.
// The window to record (every iteration for an empty `iterations`); nullopt for no `file` (no trace).
std::optional<TraceWindow> check_trace_settings(const std::string& file, const std::string& iterations,
                                                const TraceSettingNames& names = {});

// Where rank `rank` writes its own events after a failure, when the ranks can no longer meet to merge
// theirs: `file` on rank 0, `file`.rank-R on rank R > 0.
std::string failure_trace_path(const std::string& file, int rank);

// After a failure: `recorder`'s events up to it (threads may still be recording: what each had
// recorded), with `failure` in the file, to `path`. Never throws: "" once written, else why not.
std::string write_trace_after_failure(const std::string& path, const TraceRecorder& recorder,
                                      const std::string& failure) noexcept;

// {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {...}} written atomically to
// `path`; otherData says how many events full buffers dropped (`dropped`), for a failed run why, and
// with `origin_since_epoch_us` >= 0 the wall-clock time of ts 0 (start_time_since_epoch_in_micros,
// as Horovod's timeline).
void write_trace_file(const std::string& path, nlohmann::json events, std::size_t dropped,
                      const std::string& failure = "", std::int64_t origin_since_epoch_us = -1);

}  // namespace pipesgd
