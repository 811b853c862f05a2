// The step function: Megatron's forward_step, in the shapes pretrain() accepts.
//
// A step function takes the data iterator and one model chunk (optionally the GlobalState first), runs the chunk's
// forward pass on the next micro-batch and returns its output with the loss function the last pipeline stage applies
// to it. Which shape a callable has is decided at compile time; anything else fails to compile with a message that
// lists the shapes.
//
//   StepResult my_step(DataIterator& data, models::GPTModel& model) {
//     GPTBatch batch = data.next();
//     torch::Tensor losses = model->forward(batch.tokens, batch.position_ids, batch.labels);
//     return {losses, masked_token_loss(batch.loss_mask)};
//   }
//   pretrain(config, my_step);                                     // or a lambda taking (GlobalState&, data, model)
#pragma once

#include <torch/torch.h>

#include <functional>
#include <type_traits>
#include <utility>

#include "bridge/models/gpt_model.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "training/data.h"
#include "training/state.h"

namespace bridge::training {

using LossOutput = parallel::pipeline_parallel::LossOutput;
using LossFunc = parallel::pipeline_parallel::LossFunc;
/// What a step function returns: the chunk's output (the per-token loss on the last stage) and the loss function.
using StepResult = std::pair<torch::Tensor, LossFunc>;
/// Every step function, normalised to the shape that takes the state.
using ForwardStepFn = std::function<StepResult(GlobalState&, DataIterator&, models::GPTModel&)>;

/// Megatron's GPT loss_func: the masked sum of per-token losses over the number of unmasked tokens, reported as
/// "lm loss" -> [sum, tokens] so that micro-batches and data-parallel ranks average by token.
LossFunc masked_token_loss(torch::Tensor loss_mask);

/// Megatron's pretrain_gpt forward_step: next micro-batch, the model's per-token loss, masked_token_loss.
StepResult gpt_forward_step(DataIterator& data_iterator, models::GPTModel& model);

namespace detail {
template <class>
inline constexpr bool kUnsupportedStepFunction = false;
}

/// Wraps `step_fn` as a ForwardStepFn: called with the state first when it accepts (GlobalState&, DataIterator&,
/// GPTModel&), else with (DataIterator&, GPTModel&). A functor is moved into the wrapper and keeps its state there;
/// pass std::ref(functor) to keep using your own object.
template <class StepFn>
ForwardStepFn make_forward_step(StepFn step_fn) {
  using Fn = std::decay_t<StepFn>;
  if constexpr (std::is_invocable_r_v<StepResult, Fn&, GlobalState&, DataIterator&, models::GPTModel&>) {
    return ForwardStepFn(std::move(step_fn));
  } else if constexpr (std::is_invocable_r_v<StepResult, Fn&, DataIterator&, models::GPTModel&>) {
    return [fn = std::move(step_fn)](GlobalState&, DataIterator& data, models::GPTModel& model) mutable {
      return fn(data, model);
    };
  } else {
    static_assert(detail::kUnsupportedStepFunction<Fn>,
                  "pretrain: the step function must be callable as step_fn(DataIterator&, models::GPTModel&) or "
                  "step_fn(GlobalState&, DataIterator&, models::GPTModel&) and return StepResult "
                  "(std::pair<torch::Tensor, LossFunc>)");
    return {};
  }
}

}  // namespace bridge::training
