#pragma once
// Horovod's timeline (hvd.start_timeline / Worker::start_timeline) for the negotiated collectives of
// api/collective_engine.h, in pipesgd's trace format (core/trace.h, written by report/trace_file.h;
// open it in https://ui.perfetto.dev). Rank 0's view, as Horovod's coordinator's: it reads every
// rank's rows in each negotiation round. Process "worker 0"; per collective a track named as
// Horovod names it ("allreduce.NAME"; unnamed ones share "allreduce.noname") with
//   NEGOTIATE_ALLREDUCE  from rank 0's submission, or the round in which a peer listed it if earlier,
//                        to the round in which every member had (RANK_READY instants, args.worker =
//                        the rank: rank 0's at its submission, a peer's at the end of the round
//                        that brought its row),
//   ALLREDUCE            while rank 0 ran it (args: bytes; iteration = the collective's number),
// and with mark_cycles a CYCLE_START instant per negotiation round on the "negotiation" track.
// otherData.start_time_since_epoch_in_micros: the wall-clock time of ts 0 (as Horovod's).
// Only collectives rank 0 takes part in appear (it knows their names). Past kNamedTracks distinct
// names, further ones share the track "other collectives".
//
// Threads: made on any thread; everything else under the engine's turns (the thread running rounds).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "pipesgd/collectives.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

class CollectiveTimeline {
 public:
  using Clock = TraceClock;
  static constexpr std::size_t kNamedTracks = 64;
  static constexpr std::size_t kEventsPerTrack = 4096;

  // UsageError (one line) if `path`'s directory cannot be created or written in.
  CollectiveTimeline(std::string path, bool mark_cycles);

  const std::string& path() const { return path_; }
  // A negotiation round began (CYCLE_START with mark_cycles).
  void round_started();
  // `rank` listed the collective `key` in the round that ended `at` (its RANK_READY the first time).
  void listed(std::int64_t key, int rank, Clock::time_point at);
  // The collective `key` became ready at `at`; rank 0 has it (`kind`, its `name`, submitted at
  // `submitted`): its NEGOTIATE span, from its submission or the first round a peer listed it in.
  void decided(std::int64_t key, CollectiveKind kind, const std::string& name, Clock::time_point submitted,
               Clock::time_point at);
  // Rank 0 ran it from `start` to `end`: the operation's span.
  void ran(CollectiveKind kind, const std::string& name, std::uint64_t number, std::uint64_t bytes,
           Clock::time_point start, Clock::time_point end);
  // Forgets what it knows of collectives that are not in `listed` (ready without rank 0, failed).
  void keep_only(const std::set<std::int64_t>& listed);

  // The file (every event recorded until now; a warning on stderr for dropped events). Throws the
  // error of core/atomic_file.h if it cannot be written.
  void write() const;

 private:
  struct Track {
    ThreadTrace* trace = nullptr;
    Clock::time_point last_end{};  // spans on a shared track start after the previous one ends
  };
  struct Negotiation {
    Clock::time_point first{};
    std::map<int, Clock::time_point> ranks;  // when each rank first listed it
  };
  Track& track(CollectiveKind kind, const std::string& name);
  // The operation's event name (ALLREDUCE), or its negotiation's (NEGOTIATE_ALLREDUCE).
  const char* event_name(CollectiveKind kind, bool negotiation);
  // A span on `track`, moved to start no earlier than its last one ended.
  void span(Track& track, const char* event, Clock::time_point start, Clock::time_point end, const TraceArgs& args);

  std::string path_;
  bool mark_cycles_;
  std::unique_ptr<TraceRecorder> recorder_;
  ThreadTrace* negotiation_ = nullptr;
  std::map<std::string, Track> tracks_;
  std::map<std::int64_t, Negotiation> negotiations_;
  std::map<CollectiveKind, std::pair<const char*, const char*>> event_names_;  // interned
};

}  // namespace pipesgd
