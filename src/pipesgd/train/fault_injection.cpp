#include "pipesgd/train/fault_injection.h"

#include <charconv>
#include <set>

#include "pipesgd/core/error.h"

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
                              "' (form: rank=R,iter=N,kind=crash|hang)"));
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
      } else {
        throw UsageError(concat("--inject-fault: kind must be crash or hang, got '", value, "'"));
      }
    } else if (key == "at") {
      if (value == "iteration") {
        fault.during_checkpoint = false;
      } else if (value == "checkpoint") {
        fault.during_checkpoint = true;
      } else {
        throw UsageError(concat("--inject-fault: at must be iteration or checkpoint, got '", value, "'"));
      }
    } else {
      throw UsageError(concat("--inject-fault: unknown key '", key, "' (keys: rank, iter, kind, at)"));
    }
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  for (const char* key : {"rank", "iter", "kind"}) {
    if (!seen.count(key)) throw UsageError(concat("--inject-fault: '", key, "' is missing (form: rank=R,iter=N,kind=crash|hang)"));
  }
  return fault;
}

}  // namespace pipesgd
