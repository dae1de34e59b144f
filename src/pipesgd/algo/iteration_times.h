#pragma once
// Per-iteration measurements of one worker, in seconds unless named otherwise.
#include <cstdint>

namespace pipesgd {

struct IterationTimes {
  double update = 0;        // optimizer step(s) on the compute thread
  double data = 0;          // loading the batch (Alg. 1 line 6)
  double forward = 0;
  double backward = 0;
  double compensation = 0;  // sapipe: the stale range's compensated update and weight prediction
  double wait = 0;          // exposed communication: compute thread blocked on communication
  double comm = 0;          // allreduce time on the thread that ran it (consumed this iteration)
  double iteration = 0;     // whole iteration on the compute thread
  double checkpoint = 0;    // this worker's checkpoint after the iteration (its state copied; in `iteration`)
  double loss = 0;
  bool pipelined = false;   // false during warm-up / for synchronous methods

  // Adds weight * other to every timing and the loss (for means over workers and iterations).
  void add_scaled(const IterationTimes& other, double weight) {
    update += weight * other.update;
    compensation += weight * other.compensation;
    data += weight * other.data;
    forward += weight * other.forward;
    backward += weight * other.backward;
    wait += weight * other.wait;
    comm += weight * other.comm;
    iteration += weight * other.iteration;
    checkpoint += weight * other.checkpoint;
    loss += weight * other.loss;
  }
};

}  // namespace pipesgd
