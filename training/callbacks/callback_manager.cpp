// CallbackManager: registration, introspection and the fire loop.
#include "training/callbacks/callback_manager.h"

#include <exception>
#include <utility>

#include "utils/exception_message.h"
#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {

CallbackError::CallbackError(std::string callback, Event event, const std::string& what)
    : std::runtime_error("Callback '" + callback + "' failed in " + std::string(to_string(event)) + ": " + what),
      callback_(std::move(callback)),
      event_(event) {}

std::shared_ptr<CallbackManager::Isolation> CallbackManager::isolation_for(const std::string& name,
                                                                           const ErrorPolicy& errors) {
  if (errors.mode == ErrorPolicy::Mode::kPropagate) return nullptr;
  if (errors.max_failures < 1) {
    throw std::invalid_argument("ErrorPolicy::isolate(" + std::to_string(errors.max_failures) + ") for '" + name +
                                "': max_failures is the failures before the callback is disabled; use 1 or more");
  }
  auto isolation = std::make_shared<Isolation>(Isolation{name, errors.max_failures, 0, false});
  isolations_.push_back(isolation);
  return isolation;
}

std::vector<IsolatedFailures> CallbackManager::isolated_failures() const {
  std::vector<IsolatedFailures> result;
  for (const auto& isolation : isolations_) {
    result.push_back({isolation->name, isolation->failures, isolation->disabled});
  }
  return result;
}

void CallbackManager::add(const std::shared_ptr<Callback>& callback, RankFilter ranks, ErrorPolicy errors) {
  if (!callback) throw std::invalid_argument("CallbackManager::add: the callback is null; pass a constructed object.");
  const std::string name = callback->name();
  if (callback->stateful()) {
    const std::string key = callback->state_key();
    bool known = false;
    for (const std::shared_ptr<Callback>& other : stateful_) {
      if (other == callback) {
        known = true;
      } else if (other->state_key() == key) {
        throw std::invalid_argument("CallbackManager::add: callbacks '" + other->name() + "' and '" + name +
                                    "' both save their state under the key '" + key +
                                    "'; override state_key() so that each has its own");
      }
    }
    if (!known) stateful_.push_back(callback);
  }
  const std::shared_ptr<Isolation> isolation = isolation_for(name, errors);
  for (Event event : all_events()) {
    if (!callback->overrides(event)) continue;
    registry_[index(event)].push_back(std::make_unique<const Registration>(
        Registration{name, callback, Callback::method_for(event), {}, ranks, isolation}));
  }
}

void CallbackManager::add(const std::vector<std::shared_ptr<Callback>>& callbacks, RankFilter ranks,
                          ErrorPolicy errors) {
  for (const std::shared_ptr<Callback>& callback : callbacks) add(callback, ranks, errors);
}

void CallbackManager::set_rank(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("CallbackManager::set_rank: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(world_size) + ")");
  }
  rank_ = rank;
  world_size_ = world_size;
}

void CallbackManager::register_callback(Event event, CallbackFn fn, std::string name, RankFilter ranks,
                                        ErrorPolicy errors) {
  if (!fn) {
    throw std::invalid_argument("CallbackManager::register_callback: the function for " +
                                std::string(to_string(event)) + " is empty; pass a callable.");
  }
  ++num_functions_;
  if (name.empty()) name = "function#" + std::to_string(num_functions_);
  std::shared_ptr<Isolation> isolation = isolation_for(name, errors);
  registry_[index(event)].push_back(std::make_unique<const Registration>(
      Registration{std::move(name), nullptr, nullptr, std::move(fn), ranks, std::move(isolation)}));
}

void CallbackManager::register_callback(std::string_view event, CallbackFn fn, std::string name, RankFilter ranks,
                                        ErrorPolicy errors) {
  register_callback(event_from_name(event), std::move(fn), std::move(name), ranks, errors);
}

void CallbackManager::register_observer(Event event, ObserverFn fn, ObserverOptions options, RankFilter ranks) {
  if (options.name.empty()) options.name = "observer#" + std::to_string(observers_.size() + 1);
  observers_.push_back(std::make_unique<AsyncObserver>(options.name, std::move(fn), options.queue_capacity));
  AsyncObserver* observer = observers_.back().get();
  // The snapshot is taken on the loop's thread, while the context is alive; the function runs on the observer's.
  register_callback(
      event, [observer, event](CallbackContext& ctx) { observer->push(snapshot_of(event, ctx)); }, options.name, ranks);
}

CallbackManager::Mark CallbackManager::mark() const {
  Mark mark;
  for (std::size_t i = 0; i < kNumEvents; ++i) mark.registrations[i] = registry_[i].size();
  mark.stateful = stateful_.size();
  mark.isolations = isolations_.size();
  mark.observers = observers_.size();
  return mark;
}

void CallbackManager::remove_since(const Mark& mark) {
  for (std::size_t i = 0; i < kNumEvents; ++i) {
    if (registry_[i].size() > mark.registrations[i]) registry_[i].resize(mark.registrations[i]);
  }
  if (stateful_.size() > mark.stateful) stateful_.resize(mark.stateful);
  if (isolations_.size() > mark.isolations) isolations_.resize(mark.isolations);
  if (observers_.size() > mark.observers) observers_.resize(mark.observers);  // after the registrations that use them
}

