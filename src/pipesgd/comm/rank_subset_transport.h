#pragma once
// RankSubsetTransport: a view of ranks 0..count-1 of another Transport, for collectives that must
// involve only those ranks (e.g. the trainer's control allreduce among the M workers of a run whose
// transport also holds the parameter-server ranks M..M+S-1).
//
// size() is `count`; rank() and everything else is forwarded unchanged (ranks are not renumbered,
// so the view is only valid on ranks < count and only addresses peers < count). Thread-safety and
// buffer ownership are the underlying transport's. The view does not own the transport, which must
// outlive it.
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

class RankSubsetTransport final : public Transport {
 public:
  // Throws UsageError if count is not in [1, inner.size()] or inner's rank is not below count.
  RankSubsetTransport(Transport& inner, int count) : inner_(inner), count_(count) {
    if (count < 1 || count > inner.size() || inner.rank() >= count) {
      throw UsageError(concat("rank subset of ", count, " ranks: invalid for rank ", inner.rank(),
                              " of ", inner.size()));
    }
  }
  int rank() const override { return inner_.rank(); }
  int size() const override { return count_; }
  Request send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) override {
    return inner_.send(peer, tag, bytes, operation);
  }
  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return inner_.recv(peer, tag, buffer, operation);
  }
  Request recv_in_place(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return inner_.recv_in_place(peer, tag, buffer, operation);
  }
  void report_failure(const std::string& reason) override { inner_.report_failure(reason); }
  std::uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  std::string describe() const override {
    return concat(inner_.describe(), ", ranks 0..", count_ - 1);
  }
  bool waits_sleep() const override { return inner_.waits_sleep(); }

 private:
  Transport& inner_;
  int count_;
};

}  // namespace pipesgd
