#include "pipesgd/comm/wait.h"

#include <algorithm>
#include <memory>

#include "pipesgd/core/error.h"
#include "pipesgd/core/interrupt.h"

namespace pipesgd {

std::string rank_failure_message(int rank, const std::string& reason) { return concat("rank ", rank, " failed: ", reason); }

namespace {

struct WaitErrors {
  std::mutex mutex;  // guards first
  std::string first;
};

WaitErrors& wait_errors() {
  static WaitErrors* errors = new WaitErrors;  // never destroyed: read by a thread at exit
  return *errors;
}

void note_wait_error(const std::string& message) {
  WaitErrors& errors = wait_errors();
  std::lock_guard lock(errors.mutex);
  if (errors.first.empty()) errors.first = message;
}

}  // namespace

void throw_wait_aborted(const std::string& wait, const std::string& failure) {
  std::string message = concat(wait, " aborted: ", failure);
  if (!interruption_in(failure)) note_wait_error(message);
  throw PeerFailedError(std::move(message));
}

void throw_wait_timed_out(const std::string& wait, Timeout timeout, int peer, const char* suffix) {
  std::string message = concat(wait, " timed out after ", Seconds(timeout).count(), " s", suffix);
  note_wait_error(message);
  throw CommTimeoutError(std::move(message), peer);
}

std::string first_wait_error() {
  WaitErrors& errors = wait_errors();
  std::lock_guard lock(errors.mutex);
  return errors.first;
}

namespace {

// One thread's WaitNote: written by its thread only (version odd while it writes), read by any.
struct WaitRecord {
  std::atomic<std::uint64_t> version{0};
  std::atomic<bool> active{false};
  std::atomic<const char*> operation{""};
  std::atomic<bool> is_send{false};
  std::atomic<int> peer{-1};
  std::atomic<Tag> tag{0};
  std::atomic<int> rank{0};
  std::atomic<std::int64_t> since_ns{0};
};

struct WaitRecords {
  std::mutex mutex;  // guards `all` (a thread registers once, at its first wait)
  std::vector<std::shared_ptr<WaitRecord>> all;
};

WaitRecords& wait_records() {
  static WaitRecords* records = new WaitRecords;  // never destroyed: threads may outlive static destruction
  return *records;
}

WaitRecord& this_thread_record() {
  thread_local std::shared_ptr<WaitRecord> record = [] {
    auto made = std::make_shared<WaitRecord>();
    WaitRecords& records = wait_records();
    std::lock_guard lock(records.mutex);
    records.all.push_back(made);
    return made;
  }();
  return *record;
}

void write_record(WaitRecord& record, bool active, const WaitNote* note) {
  const std::uint64_t v = record.version.load(std::memory_order_relaxed);
  record.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  if (note != nullptr) {
    record.operation.store(note->operation, std::memory_order_relaxed);
    record.is_send.store(note->is_send, std::memory_order_relaxed);
    record.peer.store(note->peer, std::memory_order_relaxed);
    record.tag.store(note->tag, std::memory_order_relaxed);
    record.rank.store(note->rank, std::memory_order_relaxed);
    record.since_ns.store(note->since_ns, std::memory_order_relaxed);
  }
  record.active.store(active, std::memory_order_relaxed);
  record.version.store(v + 2, std::memory_order_release);
}

}  // namespace

WaitNoteScope::WaitNoteScope(const WaitNote& note) { write_record(this_thread_record(), true, &note); }

WaitNoteScope::~WaitNoteScope() { write_record(this_thread_record(), false, nullptr); }

std::vector<WaitNote> current_waits() {
  std::vector<std::shared_ptr<WaitRecord>> records;
  {
    WaitRecords& all = wait_records();
    std::lock_guard lock(all.mutex);
    records = all.all;
  }
  std::vector<WaitNote> waits;
  for (const auto& record : records) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      const std::uint64_t before = record->version.load(std::memory_order_acquire);
      if (before % 2 != 0) continue;
      WaitNote note{record->operation.load(std::memory_order_relaxed), record->is_send.load(std::memory_order_relaxed),
                    record->peer.load(std::memory_order_relaxed), record->tag.load(std::memory_order_relaxed),
                    record->rank.load(std::memory_order_relaxed), record->since_ns.load(std::memory_order_relaxed)};
      const bool active = record->active.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (record->version.load(std::memory_order_relaxed) != before) continue;
      if (active) waits.push_back(note);
      break;
    }
  }
  std::sort(waits.begin(), waits.end(), [](const WaitNote& a, const WaitNote& b) { return a.since_ns < b.since_ns; });
  return waits;
}

bool FailureState::record(std::string message) {
  std::lock_guard lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) return false;
  message_ = std::move(message);
  failed_.store(true, std::memory_order_release);
  return true;
}

std::string FailureState::message() const {
  std::lock_guard lock(mutex_);
  return message_;
}

}  // namespace pipesgd