bool CallbackManager::flush_observers(std::chrono::milliseconds timeout) {
  bool all = true;
  for (const auto& observer : observers_) all = observer->flush(timeout) && all;
  return all;
}

std::vector<ObserverStats> CallbackManager::observer_stats() const {
  std::vector<ObserverStats> stats;
  for (const auto& observer : observers_) stats.push_back(observer->stats());
  return stats;
}

std::vector<RegisteredCallback> CallbackManager::list_callbacks(Event event) const {
  std::vector<RegisteredCallback> result;
  for (const auto& registration : registry_[index(event)]) {
    if (registration->object) {
      result.push_back({registration->name, [object = registration->object, method = registration->method](
                                                CallbackContext& ctx) { (object.get()->*method)(ctx); }});
    } else {
      result.push_back({registration->name, registration->fn});
    }
  }
  return result;
}

std::vector<RegisteredCallback> CallbackManager::list_callbacks(std::string_view event) const {
  return list_callbacks(event_from_name(event));
}

bool CallbackManager::has_callbacks(std::string_view event) const noexcept {
  const std::optional<Event> parsed = parse_event(event);
  return parsed && has_callbacks(*parsed);
}

// Binds a context to the event and callback being run, and restores what it was bound to before (nothing, or an
// outer fire for nested events) when the fire ends, also by exception.
class FireScope {
 public:
  FireScope(CallbackContext& ctx, Event event, TrainingControl& control)
      : ctx_(ctx), event_(ctx.event_), control_(ctx.control_), callback_name_(ctx.callback_name_) {
    ctx.event_ = event;
    ctx.control_ = &control;
  }
  ~FireScope() {
    ctx_.event_ = event_;
    ctx_.control_ = control_;
    ctx_.callback_name_ = callback_name_;
  }
  FireScope(const FireScope&) = delete;
  FireScope& operator=(const FireScope&) = delete;

 private:
  CallbackContext& ctx_;
  std::optional<Event> event_;
  TrainingControl* control_;
  const std::string* callback_name_;
};

void CallbackManager::fire(Event event, CallbackContext& ctx) {
  const auto& registrations = registry_[index(event)];
  const std::size_t count = registrations.size();  // callbacks added during this fire wait for the next one
  if (count == 0) return;
  if (&ctx.user_state != &user_state_) {
    throw std::invalid_argument("CallbackManager::fire(" + std::string(to_string(event)) +
                                "): the context's user_state is not this manager's, so nothing callbacks store would "
                                "persist. Build it as CallbackContext(state, model, manager.user_state()).");
  }
  FireScope scope(ctx, event, control_);
  for (std::size_t i = 0; i < count; ++i) {
    const Registration& registration = *registrations[i];
    if (!runs_here(registration.ranks)) continue;
    if (registration.isolation && registration.isolation->disabled) continue;
    ctx.callback_name_ = &registration.name;
    try {
      if (registration.object) {
        (registration.object.get()->*registration.method)(ctx);
      } else {
        registration.fn(ctx);
      }
    } catch (...) {
      if (!registration.isolation) rethrow_wrapped(registration, event);
      log_isolated(registration, event);
    }
  }
}

void CallbackManager::fire(std::string_view event, CallbackContext& ctx) { fire(event_from_name(event), ctx); }

void CallbackManager::log_isolated(const Registration& registration, Event event) {
  const std::string what = bridge::utils::exception_message(std::current_exception());
  Isolation& isolation = *registration.isolation;
  isolation.disabled = ++isolation.failures >= isolation.max_failures;
  bridge::utils::logger().error(
      "callback '{}' failed in {} (failure {} of {} allowed; isolated, training goes on){}: {}", registration.name,
      to_string(event), isolation.failures, isolation.max_failures, isolation.disabled ? "; it is now disabled" : "",
      what);
}

void CallbackManager::rethrow_wrapped(const Registration& registration, Event event) {
  std::throw_with_nested(
      CallbackError(registration.name, event, bridge::utils::exception_message(std::current_exception())));
}

std::shared_ptr<CallbackManager> normalize_callbacks(std::shared_ptr<CallbackManager> manager) { return manager; }

std::shared_ptr<CallbackManager> normalize_callbacks(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  auto manager = std::make_shared<CallbackManager>();
  manager->add(callbacks);
  return manager;
}

std::shared_ptr<CallbackManager> normalize_callbacks(std::initializer_list<std::shared_ptr<Callback>> callbacks) {
  return normalize_callbacks(std::vector<std::shared_ptr<Callback>>(callbacks));
}

bool should_fire(const CallbackManager* manager, std::string_view event) noexcept {
  return manager != nullptr && manager->has_callbacks(event);
}

bool should_fire(const std::shared_ptr<CallbackManager>& manager, std::string_view event) noexcept {
  return should_fire(manager.get(), event);
}

}  // namespace callbacks
}  // namespace bridge::training
