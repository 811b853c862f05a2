// The RNG tracker: named generator states swapped into the default generators for the lifetime of a ForkGuard.
// Generator mutexes are held while a state is read or replaced, as torch.set_rng_state does.
#include "parallel/tensor_parallel/random.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <stdexcept>
#include <utility>

#include "parallel/parallel_state.h"

namespace bridge::parallel::tensor_parallel {
namespace {

constexpr char kCudaSuffix[] = "@cuda";

bool has_cuda() { return torch::cuda::is_available(); }

at::Generator cpu_generator() { return at::detail::getDefaultCPUGenerator(); }
// The current CUDA device (bind_device made it this rank's); device-generic, so it compiles without CUDA headers.
at::Device current_cuda_device() { return c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice(); }
// A device's default CUDA generator (the hooks' own accessor was renamed in LibTorch 2.x).
at::Generator cuda_generator(const at::Device& device) { return at::globalContext().defaultGenerator(device); }

torch::Tensor swap_state(at::Generator generator, const torch::Tensor& new_state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  torch::Tensor old_state = generator.get_state();
  generator.set_state(new_state);
  return old_state;
}

}  // namespace

RngStatesTracker::ForkGuard::ForkGuard(RngStatesTracker& tracker, std::string name)
    : tracker_(tracker), name_(std::move(name)) {
  std::lock_guard<std::mutex> lock(tracker_.mutex_);
  const auto found = tracker_.states_.find(name_);
  if (found == tracker_.states_.end()) {
    throw std::invalid_argument("RngStatesTracker::fork: no RNG stream named '" + name_ +
                                "'; add it first (model_parallel_manual_seed adds '" + kModelParallelRngTrackerName +
                                "')");
  }
  if (tracker_.forked_.count(name_) != 0) {
    throw std::logic_error("RngStatesTracker::fork: the RNG stream '" + name_ +
                           "' is already forked; end the outer fork before forking it again");
  }
  saved_cpu_ = swap_state(cpu_generator(), found->second);
  const auto cuda = tracker_.states_.find(name_ + kCudaSuffix);
  // The CUDA state belongs to the device it was seeded on, whichever device is current now.
  if (cuda != tracker_.states_.end() && has_cuda()) {
    saved_cuda_ = swap_state(cuda_generator(tracker_.cuda_device_), cuda->second);
  }
  tracker_.forked_.insert(name_);
}

RngStatesTracker::ForkGuard::~ForkGuard() {
  std::lock_guard<std::mutex> lock(tracker_.mutex_);
  // Stored back even if the stream was reset meanwhile: set_states/reset while forked is the caller's choice.
  tracker_.states_[name_] = swap_state(cpu_generator(), saved_cpu_);
  if (saved_cuda_.defined()) {
    tracker_.states_[name_ + kCudaSuffix] = swap_state(cuda_generator(tracker_.cuda_device_), saved_cuda_);
  }
  tracker_.forked_.erase(name_);
}

void RngStatesTracker::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  states_.clear();
  seeds_.clear();
}

void RngStatesTracker::add(const std::string& name, uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (name.empty() || name.find(kCudaSuffix) != std::string::npos) {
    throw std::invalid_argument("RngStatesTracker::add: name '" + name + "' must be non-empty and not contain '" +
                                kCudaSuffix + "'");
  }
  if (states_.count(name) != 0) {
    throw std::invalid_argument("RngStatesTracker::add: an RNG stream named '" + name + "' already exists");
  }
  if (seeds_.count(seed) != 0) {
    throw std::invalid_argument("RngStatesTracker::add: seed " + std::to_string(seed) +
                                " is already used by another stream (for '" + name + "')");
  }
  // A fresh generator seeded with `seed` is in the state the default one would be in after manual_seed(seed).
  states_[name] = at::make_generator<at::CPUGeneratorImpl>(seed).get_state();
  if (has_cuda()) {
    // Megatron's CudaRNGStatesTracker.add: the current device's generator seeded with `seed`, its state kept, the
    // generator restored.
    cuda_device_ = current_cuda_device();
    at::Generator generator = cuda_generator(cuda_device_);
    std::lock_guard<std::mutex> generator_lock(generator.mutex());
    const torch::Tensor original = generator.get_state();
    generator.set_current_seed(seed);
    states_[name + kCudaSuffix] = generator.get_state();
    generator.set_state(original);
  }
  seeds_.insert(seed);
}

