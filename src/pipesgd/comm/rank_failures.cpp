#include "pipesgd/comm/rank_failures.h"

#include "pipesgd/core/error.h"

namespace pipesgd {

void rethrow_root_cause(const std::vector<std::exception_ptr>& failures) {
  std::exception_ptr first_failure, consequence;
  for (const auto& failure : failures) {
    if (!failure) continue;
    try {
      std::rethrow_exception(failure);
    } catch (const PeerFailedError&) {
      if (!first_failure) first_failure = failure;
    } catch (const CommTimeoutError& error) {
      const int peer = error.peer();
      const bool peer_failed =
          peer >= 0 && peer < static_cast<int>(failures.size()) && failures[static_cast<std::size_t>(peer)];
      if (!peer_failed) std::rethrow_exception(failure);
      if (!consequence) consequence = failure;
    } catch (...) {
      std::rethrow_exception(failure);
    }
  }
  if (consequence) std::rethrow_exception(consequence);
  if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace pipesgd
