#pragma once
// Cost model of the allreduce algorithms (MG-WFBP paper Sec. II.D, Table II; the ring is Pipe-SGD
// Eq. 5 without the synchronisation term S), its fit to measured timings, the calibration file that
// stores the result, and the choice of an algorithm from it.
//
// Every algorithm costs T(M) = a + b·M for a message of M bytes on p ranks (MG-WFBP Eq. 9), and a
// and b are linear in the link parameters: T(M) = messages·α + transferred·M·β + reduced·M·γ, with
// the three coefficients of allreduce_coefficients(). The cost functions and the fit both use those
// coefficients, so they cannot disagree. Each algorithm's coefficients are its entry of the list
// of algorithms (collective/allreduce_algorithms.h, a header without dependencies; the entries are
// beside their classes, collective/*_allreduce.cpp); the table below is what they compute.
//
// Table II assumes p is a power of two. For any p >= 2 (q = the largest power of two <= p,
// r = p - q, [r>0] = 1 if r > 0 else 0):
//   algorithm            messages             transferred          reduced
//   ring                 2(p-1)               2(p-1)/p             (p-1)/p
//   recursive-doubling   log2 q + 2[r>0]      log2 q + 2[r>0]      log2 q + [r>0]
//   halving-doubling     2 log2 q + 2[r>0]    2(q-1)/q + 2[r>0]    (q-1)/q + [r>0]
//   tree                 2d                   2d                   d,  d = floor(log2 p)
// * ring: Table II and Eq. 5 as they are; exact for every p.
// * recursive-doubling, halving-doubling: the r extra ranks are folded in, as
//   collective/recursive_doubling_allreduce.h and halving_doubling_allreduce.h do. Before the
//   power-of-two algorithm each extra rank sends its whole vector to a partner, which adds it
//   (α + βM + γM); after it the partner sends the whole result back (α + βM). The q-rank algorithm
//   runs in between with Table II's cost for q.
// * tree: d = floor(log2 p) = ceil(log2(p+1)) - 1 is the depth of the heap-shaped binary tree of
//   collective/tree_allreduce.h (rank i's children are 2i+1 and 2i+2): a reduce up to rank 0, one
//   whole-vector message per level (α + βM + γM), then a broadcast down, one per level (α + βM).
//   As Table II does for powers of two, a level costs one message time even where a rank has two
//   children (their messages are in flight at the same time), and d = log2 p for p = 2^k. So p = 3
//   costs what p = 2 does, and p = 5..7 what p = 4 does. (The implementation also segments and
//   pipelines large vectors, which this per-level model does not describe; a calibration's
//   measured a + b·M for "tree" is preferred where it applies, see choose_allreduce_algorithm.)
//   direct              as ring: the same 2(p-1) messages and bytes per rank, sent p-1 at a time in
//                       two rounds. A serial NIC pays them one after another, so the alpha-beta
//                       model cannot tell it from the ring; what it saves is the ring's chain of
//                       2(p-1) dependent hand-offs, which only a measured a + b*M (calibration)
//                       shows. Model ties go to the earlier name, i.e. to the ring.
// p = 1 costs 0 for every algorithm.
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipesgd/collective/allreduce_algorithms.h"

