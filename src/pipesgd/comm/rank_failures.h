#pragma once
// The root cause among the failures of a run's ranks (threads of one process, each rank's failure
// caught in its own thread).
#include <exception>
#include <vector>

namespace pipesgd {

// Rethrows the root cause among `failures` (per rank, nullptr where the rank did not fail): a
// rank's own error rather than the others' PeerFailedError, and a timeout on a peer that went
// silent (it did not fail itself) rather than one on a peer that failed (e.g. one stuck behind the
// silent one, as a ring's next rank is when a rank dies mid-allreduce). Returns if none failed.
void rethrow_root_cause(const std::vector<std::exception_ptr>& failures);

}  // namespace pipesgd
