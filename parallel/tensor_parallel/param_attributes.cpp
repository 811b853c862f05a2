// The parameter-attribute registry: a mutex-protected map from TensorImpl* to attributes. Each entry also holds a
// weak reference to its TensorImpl, so an entry whose tensor is gone is never taken for a new tensor at the same
// address; such entries are pruned as the map grows.
#include "parallel/tensor_parallel/param_attributes.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "parallel/parallel_state.h"

namespace bridge::parallel::tensor_parallel {
namespace {

struct Entry {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  ParamAttributes attributes;
};

class Registry {
 public:
  void set(const torch::Tensor& param, const ParamAttributes& attributes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() >= prune_at_) prune();
    c10::TensorImpl* key = param.unsafeGetTensorImpl();
    entries_.insert_or_assign(key,
                              Entry{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()), attributes});
  }

  ParamAttributes get(const torch::Tensor& param) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = entries_.find(param.unsafeGetTensorImpl());
    if (found == entries_.end()) return {};
    if (found->second.tensor.expired()) {
      entries_.erase(found);
      return {};
    }
    return found->second.attributes;
  }

 private:
  // Amortised: a full sweep only after the map has doubled since the last one.
  void prune() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.tensor.expired() ? entries_.erase(it) : std::next(it);
    }
    prune_at_ = std::max<std::size_t>(kMinPruneAt, 2 * entries_.size());
  }

  static constexpr std::size_t kMinPruneAt = 64;
  std::mutex mutex_;
  std::unordered_map<c10::TensorImpl*, Entry> entries_;
  std::size_t prune_at_ = kMinPruneAt;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: parameters may outlive static destruction
  return *instance;
}

void check_defined(const torch::Tensor& param, const char* where) {
  if (!param.defined()) {
    throw std::invalid_argument(std::string(where) + ": the parameter is an undefined tensor");
  }
}

}  // namespace

void set_param_attributes(const torch::Tensor& param, ParamAttributes attributes) {
  check_defined(param, "set_param_attributes");
  if (attributes.tensor_model_parallel && (attributes.partition_dim < 0 || attributes.partition_dim >= param.dim())) {
    throw std::invalid_argument("set_param_attributes: partition_dim " + std::to_string(attributes.partition_dim) +
                                " is not a dimension of a " + std::to_string(param.dim()) +
                                "-d tensor-model-parallel parameter");
  }
  if (attributes.partition_stride < 1) {
    throw std::invalid_argument("set_param_attributes: partition_stride must be >= 1, got " +
                                std::to_string(attributes.partition_stride));
  }
  registry().set(param, attributes);
}

ParamAttributes get_param_attributes(const torch::Tensor& param) {
  check_defined(param, "get_param_attributes");
  return registry().get(param);
}

bool param_is_tensor_parallel_duplicate(const torch::Tensor& param) {
  const ParamAttributes attributes = get_param_attributes(param);
  if (attributes.tensor_model_parallel) return false;
  // The expert groups are read only for an expert parameter: a dense run needs nothing beyond the dense ones.
  return (attributes.allreduce ? get_tensor_model_parallel_rank() : get_expert_tensor_parallel_rank()) != 0;
}

bool is_expert_parallel_param(const torch::Tensor& param) { return !get_param_attributes(param).allreduce; }

bool expert_parallel_groups_in_use() {
  return model_parallel_is_initialized() &&
         (get_expert_model_parallel_world_size() > 1 ||
          get_expert_tensor_parallel_world_size() != get_tensor_model_parallel_world_size());
}

bool param_is_not_shared(const torch::Tensor& param) { return !get_param_attributes(param).shared_embedding; }

void mark_sequence_parallel(const torch::nn::Module& module) {
  for (const torch::Tensor& param : module.parameters()) {
    ParamAttributes attributes = get_param_attributes(param);
    attributes.sequence_parallel = true;
    set_param_attributes(param, attributes);
  }
}

}  // namespace bridge::parallel::tensor_parallel
