// CallbackManager: registration, introspection and the fire loop.
#include "training/callback_manager.h"

#include <exception>
#include <utility>

namespace bridge::training {

CallbackError::CallbackError(std::string callback, Event event, const std::string& what)
    : std::runtime_error("Callback '" + callback + "' failed in " + std::string(to_string(event)) + ": " + what),
      callback_(std::move(callback)),
      event_(event) {}

void CallbackManager::add(const std::shared_ptr<Callback>& callback, RankFilter ranks) {
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
  for (Event event : all_events()) {
    if (!callback->overrides(event)) continue;
    registry_[index(event)].push_back(
        std::make_unique<const Registration>(Registration{name, callback, Callback::method_for(event), {}, ranks}));
  }
}

void CallbackManager::add(const std::vector<std::shared_ptr<Callback>>& callbacks, RankFilter ranks) {
  for (const std::shared_ptr<Callback>& callback : callbacks) add(callback, ranks);
}

void CallbackManager::set_rank(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("CallbackManager::set_rank: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(world_size) + ")");
  }
  rank_ = rank;
  world_size_ = world_size;
}

void CallbackManager::register_callback(Event event, CallbackFn fn, std::string name, RankFilter ranks) {
  if (!fn) {
    throw std::invalid_argument("CallbackManager::register_callback: the function for " +
                                std::string(to_string(event)) + " is empty; pass a callable.");
  }
  ++num_functions_;
  if (name.empty()) name = "function#" + std::to_string(num_functions_);
  registry_[index(event)].push_back(
      std::make_unique<const Registration>(Registration{std::move(name), nullptr, nullptr, std::move(fn), ranks}));
}

void CallbackManager::register_callback(std::string_view event, CallbackFn fn, std::string name, RankFilter ranks) {
  register_callback(event_from_name(event), std::move(fn), std::move(name), ranks);
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
    ctx.callback_name_ = &registration.name;
    try {
      if (registration.object) {
        (registration.object.get()->*registration.method)(ctx);
      } else {
        registration.fn(ctx);
      }
    } catch (...) {
      rethrow_wrapped(registration, event);
    }
  }
}

void CallbackManager::fire(std::string_view event, CallbackContext& ctx) { fire(event_from_name(event), ctx); }

void CallbackManager::rethrow_wrapped(const Registration& registration, Event event) {
  try {
    throw;
  } catch (const std::exception& error) {
    std::throw_with_nested(CallbackError(registration.name, event, error.what()));
  } catch (...) {
    std::throw_with_nested(CallbackError(registration.name, event, "an exception not derived from std::exception"));
  }
}

std::shared_ptr<CallbackManager> normalize_callbacks(std::shared_ptr<CallbackManager> manager) { return manager; }

std::shared_ptr<CallbackManager> normalize_callbacks(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  auto manager = std::make_shared<CallbackManager>();
  manager->add(callbacks);
  return manager;
}

bool should_fire(const CallbackManager* manager, std::string_view event) noexcept {
  return manager != nullptr && manager->has_callbacks(event);
}

bool should_fire(const std::shared_ptr<CallbackManager>& manager, std::string_view event) noexcept {
  return should_fire(manager.get(), event);
}

}  // namespace bridge::training
