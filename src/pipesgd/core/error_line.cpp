#include "pipesgd/core/error_line.h"

#include <unistd.h>

#include <atomic>

namespace pipesgd {

bool write_error_line(const std::string& text) {
  static std::atomic<bool> written{false};
  if (written.exchange(true)) return false;
  const std::string line = "pipesgd: error: " + text + "\n";
  // No stdio: stderr is unbuffered, and its lock may be held by a thread that never returns.
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t wrote = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (wrote <= 0) break;
    done += static_cast<std::size_t>(wrote);
  }
  return true;
}

}  // namespace pipesgd
