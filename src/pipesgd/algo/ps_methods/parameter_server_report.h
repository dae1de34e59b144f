#pragma once
// What a parameter-server run reports (pssync, asgd, dcasgd; odsgd's report extends it), and the
// table `compare` prints when one was compared: od-sgd.txt Table 1's form, speed and accuracy.
#include "pipesgd/algo/method_report.h"

namespace pipesgd {

class ParameterServerReport : public MethodReport {};

ComparisonTable parameter_server_table();

}  // namespace pipesgd
