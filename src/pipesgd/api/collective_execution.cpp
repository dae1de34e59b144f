// A negotiated collective run over its process set (collective_execution.h).
#include "pipesgd/api/collective_execution.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

std::span<std::byte> bytes_of(torch::Tensor& contiguous) {
  return {static_cast<std::byte*>(contiguous.data_ptr()),
          static_cast<std::size_t>(contiguous.numel()) * contiguous.element_size()};
}

std::string describe(const torch::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  return concat("a ", c10::toString(tensor.scalar_type()), " tensor on ", tensor.device().str());
}

bool is_integral(c10::ScalarType type) { return c10::isIntegralType(type, /*includeBool=*/false); }

// Horovod's CPU scaling: integers in float64 (then truncated), float16/bfloat16 in float32.
void scale(torch::Tensor& tensor, double factor) {
  if (factor == 1.0 || tensor.numel() == 0) return;
  const c10::ScalarType type = tensor.scalar_type();
  if (is_integral(type)) {
    tensor.copy_(tensor.to(torch::kFloat64).mul_(factor));
  } else if (type == torch::kFloat16 || type == torch::kBFloat16) {
    tensor.copy_(tensor.to(torch::kFloat32).mul_(factor));
  } else {
    tensor.mul_(factor);
  }
}

// After a Sum over `members`: Average divides (integers truncate toward zero), then postscale.
void finish_reduction(torch::Tensor& tensor, ReduceOp op, double postscale, std::size_t members) {
  if (op == ReduceOp::kAverage && tensor.numel() > 0) {
    const auto n = static_cast<double>(members);
    if (is_integral(tensor.scalar_type())) {
      if (postscale == 1.0) {
        tensor.div_(static_cast<std::int64_t>(members), "trunc");
      } else {
        scale(tensor, postscale / n);
      }
      return;
    }
    if (tensor.scalar_type() == torch::kFloat16 || tensor.scalar_type() == torch::kBFloat16) {
      tensor.copy_(tensor.to(torch::kFloat32).div_(n).mul_(postscale));
    } else {
      tensor.div_(n);
      scale(tensor, postscale);
    }
    return;
  }
  scale(tensor, postscale);
}

ElementwiseReduction elementwise(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return ElementwiseReduction::kMin;
    case ReduceOp::kMax: return ElementwiseReduction::kMax;
    case ReduceOp::kProduct: return ElementwiseReduction::kProduct;
    default: return ElementwiseReduction::kSum;
  }
}

Tag part_tag(std::uint64_t number, int part) { return collective_tag(Channel::kCollectives, number * 4 + part); }

// A contiguous tensor the collective may overwrite: `output` itself when it is `input` and
// contiguous (in place), else a fresh copy of `input`.
torch::Tensor working_copy(const Collective& call) {
  if (call.output.defined() && call.output.is_same(call.input) && call.input.is_contiguous()) return call.input;
  return call.input.contiguous().clone();
}

// Reduces `work` in place over the group (Sum before Average, or Min, Max, Product).
void reduce_in_place(torch::Tensor& work, ReduceOp op, Transport& group, std::uint64_t number, Timeout timeout,
                     SetResources& resources) {
  if (group.size() == 1 || work.numel() == 0) return;
  const c10::ScalarType type = work.scalar_type();
  if (type == torch::kFloat32 && (op == ReduceOp::kSum || op == ReduceOp::kAverage)) {
    const std::span<float> data(work.data_ptr<float>(), static_cast<std::size_t>(work.numel()));
    if (!resources.codec) resources.codec = make_codec("none");
    AllreduceOptions options;
    options.timeout = timeout;
    if (data.size() > SetResources::kCachedRingElements) {
      make_allreduce("ring", group, data.size(), *resources.codec, options)->run(data, part_tag(number, 0));
      return;
    }
    if (!resources.ring || resources.ring_count < data.size()) {
      resources.ring.reset();  // its buffers go before the larger one's come
      resources.ring = make_allreduce("ring", group, data.size(), *resources.codec, options);
      resources.ring_count = data.size();
    }
    resources.ring->run(data, part_tag(number, 0));
    return;
  }
  reduce_all(group, bytes_of(work), element_type_of(type, "allreduce"), elementwise(op), part_tag(number, 0), timeout);
}

torch::Tensor into_output(const Collective& call, torch::Tensor& work) {
  if (!call.output.defined()) return work;
  if (!call.output.is_same(work)) call.output.copy_(work);
  return call.output;
}

// Every member's int64 value, in member order.
std::vector<std::int64_t> gather_counts(Transport& group, std::int64_t own, std::uint64_t number, int part,
                                        Timeout timeout) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(group.size()));
  const std::vector<std::size_t> sizes(static_cast<std::size_t>(group.size()), sizeof(std::int64_t));
  gather_all(group, std::as_bytes(std::span(&own, 1)), sizes, std::as_writable_bytes(std::span(counts)),
             part_tag(number, part), timeout);
  return counts;
}

