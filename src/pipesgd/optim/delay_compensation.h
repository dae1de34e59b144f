#pragma once
// DC-ASGD's compensation of a delayed gradient (OD-SGD paper Eq. 4-6, after Zheng et al., "Asynchronous
// SGD with delay compensation"). A gradient g = g(w_then) computed on weights w_then is applied to
// weights w_now that have moved on; the first-order Taylor correction, with the Hessian
// approximated by lambda * g (.) g, gives the compensated gradient
//   constant (DC-ASGD-c, Eq. 4):  g~ = g + lambda * g (.) g (.) (w_now - w_then)
//   adaptive (DC-ASGD-a, Eq. 5-6): MeanSquare = m * MeanSquare + (1 - m) * g (.) g   (updated first)
//                                 g~ = g + lambda / sqrt(MeanSquare + epsilon) (.) g (.) g (.) (w_now - w_then)
// (.) is the element-wise product. The update is then an ordinary optimizer step with g~ in place of
// g (Eq. 4-5: w_now <- w_now - eta * g~). MeanSquare starts at zero and is kept per element.
//
// One object per updater (a server shard, a worker's local updater); not thread-safe.
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace pipesgd {

class CheckpointWriter;
class CheckpointReader;

enum class DelayCompensationVariant { kConstant, kAdaptive };

// lambda's default per variant, the DC-ASGD paper's recommended values as OD-SGD paper uses them:
// 0.04 for DC-ASGD-c (Sec. 4.2, 4.3), 2 for DC-ASGD-a (Sec. 4.3, 4.4).
inline constexpr float kConstantDefaultLambda = 0.04f;
inline constexpr float kAdaptiveDefaultLambda = 2.0f;
constexpr float default_lambda(DelayCompensationVariant variant) {
  return variant == DelayCompensationVariant::kConstant ? kConstantDefaultLambda : kAdaptiveDefaultLambda;
}

struct DelayCompensationOptions {
  DelayCompensationVariant variant = DelayCompensationVariant::kConstant;
  float lambda = kConstantDefaultLambda;  // default_lambda(variant)
  float mean_square_decay = 0.95f;   // m of Eq. 6 (adaptive only)
  float epsilon = 1e-7f;             // Eq. 5's epsilon
};

// "c" or "a". Throws UsageError naming `name` (the option that gave it) otherwise.
DelayCompensationVariant parse_delay_compensation_variant(const std::string& text,
                                                          const char* name = "delay compensation variant");

// The names check_delay_compensation gives lambda and m in its messages (see optim/sgd.h).
struct DelayCompensationNames {
  const char* lambda = "delay compensation lambda";
  const char* mean_square_decay = "delay compensation m (the mean square's decay)";
};
// Throws UsageError for a negative or non-finite lambda, m outside [0, 1) or epsilon <= 0.
void check_delay_compensation(const DelayCompensationOptions& options, const DelayCompensationNames& names = {});
const char* variant_name(DelayCompensationVariant variant);  // "c" | "a"

class DelayCompensation {
 public:
  // Throws UsageError for a negative or non-finite lambda, m outside [0, 1) or epsilon <= 0.
  DelayCompensation(std::size_t count, DelayCompensationOptions options);

  // Writes g~ of elements [offset, offset + gradient.size()) into `compensated`. `current` holds
  // w_now and `stale` w_then of the same elements. `compensated` may alias `gradient`; neither may
  // alias `current` or `stale`. Adaptive: also advances MeanSquare of those elements.
  void compensate(std::span<const float> gradient, std::span<const float> current,
                  std::span<const float> stale, std::span<float> compensated, std::size_t offset = 0);

  const DelayCompensationOptions& options() const { return options_; }
  std::span<const float> mean_square() const { return mean_square_; }
  // Checkpoints: MeanSquare (adaptive) as section `prefix` + "dc.mean_square"; nothing for the
  // constant variant. load_state throws DataError if the section is missing or of another size.
  void save_state(CheckpointWriter& out, const std::string& prefix) const;
  void load_state(const CheckpointReader& in, const std::string& prefix);

 private:
  DelayCompensationOptions options_;
  std::vector<float> mean_square_;  // adaptive only (empty for constant)
};

}  // namespace pipesgd
