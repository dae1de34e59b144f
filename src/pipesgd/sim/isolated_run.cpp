#include "pipesgd/sim/isolated_run.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The child's answer: one kind byte, then the result or the error message.
enum Kind : char { kResult = 'R', kUsage = 'U', kData = 'D', kOther = 'E' };

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone: nothing left to tell
    done += static_cast<std::size_t>(n);
  }
}

std::string read_all(int fd) {
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  return text;
}

[[noreturn]] void child_main(int fd, const std::function<std::string()>& body) {
  std::string answer;
  try {
    answer = static_cast<char>(kResult) + body();
  } catch (const UsageError& error) {
    answer = static_cast<char>(kUsage) + std::string(error.what());
  } catch (const DataError& error) {
    answer = static_cast<char>(kData) + std::string(error.what());
  } catch (const std::exception& error) {
    answer = static_cast<char>(kOther) + std::string(error.what());
  }
  write_all(fd, answer);
  ::close(fd);
  std::fflush(nullptr);
  ::_exit(0);  // no atexit handlers or static destructors of the parent's state
}

}  // namespace

std::string run_isolated(std::string_view what, const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(concat(what, ": pipe failed: ", std::strerror(errno)));
  std::fflush(nullptr);  // nothing buffered may be written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(concat(what, ": fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], body);
  }
  ::close(fds[1]);
  const std::string answer = read_all(fds[0]);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (answer.empty()) {
    if (WIFSIGNALED(status)) {
      throw Error(concat(what, ": the simulation process died of signal ", WTERMSIG(status), " (",
                         strsignal(WTERMSIG(status)), ")"));
    }
    throw Error(concat(what, ": the simulation process ended without a result (exit status ",
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1, ")"));
  }
  const std::string text = answer.substr(1);
  switch (answer[0]) {
    case kResult: return text;
    case kUsage: throw UsageError(text);
    case kData: throw DataError(text);
    default: throw Error(text);
  }
}

}  // namespace pipesgd