std::int64_t row_elements(const torch::Tensor& tensor) {
  std::int64_t elements = 1;
  for (std::int64_t d = 1; d < tensor.dim(); ++d) elements *= tensor.size(d);
  return elements;
}

}  // namespace

ElementType element_type_of(c10::ScalarType type, const char* call) {
  switch (type) {
    case torch::kUInt8: return ElementType::kUInt8;
    case torch::kInt8: return ElementType::kInt8;
    case torch::kInt16: return ElementType::kInt16;
    case torch::kInt32: return ElementType::kInt32;
    case torch::kInt64: return ElementType::kInt64;
    case torch::kFloat16: return ElementType::kFloat16;
    case torch::kBFloat16: return ElementType::kBFloat16;
    case torch::kFloat32: return ElementType::kFloat32;
    case torch::kFloat64: return ElementType::kFloat64;
    case torch::kBool: return ElementType::kBool;
    default:
      throw UsageError(concat(call, ": dtype ", c10::toString(type), " is not supported (uint8, int8, int16, int32, "
                              "int64, float16, bfloat16, float32, float64, bool)"));
  }
}

c10::ScalarType scalar_type_of(ElementType type) {
  switch (type) {
    case ElementType::kUInt8: return torch::kUInt8;
    case ElementType::kInt8: return torch::kInt8;
    case ElementType::kInt16: return torch::kInt16;
    case ElementType::kInt32: return torch::kInt32;
    case ElementType::kInt64: return torch::kInt64;
    case ElementType::kFloat16: return torch::kFloat16;
    case ElementType::kBFloat16: return torch::kBFloat16;
    case ElementType::kFloat32: return torch::kFloat32;
    case ElementType::kFloat64: return torch::kFloat64;
    case ElementType::kBool: return torch::kBool;
  }
  return torch::kFloat32;
}

void check_collective(Collective& call, int size) {
  const char* what = collective_kind_name(call.kind);
  const bool takes_tensor = call.kind == CollectiveKind::kAllreduce || call.kind == CollectiveKind::kAllgather ||
                            call.kind == CollectiveKind::kBroadcast || call.kind == CollectiveKind::kAlltoall ||
                            call.kind == CollectiveKind::kReducescatter;
  if (takes_tensor) {
    if (!call.input.defined() || !call.input.device().is_cpu()) {
      throw UsageError(concat(what, ": expected a CPU tensor, got ", describe(call.input)));
    }
    element_type_of(call.input.scalar_type(), what);
    call.input = call.input.detach();
    if (call.output.defined()) {
      if (!call.output.device().is_cpu() || call.output.scalar_type() != call.input.scalar_type() ||
          !call.output.sizes().equals(call.input.sizes())) {
        throw UsageError(concat(what, ": the output must be a CPU tensor of the input's dtype and shape, got ",
                                describe(call.output)));
      }
      call.output = call.output.detach();
    }
  }
  if (call.kind == CollectiveKind::kAllreduce || call.kind == CollectiveKind::kReducescatter) {
    if (call.op == ReduceOp::kAdasum) {
      throw UsageError(concat(what, ": op Adasum is not supported (Sum, Average, Min, Max or Product)"));
    }
    const bool boolean = call.input.scalar_type() == torch::kBool;
    if (boolean && (call.op == ReduceOp::kAverage || call.prescale != 1.0 || call.postscale != 1.0)) {
      throw UsageError(concat(what, ": a bool tensor takes Sum, Min, Max or Product without scale factors"));
    }
  }
  if (call.kind == CollectiveKind::kReducescatter && call.input.dim() == 0) {
    throw UsageError("reducescatter: a scalar (0-dimensional) tensor cannot be scattered");
  }
  if (call.kind == CollectiveKind::kAlltoall) {
    if (call.input.dim() == 0) throw UsageError("alltoall: a scalar (0-dimensional) tensor cannot be split");
    if (!call.splits.empty()) {
      std::int64_t total = 0;
      for (const std::int64_t split : call.splits) {
        if (split < 0) throw UsageError(concat("alltoall: splits must be >= 0, got ", split));
        total += split;
      }
      if (total != call.input.size(0)) {
        throw UsageError(concat("alltoall: splits sum to ", total, ", the tensor's first dimension is ",
                                call.input.size(0)));
      }
    }
  }
  if (call.kind == CollectiveKind::kAddProcessSet) {
    std::sort(call.ranks.begin(), call.ranks.end());  // empty: a set no collective can use (Horovod allows it)
    if (std::adjacent_find(call.ranks.begin(), call.ranks.end()) != call.ranks.end()) {
      throw UsageError("add_process_set: a rank is listed twice");
    }
    if (!call.ranks.empty() && (call.ranks.front() < 0 || call.ranks.back() >= size)) {
      throw UsageError(concat("add_process_set: ranks must be in 0..", size - 1));
    }
  }
}

