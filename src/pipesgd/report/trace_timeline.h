#pragma once
// A few iterations of a --trace file as a timeline for `pipesgd report`: per traced run (a
// comparison's method, or the one run of train), the top-level spans of the first two workers'
// compute threads and their comm threads' allreduces (or pushes and pulls) over three consecutive
// iterations in the middle of the recorded ones, in milliseconds from the window's start.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pipesgd {

struct TimelineBox {
  std::size_t track = 0;  // index into Timeline::tracks
  std::string name;       // forward, backward, update, wait, allreduce, ...
  double start_ms = 0;
  double end_ms = 0;
  std::int64_t iteration = -1;  // the span's iteration (a comm thread's: whose gradient it moves)
};

struct Timeline {
  std::string run;                  // the method's label ("pipe+int8"), "" for train's one run
  std::vector<std::string> tracks;  // "worker 0 compute", "worker 0 comm", ...
  std::vector<TimelineBox> boxes;
  std::int64_t first_iteration = 0;  // the window: [first, first + iterations)
  std::int64_t iterations = 0;
};

// Reads the trace file `path` (DataError naming it if it is not a trace this program wrote); one
// timeline per run that has a worker 0 compute track with `iterations` consecutive iterations.
std::vector<Timeline> read_trace_timelines(const std::filesystem::path& path, std::int64_t iterations = 3);

}  // namespace pipesgd
