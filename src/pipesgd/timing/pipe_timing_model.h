#pragma once
// Pipe-SGD timing models (pipe-sgd.txt Sec. 3.1), per iteration:
//   Eq. 2  D-Sync:   l_up + l_comp + l_comm
//   Eq. 4  Pipe-SGD: max(l_up + l_comp, l_comm)           (K >= 2, limited resources)
//   Eq. 5  ring allreduce of n bytes over p workers (sequential gradient communication):
//          2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ + S
#include <algorithm>

namespace pipesgd {

// Stage times of one iteration. l_up + l_comp of the paper is everything the compute thread does
// that is not waiting for communication: update, loading the batch, forward, backward and `other`
// (hooks, bookkeeping, time the thread was descheduled between the timed stages).
struct StageTimes {
  double update = 0;
  double data = 0;
  double forward = 0;
  double backward = 0;
  double other = 0;
  double comm = 0;
  double compute() const { return update + data + forward + backward + other; }
};

inline double predict_dsync_iteration(const StageTimes& t) { return t.compute() + t.comm; }  // Eq. 2
inline double predict_pipe_iteration(const StageTimes& t) {                                // Eq. 4
  return std::max(t.compute(), t.comm);
}

struct RingCostParameters {
  double alpha = 0;  // latency per message, s
  double beta = 0;   // transfer time per byte, s
  double gamma = 0;  // reduction time per byte, s
  double sync = 0;   // global synchronisation S, s
};

// Eq. 5's communication term.
inline double ring_allreduce_time(int workers, double bytes, const RingCostParameters& c) {
  if (workers <= 1) return 0;
  const double p = workers;
  return 2 * (p - 1) * c.alpha + 2 * (p - 1) / p * bytes * c.beta + (p - 1) / p * bytes * c.gamma +
         c.sync;
}

}  // namespace pipesgd
