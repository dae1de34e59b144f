#pragma once
// Atomic file replacement: a reader of the destination sees the old file or the complete new one,
// never a partial one, also across a crash.
//
// How: the content goes to a temporary file in the destination's directory, named
//   ".<file name>" + kAtomicFileTempMarker + "<pid>.<random hex>"
// (created with O_EXCL, so concurrent writers never share one), which is fsynced, renamed over the
// destination, and then the directory is fsynced so the rename itself is durable. A crash may leave
// a temporary file behind; callers that own a directory (checkpoint pruning) may recognise and
// delete it by that name.
//
// Errors: one-line messages that name the destination, the step that failed and the errno text:
//   cannot write <what> '<path>': <step and reason>
//   <what> '<path>' was written but <the directory sync failed>
// where <what> is the caller's noun ("checkpoint", "calibration file"). UsageError when the
// destination's directory does not exist or is not a directory, or the path has no file name;
// DataError for any other failure (permission, disk full, I/O error, rename). On failure before the
// rename the temporary file is removed and an existing file at the destination is left untouched.
//
// Thread safety: the functions share no state; several threads and processes may write different
// files of one directory at once.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>

namespace pipesgd {

inline constexpr std::string_view kAtomicFileTempMarker = ".tmp.";

// Appends the next bytes to the file being written.
using AtomicFileSink = std::function<void(std::span<const std::byte>)>;

// kDurable: the file and the rename are fsynced (atomic and durable across a crash of the
// machine). kProcessCrash: no fsync, so the write takes no disk wait (atomic across a crash of
// this process, which is all a process about to be killed needs: a run stopped by a signal).
enum class AtomicWrite { kDurable, kProcessCrash };

// Replaces (or creates) `path` with `content`.
void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> content,
                           std::string_view what = "file", AtomicWrite mode = AtomicWrite::kDurable);
// The same for text, e.g. a JSON document.
void write_file_atomically(const std::filesystem::path& path, std::string_view content,
                           std::string_view what = "file", AtomicWrite mode = AtomicWrite::kDurable);
// Replaces (or creates) `path` with the bytes `produce` passes to its sink, in order, so a large file
// need not be held in memory at once. An exception thrown by `produce` removes the temporary file
// and propagates unchanged.
void write_file_atomically_streaming(const std::filesystem::path& path,
                                     const std::function<void(const AtomicFileSink&)>& produce,
                                     std::string_view what = "file", AtomicWrite mode = AtomicWrite::kDurable);

}  // namespace pipesgd

namespace pipesgd {

// Creates `dir` (and its parents) if needed and checks that files can be written in it, so that a
// run fails before its work rather than after. Throws UsageError naming `flag` and the directory:
//   <flag> '<dir>': cannot create directory (<reason>)
//   <flag> '<dir>': cannot write in it (<reason>)
void ensure_writable_directory(const std::filesystem::path& dir, std::string_view flag);

}  // namespace pipesgd
