// The region operators as torch::autograd::Function's. ProcessGroup collectives work in place on contiguous
// tensors, so every reduction runs on a fresh contiguous copy: neither the caller's tensor nor a gradient that
// autograd may still hold is ever overwritten. Operators over an explicit group keep it (and their split sizes) in
// the autograd context for backward.
#include "parallel/tensor_parallel/mappings.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/parallel_state.h"
#include "utils/strings.h"

namespace bridge::parallel::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group of an operator, kept in its autograd context for backward (an IValue holds no plain pointer).
struct GroupHandle : torch::CustomClassHolder {
  explicit GroupHandle(ProcessGroup& member_of) : group(&member_of) {}
  ProcessGroup* group;
};

void save_group(AutogradContext* ctx, ProcessGroup& group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHandle>(group));
}

ProcessGroup& saved_group(AutogradContext* ctx) {
  return *static_cast<GroupHandle*>(ctx->saved_data["group"].toCapsule().get())->group;
}

// Checks split sizes given to a dim-0 gather or reduce-scatter over `group`: one per member, none negative, and
// either this rank's entry equal to `rows` (a gather's input rows) or, for a reduce-scatter, their sum equal to it.
void check_splits(const ProcessGroup& group, const std::vector<int64_t>& splits, int64_t rows, bool gather,
                  const std::string& what) {
  const std::string name = gather ? "output_split_sizes" : "input_split_sizes";
  if (static_cast<int>(splits.size()) != group.size()) {
    throw std::invalid_argument(what + " on group '" + group.name() + "': " + name + " has " +
                                std::to_string(splits.size()) + " entries; give one per group rank (" +
                                std::to_string(group.size()) + "), or none for equal splits");
  }
  int64_t sum = 0;
  for (std::size_t i = 0; i < splits.size(); ++i) {
    if (splits[i] < 0) {
      throw std::invalid_argument(what + " on group '" + group.name() + "': " + name + "[" + std::to_string(i) +
                                  "] is " + std::to_string(splits[i]) + "; split sizes count rows, none negative");
    }
    sum += splits[i];
  }
  const int64_t mine = splits[static_cast<std::size_t>(group.rank())];
  if (gather && mine != rows) {
    throw std::invalid_argument(what + " on group '" + group.name() + "': output_split_sizes[" +
                                std::to_string(group.rank()) + "] (" + std::to_string(mine) +
                                ") must be this rank's input rows (dim 0, " + std::to_string(rows) +
                                "): every rank passes the same split sizes");
  }
  if (!gather && sum != rows) {
    throw std::invalid_argument(what + " on group '" + group.name() + "': input_split_sizes [" +
                                utils::join(splits, ", ") + "] sum to " + std::to_string(sum) +
                                " rows but the input's dim 0 has " + std::to_string(rows));
  }
}

torch::Tensor all_reduce_copy(const torch::Tensor& tensor) {
  torch::Tensor result = tensor.clone(at::MemoryFormat::Contiguous);
  get_tensor_model_parallel_group().all_reduce(result);
  return result;
}

torch::Tensor split_last_dim(const torch::Tensor& tensor) {
  const int tp = get_tensor_model_parallel_world_size();
  const int64_t last = tensor.dim() == 0 ? 0 : tensor.size(-1);
  if (tensor.dim() == 0 || last % tp != 0) {
    throw std::invalid_argument("tensor-parallel split: the last dimension (" + std::to_string(last) +
                                ") must be divisible by the tensor-model-parallel size " + std::to_string(tp));
  }
  return tensor.chunk(tp, -1)[static_cast<std::size_t>(get_tensor_model_parallel_rank())].contiguous();
}

torch::Tensor gather_last_dim(const torch::Tensor& tensor) {
  if (tensor.dim() == 0) throw std::invalid_argument("tensor-parallel gather: the input is a scalar");
  std::vector<torch::Tensor> parts = get_tensor_model_parallel_group().all_gather(tensor.contiguous());
  return torch::cat(parts, -1);
}

torch::Tensor split_first_dim(const torch::Tensor& tensor) {
  const int tp = get_tensor_model_parallel_world_size();
  const int64_t first = tensor.dim() == 0 ? 0 : tensor.size(0);
  if (tensor.dim() == 0 || first % tp != 0) {
    throw std::invalid_argument("sequence-parallel split: the sequence dimension (dim 0, " + std::to_string(first) +
                                ") must be divisible by the tensor-model-parallel size " + std::to_string(tp) +
                                "; with model.sequence_parallel, model.seq_length must be a multiple of tp");
  }
  // A copy, not a view: the full tensor can be freed (Megatron clones the embedding's scatter output for this).
  return tensor.contiguous().chunk(tp, 0)[static_cast<std::size_t>(get_tensor_model_parallel_rank())].clone();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return input; }
  static variable_list backward(AutogradContext*, variable_list grads) { return {all_reduce_copy(grads[0])}; }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return all_reduce_copy(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0]}; }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return split_last_dim(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {gather_last_dim(grads[0])}; }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return gather_last_dim(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {split_last_dim(grads[0])}; }
};

