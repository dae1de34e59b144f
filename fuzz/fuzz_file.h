#pragma once
// What the fuzz targets that hand their input to a reader as a file share (idx_reader, npy_reader):
// the temporary file's path and its writing. Header-only; included by the fuzzer sources alone.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

namespace pipesgd_fuzz {

// A file of this process's own in tmpfs when there is one (/dev/shm, else $TMPDIR, else /tmp):
// DIR/<stem>_<pid><extension>.
inline std::string temp_file_path(const char* stem, const char* extension) {
  const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + stem + "_" + std::to_string(getpid()) + extension;
}

// Writes `bytes` as the whole content of `path`. Returns nullptr, or what failed ("cannot create the
// temporary file", "cannot write the temporary file") for the caller to report as a finding.
inline const char* write_whole_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return "cannot create the temporary file";
  const bool written = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  std::fclose(file);
  return written ? nullptr : "cannot write the temporary file";
}

}  // namespace pipesgd_fuzz
