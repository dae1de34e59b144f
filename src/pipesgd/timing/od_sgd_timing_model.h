#pragma once
// OD-SGD's performance model (OD-SGD paper Sec. 3.2, Eq. 1-3): the improvement rate of OD-SGD over
// synchronous SGD (SSGD) on a parameter server, from measured per-iteration times.
//
//   T_org = T_cop + T'_com                                   (SSGD: compute, then communicate)
//   T_new = T_cop                  if T_com <= T_cop         (Eq. 2: communication fully hidden)
//         = (T_com + T_cop) / 2    if T_cop <  T_com         (the average of two adjacent iterations)
//   IMP_Rate = (T_org - T_new) / T_org                       (Eq. 1; Eq. 3 substitutes Eq. 2)
//
// T'_com is SSGD's communication time and T_com OD-SGD's, which the paper keeps apart: OD-SGD's
// local update can postpone the next push and pull, and the network load differs.
#include "pipesgd/core/error.h"

namespace pipesgd {

struct OdSgdTimes {
  double compute = 0;             // T_cop: forward, backward (and local update), seconds
  double communication = 0;       // T_com: OD-SGD's push + pull, seconds
  double sync_communication = 0;  // T'_com: SSGD's push + pull, seconds
};

// Eq. 2.
inline double od_sgd_iteration_time(const OdSgdTimes& t) {
  return t.communication <= t.compute ? t.compute : (t.communication + t.compute) / 2;
}

// T_org of Eq. 2.
inline double sync_ps_iteration_time(const OdSgdTimes& t) { return t.compute + t.sync_communication; }

// Eq. 1 / Eq. 3. Throws UsageError for negative times or T_org = 0.
inline double od_sgd_improvement_rate(const OdSgdTimes& t) {
  if (!(t.compute >= 0) || !(t.communication >= 0) || !(t.sync_communication >= 0)) {
    throw UsageError("OD-SGD improvement rate: times must be non-negative");
  }
  const double original = sync_ps_iteration_time(t);
  if (original <= 0) throw UsageError("OD-SGD improvement rate: T_cop + T'_com must be positive");
  return (original - od_sgd_iteration_time(t)) / original;
}

}  // namespace pipesgd