namespace pipesgd {

// Link parameters of the point-to-point model α + β·M (plus γ·M where the bytes are summed).
struct LinkParameters {
  double alpha = 0;  // seconds per message (latency, including the receiver's wake-up)
  double beta = 0;   // seconds per byte transferred
  double gamma = 0;  // seconds per byte reduced (summed into the local vector)
};

// T(M) = a + b·M, in seconds for M bytes (MG-WFBP Eq. 9).
struct LinearCost {
  double a = 0;  // seconds
  double b = 0;  // seconds per byte
  double time(double bytes) const { return a + b * bytes; }
};

// AllreduceCoefficients (collective/allreduce_algorithms.h): T(M) = messages·α + transferred·M·β +
// reduced·M·γ on the critical path of one allreduce.

// Every allreduce algorithm (allreduce_algorithm_names(), collective/allreduce_algorithms.h):
// "ring", "recursive-doubling", "halving-doubling", "tree", "direct", in that order.
std::vector<std::string> cost_model_algorithm_names();
bool is_cost_model_algorithm(std::string_view algorithm);

// The coefficients above for `algorithm` on `world_size` ranks; all zero for world_size 1.
// Throws UsageError for an unknown algorithm (the message lists the known names) or world_size < 1.
AllreduceCoefficients allreduce_coefficients(std::string_view algorithm, int world_size);

// The allreduce's a + b·M from the link parameters (Table II, generalised as described above).
// Throws as allreduce_coefficients().
LinearCost allreduce_cost(std::string_view algorithm, int world_size, const LinkParameters& link);

// Defaults when no calibration file is given, of the order measured on LocalTransport without link
// emulation (4 ranks sharing 2 cores, git show d620cdd:docs/results.md): α = 20 us (a message hand-off and the
// receiving thread's wake-up on a busy machine), β = 0.4 ns/byte (2.5 GB/s per copy), γ = 0.25
// ns/byte (4 GB/s fp32 summation). Ring over 4 ranks: about 0.12 ms for 4 KiB, 13 ms for 16 MiB.
LinkParameters default_link_parameters();

// ---------------------------------------------------------------------------------------------
// Fitting measured timings.

// One measured allreduce: `seconds` for `bytes` per rank over `world_size` ranks.
struct TimingSample {
  std::string algorithm;
  int world_size = 0;
  double bytes = 0;
  double seconds = 0;
};

// What a fit minimises. relative: sum over samples of ((predicted - measured) / measured)^2, so
// every sample counts the same whatever its size (microsecond messages are not drowned by
// millisecond ones, and a few large sizes that fall off the cache do not drag the whole fit).
// absolute: sum of (predicted - measured)^2, the plain least squares (for comparison).
enum class ResidualWeighting { relative, absolute };

struct LinkFit {
  LinkParameters link;
  std::vector<double> predicted_seconds;   // per sample, in the order given
  std::vector<double> relative_residuals;  // per sample: (predicted - measured) / measured
  double rms_relative_residual = 0;        // sqrt(mean of relative_residuals^2)
  // False when the samples do not determine α, β and γ separately (their coefficient columns are
  // linearly dependent, e.g. only algorithms whose bytes are transferred and reduced in the same
  // 2:1 proportion, which cannot tell β from γ). `link` is then one of the equally good fits: the
  // one with the fewest non-zero parameters, setting γ to zero before β before α. Its predictions
  // for the sampled algorithms are as good as any other's.
  bool unique = true;
  std::string ambiguity;  // one line saying what cannot be told apart; empty when unique
};

// Least squares of the Table II model against all samples (any mix of algorithms and world
// sizes), weighted as given, subject to α, β, γ >= 0. The non-negative problem is solved exactly:
// the unconstrained optimum over every subset of the parameters (the others held at zero) is
// computed and the best one with no negative parameter is kept.
// Throws DataError for fewer than 3 samples or a sample that is not usable (world size < 2, bytes
// negative or not finite, time not positive or not finite, unknown algorithm), naming the sample.
LinkFit fit_link_parameters(std::span<const TimingSample> samples,
                            ResidualWeighting weighting = ResidualWeighting::relative);

// a + b·M fitted directly to samples of one algorithm and one world size (same weighting and
// method as above, a, b >= 0). Throws UsageError if the samples mix algorithms or world sizes,
// DataError for fewer than two distinct message sizes or an unusable sample.
LinearCost fit_linear_cost(std::span<const TimingSample> samples_of_one_algorithm,
                           ResidualWeighting weighting = ResidualWeighting::relative);

// ---------------------------------------------------------------------------------------------
// Calibration file.

// The result of calibrating one transport. JSON, e.g.
//   {"format": "pipesgd-allreduce-calibration/1", "transport": "local", "world_size": 4,
//    "link": {"alpha": 2e-05, "beta": 4e-10, "gamma": 2.5e-10},
//    "measured": {"ring": {"a": 0.00012, "b": 7.9e-10}},
//    "samples": [{"algorithm": "ring", "world_size": 4, "bytes": 4096, "seconds": 0.00015}]}
// "measured" and "samples" may be omitted (empty); every other field is required, and unknown
// fields are rejected. Parameters and times are seconds and bytes.
struct Calibration {
  std::string transport;                       // which transport was measured, e.g. "local"
  int world_size = 1;                          // ranks of the calibration run, >= 1
  LinkParameters link;                         // all >= 0
  std::map<std::string, LinearCost> measured;  // per algorithm, at world_size; a, b >= 0
  std::vector<TimingSample> samples;           // the raw timings (any world sizes >= 1)
};

inline constexpr const char* kCalibrationFormat = "pipesgd-allreduce-calibration/1";

nlohmann::json to_json(const Calibration& calibration);
// Validates as load_calibration(); `source` names the origin in messages (e.g. a file name).
Calibration calibration_from_json(const nlohmann::json& json, const std::string& source);

// Writes the calibration as JSON with write_file_atomically (core/atomic_file.h), so a reader sees
// the old file or the new one, never a partial one. Throws DataError (naming the file) if the
// calibration is invalid or the file cannot be written, UsageError if the file's directory does not
// exist or is not a directory.
void save_calibration(const Calibration& calibration, const std::string& path);

// Reads and validates a calibration file. Throws DataError with a one-line message naming the file
// and the problem: missing or unreadable file, not JSON, wrong "format", a missing, mistyped,
// negative or non-finite field, world size < 1, an unknown algorithm or field.
Calibration load_calibration(const std::string& path);

// ---------------------------------------------------------------------------------------------
// Choosing an algorithm.

// Predicted seconds of `algorithm` for `bytes` on `world_size` ranks. If the calibration was made
// at this world size: between two sizes it measured for this algorithm, the measured times
// interpolated linearly in log(bytes) and log(time) (exact at the measured sizes); outside them, its
// measured a + b·M; else the model of allreduce_cost() with the calibration's link parameters.
double predict_allreduce_seconds(const Calibration& calibration, std::string_view algorithm,
                                 int world_size, double bytes);

// The candidate with the least predicted time. Ties (equal predicted times, e.g. every candidate
// at world size 1) go to the candidate that comes first in `candidates`, so the choice is
// deterministic. Throws UsageError for no candidates, an unknown candidate, world_size < 1 or bytes
// negative or not finite.
std::string choose_allreduce_algorithm(const LinkParameters& link, int world_size, double bytes,
                                       std::span<const std::string> candidates);
std::string choose_allreduce_algorithm(const Calibration& calibration, int world_size, double bytes,
                                       std::span<const std::string> candidates);

}  // namespace pipesgd
