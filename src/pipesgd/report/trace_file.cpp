#include "pipesgd/report/trace_file.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/json_file.h"

namespace pipesgd {
namespace {

constexpr const char* kOperation = "gathering the trace";
// Ranks of one kernel read one monotonic clock: their offset is the difference of their recorders'
// origins, exactly. Across machines, ping-pongs: 64, because with waits that sleep a round trip on
// a loaded machine often includes a wake-up (the best of 8 was off by up to 300 us; the best of 64,
// once still by more than two ranks' allreduce of one iteration overlap on a loaded machine).
constexpr int kPingPongs = 64;
// The gathering's messages: a control-channel sequence no run uses (runs use 2 * epochs + 1 at most).
constexpr Tag kBase = collective_tag(Channel::kControl, 0xfffffff0u);
constexpr int kOffsetStep = kPingPongs, kSizeStep = kPingPongs + 1, kEventsStep = kPingPongs + 2,
              kClockStep = kPingPongs + 3;

std::int64_t now_since(const TraceRecorder& recorder) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(TraceClock::now() - recorder.origin()).count();
}

template <typename T>
std::span<const std::byte> bytes_of(const T& value) {
  return std::as_bytes(std::span(&value, 1));
}
template <typename T>
std::span<std::byte> writable_bytes_of(T& value) {
  return std::as_writable_bytes(std::span(&value, 1));
}

// This process's clock: the kernel's boot (processes of one boot share CLOCK_MONOTONIC, steady_clock
// here, whichever host name or network namespace they have; 0 if unknown) and the recorder's origin on it.
struct ClockIdentity {
  std::uint64_t boot = 0;
  std::int64_t origin_ns = 0;
};

ClockIdentity clock_identity(const TraceRecorder& recorder) {
  ClockIdentity identity;
  std::ifstream boot_id("/proc/sys/kernel/random/boot_id");
  std::string text;
  if (boot_id >> text) {
    identity.boot = 14695981039346656037ull;  // FNV-1a: the same value in every process
    for (const char c : text) identity.boot = (identity.boot ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  identity.origin_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(recorder.origin().time_since_epoch()).count();
  return identity;
}

// Both sides' clock identities (rank 0 and `peer` exchange theirs); true if the two share a clock.
bool share_a_clock(Transport& ranks, int peer, const ClockIdentity& mine, ClockIdentity& theirs, Timeout timeout) {
  const bool root = ranks.rank() == 0;
  Request send = ranks.send(peer, step_tag(kBase, kClockStep, root ? 0 : 1), bytes_of(mine), kOperation);
  ranks.recv(peer, step_tag(kBase, kClockStep, root ? 1 : 0), writable_bytes_of(theirs), kOperation).wait(timeout);
  send.wait(timeout);
  return mine.boot != 0 && mine.boot == theirs.boot;
}

// Rank 0's side with `peer`: the offset that maps the peer's trace times onto rank 0's.
std::int64_t measure_offset(Transport& ranks, int peer, const TraceRecorder& recorder, Timeout timeout) {
  std::int64_t best_round_trip = std::numeric_limits<std::int64_t>::max(), offset = 0;
  for (int round = 0; round < kPingPongs; ++round) {
    const std::int64_t sent = now_since(recorder);
    ranks.send(peer, step_tag(kBase, round, 0), bytes_of(sent), kOperation).wait(timeout);
    std::int64_t peer_time = 0;
    ranks.recv(peer, step_tag(kBase, round, 1), writable_bytes_of(peer_time), kOperation).wait(timeout);
    const std::int64_t received = now_since(recorder);
    if (received - sent < best_round_trip) {
      best_round_trip = received - sent;
      offset = (sent + received) / 2 - peer_time;
    }
  }
  return offset;
}

}  // namespace

nlohmann::json gather_trace_events(Transport& ranks, const TraceRecorder& recorder, Timeout timeout) {
  const int rank = ranks.rank();
  const ClockIdentity mine = clock_identity(recorder);
  if (rank != 0) {
    ClockIdentity root_clock;
    const bool same_clock = share_a_clock(ranks, 0, mine, root_clock, timeout);
    for (int round = 0; same_clock ? false : round < kPingPongs; ++round) {
      std::int64_t ping = 0;
      ranks.recv(0, step_tag(kBase, round, 0), writable_bytes_of(ping), kOperation).wait(timeout);
      const std::int64_t stamp = now_since(recorder);
      ranks.send(0, step_tag(kBase, round, 1), bytes_of(stamp), kOperation).wait(timeout);
    }
    std::int64_t offset = 0;
    ranks.recv(0, step_tag(kBase, kOffsetStep, 0), writable_bytes_of(offset), kOperation).wait(timeout);
    const std::string text = recorder.events_json(offset).dump();
    const std::uint64_t size = text.size();
    ranks.send(0, step_tag(kBase, kSizeStep, 0), bytes_of(size), kOperation).wait(timeout);
    ranks.send(0, step_tag(kBase, kEventsStep, 0), std::as_bytes(std::span(text.data(), text.size())), kOperation)
        .wait(timeout);
    return nlohmann::json::array();
  }
  nlohmann::json events = recorder.events_json();
  for (int peer = 1; peer < ranks.size(); ++peer) {
    // One kernel's monotonic clock: the origins' difference, exactly; else ping-pongs.
    ClockIdentity theirs;
    const std::int64_t offset = share_a_clock(ranks, peer, mine, theirs, timeout)
                                    ? theirs.origin_ns - mine.origin_ns
                                    : measure_offset(ranks, peer, recorder, timeout);
    ranks.send(peer, step_tag(kBase, kOffsetStep, 0), bytes_of(offset), kOperation).wait(timeout);
    std::uint64_t size = 0;
    ranks.recv(peer, step_tag(kBase, kSizeStep, 0), writable_bytes_of(size), kOperation).wait(timeout);
    std::string text(size, '\0');
    ranks.recv(peer, step_tag(kBase, kEventsStep, 0), std::as_writable_bytes(std::span(text.data(), text.size())),
               kOperation)
        .wait(timeout);
    nlohmann::json part = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!part.is_array()) throw CommError(concat(kOperation, ": rank ", peer, " sent a malformed trace"));
    for (nlohmann::json& event : part) events.push_back(std::move(event));
  }
  return events;
}

std::optional<TraceWindow> check_trace_settings(const std::string& file, const std::string& iterations,
                                                const TraceSettingNames& names) {
  if (file.empty()) {
    if (!iterations.empty()) throw UsageError(concat(names.iterations, " needs ", names.file_usage));
    return std::nullopt;
  }
  const TraceWindow window = iterations.empty() ? TraceWindow{} : parse_trace_window(iterations, names.iterations);
  const std::filesystem::path parent = std::filesystem::path(file).parent_path();
  ensure_writable_directory(parent.empty() ? std::filesystem::path(".") : parent, names.file);
  return window;
}

std::string failure_trace_path(const std::string& file, int rank) {
  return rank == 0 ? file : concat(file, ".rank-", rank);
}

std::string write_trace_after_failure(const std::string& path, const TraceRecorder& recorder,
                                      const std::string& failure) noexcept {
  try {
    write_trace_file(path, recorder.events_json(), recorder.dropped(), failure);
    return "";
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void write_trace_file(const std::string& path, nlohmann::json events, std::size_t dropped, const std::string& failure,
                      std::int64_t origin_since_epoch_us) {
  nlohmann::json other = {{"dropped_events", dropped}};
  if (!failure.empty()) other["failure"] = failure;
  if (origin_since_epoch_us >= 0) other["start_time_since_epoch_in_micros"] = origin_since_epoch_us;
  write_json_file(path, {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}},
                  "trace file");
}

}  // namespace pipesgd
