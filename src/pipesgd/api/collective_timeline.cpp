#include "pipesgd/api/collective_timeline.h"

#include <algorithm>
#include <iostream>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "pipesgd/core/error.h"
#include "pipesgd/train/trace_file.h"

namespace pipesgd {
namespace {

constexpr const char* kCategory = "collective";

// Horovod's activity names.
const char* operation_event(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return "ALLREDUCE";
    case CollectiveKind::kAllgather: return "ALLGATHER";
    case CollectiveKind::kBroadcast: return "BROADCAST";
    case CollectiveKind::kAlltoall: return "ALLTOALL";
    case CollectiveKind::kReducescatter: return "REDUCESCATTER";
    case CollectiveKind::kBarrier: return "BARRIER";
    case CollectiveKind::kJoin: return "JOIN";
    case CollectiveKind::kAddProcessSet: return "ADD_PROCESS_SET";
    case CollectiveKind::kRemoveProcessSet: return "REMOVE_PROCESS_SET";
  }
  return "COLLECTIVE";
}

const char* negotiate_event(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return "NEGOTIATE_ALLREDUCE";
    case CollectiveKind::kAllgather: return "NEGOTIATE_ALLGATHER";
    case CollectiveKind::kBroadcast: return "NEGOTIATE_BROADCAST";
    case CollectiveKind::kAlltoall: return "NEGOTIATE_ALLTOALL";
    case CollectiveKind::kReducescatter: return "NEGOTIATE_REDUCESCATTER";
    case CollectiveKind::kBarrier: return "NEGOTIATE_BARRIER";
    case CollectiveKind::kJoin: return "NEGOTIATE_JOIN";
    case CollectiveKind::kAddProcessSet: return "NEGOTIATE_ADD_PROCESS_SET";
    case CollectiveKind::kRemoveProcessSet: return "NEGOTIATE_REMOVE_PROCESS_SET";
  }
  return "NEGOTIATE";
}

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
  span(line, negotiate_event(kind), found->second.first, at, {});
  negotiations_.erase(found);
}

void CollectiveTimeline::ran(CollectiveKind kind, const std::string& name, std::uint64_t number, std::uint64_t bytes,
                             Clock::time_point start, Clock::time_point end) {
  Track& line = track(kind, name);
  TraceArgs args;
  args.iteration = static_cast<std::int64_t>(number);
  args.bytes = bytes;
  span(line, operation_event(kind), start, end, args);
}

void CollectiveTimeline::keep_only(const std::set<std::int64_t>& listed) {
  std::erase_if(negotiations_, [&](const auto& entry) { return !listed.count(entry.first); });
}

void CollectiveTimeline::write() const {
  const std::size_t dropped = recorder_->dropped();
  write_trace_file(path_, recorder_->events_json(), dropped);
  if (dropped > 0) {
    std::cerr << "pipesgd: warning: " << dropped << " timeline events did not fit the buffers (" << path_ << ")\n";
  }
}

}  // namespace pipesgd