struct ScatterToSequenceRegion : torch::autograd::Function<ScatterToSequenceRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return split_first_dim(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {gather_along_first_dim(grads[0])}; }
};

// This rank's rows of dim 0 (a view): its equal chunk, or its rows of `splits` when given.
torch::Tensor own_rows(const ProcessGroup& group, const torch::Tensor& tensor, const std::vector<int64_t>& splits) {
  if (splits.empty()) return tensor.chunk(group.size(), 0)[static_cast<std::size_t>(group.rank())];
  int64_t offset = 0;
  for (int i = 0; i < group.rank(); ++i) offset += splits[static_cast<std::size_t>(i)];
  return tensor.narrow(0, offset, splits[static_cast<std::size_t>(group.rank())]);
}

struct GatherFromSequenceRegion : torch::autograd::Function<GatherFromSequenceRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, ProcessGroup* group,
                               bool tensor_parallel_output_grad, const std::vector<int64_t>& output_split_sizes) {
    save_group(ctx, *group);
    ctx->saved_data["reduce"] = tensor_parallel_output_grad;
    ctx->saved_data["splits"] = output_split_sizes;
    return gather_along_first_dim(*group, input, output_split_sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ProcessGroup& group = saved_group(ctx);
    const std::vector<int64_t> splits = ctx->saved_data["splits"].toIntVector();
    if (ctx->saved_data["reduce"].toBool()) {
      return {reduce_scatter_along_first_dim(group, grads[0], splits), torch::Tensor(), torch::Tensor(),
              torch::Tensor()};
    }
    return {own_rows(group, grads[0], splits).clone(at::MemoryFormat::Contiguous), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

struct ReduceScatterToSequenceRegion : torch::autograd::Function<ReduceScatterToSequenceRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, ProcessGroup* group,
                               const std::vector<int64_t>& input_split_sizes) {
    save_group(ctx, *group);
    ctx->saved_data["splits"] = input_split_sizes;
    return reduce_scatter_along_first_dim(*group, input, input_split_sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> splits = ctx->saved_data["splits"].toIntVector();
    return {gather_along_first_dim(saved_group(ctx), grads[0], splits), torch::Tensor(), torch::Tensor()};
  }
};

// Megatron's _AllToAll: backward sends the gradient back along the way the forward came, the splits swapped.
struct AllToAll : torch::autograd::Function<AllToAll> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, ProcessGroup* group,
                               const std::vector<int64_t>& output_split_sizes,
                               const std::vector<int64_t>& input_split_sizes) {
    save_group(ctx, *group);
    ctx->saved_data["output_splits"] = output_split_sizes;
    ctx->saved_data["input_splits"] = input_split_sizes;
    return group->all_to_all(input, output_split_sizes, input_split_sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> output_splits = ctx->saved_data["output_splits"].toIntVector();
    const std::vector<int64_t> input_splits = ctx->saved_data["input_splits"].toIntVector();
    return {saved_group(ctx).all_to_all(grads[0], input_splits, output_splits), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

bool single_rank() { return get_tensor_model_parallel_world_size() == 1; }

}  // namespace

torch::Tensor copy_to_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : CopyToRegion::apply(input);
}

torch::Tensor reduce_from_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : ReduceFromRegion::apply(input);
}

torch::Tensor scatter_to_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : ScatterToRegion::apply(input);
}

torch::Tensor gather_from_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : GatherFromRegion::apply(input);
}

torch::Tensor scatter_to_sequence_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : ScatterToSequenceRegion::apply(input);
}

torch::Tensor gather_from_sequence_parallel_region(const torch::Tensor& input, bool tensor_parallel_output_grad) {
  return single_rank() ? input
                       : gather_from_sequence_parallel_region(get_tensor_model_parallel_group(), input,
                                                              tensor_parallel_output_grad);
}

torch::Tensor reduce_scatter_to_sequence_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : reduce_scatter_to_sequence_parallel_region(get_tensor_model_parallel_group(), input);
}

