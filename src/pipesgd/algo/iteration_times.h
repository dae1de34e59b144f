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
  // The gradient allreduces that finished during this iteration, on whichever thread ran them:
  // their CPU time on that thread's CPU clock, and their fp32 bytes (collective/allreduce_meter.h).
  double comm_cpu = 0;
  double comm_bytes = 0;
  double iteration = 0;     // whole iteration on the compute thread
  double checkpoint = 0;    // this worker's checkpoint after the iteration (its state copied; in `iteration`)
  double loss = 0;
  bool pipelined = false;   // false during warm-up / for synchronous methods

  // CPU seconds per allreduced fp32 byte (0 when nothing was allreduced).
  double comm_cpu_per_byte() const { return comm_bytes > 0 ? comm_cpu / comm_bytes : 0; }

  // Adds weight * other to every timing and the loss (for means over workers and iterations).
  void add_scaled(const IterationTimes& other, double weight) {
    update += weight * other.update;
    compensation += weight * other.compensation;
    data += weight * other.data;
    forward += weight * other.forward;
    backward += weight * other.backward;
    wait += weight * other.wait;
    comm += weight * other.comm;
    comm_cpu += weight * other.comm_cpu;
    comm_bytes += weight * other.comm_bytes;
    iteration += weight * other.iteration;
    checkpoint += weight * other.checkpoint;
    loss += weight * other.loss;
  }
};

}  // namespace pipesgd
