#pragma once
// Test harness: a world of processes (fork) on one host, joined by a SharedMemoryTransport over an
// anonymous shared mapping. ForkedWorld::run(body) runs body(transport, output) in every rank's own
// process and returns each rank's error ("" when body returned; the exception's text, or how the
// process ended). `output(rank)` is that rank's part of a shared area the children write results into
// and the parent reads after run(). `signals()` are shared atomics for ordering steps across
// processes without the transport. The parent makes every assertion (children never touch gtest).
// Children die with the parent (PR_SET_PDEATHSIG), so a hung test cannot leave processes behind.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/comm/shared_memory_transport.h"

namespace pipesgd {

class ForkedWorld {
 public:
  using Body = std::function<void(SharedMemoryTransport& transport, std::span<std::byte> output)>;
  static constexpr std::size_t kErrorBytes = 1024;
  static constexpr int kSignals = 16;

  // `staging`: the transport's eager-message staging (none by default: every message rendezvous).
  explicit ForkedWorld(int ranks, std::size_t output_bytes = 0, SharedMemoryStaging staging = {})
      : ranks_(ranks),
        output_bytes_(output_bytes),
        staging_(staging),
        shared_(SharedRegion::anonymous(static_cast<std::size_t>(ranks) * (kErrorBytes + output_bytes) +
                                        kSignals * sizeof(std::atomic<int>))) {}

  std::vector<std::string> run(const Body& body) {
    SharedRegion region = SharedRegion::anonymous(SharedMemoryTransport::region_bytes(ranks_, staging_));
    std::fill(shared_.bytes().begin(), shared_.bytes().end(), std::byte{0});
    std::vector<int> members(static_cast<std::size_t>(ranks_));
    std::iota(members.begin(), members.end(), 0);
    const pid_t parent = getpid();
    std::vector<pid_t> children;
    for (int rank = 0; rank < ranks_; ++rank) {
      const pid_t child = fork();
      if (child < 0) throw std::runtime_error("fork failed");
      if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(3);
        int status = 0;
        try {
          SharedMemoryTransport transport(std::move(region), members, rank, ranks_, staging_, std::chrono::hours(1));
          if (!transport.usable()) throw std::runtime_error("cross-memory attach not permitted");
          body(transport, output(rank));
        } catch (const std::exception& error) {
          write_error(rank, error.what());
          status = 1;
        } catch (...) {
          write_error(rank, "unknown exception");
          status = 1;
        }
        _exit(status);
      }
      children.push_back(child);
    }
    std::vector<std::string> errors(static_cast<std::size_t>(ranks_));
    for (int rank = 0; rank < ranks_; ++rank) {
      int status = 0;
      waitpid(children[static_cast<std::size_t>(rank)], &status, 0);
      const char* text = reinterpret_cast<const char*>(error_area(rank).data());
      std::string& error = errors[static_cast<std::size_t>(rank)];
      error.assign(text, strnlen(text, kErrorBytes));
      if (error.empty() && WIFSIGNALED(status)) error = "killed by signal " + std::to_string(WTERMSIG(status));
      if (error.empty() && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        error = "exit " + std::to_string(WEXITSTATUS(status));
      }
    }
    return errors;
  }

  std::span<std::byte> output(int rank) const {
    return shared_.bytes().subspan(static_cast<std::size_t>(ranks_) * kErrorBytes +
                                       static_cast<std::size_t>(rank) * output_bytes_,
                                   output_bytes_);
  }
  template <typename T>
  std::span<T> output_as(int rank) const {
    const std::span<std::byte> bytes = output(rank);
    return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
  }

  // Shared counters for ordering steps across the processes (zero at every run()).
  std::atomic<int>& signal(int index) const {
    auto* base = shared_.bytes().data() + static_cast<std::size_t>(ranks_) * (kErrorBytes + output_bytes_);
    return reinterpret_cast<std::atomic<int>*>(base)[index];
  }
  // Polls (sleeping 100 us between polls) until signal(index) >= value.
  void await(int index, int value) const {
    while (signal(index).load() < value) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

 private:
  std::span<std::byte> error_area(int rank) const {
    return shared_.bytes().subspan(static_cast<std::size_t>(rank) * kErrorBytes, kErrorBytes);
  }
  void write_error(int rank, const std::string& text) const {
    const std::span<std::byte> area = error_area(rank);
    const std::size_t n = std::min(text.size(), kErrorBytes - 1);
    std::memcpy(area.data(), text.data(), n);
  }

  int ranks_;
  std::size_t output_bytes_;
  SharedMemoryStaging staging_;
  SharedRegion shared_;
};

}  // namespace pipesgd