std::vector<torch::Tensor> run_collective(const Collective& call, Transport& group, const std::vector<int>& members,
                                          std::uint64_t number, Timeout timeout, SetResources& resources) {
  const std::size_t n = members.size();
  const int me = group.rank();
  switch (call.kind) {
    case CollectiveKind::kBarrier:
    case CollectiveKind::kJoin:
    case CollectiveKind::kAddProcessSet:
    case CollectiveKind::kRemoveProcessSet:
      return {};  // the round that agreed on it is the barrier
    case CollectiveKind::kAllreduce: {
      torch::Tensor work = working_copy(call);
      scale(work, call.prescale);
      reduce_in_place(work, call.op, group, number, timeout, resources);
      finish_reduction(work, call.op, call.postscale, n);
      return {into_output(call, work)};
    }
    case CollectiveKind::kBroadcast: {
      torch::Tensor work = working_copy(call);
      const int root = static_cast<int>(std::find(members.begin(), members.end(), call.root) - members.begin());
      if (n > 1 && work.numel() > 0) broadcast_bytes(group, bytes_of(work), root, part_tag(number, 0), timeout);
      return {into_output(call, work)};
    }
    case CollectiveKind::kAllgather: {
      torch::Tensor work = call.input.dim() == 0 ? call.input.reshape({1}).contiguous() : call.input.contiguous();
      const std::vector<std::int64_t> rows = gather_counts(group, work.size(0), number, 0, timeout);
      const std::size_t row_bytes = static_cast<std::size_t>(row_elements(work)) * work.element_size();
      std::vector<std::size_t> byte_counts(n);
      std::vector<std::int64_t> shape(work.sizes().begin(), work.sizes().end());
      shape[0] = 0;
      for (std::size_t r = 0; r < n; ++r) {
        byte_counts[r] = static_cast<std::size_t>(rows[r]) * row_bytes;
        shape[0] += rows[r];
      }
      torch::Tensor result = torch::empty(shape, work.options());
      gather_all(group, bytes_of(work), byte_counts, bytes_of(result), part_tag(number, 1), timeout);
      return {result};
    }
    case CollectiveKind::kAlltoall: {
      torch::Tensor work = call.input.contiguous();
      std::vector<std::int64_t> splits = call.splits;
      if (splits.empty()) {
        if (work.size(0) % static_cast<std::int64_t>(n) != 0) {
          throw UsageError(concat("alltoall: the tensor's first dimension ", work.size(0), " is not divisible by the ",
                                  n, " ranks of the process set (give splits)"));
        }
        splits.assign(n, work.size(0) / static_cast<std::int64_t>(n));
      }
      std::vector<std::int64_t> received(n);
      const std::vector<std::size_t> words(n, sizeof(std::int64_t));
      exchange_all(group, std::as_bytes(std::span(splits)), words, std::as_writable_bytes(std::span(received)), words,
                   part_tag(number, 0), timeout);
      const std::size_t row_bytes = static_cast<std::size_t>(row_elements(work)) * work.element_size();
      std::vector<std::size_t> send_bytes(n), recv_bytes(n);
      std::vector<std::int64_t> shape(work.sizes().begin(), work.sizes().end());
      shape[0] = 0;
      for (std::size_t r = 0; r < n; ++r) {
        send_bytes[r] = static_cast<std::size_t>(splits[r]) * row_bytes;
        recv_bytes[r] = static_cast<std::size_t>(received[r]) * row_bytes;
        shape[0] += received[r];
      }
      torch::Tensor result = torch::empty(shape, work.options());
      exchange_all(group, bytes_of(work), send_bytes, bytes_of(result), recv_bytes, part_tag(number, 1), timeout);
      torch::Tensor received_splits = torch::tensor(received, torch::kInt64).to(torch::kInt32);
      return {result, received_splits};
    }
    case CollectiveKind::kReducescatter: {
      torch::Tensor work = call.input.contiguous().clone();
      scale(work, call.prescale);
      const std::int64_t rows = work.size(0);
      const std::int64_t base = rows / static_cast<std::int64_t>(n);
      const std::int64_t extra = rows % static_cast<std::int64_t>(n);
      const std::int64_t per_row = row_elements(work);
      std::vector<std::int64_t> counts(n);
      for (std::size_t r = 0; r < n; ++r) counts[r] = (base + (static_cast<std::int64_t>(r) < extra ? 1 : 0)) * per_row;
      std::vector<std::int64_t> shape(work.sizes().begin(), work.sizes().end());
      shape[0] = counts[static_cast<std::size_t>(me)] / std::max<std::int64_t>(per_row, 1);
      if (per_row == 0) shape[0] = base + (me < extra ? 1 : 0);
      torch::Tensor result = torch::empty(shape, work.options());
      if (n == 1) {
        result.copy_(work);
      } else {
        reduce_scatter(group, bytes_of(work), counts, bytes_of(result), element_type_of(work.scalar_type(), "reducescatter"),
                       elementwise(call.op), part_tag(number, 0), timeout);
      }
      finish_reduction(result, call.op, call.postscale, n);
      return {result};
    }
  }
  return {};
}

}  // namespace pipesgd