torch::Tensor all_to_all(ProcessGroup& group, const torch::Tensor& input, std::vector<int64_t> output_split_sizes,
                         std::vector<int64_t> input_split_sizes) {
  if (group.size() > 1) return AllToAll::apply(input, &group, output_split_sizes, input_split_sizes);
  // A group of one sends its rows to itself: the splits, when given, are all of them.
  if (input.dim() == 0) {
    throw std::invalid_argument("all_to_all on group '" + group.name() +
                                "': the input is a scalar; splits count rows of dim 0");
  }
  const auto check = [&](const std::vector<int64_t>& splits, const std::string& name) {
    if (!splits.empty() && splits != std::vector<int64_t>{input.size(0)}) {
      throw std::invalid_argument("all_to_all on group '" + group.name() + "': " + name + " must be empty or [" +
                                  std::to_string(input.size(0)) + "]: this group of one sends its input's " +
                                  std::to_string(input.size(0)) + " rows to itself");
    }
  };
  check(output_split_sizes, "output_split_sizes");
  check(input_split_sizes, "input_split_sizes");
  return input;
}

torch::Tensor gather_from_sequence_parallel_region(ProcessGroup& group, const torch::Tensor& input,
                                                   bool tensor_parallel_output_grad,
                                                   std::vector<int64_t> output_split_sizes) {
  if (group.size() == 1) return gather_along_first_dim(group, input, output_split_sizes);  // checks, returns input
  return GatherFromSequenceRegion::apply(input, &group, tensor_parallel_output_grad, output_split_sizes);
}

torch::Tensor reduce_scatter_to_sequence_parallel_region(ProcessGroup& group, const torch::Tensor& input,
                                                         std::vector<int64_t> input_split_sizes) {
  if (group.size() == 1) return reduce_scatter_along_first_dim(group, input, input_split_sizes);
  return ReduceScatterToSequenceRegion::apply(input, &group, input_split_sizes);
}

torch::Tensor gather_along_first_dim(const torch::Tensor& input) {
  return single_rank() ? input : gather_along_first_dim(get_tensor_model_parallel_group(), input);
}

torch::Tensor reduce_scatter_along_first_dim(const torch::Tensor& input) {
  return single_rank() ? input : reduce_scatter_along_first_dim(get_tensor_model_parallel_group(), input);
}

torch::Tensor gather_along_first_dim(ProcessGroup& group, const torch::Tensor& input,
                                     const std::vector<int64_t>& output_split_sizes) {
  if (input.dim() == 0) {
    throw std::invalid_argument("sequence-parallel gather on group '" + group.name() + "': the input is a scalar");
  }
  if (!output_split_sizes.empty()) check_splits(group, output_split_sizes, input.size(0), true, "uneven gather");
  if (group.size() == 1) return input;
  if (output_split_sizes.empty()) return torch::cat(group.all_gather(input.contiguous()), 0);
  // Every member gets all of this rank's rows: the input once per member, laid end to end.
  std::vector<int64_t> repeats(static_cast<std::size_t>(input.dim()), 1);
  repeats[0] = group.size();
  const std::vector<int64_t> input_splits(static_cast<std::size_t>(group.size()), input.size(0));
  return group.all_to_all(input.repeat(repeats), output_split_sizes, input_splits);
}

torch::Tensor reduce_scatter_along_first_dim(ProcessGroup& group, const torch::Tensor& input,
                                             const std::vector<int64_t>& input_split_sizes) {
  const std::string what = "sequence-parallel reduce-scatter on group '" + group.name() + "'";
  if (input.dim() == 0) throw std::invalid_argument(what + ": the input is a scalar");
  if (input_split_sizes.empty()) {
    if (input.size(0) % group.size() != 0) {
      throw std::invalid_argument(what + ": the sequence dimension (dim 0, " + std::to_string(input.size(0)) +
                                  ") must be divisible by the group size " + std::to_string(group.size()) +
                                  ", or give input_split_sizes");
    }
    return group.size() == 1 ? input : group.reduce_scatter(input.contiguous());
  }
  check_splits(group, input_split_sizes, input.size(0), false, "uneven reduce-scatter");
  if (group.size() == 1) return input;
  // Each member gets its rows of every rank's input, in group-rank order, and sums them.
  const int64_t mine = input_split_sizes[static_cast<std::size_t>(group.rank())];
  const std::vector<int64_t> output_splits(static_cast<std::size_t>(group.size()), mine);
  const torch::Tensor received = group.all_to_all(input, output_splits, input_split_sizes);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] = mine;
  sizes.insert(sizes.begin(), group.size());
  return received.view(sizes).sum(0, /*keepdim=*/false, input.scalar_type());
}

}  // namespace bridge::parallel::tensor_parallel
