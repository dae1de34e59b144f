#include "pipesgd/core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "pipesgd/core/error.h"

extern char** environ;

namespace pipesgd {
namespace {

bool is_executable_file(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error) && ::access(path.c_str(), X_OK) == 0;
}

// Closes a descriptor once, at the end of its scope.
class Descriptor {
 public:
  explicit Descriptor(int fd = -1) : fd_(fd) {}
  ~Descriptor() { reset(); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// posix_spawn's attributes and file actions, destroyed at the end of their scope.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
}

}  // namespace

std::optional<std::filesystem::path> find_program(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    return is_executable_file(name) ? std::optional<std::filesystem::path>(name) : std::nullopt;
  }
  const char* path = std::getenv("PATH");
  const std::string directories = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= directories.size()) {
    std::size_t end = directories.find(':', start);
    if (end == std::string::npos) end = directories.size();
    const std::string directory = directories.substr(start, end - start);
    const std::filesystem::path candidate = std::filesystem::path(directory.empty() ? "." : directory) / name;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

ProgramResult run_program(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  PIPESGD_ASSERT(!argv.empty());
  int pipe_ends[2];
  if (::pipe2(pipe_ends, O_CLOEXEC) != 0) {
    throw Error(concat("cannot run ", argv[0], ": pipe failed (", std::strerror(errno), ")"));
  }
  Descriptor read_end(pipe_ends[0]);
  Descriptor write_end(pipe_ends[1]);

  SpawnSetup setup;
  posix_spawn_file_actions_addopen(&setup.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&setup.actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&setup.actions, write_end.get(), STDERR_FILENO);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&setup.attributes, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int signal_number : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&defaults, signal_number);
  posix_spawnattr_setsigdefault(&setup.attributes, &defaults);
  posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> arguments;
  for (const std::string& argument : argv) arguments.push_back(const_cast<char*>(argument.c_str()));
  arguments.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, argv[0].c_str(), &setup.actions, &setup.attributes, arguments.data(), environ);
  if (spawned != 0) throw Error(concat("cannot run ", argv[0], " (", std::strerror(spawned), ")"));
  write_end.reset();  // the child holds its own copy: EOF once it exits

  ProgramResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Its stderr until EOF or the deadline.
  ::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
  for (;;) {
    const std::chrono::milliseconds left = remaining(deadline);
    if (left.count() <= 0) break;
    pollfd request{read_end.get(), POLLIN, 0};
    const int ready = ::poll(&request, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t count = ::read(read_end.get(), buffer, sizeof buffer);
    if (count == 0) break;  // EOF
    if (count < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      break;
    }
    const std::size_t room = kStandardErrorLimit - std::min(kStandardErrorLimit, result.standard_error.size());
    result.standard_error.append(buffer, std::min(room, static_cast<std::size_t>(count)));
  }
  // Its exit, until the deadline; then it is killed.
  int status = 0;
  for (;;) {
    const pid_t waited = ::waitpid(pid, &status, WNOHANG);
    if (waited == pid) break;
    if (waited < 0 && errno != EINTR) {
      throw Error(concat("cannot run ", argv[0], ": waitpid failed (", std::strerror(errno), ")"));
    }
    if (remaining(deadline).count() <= 0) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

std::string describe_program_failure(const std::string& program, const ProgramResult& result) {
  std::string line;
  if (result.timed_out) {
    line = concat(program, " did not finish in time and was stopped");
  } else if (result.signal != 0) {
    line = concat(program, " was killed by signal ", result.signal);
  } else {
    line = concat(program, " exited with status ", result.exit_code);
  }
  std::string messages;
  std::size_t start = 0;
  const std::string& text = result.standard_error;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string piece = text.substr(start, end - start);
    const std::size_t first = piece.find_first_not_of(" \t\r");
    if (first != std::string::npos) {
      piece = piece.substr(first, piece.find_last_not_of(" \t\r") + 1 - first);
      if (!messages.empty()) messages += " | ";
      messages += piece;
    }
    start = end + 1;
  }
  constexpr std::size_t kMaxMessage = 300;
  if (messages.size() > kMaxMessage) messages = messages.substr(0, kMaxMessage) + "...";
  return messages.empty() ? line : concat(line, ": ", messages);
}

}  // namespace pipesgd
