#include "pipesgd/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include "pipesgd/core/error.h"

namespace pipesgd {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int error_number) { return std::strerror(error_number); }

// A temporary file being written; closed, and removed unless committed, on destruction.
class TempFile {
 public:
  TempFile(int fd, fs::path path) : fd_(fd), path_(std::move(path)) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  const fs::path& path() const { return path_; }
  // Closes the descriptor; returns 0 or an errno value.
  int close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result == 0 ? 0 : errno;
  }
  void commit() { committed_ = true; }

 private:
  int fd_;
  fs::path path_;
  bool committed_ = false;
};

std::string random_suffix() {
  std::random_device device;
  const std::uint64_t value = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  std::ostringstream out;
  out << ::getpid() << '.' << std::hex << value;
  return out.str();
}

// Throws UsageError unless `dir` exists and is a directory (DataError if it cannot be examined).
void check_directory(const fs::path& dir, std::string_view what, const std::string& target) {
  struct stat dir_status{};
  if (::stat(dir.c_str(), &dir_status) != 0) {
    const int error_number = errno;
    if (error_number == ENOENT) {
      throw UsageError(concat("cannot write ", what, " '", target, "': directory '", dir.string(),
                              "' does not exist"));
    }
    throw DataError(concat("cannot write ", what, " '", target, "': directory '", dir.string(), "': ",
                           errno_text(error_number)));
  }
  if (!S_ISDIR(dir_status.st_mode)) {
    throw UsageError(concat("cannot write ", what, " '", target, "': '", dir.string(),
                            "' is not a directory"));
  }
}

// Creates a fresh temporary file next to the destination (O_EXCL never reuses someone else's).
TempFile create_temp_file(const fs::path& dir, const std::string& file_name, std::string_view what,
                          const std::string& target) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    fs::path temp_path = dir / concat(".", file_name, kAtomicFileTempMarker, random_suffix());
    const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return TempFile(fd, std::move(temp_path));
    const int error_number = errno;
    if (error_number == EEXIST) continue;
    if (error_number == ENOENT) {
      throw UsageError(concat("cannot write ", what, " '", target, "': directory '", dir.string(),
                              "' does not exist"));
    }
    throw DataError(concat("cannot write ", what, " '", target, "': cannot create '", temp_path.string(),
                           "': ", errno_text(error_number)));
  }
  throw DataError(concat("cannot write ", what, " '", target,
                         "': cannot create a temporary file (names keep colliding)"));
}

// Makes the rename durable. Some file systems cannot sync a directory (EINVAL, ENOTSUP); there the
// rename is as durable as it gets.
void sync_directory(const fs::path& dir, std::string_view what, const std::string& target) {
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    const int error_number = errno;
    throw DataError(concat(what, " '", target, "' was written but its directory could not be opened ",
                           "to sync it: ", errno_text(error_number)));
  }
  const int synced = ::fsync(dir_fd);
  const int sync_error = errno;
  ::close(dir_fd);
  if (synced != 0 && sync_error != EINVAL && sync_error != ENOTSUP) {
    throw DataError(concat(what, " '", target, "' was written but syncing its directory failed: ",
                           errno_text(sync_error)));
  }
}

}  // namespace

void write_file_atomically_streaming(const fs::path& path,
                                     const std::function<void(const AtomicFileSink&)>& produce,
                                     std::string_view what, AtomicWrite mode) {
  const bool durable = mode == AtomicWrite::kDurable;
  const std::string target = path.string();
  const std::string file_name = path.filename().string();
  if (file_name.empty() || file_name == "." || file_name == "..") {
    throw UsageError(concat("cannot write ", what, " '", target, "': the path has no file name"));
  }
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  check_directory(dir, what, target);

  TempFile temp = create_temp_file(dir, file_name, what, target);
  const auto fail = [&](const char* step, int error_number) {
    throw DataError(concat("cannot write ", what, " '", target, "': ", step, " '", temp.path().string(),
                           "': ", errno_text(error_number)));
  };
  produce([&](std::span<const std::byte> chunk) {
    const std::byte* data = chunk.data();
    std::size_t left = chunk.size();
    while (left > 0) {
      const ssize_t written = ::write(temp.fd(), data, std::min<std::size_t>(left, std::size_t{1} << 30));
      if (written < 0) {
        if (errno == EINTR) continue;
        fail("writing", errno);
      }
      if (written == 0) fail("writing", ENOSPC);
      data += written;
      left -= static_cast<std::size_t>(written);
    }
  });
  if (durable && ::fsync(temp.fd()) != 0) fail("syncing", errno);
  if (const int error_number = temp.close(); error_number != 0) fail("closing", error_number);
  if (::rename(temp.path().c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    throw DataError(concat("cannot write ", what, " '", target, "': renaming '", temp.path().string(),
                           "' over it: ", errno_text(error_number)));
  }
  temp.commit();
  if (durable) sync_directory(dir, what, target);
}

void write_file_atomically(const fs::path& path, std::span<const std::byte> content,
                           std::string_view what, AtomicWrite mode) {
  write_file_atomically_streaming(path, [&](const AtomicFileSink& sink) { sink(content); }, what, mode);
}

void write_file_atomically(const fs::path& path, std::string_view content, std::string_view what,
                           AtomicWrite mode) {
  write_file_atomically(path, std::as_bytes(std::span(content.data(), content.size())), what, mode);
}

}  // namespace pipesgd

namespace pipesgd {

void ensure_writable_directory(const std::filesystem::path& dir, std::string_view flag) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    throw UsageError(concat(flag, " '", dir.string(), "': cannot create directory",
                            error ? concat(" (", error.message(), ")") : std::string(" (a file of that name exists)")));
  }
  // A file created and removed at once: what a later write needs.
  const std::filesystem::path probe = dir / concat(".pipesgd-write-probe", kAtomicFileTempMarker, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error_number = errno;
    throw UsageError(concat(flag, " '", dir.string(), "': cannot write in it (", std::strerror(error_number), ")"));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace pipesgd
