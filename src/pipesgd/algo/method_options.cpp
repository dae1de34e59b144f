#include "pipesgd/algo/method_options.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

void OptionValues::erase(std::string_view flag) {
  const auto found = values_.find(flag);
  if (found != values_.end()) values_.erase(found);
}

std::string OptionValues::text(std::string_view flag, const std::string& fallback) const {
  const auto found = values_.find(flag);
  return found == values_.end() ? fallback : found->second;
}

std::int64_t OptionValues::integer(std::string_view flag, std::int64_t fallback) const {
  const auto found = values_.find(flag);
  if (found == values_.end()) return fallback;
  const std::string& text = found->second;
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw UsageError(concat(flag, ": '", text, "' is not an integer"));
  }
  return value;
}

double OptionValues::real(std::string_view flag, double fallback) const {
  const auto found = values_.find(flag);
  if (found == values_.end()) return fallback;
  const std::string& text = found->second;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError(concat(flag, ": '", text, "' is not a number"));
  }
  return value;
}

std::size_t MethodOptions::default_segment_bytes() const { return kDefaultSegmentBytes; }

std::int64_t MethodOptions::steady_state_start(std::int64_t warmup_iterations) const {
  const std::optional<DeferredPhase> phase = deferred_phase(warmup_iterations);
  return phase ? phase->start : warmup_iterations;
}

}  // namespace pipesgd
