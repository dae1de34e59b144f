#include "pipesgd/train/fault_injection.h"

#include <charconv>
#include <csignal>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/ps/parameter_server.h"

namespace pipesgd {
namespace {

template <typename Integer>
Integer parse_integer(const std::string& key, const std::string& value, Integer minimum) {
  Integer number{};
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size() || number < minimum) {
    throw UsageError(concat("--inject-fault: ", key, " must be an integer >= ", minimum, ", got '", value, "'"));
  }
  return number;
}

}  // namespace

void inject_fault(const FaultInjection& fault, const FaultControl& control) {
  PIPESGD_ASSERT(!fault.slows_link());  // kind=slow is no failure (FaultControl::slow_link)
  if (control.fired_at_ns != nullptr) {
    control.fired_at_ns->store(unix_time_ns(), std::memory_order_relaxed);
  }
  if (fault.kind == FaultInjection::Kind::kCrash) {
    if (control.rank_is_process) std::raise(SIGKILL);
    throw InjectedFault{};
  }
  // Hang: alive but silent. A thread ends (silently) once another worker has failed, or after
  // twice the comm timeout at the latest; a process sleeps until it is killed.
  const auto give_up = Clock::now() + 2 * control.timeout + std::chrono::seconds(10);
  while (control.rank_is_process || Clock::now() < give_up) {
    if (control.any_worker_failed != nullptr && control.any_worker_failed->load(std::memory_order_acquire)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw InjectedFault{};
}

FaultInjection parse_fault_injection(const std::string& text) {
  FaultInjection fault;
  std::set<std::string> seen;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = text.find(',', begin);
    const std::string part = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const std::size_t equals = part.find('=');
    if (equals == std::string::npos) {
      throw UsageError(concat("--inject-fault: expected key=value, got '", part,
                              "' (form: rank=R,iter=N,kind=crash|hang|slow)"));
    }
    const std::string key = part.substr(0, equals), value = part.substr(equals + 1);
    if (!seen.insert(key).second) throw UsageError(concat("--inject-fault: '", key, "' given twice"));
    if (key == "rank") {
      fault.rank = parse_integer<int>(key, value, 0);
    } else if (key == "iter") {
      fault.iteration = parse_integer<std::int64_t>(key, value, 0);
    } else if (key == "kind") {
      if (value == "crash") {
        fault.kind = FaultInjection::Kind::kCrash;
      } else if (value == "hang") {
        fault.kind = FaultInjection::Kind::kHang;
      } else if (value == "slow") {
        fault.kind = FaultInjection::Kind::kSlow;
      } else {
        throw UsageError(concat("--inject-fault: kind must be crash, hang or slow, got '", value, "'"));
      }
    } else if (key == "factor") {
      std::size_t used = 0;
      double factor = 0;
      try {
        factor = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != value.size() || !(factor >= 1) || factor > 1e6) {
        throw UsageError(concat("--inject-fault: factor must be a number in [1, 1e6], got '", value, "'"));
      }
      fault.factor = factor;
    } else if (key == "at") {
      if (value == "iteration") {
        fault.point = FaultInjection::Point::kIteration;
      } else if (value == "checkpoint") {
        fault.point = FaultInjection::Point::kCheckpoint;
      } else if (value == "allreduce") {
        fault.point = FaultInjection::Point::kAllreduce;
      } else if (value == "push") {
        fault.point = FaultInjection::Point::kPush;
      } else {
        throw UsageError(concat("--inject-fault: at must be iteration, checkpoint, allreduce or push, got '", value, "'"));
      }
    } else {
      throw UsageError(concat("--inject-fault: unknown key '", key, "' (keys: rank, iter, kind, at, factor)"));
    }
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  for (const char* key : {"rank", "iter", "kind"}) {
    if (!seen.count(key)) {
      throw UsageError(concat("--inject-fault: '", key, "' is missing (form: rank=R,iter=N,kind=crash|hang|slow)"));
    }
  }
  if (fault.slows_link() && !seen.count("factor")) {
    throw UsageError("--inject-fault: kind=slow needs factor=F, how many times slower the link gets (e.g. 4)");
  }
  if (!fault.slows_link() && seen.count("factor")) {
    throw UsageError("--inject-fault: factor applies to kind=slow only");
  }
  if (fault.slows_link() && seen.count("at")) {
    throw UsageError("--inject-fault: kind=slow takes no at= (the link slows from the start of iteration N on)");
  }
  return fault;
}

std::string describe(const FaultInjection& fault) {
  if (!fault.active()) return "";
  constexpr const char* kPoints[] = {"iteration", "checkpoint", "allreduce", "push"};
  if (fault.slows_link()) return concat("rank=", fault.rank, ",iter=", fault.iteration, ",kind=slow,factor=", fault.factor);
  return concat("rank=", fault.rank, ",iter=", fault.iteration, ",kind=",
                fault.kind == FaultInjection::Kind::kCrash ? "crash" : "hang", ",at=",
                kPoints[static_cast<int>(fault.point)]);
}

FaultInjectingTransport::FaultInjectingTransport(Transport& inner, FaultInjection::Point point, int fire_on,
                                                 std::function<void()> fire)
    : inner_(inner), point_(point), fire_on_(fire_on), fire_(std::move(fire)) {}

void FaultInjectingTransport::arm(std::uint64_t minimum) {
  minimum_.store(minimum, std::memory_order_relaxed);
  armed_.store(true, std::memory_order_release);
}

bool FaultInjectingTransport::targeted(Tag tag, std::span<const std::byte> bytes) const {
  const TagFields fields = decode_tag(tag);
  const std::uint64_t minimum = minimum_.load(std::memory_order_relaxed);
  if (point_ == FaultInjection::Point::kAllreduce) {
    return fields.channel == static_cast<unsigned>(Channel::kGradients) && fields.sequence >= minimum;
  }
  if (point_ != FaultInjection::Point::kPush || fields.channel != static_cast<unsigned>(Channel::kParameterServer) ||
      fields.step != 0) {
    return false;
  }
  const std::optional<std::uint64_t> version = push_version_of_request(bytes);
  return version && *version >= minimum;
}

Request FaultInjectingTransport::send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) {
  if (armed_.load(std::memory_order_acquire) && !fired() && targeted(tag, bytes) &&
      counted_.fetch_add(1, std::memory_order_acq_rel) + 1 == fire_on_) {
    fired_.store(true, std::memory_order_release);
    fire_();  // does not return
    throw InjectedFault{};
  }
  return inner_.send(peer, tag, bytes, operation);
}

}  // namespace pipesgd
