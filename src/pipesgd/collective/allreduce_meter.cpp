#include "pipesgd/collective/allreduce_meter.h"

namespace pipesgd {
namespace {
thread_local AllreduceMeter* installed_meter = nullptr;
}  // namespace

AllreduceMeter* current_allreduce_meter() { return installed_meter; }

ScopedAllreduceMeter::ScopedAllreduceMeter(AllreduceMeter* meter) : previous_(installed_meter) {
  installed_meter = meter;
}

ScopedAllreduceMeter::~ScopedAllreduceMeter() { installed_meter = previous_; }

}  // namespace pipesgd
