#pragma once
// TracedAllreduce: an allreduce that is also an "allreduce" span on the calling thread's trace
// (core/trace.h, --trace), with the gradient's bytes, the algorithm, the codec and the tag as
// arguments, and whose CPU time on the calling thread and bytes go to the AllreduceMeter installed
// where it was built (collective/allreduce_meter.h), if any. Without either it only forwards (one
// thread-local read).
#include <memory>
#include <string>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/allreduce_meter.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

class TracedAllreduce final : public Allreduce {
 public:
  // The names shown are interned in the trace of the constructing thread, if it has one (a run's
  // allreduces are built on its compute thread, before the run).
  TracedAllreduce(std::unique_ptr<Allreduce> inner, const Codec& codec)
      : inner_(std::move(inner)), meter_(current_allreduce_meter()) {
    if (ThreadTrace* trace = current_thread_trace()) {
      algorithm_ = trace->recorder().intern(std::string(inner_->name()));
      codec_ = trace->recorder().intern(std::string(codec.name()));
    }
  }
  std::string_view name() const override { return inner_->name(); }
  void run(std::span<float> data, Tag tag) override {
    TraceArgs args;
    args.bytes = data.size_bytes();
    args.tag = tag;
    args.algorithm = algorithm_;
    args.codec = codec_;
    const TraceSpan span("allreduce", kTraceComm, args);
    if (meter_ == nullptr) {
      inner_->run(data, tag);
      return;
    }
    const double cpu_start = thread_cpu_seconds();
    inner_->run(data, tag);
    meter_->record(thread_cpu_seconds() - cpu_start, data.size_bytes());
  }

 private:
  std::unique_ptr<Allreduce> inner_;
  AllreduceMeter* meter_;  // not owned; outlives this object
  const char* algorithm_ = nullptr;
  const char* codec_ = nullptr;
};

}  // namespace pipesgd
