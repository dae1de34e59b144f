// OD-SGD's Eq. 1-3 against values worked by hand.
#include "pipesgd/timing/od_sgd_timing_model.h"

#include <gtest/gtest.h>

namespace pipesgd {
namespace {

TEST(OdSgdTimingModel, CommunicationHiddenWhenItIsShorterThanCompute) {
  // T_cop = 4, T_com = 3, T'_com = 2: T_new = 4, T_org = 6, IMP = 1 - 4/6 = 1/3 (Eq. 3, first case).
  const OdSgdTimes t{4, 3, 2};
  EXPECT_DOUBLE_EQ(od_sgd_iteration_time(t), 4);
  EXPECT_DOUBLE_EQ(sync_ps_iteration_time(t), 6);
  EXPECT_DOUBLE_EQ(od_sgd_improvement_rate(t), 1.0 / 3.0);
}

TEST(OdSgdTimingModel, AveragesTwoIterationsWhenCommunicationDominates) {
  // T_cop = 2, T_com = 6, T'_com = 5: T_new = (6 + 2) / 2 = 4, T_org = 7, IMP = 1 - 8/14 = 3/7.
  const OdSgdTimes t{2, 6, 5};
  EXPECT_DOUBLE_EQ(od_sgd_iteration_time(t), 4);
  EXPECT_DOUBLE_EQ(od_sgd_improvement_rate(t), 3.0 / 7.0);
  // At the boundary T_com = T_cop both cases agree.
  EXPECT_DOUBLE_EQ(od_sgd_iteration_time({3, 3, 3}), 3);
}

TEST(OdSgdTimingModel, SlowerCommunicationThanSsgdCanMakeItNegative) {
  // OD-SGD's own communication may be longer than SSGD's (T_com > T'_com): T_cop = 1, T_com = 9,
  // T'_com = 3: T_new = 5 > T_org = 4, a negative improvement.
  EXPECT_DOUBLE_EQ(od_sgd_improvement_rate({1, 9, 3}), -0.25);
}

TEST(OdSgdTimingModel, RejectsNegativeAndDegenerateTimes) {
  EXPECT_THROW(od_sgd_improvement_rate({-1, 1, 1}), UsageError);
  EXPECT_THROW(od_sgd_improvement_rate({0, 0, 0}), UsageError);
}

}  // namespace
}  // namespace pipesgd
