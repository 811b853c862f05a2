// CallbackContext: construction, control requests, and the absent-field error that names the providing events.
#include "training/callbacks/callback_context.h"

#include <stdexcept>
#include <typeinfo>

#include "bridge/models/gpt_model.h"
#include "utils/strings.h"
#include "utils/type_name.h"

namespace bridge::training {
inline namespace callbacks {

std::string_view to_string(ContextFieldId field) {
  switch (field) {
    case ContextFieldId::kOptimizer:
      return "optimizer";
    case ContextFieldId::kScheduler:
      return "scheduler";
    case ContextFieldId::kLossDict:
      return "loss_dict";
    case ContextFieldId::kGradNorm:
      return "grad_norm";
    case ContextFieldId::kSkippedIter:
      return "skipped_iter";
    case ContextFieldId::kTotalLossDict:
      return "total_loss_dict";
    case ContextFieldId::kMicroBatch:
      return "micro_batch";
    case ContextFieldId::kModelChunk:
      return "model_chunk";
    case ContextFieldId::kOutputTensor:
      return "output_tensor";
    case ContextFieldId::kLog:
      return "log";
    case ContextFieldId::kTimers:
      return "timers";
    case ContextFieldId::kCheckpoint:
      return "checkpoint";
    case ContextFieldId::kException:
      return "exception";
  }
  return "unknown";
}

const std::vector<Event>& events_providing(ContextFieldId field) {
  using E = Event;
  static const std::vector<Event> kTraining = {
      E::kDataInitStart,    E::kTrainStart, E::kTrainStepStart, E::kTrainStepEnd, E::kTrainEnd,
      E::kForwardStart,     E::kForwardEnd, E::kBackwardStart,  E::kBackwardEnd,  E::kOptimizerStepStart,
      E::kOptimizerStepEnd, E::kLog,        E::kCheckpointLoad};
  static const std::vector<Event> kOptimizer = [] {
    std::vector<Event> events = kTraining;
    events.push_back(E::kCheckpointSave);
    return events;
  }();
  static const std::vector<Event> kLossDict = {E::kTrainStepEnd};
  static const std::vector<Event> kGradNorm = {E::kTrainStepEnd, E::kOptimizerStepStart, E::kOptimizerStepEnd};
  static const std::vector<Event> kSkippedIter = {E::kTrainStepEnd};
  static const std::vector<Event> kTotalLossDict = {E::kEvalEnd, E::kTestEnd};
  static const std::vector<Event> kMicroBatch = {E::kForwardStart, E::kForwardEnd, E::kBackwardStart, E::kBackwardEnd};
  static const std::vector<Event> kOutputTensor = {E::kForwardEnd};
  static const std::vector<Event> kLog = {E::kLog};
  static const std::vector<Event> kCheckpoint = {E::kCheckpointSave, E::kCheckpointLoad};
  static const std::vector<Event> kException = {E::kException};
  switch (field) {
    case ContextFieldId::kOptimizer:
      return kOptimizer;
    case ContextFieldId::kScheduler:
      return kTraining;
    case ContextFieldId::kLossDict:
      return kLossDict;
    case ContextFieldId::kGradNorm:
      return kGradNorm;
    case ContextFieldId::kSkippedIter:
      return kSkippedIter;
    case ContextFieldId::kTotalLossDict:
      return kTotalLossDict;
    case ContextFieldId::kMicroBatch:
    case ContextFieldId::kModelChunk:
      return kMicroBatch;
    case ContextFieldId::kOutputTensor:
      return kOutputTensor;
    case ContextFieldId::kLog:
    case ContextFieldId::kTimers:
      return kLog;
    case ContextFieldId::kCheckpoint:
      return kCheckpoint;
    case ContextFieldId::kException:
      return kException;
  }
  throw std::logic_error("events_providing: unknown context field");
}

void throw_absent_field(ContextFieldId field) {
  std::string message =
      "CallbackContext::" + std::string(to_string(field)) + " is absent at this event. It is provided by: ";
  bool first = true;
  for (Event event : events_providing(field)) {
    message += (first ? "" : ", ") + std::string(to_string(event));
    first = false;
  }
  message += ". Check ctx." + std::string(to_string(field)) + ".has_value() before reading it.";
  throw std::logic_error(message);
}

CallbackContext::CallbackContext(GlobalState& state_in, ModelChunks& model_in, UserState& user_state_in)
    : state(state_in), model(model_in), user_state(user_state_in) {}

CallbackContext::CallbackContext(GlobalState& state_in, ModelChunks& model_in)
    : own_user_state_(std::make_unique<UserState>()), state(state_in), model(model_in), user_state(*own_user_state_) {}

void CallbackContext::request(ControlAction action, std::string reason) {
  if (control_ == nullptr || !event_) {
    throw std::logic_error("CallbackContext::request_" + std::string(to_string(action)) +
                           "() was called outside CallbackManager::fire; control requests can only be made by a "
                           "callback while its event fires.");
  }
  control_->request(action, std::move(reason), callback_name_ != nullptr ? *callback_name_ : std::string("?"), *event_);
}

std::int64_t iteration_at(Event event, std::int64_t steps_done) noexcept {
  switch (event) {
    // Within a step the loop has not counted it yet (Megatron-Bridge's train_state.step): the log will call it +1.
    case Event::kTrainStepStart:
    case Event::kForwardStart:
    case Event::kForwardEnd:
    case Event::kBackwardStart:
    case Event::kBackwardEnd:
    case Event::kOptimizerStepStart:
    case Event::kOptimizerStepEnd:
    case Event::kTrainStepEnd:
      return steps_done + 1;
    default:
      return steps_done;
  }
}

std::int64_t CallbackContext::iteration() const noexcept {
  return event_ ? iteration_at(*event_, state.train_state.step) : state.train_state.step;
}

models::GPTModelImpl& CallbackContext::gpt(std::size_t chunk) const {
  if (chunk >= model.size()) {
    throw std::out_of_range("ctx.gpt(" + std::to_string(chunk) + "): this rank holds " + std::to_string(model.size()) +
                            " model chunk(s); chunks are numbered from 0 (one per virtual pipeline stage)");
  }
  auto* gpt = dynamic_cast<models::GPTModelImpl*>(model[chunk].get());
  if (gpt == nullptr) {
    const torch::nn::Module* module = model[chunk].get();
    throw std::logic_error("ctx.gpt(" + std::to_string(chunk) + "): the chunk is " +
                           (module == nullptr ? std::string("null") : bridge::utils::demangled_name(typeid(*module))) +
                           ", not a GPT; read ctx.model[" + std::to_string(chunk) +
                           "] as the module your provider built");
  }
  return *gpt;
}

}  // namespace callbacks
}  // namespace bridge::training
