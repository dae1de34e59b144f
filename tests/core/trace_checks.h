#pragma once
// What the tests of trace files share (core/run_trace_test.cpp: the CLI's runs; api/trace_test.cpp:
// the API's worlds): a file's names, spans by track, the innermost span at a time, the check that
// every track's spans nest, the flow arrows by id and the gradient arrows' checks. LibTorch-free
// and pipesgd-free.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace trace_checks {

struct Span {
  double start, end;  // microseconds, as in the file
  std::string name;
  std::int64_t iteration;  // -1: none
};
using Track = std::pair<int, int>;  // pid, tid

constexpr double kNanosecond = 1e-3;  // in the file's microseconds: the rounding of ts + dur

inline std::map<int, std::string> process_names(const nlohmann::json& events) {
  std::map<int, std::string> processes;
  for (const nlohmann::json& event : events) {
    if (event.at("ph") == "M" && event.at("name") == "process_name") processes[event.at("pid")] = event["args"]["name"];
  }
  return processes;
}

inline std::map<Track, std::string> thread_names(const nlohmann::json& events) {
  std::map<Track, std::string> threads;
  for (const nlohmann::json& event : events) {
    if (event.at("ph") == "M" && event.at("name") == "thread_name") {
      threads[{event.at("pid"), event.at("tid")}] = event["args"]["name"];
    }
  }
  return threads;
}

// How many threads of each kind process `pid` has: "compute", "comm" (any "comm (OWNER)"), "serve".
inline std::map<std::string, int> thread_kinds(const std::map<Track, std::string>& threads, int pid) {
  std::map<std::string, int> kinds;
  for (const auto& [track, name] : threads) {
    if (track.first == pid) ++kinds[name.rfind("comm (", 0) == 0 ? "comm" : name];
  }
  return kinds;
}

inline std::map<Track, std::vector<Span>> spans_by_track(const nlohmann::json& events) {
  std::map<Track, std::vector<Span>> tracks;
  for (const nlohmann::json& event : events) {
    if (event.at("ph") != "X") continue;
    const double start = event.at("ts").get<double>();
    const std::int64_t iteration = event.contains("args") ? event["args"].value("iteration", std::int64_t{-1}) : -1;
    tracks[{event.at("pid").get<int>(), event.at("tid").get<int>()}].push_back(
        {start, start + event.at("dur").get<double>(), event.at("name").get<std::string>(), iteration});
  }
  return tracks;
}

// The innermost span of `spans` (one track's) that contains `time`, or nullptr.
inline const Span* enclosing(const std::vector<Span>& spans, double time) {
  const Span* best = nullptr;
  for (const Span& span : spans) {
    if (span.start <= time && time <= span.end && (best == nullptr || span.end - span.start < best->end - best->start)) {
      best = &span;
    }
  }
  return best;
}

// Spans nest on every track: sorted by start (longer first), each lies inside the open span or
// after its end.
inline void expect_spans_nest(const std::map<Track, std::vector<Span>>& tracks,
                              const std::map<Track, std::string>& threads) {
  for (const auto& [track, unsorted] : tracks) {
    std::vector<Span> spans = unsorted;
    std::sort(spans.begin(), spans.end(),
              [](const Span& a, const Span& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; });
    std::vector<const Span*> open;
    for (const Span& span : spans) {
      while (!open.empty() && span.start >= open.back()->end - kNanosecond) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(span.end, open.back()->end + kNanosecond)
            << span.name << " [" << span.start << ", " << span.end << "] overlaps " << open.back()->name << " ["
            << open.back()->start << ", " << open.back()->end << "] on "
            << (threads.count(track) ? threads.at(track) : "an unnamed thread") << " of process " << track.first;
      }
      open.push_back(&span);
    }
  }
}

// The flow arrows by id: their start ("s") and end ("f") events (nullptr where missing); a second
// start or end of an id is a test failure.
using Flows = std::map<std::uint64_t, std::pair<const nlohmann::json*, const nlohmann::json*>>;
inline Flows flows_by_id(const nlohmann::json& events) {
  Flows flows;
  for (const nlohmann::json& event : events) {
    if (event.at("ph") == "s") {
      EXPECT_EQ(flows[event.at("id")].first, nullptr) << "a second start of " << event.at("id");
      flows[event.at("id")].first = &event;
    } else if (event.at("ph") == "f") {
      EXPECT_EQ(flows[event.at("id")].second, nullptr) << "a second end of " << event.at("id");
      flows[event.at("id")].second = &event;
    }
  }
  return flows;
}

// A gradient arrow's two spans: the innermost span around each end.
struct Arrow {
  const Span* from;
  const Span* to;
};

// The arrows of `flows` after the checks every gradient arrow passes: both ends exist, in one
// process, each inside a span; it starts in a comm thread's "bucket" and ends on the "compute" track,
// no earlier than the bucket ended. An arrow failing a check is a test failure, and left out.
inline std::vector<Arrow> gradient_arrows(const Flows& flows, const std::map<Track, std::vector<Span>>& tracks,
                                          const std::map<Track, std::string>& threads) {
  std::vector<Arrow> arrows;
  for (const auto& [id, ends] : flows) {
    if (ends.first == nullptr || ends.second == nullptr) {
      ADD_FAILURE() << "arrow " << id << " has no " << (ends.first == nullptr ? "start" : "end");
      continue;
    }
    const nlohmann::json& start = *ends.first;
    const nlohmann::json& end = *ends.second;
    EXPECT_EQ(start.at("pid"), end.at("pid")) << "arrow " << id;
    const Track from_track{start.at("pid").get<int>(), start.at("tid").get<int>()};
    const Track to_track{end.at("pid").get<int>(), end.at("tid").get<int>()};
    const Span* from = tracks.count(from_track) ? enclosing(tracks.at(from_track), start.at("ts").get<double>()) : nullptr;
    const Span* to = tracks.count(to_track) ? enclosing(tracks.at(to_track), end.at("ts").get<double>()) : nullptr;
    if (from == nullptr || to == nullptr) {
      ADD_FAILURE() << "arrow " << id << "'s " << (from == nullptr ? "start" : "end") << " is in no span";
      continue;
    }
    EXPECT_EQ(from->name, "bucket") << "arrow " << id;
    EXPECT_EQ(threads.count(to_track) ? threads.at(to_track) : "", "compute") << "arrow " << id;
    EXPECT_GE(to->start, from->end - kNanosecond) << "arrow " << id << ": applied before it was reduced";
    arrows.push_back({from, to});
  }
  return arrows;
}

}  // namespace trace_checks
