#pragma once
// One negotiated collective (include/pipesgd/collectives.h) run over its process set's ranks: the
// tensor-level part (dtypes, scale factors, averaging, output shapes) on LibTorch, the messages by
// pipesgd's collective layer (ring allreduce for float32 Sum/Average, typed_collectives.h otherwise).
#include <cstddef>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/collective/typed_collectives.h"
#include "pipesgd/collectives.h"
#include "pipesgd/comm/transport.h"

namespace pipesgd {

// The collective layer's element type of a LibTorch dtype; UsageError naming `call` for the
// dtypes it does not carry (complex, quantized).
ElementType element_type_of(c10::ScalarType type, const char* call);
c10::ScalarType scalar_type_of(ElementType type);

// What a rank can check alone before a collective is negotiated (UsageError, one line): a defined
// CPU tensor where the kind takes one, a supported dtype, the reduction (Adasum refused; Average
// and scale factors not on bool), alltoall's splits (non-negative, summing to dimension 0, or none
// and dimension 0 divisible by the members: checked with the set's size by the engine), a new set's
// ranks (distinct, in 0..size-1), reducescatter not on a scalar.
void check_collective(Collective& call, int size);

// What one process set's collectives keep between calls (the engine holds one per set, used by
// one collective at a time): the ring allreduce of float32 Sum/Average over the set's transport,
// built for the largest count seen up to kCachedRingElements and reused (a ring's buffers are
// several times the tensor: building them for every call costs more than a small allreduce).
struct SetResources {
  static constexpr std::size_t kCachedRingElements = std::size_t{16} << 20;  // 64 MiB of float32
  std::unique_ptr<Codec> codec;
  std::unique_ptr<Allreduce> ring;
  std::size_t ring_count = 0;
};

// Runs `call` on this member of `group` (the set's ranks renumbered 0..n-1; `members` their world
// ranks), collective number `number` (its tags: Channel::kCollectives, sequences 4 * number + k).
// Returns the results as collectives.h lists them. UsageError for what only shows once the peers'
// sizes are known; CommError from the transport.
// `resources`: the set's (its ring must have been built over `group`).
std::vector<torch::Tensor> run_collective(const Collective& call, Transport& group, const std::vector<int>& members,
                                          std::uint64_t number, Timeout timeout, SetResources& resources);

}  // namespace pipesgd
