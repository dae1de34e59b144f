#pragma once
// Pipe-SGD timing models (Pipe-SGD paper Sec. 3.1-3.2), per iteration (the paper's totals are T times
// these):
//   Eq. 2  D-Sync:   l_up + l_comp + l_comm
//   Eq. 4  Pipe-SGD: max(l_up + l_comp, l_comm)           (K >= 2, limited resources)
//   Eq. 5  Pipe-SGD with sequential gradient communication, a ring allreduce of n bytes over p workers:
//          max(l_up + l_for + l_back, 2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ + S)
//   Eq. 6  ... with pipelined gradient communication in L segments, each sent as soon as computed:
//          max(l_up + l_for + l_b, 2(p-1)L·α + 2(p-1)/p·n·β + (p-1)/p·n·γ + L·S)
//          (l_b: the backward time of the first segment; L = 1 with l_b = l_back is Eq. 5)
//   Eq. 7  scaling efficiency: SE = (l_up + l_comp) / max(l_up + l_comp, l_comm), 1 when compute-bound
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

// The communication term of Eq. 6 for `segments` = L >= 1 gradient segments, of Eq. 5 for L = 1:
// 2(p-1)L·α + 2(p-1)/p·n·β + (p-1)/p·n·γ + L·S seconds for n = `bytes`; 0 for p <= 1.
inline double ring_allreduce_time(int workers, double bytes, const RingCostParameters& c, int segments = 1) {
  if (workers <= 1) return 0;
  const double p = workers, L = segments;
  return 2 * (p - 1) * L * c.alpha + 2 * (p - 1) / p * bytes * c.beta + (p - 1) / p * bytes * c.gamma + L * c.sync;
}

// Eq. 5 per iteration: max(compute, comm) with the whole backward before the allreduce, where
// compute = l_up + l_for + l_back and comm = ring_allreduce_time(p, n, c).
inline double predict_pipe_sequential_iteration(double compute, double comm) { return std::max(compute, comm); }

// Eq. 6 per iteration: max(compute - backward + first_segment_backward, comm_L), where compute =
// l_up + l_for + l_back, backward = l_back, first_segment_backward = l_b and comm_L =
// ring_allreduce_time(p, n, c, L).
inline double predict_pipe_pipelined_iteration(double compute, double backward, double first_segment_backward,
                                               double comm_segmented) {
  return std::max(compute - backward + first_segment_backward, comm_segmented);
}

// Eq. 7: (l_up + l_comp) / max(l_up + l_comp, l_comm) for compute = l_up + l_comp >= 0 and comm =
// l_comm >= 0; in [0, 1], 1 when compute-bound; 0 when both are 0 (nothing measured).
inline double pipe_scaling_efficiency(double compute, double comm) {
  const double bound = std::max(compute, comm);
  return bound > 0 ? compute / bound : 0;
}

}  // namespace pipesgd