bool RngStatesTracker::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return states_.count(name) != 0;
}

std::map<std::string, torch::Tensor> RngStatesTracker::get_states() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, torch::Tensor> states;
  for (const auto& [name, state] : states_) states.emplace(name, state.clone());
  return states;
}

void RngStatesTracker::set_states(const std::map<std::string, torch::Tensor>& states) {
  std::lock_guard<std::mutex> lock(mutex_);
  states_.clear();
  for (const auto& [name, state] : states) states_.emplace(name, state.clone());
}

RngStatesTracker::ForkGuard RngStatesTracker::fork(const std::string& name) { return ForkGuard(*this, name); }

RngStatesTracker& get_rng_tracker() {
  static RngStatesTracker tracker;
  return tracker;
}

RngStates get_all_rng_states() {
  auto state_of = [](at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  };
  RngStates states;
  states.cpu = state_of(cpu_generator());
  if (has_cuda()) states.cuda = state_of(cuda_generator(current_cuda_device()));
  states.tracker = get_rng_tracker().get_states();
  return states;
}

void set_all_rng_states(const RngStates& states) {
  if (states.cpu.defined()) swap_state(cpu_generator(), states.cpu);
  if (states.cuda.defined() && has_cuda()) swap_state(cuda_generator(current_cuda_device()), states.cuda);
  get_rng_tracker().set_states(states.tracker);
}

namespace {

// What the first run of a checkpointed function leaves for backward besides its inputs, kept in the autograd
// context as a capsule (LibTorch's way to hold a C++ object in an IValue).
struct CheckpointState : torch::CustomClassHolder {
  CheckpointedFunction function;
  RngStates rng;
};

// Puts back, when it ends, the RNG states there were when it began.
struct RestoreRngStates {
  RestoreRngStates() : states(get_all_rng_states()) {}
  RestoreRngStates(const RestoreRngStates&) = delete;
  RestoreRngStates& operator=(const RestoreRngStates&) = delete;
  ~RestoreRngStates() { set_all_rng_states(states); }
  RngStates states;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, CheckpointedFunction function,
                                                at::TensorList inputs) {
    auto state = c10::make_intrusive<CheckpointState>();
    state->rng = get_all_rng_states();
    torch::autograd::variable_list outputs;
    {
      torch::NoGradGuard no_grad;
      outputs = function(inputs.vec());
    }
    state->function = std::move(function);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    ctx->save_for_backward(inputs.vec());
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const c10::intrusive_ptr<torch::CustomClassHolder> capsule = ctx->saved_data["state"].toCapsule();
    const auto* state = static_cast<const CheckpointState*>(capsule.get());
    torch::autograd::variable_list inputs = ctx->get_saved_variables();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined()) inputs[i] = inputs[i].detach().requires_grad_(ctx->needs_input_grad(i));
    }
    torch::autograd::variable_list outputs;
    {
      // The second run draws from the first run's streams; whatever the generators hold now is theirs again after.
      const RestoreRngStates restore;
      set_all_rng_states(state->rng);
      torch::AutoGradMode enable_grad(true);
      outputs = state->function(inputs);
    }
    torch::autograd::variable_list roots, grads;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    torch::autograd::variable_list input_grads{torch::Tensor()};  // the function argument's
    for (const torch::Tensor& input : inputs) input_grads.push_back(input.defined() ? input.grad() : torch::Tensor());
    return input_grads;
  }
};

}  // namespace

torch::autograd::variable_list checkpoint(CheckpointedFunction function, const torch::autograd::variable_list& inputs) {
  if (!torch::GradMode::is_enabled()) return function(inputs);
  return CheckpointFunction::apply(std::move(function), at::TensorList(inputs));
}

void model_parallel_manual_seed(uint64_t seed) {
  const int tp_rank = get_tensor_model_parallel_rank();
  torch::manual_seed(seed);
  RngStatesTracker& tracker = get_rng_tracker();
  tracker.reset();
  tracker.add(kModelParallelRngTrackerName, seed + 2718 + static_cast<uint64_t>(tp_rank));
}

}  // namespace bridge::parallel::tensor_parallel
