#pragma once
// Negotiated, asynchronous collectives of a Worker: Horovod's collectives (allreduce, allgather,
// broadcast, alltoall, reducescatter, barrier, join, process sets) with c10d's handle shape.
//
//   pipesgd::Collective call;
//   call.kind = pipesgd::CollectiveKind::kAllreduce;
//   call.name = "loss";                 // optional; unnamed ones match in the order each rank issues them
//   call.input = tensor;                // any CPU dtype (see below); read when the collective runs
//   call.op = pipesgd::ReduceOp::kSum;
//   std::shared_ptr<pipesgd::Work> work = worker.submit(call);   // returns at once
//   ... compute ...
//   torch::Tensor total = work->wait()[0];                       // rethrows the collective's error
//
// Negotiation (peers agree before bytes move): a Worker's collectives are handed to its
// communication thread, which agrees with the other workers' on what runs (one exchange of small
// descriptors, a "round", among every worker, repeated while any worker has one pending). A
// collective runs once every member of its process set submitted one of the same name; they must
// agree on kind, dtype, shape (allgather and alltoall: after dimension 0), reduction, root, scale
// factors and process set, else the collective fails on each of them with Horovod's wording
// ("Mismatched ..."), and nothing of it is sent. Collectives run one at a time in an order every
// worker reads from the rounds, so collectives of overlapping process sets never cross. A
// collective that some member does not submit fails after WorldOptions::timeout (CommTimeoutError
// naming the ranks), or after the stall limit (5 s) when every worker is waiting on a collective no
// peer will submit. Worker::new_phase() begins a new phase: names are matched within a phase, and
// a collective of an earlier phase that not every member submitted fails as soon as a member has
// begun a later phase.
//
// Types: uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64 and bool (allreduce
// of bool: Sum/Max = or, Min/Product = and). Reductions: Sum, Average, Min, Max, Product; Adasum is
// a UsageError. Integers: Average truncates toward zero; scale factors multiply in float64 and
// truncate (float16/bfloat16 in float32), as Horovod does on the CPU. Results are bit-identical on
// every member.
//
// Join (uneven inputs, Horovod's hvd.join): a joined worker takes part in the collectives its peers
// still run, as if it had submitted them: an allreduce (Sum or Average; Average divides by the set's
// size) with zeros, a barrier; an allgather, broadcast, alltoall or reducescatter that needs it fails
// on the others (a RuntimeError in Python). join completes when every worker joined; its result is
// the rank that joined last (the highest rank among those that joined in the same round).
//
// Threads: submit() from the thread that owns the Worker; a Work may be waited on or polled from
// any thread. The tensors of a pending collective belong to it until it completed: do not write an
// input or read an in-place output before wait() returned.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pipesgd {

// How allreduce and reducescatter combine the workers' tensors (Horovod's hvd.Sum, ...). Adasum is
// named so that it can be refused with a clear message.
enum class ReduceOp { kSum, kAverage, kMin, kMax, kProduct, kAdasum };
const char* reduce_op_name(ReduceOp op);

enum class CollectiveKind : std::uint8_t {
  kAllreduce,         // input -> [result] (in place into `output` if given)
  kAllgather,         // input -> [every member's input along dimension 0, in member order]
  kBroadcast,         // input (in place into `output` if given) -> [root's input]
  kAlltoall,          // input, splits -> [received rows, received splits (int32)]
  kReducescatter,     // input -> [this member's rows of the reduction]; rows split as evenly as
                      // possible, the first (rows % members) members one more
  kBarrier,           // -> []
  kJoin,              // -> [int64 scalar: the last rank to join]; global set only
  kAddProcessSet,     // ranks -> [int64 scalar: the new set's id]; every worker, global set
  kRemoveProcessSet,  // process_set = the set to remove -> []; every worker, global set
};
const char* collective_kind_name(CollectiveKind kind);

// One collective. Process sets: 0 is every worker; other ids come from kAddProcessSet.
struct Collective {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  std::string name;           // "" = unnamed (matched by order among the unnamed of its process set)
  torch::Tensor input;        // a CPU tensor (kind-dependent; undefined for barrier, join, sets)
  torch::Tensor output;       // allreduce, broadcast: where the result is written (may be `input`);
                              // undefined: a new tensor
  ReduceOp op = ReduceOp::kAverage;  // allreduce, reducescatter
  double prescale = 1.0;      // allreduce, reducescatter: applied to the input before the reduction
  double postscale = 1.0;     // ... and to the result after it
  int root = 0;               // broadcast: the root's rank among all workers (a member of the set)
  std::vector<std::int64_t> splits;  // alltoall: rows to each member in member order (empty: equal)
  int process_set = 0;        // the members; kRemoveProcessSet: the set to remove
  std::vector<int> ranks;     // kAddProcessSet: the new set's workers (distinct, sorted on entry)
};

// The handle of a submitted collective (c10d's Work). Its name stays taken (a second collective of
// that name is a UsageError) until the collective finished and its holder is done with it: wait()
// returned or threw, or the Work was destroyed.
class Work {
 public:
  struct State;
  explicit Work(std::shared_ptr<State> state);
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  // Non-blocking: true once the collective completed or failed.
  bool is_completed() const;
  // Blocks until the collective completed (every wait inside it has the world's timeout) and
  // returns its results, or rethrows its error (UsageError, CommError; a mismatch between the
  // ranks is a CollectiveMismatchError).
  const std::vector<torch::Tensor>& wait();
  const std::string& name() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace pipesgd
