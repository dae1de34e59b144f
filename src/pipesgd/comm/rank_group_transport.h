#pragma once
// RankGroupTransport: a view of an ordered list of distinct ranks of another Transport, renumbered:
// the rank at index i of the list is rank i of the view. Collectives run over a view involve the
// group's ranks only (process sets: a group {2, 0} of a 4-rank world runs its own collectives while
// ranks 1 and 3 do something else).
//
// rank() is this rank's index in the list and size() the list's length; send, recv and recv_in_place
// to peer i go to the inner rank ranks[i] with the tag unchanged; report_failure, bytes_sent and
// waits_sleep are the inner transport's. Errors the inner transport raises name inner ranks.
// Messages are matched by (inner peer, tag): groups with no rank in common may use the same tags at
// once; overlapping groups (or a group and its inner transport) need distinct tags for collectives
// in flight at once. Thread-safety and buffer ownership are the inner transport's. The view does not
// own the inner transport, which must outlive it.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

class RankGroupTransport final : public Transport {
 public:
  // Throws UsageError if `ranks` is empty, holds a rank twice or a rank outside [0, inner.size()),
  // or does not hold inner.rank().
  RankGroupTransport(Transport& inner, std::vector<int> ranks) : inner_(inner), ranks_(std::move(ranks)) {
    if (ranks_.empty()) throw UsageError(concat("rank group: no ranks (of ", inner.size(), ")"));
    std::vector<bool> seen(static_cast<std::size_t>(inner.size()), false);
    for (std::size_t index = 0; index < ranks_.size(); ++index) {
      const int rank = ranks_[index];
      if (rank < 0 || rank >= inner.size()) {
        throw UsageError(concat("rank group ", list(), ": rank ", rank, " is outside [0, ", inner.size(), ")"));
      }
      if (seen[static_cast<std::size_t>(rank)]) {
        throw UsageError(concat("rank group ", list(), ": rank ", rank, " appears twice"));
      }
      seen[static_cast<std::size_t>(rank)] = true;
      if (rank == inner.rank()) rank_ = static_cast<int>(index);
    }
    if (rank_ < 0) {
      throw UsageError(concat("rank group ", list(), ": does not hold this rank (", inner.rank(), " of ",
                              inner.size(), ")"));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  // The inner ranks, in group order: ranks()[i] is group rank i.
  const std::vector<int>& ranks() const { return ranks_; }
  // The inner rank of group rank `peer`; throws UsageError naming `operation` if peer is not in
  // [0, size()).
  int inner_rank(int peer, const char* operation) const {
    if (peer < 0 || peer >= size()) {
      throw UsageError(concat(operation, ": peer rank ", peer, " out of range [0, ", size(), ") of rank group ",
                              list()));
    }
    return ranks_[static_cast<std::size_t>(peer)];
  }

  Request send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) override {
    return inner_.send(inner_rank(peer, operation), tag, bytes, operation);
  }
  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return inner_.recv(inner_rank(peer, operation), tag, buffer, operation);
  }
  Request recv_in_place(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return inner_.recv_in_place(inner_rank(peer, operation), tag, buffer, operation);
  }
  void report_failure(const std::string& reason) override { inner_.report_failure(reason); }
  std::uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  // "<inner>, ranks 0..3" for consecutive ascending ranks, else "<inner>, ranks 2, 0".
  std::string describe() const override { return concat(inner_.describe(), ", ranks ", list()); }
  bool waits_sleep() const override { return inner_.waits_sleep(); }

 private:
  // "0..3" or "2, 0": the list for messages.
  std::string list() const {
    bool consecutive = ranks_.size() > 1;
    for (std::size_t index = 1; index < ranks_.size(); ++index) consecutive &= ranks_[index] == ranks_[index - 1] + 1;
    if (consecutive) return concat(ranks_.front(), "..", ranks_.back());
    std::string text;
    for (std::size_t index = 0; index < ranks_.size(); ++index) text += concat(index > 0 ? ", " : "", ranks_[index]);
    return text;
  }

  Transport& inner_;
  std::vector<int> ranks_;
  int rank_ = -1;
};

}  // namespace pipesgd
