// CallbackManager: registers callbacks per event and fires them in registration order.
//
//   auto manager = std::make_shared<CallbackManager>();
//   manager->add(std::make_shared<Timing>());                       // class style: only overridden events
//   manager->register_callback("on_eval_end", [](CallbackContext& ctx) {
//     std::cout << "eval loss " << ctx.total_loss_dict->at("lm loss").item<double>() << "\n";
//   });
//   pretrain(config, step_fn, manager);
//
// Both styles mix; within an event, callbacks fire in the order they were registered. The first exception stops the
// event and reaches the caller as a CallbackError that names the callback and the event, with the original
// exception nested inside (std::rethrow_if_nested recovers it), unless the callback was registered with
// ErrorPolicy::isolate, whose errors are logged and counted instead. The manager also owns `user_state` and the pending
// control requests; neither is ever reset.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "training/callbacks/async_observer.h"
#include "training/callbacks/callback.h"
#include "training/callbacks/callback_context.h"
#include "training/callbacks/control.h"
#include "training/callbacks/event.h"
#include "training/callbacks/user_state.h"

namespace bridge::training {
inline namespace callbacks {

using CallbackFn = std::function<void(CallbackContext&)>;

/// A callback failed while an event fired. The callback's own exception is nested inside; to handle it by its type:
///
///   try {
///     pretrain(config, step_fn, manager);
///   } catch (const CallbackError& e) {             // "callback 'MyCheck' failed during on_eval_end: ..."
///     try { std::rethrow_if_nested(e); } catch (const MyError& mine) { /* the callback's own exception */ }
///   }
///
/// A type derived from both is not possible: the callback's type is only known where it was thrown.
class CallbackError : public std::runtime_error {
 public:
  CallbackError(std::string callback, Event event, const std::string& what);
  const std::string& callback() const noexcept { return callback_; }
  Event event() const noexcept { return event_; }

 private:
  std::string callback_;
  Event event_;
};

/// The ranks a registration runs on. Callbacks run on every rank by default; kFirst and kLast limit one to rank 0
/// (where Megatron logs) or to the last rank (which holds the losses in a pipeline).
enum class RankFilter : std::uint8_t { kAll, kFirst, kLast };

/// What a callback's exception does (InstructLab's proposal for callbacks that must not end a job).
///
///   manager.add(std::make_shared<Uploader>(), RankFilter::kAll, ErrorPolicy::isolate(3));
///
/// kPropagate (the default, Megatron-Bridge's behaviour) ends the event with a CallbackError. kIsolate logs the error
/// with the callback's name and event, counts it, and goes on with the next callback; after `max_failures` failures
/// the callback is disabled for the rest of the manager's life (logged once).
struct ErrorPolicy {
  enum class Mode : std::uint8_t { kPropagate, kIsolate };
  Mode mode = Mode::kPropagate;
  int max_failures = 3;  ///< kIsolate: failures before the callback is disabled (>= 1)

  static ErrorPolicy propagate() { return {}; }
  static ErrorPolicy isolate(int max_failures = 3) { return {Mode::kIsolate, max_failures}; }
};

/// An isolated callback's failures so far, as isolated_failures() reports them.
struct IsolatedFailures {
  std::string name;
  int failures = 0;
  bool disabled = false;
};

/// One registered callback, as list_callbacks() reports it.
struct RegisteredCallback {
  std::string name;
  CallbackFn fn;  ///< Calls the callback (a class callback's handler, or the registered function).
};

class CallbackManager {
 public:
  CallbackManager() = default;
  CallbackManager(const CallbackManager&) = delete;
  CallbackManager& operator=(const CallbackManager&) = delete;

  /// Registers the handlers that `callback`'s class overrides, also when it is held through a base pointer. Adding
  /// the same object twice registers it twice. A stateful callback (see Callback::state_dict) whose state_key() another
  /// stateful callback already has throws std::invalid_argument naming both.
  /// `errors` says what its exceptions do (see ErrorPolicy); an isolated callback's failures count across its events.
  void add(const std::shared_ptr<Callback>& callback, RankFilter ranks = RankFilter::kAll, ErrorPolicy errors = {});
  /// Registers each callback in list order.
  void add(const std::vector<std::shared_ptr<Callback>>& callbacks, RankFilter ranks = RankFilter::kAll,
           ErrorPolicy errors = {});

  /// Registers `fn` for `event`; `name` appears in errors (default "function#<n>").
  void register_callback(Event event, CallbackFn fn, std::string name = {}, RankFilter ranks = RankFilter::kAll,
                         ErrorPolicy errors = {});
  /// As above; an unknown name throws std::invalid_argument ("Unknown event '<name>'. Valid events: ...").
  void register_callback(std::string_view event, CallbackFn fn, std::string name = {},
                         RankFilter ranks = RankFilter::kAll, ErrorPolicy errors = {});

  /// The failures of every callback registered with ErrorPolicy::isolate, in registration order.
  std::vector<IsolatedFailures> isolated_failures() const;

  /// Runs `fn` on a worker thread of its own with a snapshot of each `event` (see async_observer.h): read-only,
  /// bounded (the oldest snapshot is dropped when the queue is full), its exceptions logged, never thrown.
  void register_observer(Event event, ObserverFn fn, ObserverOptions options = {}, RankFilter ranks = RankFilter::kAll);
  /// Waits for every observer to finish what is queued, up to `timeout` each; false if one ran out of time.
  bool flush_observers(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  /// Each observer's delivered, failed and dropped snapshots, in registration order.
  std::vector<ObserverStats> observer_stats() const;

  /// This process's rank in the job, for RankFilter (pretrain() sets it; until then rank 0 of 1, where every
  /// filter passes).
  void set_rank(int rank, int world_size);

  /// Where the registrations stand now, for remove_since(): pretrain() adds a recipe's callbacks for one run and
  /// takes them out again, so that a manager reused for another run does not collect them.
  struct Mark {
    std::array<std::size_t, kNumEvents> registrations{};
    std::size_t stateful = 0, isolations = 0, observers = 0;
  };
  Mark mark() const;
  /// Removes every registration (and stateful callback, isolation record, observer) added since `mark`.
  void remove_since(const Mark& mark);

  /// The valid event names.
  const std::set<std::string, std::less<>>& events() const { return valid_events(); }

  /// A copy of the callbacks registered for `event`, in firing order.
  std::vector<RegisteredCallback> list_callbacks(Event event) const;
  /// As above; an unknown name throws std::invalid_argument.
  std::vector<RegisteredCallback> list_callbacks(std::string_view event) const;

  /// Whether any callback was registered for `event`.
  bool has_callbacks(Event event) const noexcept { return !registry_[index(event)].empty(); }
  /// As above; false (not an error) for an unknown name.
  bool has_callbacks(std::string_view event) const noexcept;

  /// Calls every callback registered for `event`, in registration order, with `ctx`, whose user_state must be this
  /// manager's. Callbacks registered while the event fires run from its next firing on. Firing from inside a callback
  /// (nested events) is allowed.
  void fire(Event event, CallbackContext& ctx);
  /// As above; an unknown name throws std::invalid_argument.
  void fire(std::string_view event, CallbackContext& ctx);

  /// The store shared by all callbacks, persistent across events.
  UserState& user_state() noexcept { return user_state_; }
  /// Control requests made by callbacks and not yet acted on.
  TrainingControl& control() noexcept { return control_; }
  /// The stateful callbacks, each once, in registration order; checkpoints save their state_dict() by state_key().
  const std::vector<std::shared_ptr<Callback>>& stateful_callbacks() const noexcept { return stateful_; }

 private:
  struct Isolation {  // shared by the registrations of one isolated callback
    std::string name;
    int max_failures = 3;
    int failures = 0;
    bool disabled = false;
  };
  struct Registration {
    std::string name;
    std::shared_ptr<Callback> object;  // class style: object->*method
    Callback::Method method = nullptr;
    CallbackFn fn;  // function style
    RankFilter ranks = RankFilter::kAll;
    std::shared_ptr<Isolation> isolation;  // null: errors propagate
  };
  bool runs_here(RankFilter ranks) const noexcept {
    return ranks == RankFilter::kAll || (ranks == RankFilter::kFirst ? rank_ == 0 : rank_ == world_size_ - 1);
  }

  static constexpr std::size_t index(Event event) noexcept { return static_cast<std::size_t>(event); }
  [[noreturn]] static void rethrow_wrapped(const Registration& registration, Event event);
  static void log_isolated(const Registration& registration, Event event);
  std::shared_ptr<Isolation> isolation_for(const std::string& name, const ErrorPolicy& errors);

  // unique_ptr keeps each registration at a fixed address, so fire() can run over a stable prefix while a callback
  // registers more, without copying the list (no allocation on the fire path).
  std::array<std::vector<std::unique_ptr<const Registration>>, kNumEvents> registry_;
  std::size_t num_functions_ = 0;
  std::vector<std::shared_ptr<Callback>> stateful_;
  std::vector<std::shared_ptr<Isolation>> isolations_;
  std::vector<std::unique_ptr<AsyncObserver>> observers_;
  UserState user_state_;
  TrainingControl control_;
  int rank_ = 0;
  int world_size_ = 1;
};

/// Megatron-Bridge's normalize_callbacks: nothing (nullptr) stays nothing, a manager is returned as is, and a list of
/// callbacks becomes a new manager (an empty list gives an empty manager, not nothing).
std::shared_ptr<CallbackManager> normalize_callbacks(std::shared_ptr<CallbackManager> manager);
std::shared_ptr<CallbackManager> normalize_callbacks(const std::vector<std::shared_ptr<Callback>>& callbacks);
/// A braced list, `{}` included: normalize_callbacks({}) is an empty manager, as for an empty vector.
std::shared_ptr<CallbackManager> normalize_callbacks(std::initializer_list<std::shared_ptr<Callback>> callbacks);

/// True iff `manager` exists and has callbacks for `event`. The loop builds a context only when this holds, so an
/// event nobody listens to costs one load and one compare.
inline bool should_fire(const CallbackManager* manager, Event event) noexcept {
  return manager != nullptr && manager->has_callbacks(event);
}
inline bool should_fire(const std::shared_ptr<CallbackManager>& manager, Event event) noexcept {
  return should_fire(manager.get(), event);
}
/// By name; false for an unknown name.
bool should_fire(const CallbackManager* manager, std::string_view event) noexcept;
bool should_fire(const std::shared_ptr<CallbackManager>& manager, std::string_view event) noexcept;

}  // namespace callbacks
}  // namespace bridge::training
