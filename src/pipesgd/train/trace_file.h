#pragma once
// --trace's file: a run's recorder (core/trace.h) written in the Chrome trace event format. Where
// every rank is a thread of this process, the recorder holds them all; under MPI each rank
// records its own, and write_trace gathers them at rank 0 on rank 0's clock.
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

// Collective over `ranks` (every rank of an MPI run; a world of one: this process's events).
// Rank r > 0 aligns its clock with rank 0's (the best of 8 ping-pongs: rank 0's midpoint minus
// rank r's stamp, within half a round trip) and sends its events shifted by that offset; rank 0
// returns everyone's events in rank order, the others an empty array. Waits time out after
// `timeout`, naming the peer.
nlohmann::json gather_trace_events(Transport& ranks, const TraceRecorder& recorder, Timeout timeout);

// {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {...}} written atomically to
// `path`; otherData says how many events full buffers dropped (`dropped`) and, for a failed run, why.
void write_trace_file(const std::string& path, nlohmann::json events, std::size_t dropped,
                      const std::string& failure = "");

}  // namespace pipesgd
