#include "pipesgd/api/collective_timeline.h"

#include <algorithm>
#include <cctype>
#include <iostream>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "pipesgd/core/error.h"
#include "pipesgd/report/trace_file.h"

namespace pipesgd {
namespace {

constexpr const char* kCategory = "collective";

}  // namespace

CollectiveTimeline::CollectiveTimeline(std::string path, bool mark_cycles)
    : path_(std::move(path)), mark_cycles_(mark_cycles) {
  const TraceSettingNames names{"start_timeline", "start_timeline(file_path)", "start_timeline"};
  const std::optional<TraceWindow> window = check_trace_settings(path_, "", names);
  if (!window) throw UsageError("start_timeline: the file path is empty");
  recorder_ = std::make_unique<TraceRecorder>(*window, kEventsPerTrack);
  negotiation_ = &recorder_->add_thread(0, "worker 0", "negotiation");
}

void CollectiveTimeline::round_started() {
  if (mark_cycles_) negotiation_->instant("CYCLE_START", kCategory);
}

void CollectiveTimeline::listed(std::int64_t key, int rank, Clock::time_point at) {
  auto [found, added] = negotiations_.try_emplace(key);
  if (added) found->second.first = at;
  found->second.ranks.try_emplace(rank, at);
}

CollectiveTimeline::Track& CollectiveTimeline::track(CollectiveKind kind, const std::string& name) {
  const bool unnamed = name.rfind("noname.", 0) == 0;
  std::string track_name = concat(collective_kind_name(kind), ".", unnamed ? "noname" : name);
  if (!tracks_.count(track_name) && tracks_.size() >= kNamedTracks) track_name = "other collectives";
  auto [found, added] = tracks_.try_emplace(track_name);
  if (added) found->second.trace = &recorder_->add_thread(0, "", track_name);
  return found->second;
}

void CollectiveTimeline::span(Track& track, const char* event, Clock::time_point start, Clock::time_point end,
                              const TraceArgs& args) {
  start = std::max(start, track.last_end);
  end = std::max(end, start);
  track.trace->span(event, kCategory, start, end, args);
  track.last_end = end;
}

const char* CollectiveTimeline::event_name(CollectiveKind kind, bool negotiation) {
  auto [found, added] = event_names_.try_emplace(kind);
  if (added) {
    // Horovod's activity names: ALLREDUCE, NEGOTIATE_ALLREDUCE, ADD_PROCESS_SET, ...
    std::string upper = collective_kind_name(kind);
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
    found->second = {recorder_->intern(upper), recorder_->intern("NEGOTIATE_" + upper)};
  }
  return negotiation ? found->second.second : found->second.first;
}

void CollectiveTimeline::decided(std::int64_t key, CollectiveKind kind, const std::string& name,
                                 Clock::time_point submitted, Clock::time_point at) {
  Track& line = track(kind, name);
  const auto found = negotiations_.find(key);
  if (found == negotiations_.end()) return;
  found->second.first = std::min(found->second.first, submitted);
  found->second.ranks[0] = submitted;
  for (const auto& [rank, when] : found->second.ranks) {
    TraceArgs ready;
    ready.worker = rank;
    line.trace->instant("RANK_READY", kCategory, when, ready);
  }
  span(line, event_name(kind, /*negotiation=*/true), found->second.first, at, {});
  negotiations_.erase(found);
}

void CollectiveTimeline::ran(CollectiveKind kind, const std::string& name, std::uint64_t number, std::uint64_t bytes,
                             Clock::time_point start, Clock::time_point end) {
  Track& line = track(kind, name);
  TraceArgs args;
  args.iteration = static_cast<std::int64_t>(number);
  args.bytes = bytes;
  span(line, event_name(kind, /*negotiation=*/false), start, end, args);
}

void CollectiveTimeline::keep_only(const std::set<std::int64_t>& listed) {
  std::erase_if(negotiations_, [&](const auto& entry) { return !listed.count(entry.first); });
}

void CollectiveTimeline::write() const {
  const std::size_t dropped = recorder_->dropped();
  // The wall-clock time of the recorder's origin (ts 0).
  const auto since_origin = TraceClock::now() - recorder_->origin();
  const auto origin = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(since_origin);
  const std::int64_t origin_us =
      std::chrono::duration_cast<std::chrono::microseconds>(origin.time_since_epoch()).count();
  write_trace_file(path_, recorder_->events_json(), dropped, "", origin_us);
  if (dropped > 0) {
    std::cerr << "pipesgd: warning: " << dropped << " timeline events did not fit the buffers (" << path_ << ")\n";
  }
}

}  // namespace pipesgd
