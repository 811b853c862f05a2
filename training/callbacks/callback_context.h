// CallbackContext: what a callback sees when an event fires.
//
// `state`, `model` and `user_state` are present at every event. Every other field is present only at the events that
// provide it (the table in README.md); reading an absent field throws std::logic_error naming the field and the events
// that provide it. At on_setup_start nothing is built yet: `model` is empty, state.train_state is a fresh one and
// state.cfg is the config as passed to pretrain() (before the tokenizer and validation complete it), and every other
// field is absent. "Absent" is distinct from "empty": off the last pipeline stage, on_train_step_end carries an empty
// loss_dict, not an absent one.
//
//   manager.register_callback(Event::kTrainStepEnd, [](CallbackContext& ctx) {
//     if (ctx.grad_norm.has_value() && *ctx.grad_norm > 100.0) ctx.request_stop("gradient norm exploded");
//   });
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "training/callbacks/control.h"
#include "training/callbacks/event.h"
#include "training/callbacks/user_state.h"
#include "training/state.h"

namespace bridge::models {
class GPTModelImpl;
}  // namespace bridge::models

namespace bridge::training {

class OptimizerParamScheduler;

inline namespace callbacks {

class CallbackManager;
class FireScope;

/// The model as a list of chunks: one per virtual pipeline stage held by this rank.
using ModelChunks = std::vector<std::shared_ptr<torch::nn::Module>>;
/// Losses by name (e.g. "lm loss"), reduced over micro-batches and data-parallel ranks.
using LossDict = std::map<std::string, torch::Tensor>;

/// What on_log callbacks may add to the log record before it is written.
struct LogRecord {
  std::int64_t iteration = 0;
  std::map<std::string, double> metrics;     ///< Written to the metric writers under these names.
  std::vector<std::string> text;             ///< Appended to the console line as " name: value |" fragments.
  std::map<std::string, std::string> texts;  ///< Written to the metric writers as texts (add_text) by these tags.
  /// The time left, in seconds, shown as the console line's "ETA": the loop's estimate from the steps so far, which
  /// a callback with a better one (RuntimeEstimator) replaces. Absent when training has no known end.
  std::optional<double> eta_seconds;

  /// Runs `fn` once every on_log callback has run (the loop calls complete() then, before the record is written), so
  /// a callback sees what callbacks registered after it add, as ControlEndpoint does for its /status.
  void when_complete(std::function<void(const LogRecord&)> fn) { when_complete_.fns.push_back(std::move(fn)); }
  /// Runs the when_complete functions once, in the order given.
  void complete() {
    for (const auto& fn : std::exchange(when_complete_.fns, {})) fn(*this);
  }

 private:
  /// The pending functions belong to the record the loop completes: a copy (a callback's snapshot) carries the
  /// fields but none of them, so completing both cannot run one twice; an assigned record keeps its own. A move
  /// hands them over.
  struct Pending {
    Pending() = default;
    Pending(const Pending&) {}
    Pending& operator=(const Pending&) { return *this; }
    Pending(Pending&&) noexcept = default;
    Pending& operator=(Pending&&) noexcept = default;
    ~Pending() = default;
    std::vector<std::function<void(const LogRecord&)>> fns;
  };
  Pending when_complete_;
};

/// The checkpoint an on_checkpoint_save/load event is about.
struct CheckpointInfo {
  std::string path;
  std::int64_t iteration = 0;
};

/// The failure an on_exception event reports.
struct ExceptionInfo {
  std::exception_ptr error;
  std::string what;
};

enum class ContextFieldId : std::uint8_t {
  kOptimizer,
  kScheduler,
  kLossDict,
  kGradNorm,
  kSkippedIter,
  kTotalLossDict,
  kMicroBatch,
  kModelChunk,
  kOutputTensor,
  kLog,
  kTimers,
  kCheckpoint,
  kException,
};

/// The log line's number ("iteration N") of the step an event belongs to, given train_state.step then: steps_done + 1
/// at the events of a step in flight (on_train_step_start to on_train_step_end), steps_done at the others.
std::int64_t iteration_at(Event event, std::int64_t steps_done) noexcept;

/// "optimizer", "loss_dict", ...: the field's name as written in code.
std::string_view to_string(ContextFieldId field);
/// The events at which the loop provides `field`.
const std::vector<Event>& events_providing(ContextFieldId field);
[[noreturn]] void throw_absent_field(ContextFieldId field);

/// A field held by value (a number, a loss map, a tensor) that may be absent.
template <class T, ContextFieldId Id>
class ContextField {
 public:
  ContextField() = default;
  ContextField& operator=(T value) {
    value_ = std::move(value);
    return *this;
  }
  // No operator bool: for ContextField<bool> it would read as the value, not its presence.
  bool has_value() const noexcept { return value_.has_value(); }
  T& value() {
    if (!value_) throw_absent_field(Id);
    return *value_;
  }
  const T& value() const {
    if (!value_) throw_absent_field(Id);
    return *value_;
  }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  void reset() noexcept { value_.reset(); }

 private:
  std::optional<T> value_;
};

/// A field that refers to an object the loop owns (the optimizer, the log record); absent when null.
template <class T, ContextFieldId Id>
class ContextRef {
 public:
  ContextRef() = default;
  ContextRef& operator=(T* object) noexcept {
    object_ = object;
    return *this;
  }
  ContextRef& operator=(T& object) noexcept { return *this = &object; }
  bool has_value() const noexcept { return object_ != nullptr; }
  explicit operator bool() const noexcept { return has_value(); }
  T& value() const {
    if (object_ == nullptr) throw_absent_field(Id);
    return *object_;
  }
  T& operator*() const { return value(); }
  T* operator->() const { return &value(); }
  /// The object, or nullptr when absent (for identity checks).
  T* get() const noexcept { return object_; }
  void reset() noexcept { object_ = nullptr; }

 private:
  T* object_ = nullptr;
};

class CallbackContext {
 public:
  /// A context over the loop's state and model, sharing a manager's persistent user_state.
  CallbackContext(GlobalState& state, ModelChunks& model, UserState& user_state);
  /// A context with its own, empty user_state (for tests and tools; the loop always passes the manager's).
  CallbackContext(GlobalState& state, ModelChunks& model);
  CallbackContext(const CallbackContext&) = delete;
  CallbackContext& operator=(const CallbackContext&) = delete;

 private:
  std::unique_ptr<UserState> own_user_state_;  // declared first: user_state may refer to it

 public:
  GlobalState& state;
  ModelChunks& model;
  UserState& user_state;

  // Training events (not on_checkpoint_save for the scheduler).
  ContextRef<torch::optim::Optimizer, ContextFieldId::kOptimizer> optimizer;
  ContextRef<OptimizerParamScheduler, ContextFieldId::kScheduler> scheduler;
  // on_train_step_end: empty off the last pipeline stage.
  ContextField<LossDict, ContextFieldId::kLossDict> loss_dict;
  // on_train_step_end (when computed), on_optimizer_step_start/end.
  ContextField<double, ContextFieldId::kGradNorm> grad_norm;
  ContextField<bool, ContextFieldId::kSkippedIter> skipped_iter;
  // on_eval_end, on_test_end: empty off the last pipeline stage.
  ContextField<LossDict, ContextFieldId::kTotalLossDict> total_loss_dict;
  // on_forward_*/on_backward_*: which micro-batch of the step, and which model chunk.
  ContextField<std::int64_t, ContextFieldId::kMicroBatch> micro_batch;
  ContextField<std::int64_t, ContextFieldId::kModelChunk> model_chunk;
  // on_forward_end: the chunk's output (activations, or the loss on the last stage).
  ContextField<torch::Tensor, ContextFieldId::kOutputTensor> output_tensor;
  ContextRef<LogRecord, ContextFieldId::kLog> log;
  /// on_log: the timers the log line reports, by Megatron's names, in seconds per iteration over the log interval
  /// (Megatron-LM hands on_log its timers too, as timers_to_log). Empty at a step that only the metric writers log,
  /// where no interval is timed. "iteration-time": the wall time of a step (the log line's "elapsed time per
  /// iteration (ms)" / 1000, the writers' iteration-time).
  ContextField<std::map<std::string, double>, ContextFieldId::kTimers> timers;
  ContextField<CheckpointInfo, ContextFieldId::kCheckpoint> checkpoint;
  ContextField<ExceptionInfo, ContextFieldId::kException> exception;

  /// Model chunk `chunk` as the GPT it is (ctx.model holds the chunks as plain modules), without a cast:
  ///   const auto& config = ctx.gpt().config();
  /// Throws std::out_of_range for a chunk this rank does not hold and std::logic_error, naming the module's type,
  /// when the chunk is not a GPT.
  models::GPTModelImpl& gpt(std::size_t chunk = 0) const;

  /// The event being fired (set by CallbackManager::fire).
  std::optional<Event> event() const noexcept { return event_; }

  /// The step as the log line numbers it ("iteration N"; 1 for the first step): train_state.step + 1 from
  /// on_train_step_start to on_train_step_end, where train_state.step is still Megatron-Bridge's 0-based step in
  /// flight, and train_state.step (the steps done) at every other event. Use it for anything a user compares with
  /// the log; the first step's on_train_step_end and on_log both see 1.
  std::int64_t iteration() const noexcept;

  /// Asks the loop to stop after this step, run on_train_end and return normally. All ranks stop at the same step.
  void request_stop(std::string reason) { request(ControlAction::kStop, std::move(reason)); }
  /// Asks the loop to save a checkpoint at the end of this step.
  void request_save(std::string reason) { request(ControlAction::kSave, std::move(reason)); }
  /// Asks the loop to stop now; pretrain() then fails with the reason.
  void request_abort(std::string reason) { request(ControlAction::kAbort, std::move(reason)); }

 private:
  friend class CallbackManager;
  friend class FireScope;
  void request(ControlAction action, std::string reason);

  // Set by CallbackManager::fire for the callback being run.
  std::optional<Event> event_;
  TrainingControl* control_ = nullptr;
  const std::string* callback_name_ = nullptr;
};

}  // namespace callbacks
}  // namespace bridge::training
