// CallbackManager, Callback, normalize_callbacks and should_fire against Megatron-Bridge's semantics.
//
// Cases numbered "MB n" translate test n of the reference checklist (megatron_bridge_callbacks.md, section 3.1);
// the rest cover the C++ extensions and error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tests/unit/callback_test_support.h"
#include "training/callbacks.h"

namespace bridge::training {
namespace {

using testing::CallbackTest;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class TrainStartAndEnd : public Callback {
 public:
  void on_train_start(CallbackContext&) override { ++starts; }
  void on_train_end(CallbackContext&) override { ++ends; }
  int starts = 0;
  int ends = 0;
};

class EvalEndOnly : public Callback {
 public:
  void on_eval_end(CallbackContext&) override { ++calls; }
  int calls = 0;
};

class NoOverrides : public Callback {};

// Overrides in an intermediate base count (Python: an override anywhere in the hierarchy).
class Intermediate : public Callback {
 public:
  void on_train_step_end(CallbackContext&) override { ++step_ends; }
  int step_ends = 0;
};
class Leaf : public Intermediate {
 public:
  void on_log(CallbackContext&) override { ++logs; }
  int logs = 0;
};

class Recorder : public Callback {
 public:
  Recorder(std::vector<std::string>& out, std::string tag) : out_(out), tag_(std::move(tag)) {}
  void on_train_start(CallbackContext&) override { out_.push_back(tag_); }

 private:
  std::vector<std::string>& out_;
  std::string tag_;
};

std::vector<std::string> names_of(const std::vector<RegisteredCallback>& callbacks) {
  std::vector<std::string> names;
  for (const auto& callback : callbacks) names.push_back(callback.name);
  return names;
}

// --- Callback base class -------------------------------------------------------------------------------------------

TEST_F(CallbackTest, MB06_AllBaseMethodsAreNoOps) {
  Callback base;
  for (Event event : all_events()) EXPECT_NO_THROW((base.*Callback::method_for(event))(ctx));
}

TEST_F(CallbackTest, MB07_SubclassCanOverrideMethods) {
  TrainStartAndEnd callback;
  callback.on_train_start(ctx);
  callback.on_eval_start(ctx);  // not overridden: a no-op
  EXPECT_EQ(callback.starts, 1);
  EXPECT_EQ(callback.ends, 0);
}

TEST(Callback, NameDefaultsToClassNameAndCanBeOverridden) {
  EXPECT_EQ(TrainStartAndEnd().name(), "TrainStartAndEnd");
  struct Named : Callback {
    std::string name() const override { return "custom"; }
  };
  EXPECT_EQ(Named().name(), "custom");
}

TEST(Callback, OverrideDetectionSeesTheDynamicType) {
  std::shared_ptr<Callback> leaf = std::make_shared<Leaf>();
  for (Event event : all_events()) {
    const bool expected = event == Event::kTrainStepEnd || event == Event::kLog;
    EXPECT_EQ(leaf->overrides(event), expected) << to_string(event);
  }
}

// Each handler is wired to the event of the same name: one class per event overrides only that handler.
#define BRIDGE_ONLY(method, event)                      \
  struct Only_##method : Callback {                     \
    void method(CallbackContext&) override { ++calls; } \
    int calls = 0;                                      \
  };                                                    \
  check_only<Only_##method>(Event::event, #method);

template <class T>
void expect_registered_only_for(Event expected) {
  SCOPED_TRACE(to_string(expected));
  GlobalState state;
  ModelChunks model;
  CallbackManager manager;
  auto callback = std::make_shared<T>();
  manager.add(std::shared_ptr<Callback>(callback));
  for (Event event : all_events()) EXPECT_EQ(manager.has_callbacks(event), event == expected) << to_string(event);
  CallbackContext ctx(state, model, manager.user_state());
  manager.fire(expected, ctx);
  EXPECT_EQ(callback->calls, 1);
}

template <class T>
void check_only(Event event, const char* method_name) {
  EXPECT_EQ(to_string(event), method_name);
  expect_registered_only_for<T>(event);
}

TEST(Callback, EveryHandlerIsWiredToItsEvent) {
  BRIDGE_ONLY(on_setup_start, kSetupStart)
  BRIDGE_ONLY(on_data_init_start, kDataInitStart)
  BRIDGE_ONLY(on_train_start, kTrainStart)
  BRIDGE_ONLY(on_train_step_start, kTrainStepStart)
  BRIDGE_ONLY(on_train_step_end, kTrainStepEnd)
  BRIDGE_ONLY(on_train_end, kTrainEnd)
  BRIDGE_ONLY(on_eval_start, kEvalStart)
  BRIDGE_ONLY(on_eval_step_start, kEvalStepStart)
  BRIDGE_ONLY(on_eval_step_end, kEvalStepEnd)
  BRIDGE_ONLY(on_eval_end, kEvalEnd)
  BRIDGE_ONLY(on_test_start, kTestStart)
  BRIDGE_ONLY(on_test_step_start, kTestStepStart)
  BRIDGE_ONLY(on_test_step_end, kTestStepEnd)
  BRIDGE_ONLY(on_test_end, kTestEnd)
  BRIDGE_ONLY(on_checkpoint_save, kCheckpointSave)
  BRIDGE_ONLY(on_forward_start, kForwardStart)
  BRIDGE_ONLY(on_forward_end, kForwardEnd)
  BRIDGE_ONLY(on_backward_start, kBackwardStart)
  BRIDGE_ONLY(on_backward_end, kBackwardEnd)
  BRIDGE_ONLY(on_optimizer_step_start, kOptimizerStepStart)
  BRIDGE_ONLY(on_optimizer_step_end, kOptimizerStepEnd)
  BRIDGE_ONLY(on_log, kLog)
  BRIDGE_ONLY(on_checkpoint_load, kCheckpointLoad)
  BRIDGE_ONLY(on_exception, kException)
}
#undef BRIDGE_ONLY

// Callback as a non-primary base, as a virtual base, and in a final class: the vtable read must still be exact.
struct Unrelated {
  virtual ~Unrelated() = default;
  virtual void unrelated() {}
  int payload = 0;
};
class SecondaryBase : public Unrelated, public Callback {
 public:
  void on_eval_start(CallbackContext&) override { ++calls; }
  int calls = 0;
};
class VirtualBase : public virtual Callback {
 public:
  void on_test_end(CallbackContext&) override { ++calls; }
  int calls = 0;
};
class Diamond : public VirtualBase, public Unrelated {};
class FinalCallback final : public Callback {
 public:
  void on_checkpoint_save(CallbackContext&) override { ++calls; }
  int calls = 0;
};

TEST(Callback, OverrideDetectionWithNonPrimaryVirtualAndFinalBases) {
  expect_registered_only_for<SecondaryBase>(Event::kEvalStart);
  expect_registered_only_for<Diamond>(Event::kTestEnd);
  expect_registered_only_for<FinalCallback>(Event::kCheckpointSave);
}

// --- Registration ---------------------------------------------------------------------------------------------------

TEST_F(CallbackTest, MB08_RegisterValidEvent) {
  int calls = 0;
  manager.register_callback(
      "on_train_start", [&](CallbackContext&) { ++calls; }, "fn");
  EXPECT_TRUE(manager.has_callbacks("on_train_start"));
  const auto listed = manager.list_callbacks("on_train_start");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name, "fn");
  listed[0].fn(ctx);  // the listed entry is the registered function
  EXPECT_EQ(calls, 1);
}

TEST_F(CallbackTest, MB09_RegisterInvalidEventThrows) {
  EXPECT_THROW(manager.register_callback("on_invalid_event", [](CallbackContext&) {}), std::invalid_argument);
  try {
    manager.register_callback("on_trian_start", [](CallbackContext&) {});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), StartsWith("Unknown event 'on_trian_start'. Valid events: "));
    EXPECT_THAT(error.what(), HasSubstr("on_checkpoint_save"));
    EXPECT_THAT(error.what(), HasSubstr("Did you mean 'on_train_start'?"));
  }
}

TEST_F(CallbackTest, MB10_RegisterMultipleCallbacksSameEvent) {
  for (const char* name : {"fn1", "fn2", "fn3"})
    manager.register_callback(
        Event::kTrainStart, [](CallbackContext&) {}, name);
  EXPECT_THAT(names_of(manager.list_callbacks(Event::kTrainStart)), ElementsAre("fn1", "fn2", "fn3"));
}

TEST_F(CallbackTest, MB11_AddSingleCallback) {
  manager.add(std::make_shared<TrainStartAndEnd>());
  EXPECT_TRUE(manager.has_callbacks(Event::kTrainStart));
  EXPECT_TRUE(manager.has_callbacks(Event::kTrainEnd));
}

TEST_F(CallbackTest, MB12_AddListOfCallbacks) {
  manager.add({std::make_shared<TrainStartAndEnd>(), std::make_shared<EvalEndOnly>()});
  EXPECT_TRUE(manager.has_callbacks(Event::kTrainStart));
  EXPECT_TRUE(manager.has_callbacks(Event::kTrainEnd));
  EXPECT_TRUE(manager.has_callbacks(Event::kEvalEnd));
}

TEST_F(CallbackTest, MB13_AddIgnoresBaseClassMethods) {
  manager.add(std::make_shared<NoOverrides>());
  for (Event event : all_events()) EXPECT_FALSE(manager.has_callbacks(event)) << to_string(event);
}

TEST_F(CallbackTest, MB14_AddOnlyRegistersOverriddenMethods) {
  manager.add(std::make_shared<EvalEndOnly>());
  EXPECT_TRUE(manager.has_callbacks(Event::kEvalEnd));
  for (Event event :
       {Event::kTrainStart, Event::kTrainStepStart, Event::kTrainStepEnd, Event::kTrainEnd, Event::kEvalStart}) {
    EXPECT_FALSE(manager.has_callbacks(event)) << to_string(event);
  }
}

TEST_F(CallbackTest, AddThroughBasePointerRegistersOnlyOverriddenEvents) {
  std::shared_ptr<Callback> held_as_base = std::make_shared<Leaf>();
  manager.add(held_as_base);
  for (Event event : all_events()) {
    EXPECT_EQ(manager.has_callbacks(event), event == Event::kTrainStepEnd || event == Event::kLog) << to_string(event);
  }
}

TEST_F(CallbackTest, AddingTheSameInstanceTwiceRegistersItTwice) {
  auto callback = std::make_shared<TrainStartAndEnd>();
  manager.add(callback);
  manager.add(callback);
  manager.fire(Event::kTrainStart, ctx);
  EXPECT_EQ(callback->starts, 2);
}

TEST_F(CallbackTest, ManagerKeepsClassCallbacksAlive) {
  auto callback = std::make_shared<TrainStartAndEnd>();
  std::weak_ptr<TrainStartAndEnd> weak = callback;
  manager.add(callback);
  callback.reset();
  ASSERT_FALSE(weak.expired());
  manager.fire(Event::kTrainStart, ctx);
  EXPECT_EQ(weak.lock()->starts, 1);
}

TEST_F(CallbackTest, RejectsNullCallbackAndEmptyFunction) {
  EXPECT_THROW(manager.add(std::shared_ptr<Callback>()), std::invalid_argument);
  EXPECT_THROW(manager.register_callback(Event::kTrainStart, CallbackFn()), std::invalid_argument);
  EXPECT_FALSE(manager.has_callbacks(Event::kTrainStart));
}

TEST_F(CallbackTest, UnnamedFunctionsGetNumberedNames) {
  manager.register_callback(Event::kTrainStart, [](CallbackContext&) {});
  manager.register_callback(Event::kLog, [](CallbackContext&) {});
  EXPECT_THAT(names_of(manager.list_callbacks(Event::kTrainStart)), ElementsAre("function#1"));
  EXPECT_THAT(names_of(manager.list_callbacks(Event::kLog)), ElementsAre("function#2"));
}

// --- Firing ---------------------------------------------------------------------------------------------------------

TEST_F(CallbackTest, MB15_FireCallsRegisteredCallbacksWithTheSameContext) {
  std::vector<CallbackContext*> seen;
  manager.register_callback(Event::kTrainStart, [&](CallbackContext& c) { seen.push_back(&c); });
  manager.register_callback(Event::kTrainStart, [&](CallbackContext& c) { seen.push_back(&c); });
  manager.fire(Event::kTrainStart, ctx);
  EXPECT_THAT(seen, ElementsAre(&ctx, &ctx));
}

TEST_F(CallbackTest, MB16_FireRespectsRegistrationOrder) {
  std::vector<int> order;
  for (int i = 1; i <= 3; ++i)
    manager.register_callback(Event::kTrainStart, [&order, i](CallbackContext&) { order.push_back(i); });
  manager.fire(Event::kTrainStart, ctx);
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
}

TEST_F(CallbackTest, MB17_FireRespectsMixedRegistrationOrder) {
  std::vector<std::string> order;
  manager.add(std::make_shared<Recorder>(order, "class_first"));
  manager.register_callback("on_train_start", [&](CallbackContext&) { order.push_back("fn_middle"); });
  manager.add(std::make_shared<Recorder>(order, "class_last"));
  manager.fire("on_train_start", ctx);
  EXPECT_THAT(order, ElementsAre("class_first", "fn_middle", "class_last"));
}

TEST_F(CallbackTest, MB18_FireDoesNothingWhenNoCallbacks) { EXPECT_NO_THROW(manager.fire(Event::kTrainStart, ctx)); }

TEST_F(CallbackTest, MB19_FireOnlyFiresRequestedEvent) {
  int train = 0;
  int eval = 0;
  manager.register_callback(Event::kTrainStart, [&](CallbackContext&) { ++train; });
  manager.register_callback(Event::kEvalStart, [&](CallbackContext&) { ++eval; });
  manager.fire(Event::kTrainStart, ctx);
  EXPECT_EQ(train, 1);
  EXPECT_EQ(eval, 0);
}

TEST_F(CallbackTest, MB20_ExceptionPropagatesWithTheOriginalNested) {
  manager.register_callback(
      Event::kTrainStart, [](CallbackContext&) { throw std::domain_error("division by zero"); }, "divider");
  try {
    manager.fire(Event::kTrainStart, ctx);
    FAIL() << "expected CallbackError";
  } catch (const CallbackError& error) {
    EXPECT_EQ(error.callback(), "divider");
    EXPECT_EQ(error.event(), Event::kTrainStart);
    EXPECT_STREQ(error.what(), "Callback 'divider' failed in on_train_start: division by zero");
    EXPECT_THROW(std::rethrow_if_nested(error), std::domain_error);
  }
}

TEST_F(CallbackTest, MB21_ExceptionStopsSubsequentCallbacks) {
  std::vector<std::string> calls;
  manager.register_callback(Event::kTrainStart, [&](CallbackContext&) { calls.push_back("first"); });
  manager.register_callback(Event::kTrainStart, [&](CallbackContext&) {
    calls.push_back("raiser");
    throw std::runtime_error("boom");
  });
  manager.register_callback(Event::kTrainStart, [&](CallbackContext&) { calls.push_back("third"); });
  EXPECT_THROW(manager.fire(Event::kTrainStart, ctx), CallbackError);
  EXPECT_THAT(calls, ElementsAre("first", "raiser"));
}

TEST_F(CallbackTest, ClassCallbackExceptionNamesTheClass) {
  struct Exploding : Callback {
    void on_eval_end(CallbackContext&) override { throw 42; }
  };
  manager.add(std::make_shared<Exploding>());
  try {
    manager.fire(Event::kEvalEnd, ctx);
    FAIL() << "expected CallbackError";
  } catch (const CallbackError& error) {
    EXPECT_THAT(error.what(), StartsWith("Callback 'Exploding' failed in on_eval_end: an exception not derived"));
    EXPECT_THROW(std::rethrow_if_nested(error), int);
  }
}

TEST_F(CallbackTest, CallbacksRegisteredDuringFireRunFromTheNextFire) {
  int late_calls = 0;
  manager.register_callback(Event::kTrainStepEnd, [&](CallbackContext&) {
    manager.register_callback(Event::kTrainStepEnd, [&](CallbackContext&) { ++late_calls; });
  });
  manager.fire(Event::kTrainStepEnd, ctx);
  EXPECT_EQ(late_calls, 0);
  manager.fire(Event::kTrainStepEnd, ctx);  // the first callback registers one more each time
  EXPECT_EQ(late_calls, 1);
  EXPECT_EQ(manager.list_callbacks(Event::kTrainStepEnd).size(), 3u);
}

TEST_F(CallbackTest, ContextReportsTheEventBeingFired) {
  std::vector<Event> seen;
  auto record = [&](CallbackContext& c) { seen.push_back(c.event().value()); };
  manager.register_callback(Event::kEvalStart, record);
  manager.register_callback(Event::kEvalEnd, record);
  EXPECT_FALSE(ctx.event().has_value());
  manager.fire(Event::kEvalStart, ctx);
  manager.fire(Event::kEvalEnd, ctx);
  EXPECT_THAT(seen, ElementsAre(Event::kEvalStart, Event::kEvalEnd));
}

TEST_F(CallbackTest, NestedFireSeesItsOwnEventAndRestoresTheOuterOne) {
  std::vector<Event> seen_by_outer;
  manager.register_callback(
      Event::kLog, [](CallbackContext& c) { c.request_save("from the nested event"); }, "inner");
  manager.register_callback(
      Event::kTrainStepEnd,
      [&](CallbackContext& c) {
        manager.fire(Event::kLog, c);  // a callback firing another event with the same context
        seen_by_outer.push_back(c.event().value());
        c.request_stop("from the outer event");
      },
      "outer");
  manager.fire(Event::kTrainStepEnd, ctx);
  EXPECT_THAT(seen_by_outer, ElementsAre(Event::kTrainStepEnd));
  const auto requests = manager.control().take();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].callback, "inner");
  EXPECT_EQ(requests[0].event, Event::kLog);
  EXPECT_EQ(requests[1].callback, "outer");
  EXPECT_EQ(requests[1].event, Event::kTrainStepEnd);
  EXPECT_FALSE(ctx.event().has_value());  // unbound again once the outer fire returns
}

TEST_F(CallbackTest, ContextIsUnboundAfterFireEvenWhenACallbackThrows) {
  manager.register_callback(Event::kTrainStart, [](CallbackContext&) {});
  manager.register_callback(Event::kTrainEnd, [](CallbackContext&) { throw std::runtime_error("x"); });
  manager.fire(Event::kTrainStart, ctx);
  EXPECT_THROW(ctx.request_stop("after the fire"), std::logic_error);
  EXPECT_THROW(manager.fire(Event::kTrainEnd, ctx), CallbackError);
  EXPECT_FALSE(ctx.event().has_value());
  EXPECT_THROW(ctx.request_stop("after a failed fire"), std::logic_error);
  EXPECT_TRUE(manager.control().empty());
}

TEST_F(CallbackTest, ListedFunctionsRunOutsideFireAndCannotMakeRequests) {
  manager.register_callback(Event::kTrainStart, [](CallbackContext& c) { c.request_stop("listed"); });
  EXPECT_THROW(manager.list_callbacks(Event::kTrainStart).at(0).fn(ctx), std::logic_error);
}

TEST_F(CallbackTest, FireRejectsAContextWithAnotherUserState) {
  manager.register_callback(Event::kTrainStart, [](CallbackContext&) {});
  CallbackContext detached(state, model);  // its own store: nothing callbacks write would persist
  try {
    manager.fire(Event::kTrainStart, detached);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("CallbackContext(state, model, manager.user_state())"));
  }
}

TEST_F(CallbackTest, FireByUnknownNameThrows) { EXPECT_THROW(manager.fire("on_nothing", ctx), std::invalid_argument); }

// --- Control requests -----------------------------------------------------------------------------------------------

TEST_F(CallbackTest, ControlRequestsRecordCallbackEventAndReason) {
  struct Stopper : Callback {
    void on_train_step_end(CallbackContext& c) override { c.request_stop("loss is NaN"); }
  };
  manager.add(std::make_shared<Stopper>());
  manager.register_callback(
      Event::kLog, [](CallbackContext& c) { c.request_save("best so far"); }, "saver");
  manager.fire(Event::kTrainStepEnd, ctx);
  manager.fire(Event::kLog, ctx);

  TrainingControl& control = manager.control();
  EXPECT_TRUE(control.pending(ControlAction::kStop));
  EXPECT_TRUE(control.pending(ControlAction::kSave));
  EXPECT_FALSE(control.pending(ControlAction::kAbort));
  ASSERT_EQ(control.requests().size(), 2u);  // looking does not consume
  EXPECT_EQ(control.requests()[0].reason, "loss is NaN");
  const std::vector<ControlRequest> taken = control.take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].action, ControlAction::kStop);
  EXPECT_EQ(taken[0].reason, "loss is NaN");
  EXPECT_EQ(taken[0].callback, "Stopper");
  EXPECT_EQ(taken[0].event, Event::kTrainStepEnd);
  EXPECT_EQ(taken[1].callback, "saver");
  EXPECT_EQ(taken[1].event, Event::kLog);
  EXPECT_TRUE(control.empty());  // taking consumes them
}

TEST_F(CallbackTest, ControlRequestOutsideFireIsAnError) {
  try {
    ctx.request_abort("no");
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("request_abort() was called outside CallbackManager::fire"));
  }
}

// --- Introspection --------------------------------------------------------------------------------------------------

TEST_F(CallbackTest, MB22_EventsPropertyReturnsValidEvents) {
  EXPECT_EQ(&manager.events(), &valid_events());
  EXPECT_EQ(manager.events().count("on_train_start"), 1u);
  EXPECT_EQ(manager.events().count("on_eval_end"), 1u);
}

TEST_F(CallbackTest, MB23_ListCallbacksReturnsRegisteredInOrder) {
  manager.register_callback(
      Event::kTrainStart, [](CallbackContext&) {}, "a");
  manager.add(std::make_shared<TrainStartAndEnd>());
  manager.register_callback(
      Event::kTrainStart, [](CallbackContext&) {}, "b");
  EXPECT_THAT(names_of(manager.list_callbacks(Event::kTrainStart)), ElementsAre("a", "TrainStartAndEnd", "b"));
}

TEST_F(CallbackTest, MB24_ListCallbacksReturnsCopy) {
  manager.register_callback(Event::kTrainStart, [](CallbackContext&) {});
  auto listed = manager.list_callbacks(Event::kTrainStart);
  listed.push_back({"extra", [](CallbackContext&) {}});
  EXPECT_EQ(manager.list_callbacks(Event::kTrainStart).size(), 1u);
}

TEST_F(CallbackTest, MB25_ListCallbacksInvalidEventThrows) {
  try {
    manager.list_callbacks("invalid_event");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), StartsWith("Unknown event 'invalid_event'"));
  }
}

TEST_F(CallbackTest, MB26_HasCallbacksFalseWhenEmpty) {
  for (Event event : all_events()) EXPECT_FALSE(manager.has_callbacks(event));
}

TEST_F(CallbackTest, MB27_HasCallbacksTrueWhenRegistered) {
  manager.register_callback("on_train_start", [](CallbackContext&) {});
  EXPECT_TRUE(manager.has_callbacks("on_train_start"));
  EXPECT_TRUE(manager.has_callbacks(Event::kTrainStart));
}

TEST_F(CallbackTest, MB28_HasCallbacksFalseForInvalidEvent) {
  EXPECT_NO_THROW(EXPECT_FALSE(manager.has_callbacks("invalid_event")));
}

TEST_F(CallbackTest, ListedClassCallbackCallsTheObject) {
  auto callback = std::make_shared<TrainStartAndEnd>();
  manager.add(callback);
  manager.list_callbacks(Event::kTrainEnd).at(0).fn(ctx);
  EXPECT_EQ(callback->ends, 1);
}

// --- user_state persistence -----------------------------------------------------------------------------------------

TEST_F(CallbackTest, MB29_UserStatePersistsAcrossFires) {
  manager.register_callback(Event::kTrainStepEnd,
                            [](CallbackContext& c) { ++c.user_state.get_or_insert("counter", 0); });
  for (int i = 0; i < 5; ++i) {
    CallbackContext fresh(state, model, manager.user_state());  // the loop builds a new context per fire
    manager.fire(Event::kTrainStepEnd, fresh);
  }
  EXPECT_EQ(manager.user_state().get<int>("counter"), 5);
}

TEST_F(CallbackTest, MB30_UserStateSharedAcrossDifferentEvents) {
  manager.register_callback(Event::kTrainStart, [](CallbackContext& c) { c.user_state.set("start_time", 100.0); });
  double elapsed = 0.0;
  manager.register_callback(Event::kTrainEnd,
                            [&](CallbackContext& c) { elapsed = 200.0 - c.user_state.get<double>("start_time"); });
  manager.fire(Event::kTrainStart, ctx);
  CallbackContext later(state, model, manager.user_state());
  manager.fire(Event::kTrainEnd, later);
  EXPECT_DOUBLE_EQ(elapsed, 100.0);
}

// --- normalize_callbacks --------------------------------------------------------------------------------------------

TEST(NormalizeCallbacks, MB31_NoneReturnsNone) { EXPECT_EQ(normalize_callbacks(nullptr), nullptr); }

TEST(NormalizeCallbacks, MB32_CallbackManagerReturnsSameInstance) {
  auto manager = std::make_shared<CallbackManager>();
  EXPECT_EQ(normalize_callbacks(manager), manager);
}

TEST(NormalizeCallbacks, MB33_ListCreatesNewManager) {
  auto manager = normalize_callbacks(std::vector<std::shared_ptr<Callback>>{std::make_shared<EvalEndOnly>()});
  ASSERT_NE(manager, nullptr);
  EXPECT_TRUE(manager->has_callbacks(Event::kEvalEnd));
}

TEST(NormalizeCallbacks, MB34_ListWithMultipleCallbacks) {
  auto manager = normalize_callbacks(
      std::vector<std::shared_ptr<Callback>>{std::make_shared<TrainStartAndEnd>(), std::make_shared<EvalEndOnly>()});
  EXPECT_TRUE(manager->has_callbacks(Event::kTrainStart));
  EXPECT_TRUE(manager->has_callbacks(Event::kEvalEnd));
}

TEST(NormalizeCallbacks, MB35_EmptyListReturnsEmptyManager) {
  auto manager = normalize_callbacks(std::vector<std::shared_ptr<Callback>>{});
  ASSERT_NE(manager, nullptr);
  for (Event event : all_events()) EXPECT_FALSE(manager->has_callbacks(event));
}

// --- should_fire ----------------------------------------------------------------------------------------------------

TEST(ShouldFire, MB38_FalseWhenManagerIsNone) {
  const CallbackManager* none = nullptr;
  const bool result = should_fire(none, Event::kTrainStart);
  static_assert(std::is_same_v<decltype(should_fire(none, Event::kTrainStart)), bool>);
  EXPECT_FALSE(result);
  EXPECT_FALSE(should_fire(std::shared_ptr<CallbackManager>(), Event::kTrainStart));
  EXPECT_FALSE(should_fire(none, "on_train_start"));
}

TEST(ShouldFire, MB39_FalseWhenNoCallbacksRegistered) {
  CallbackManager manager;
  EXPECT_FALSE(should_fire(&manager, Event::kTrainStart));
}

TEST(ShouldFire, MB40_TrueWhenCallbacksRegistered) {
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(Event::kTrainStart, [](CallbackContext&) {});
  EXPECT_TRUE(should_fire(manager, Event::kTrainStart));
  EXPECT_TRUE(should_fire(manager.get(), "on_train_start"));
  EXPECT_TRUE(should_fire(manager, "on_train_start"));
}

TEST(ShouldFire, MB41_FalseForDifferentEvent) {
  CallbackManager manager;
  manager.register_callback(Event::kTrainStart, [](CallbackContext&) {});
  EXPECT_FALSE(should_fire(&manager, Event::kTrainEnd));
  EXPECT_FALSE(should_fire(&manager, "not_an_event"));
}

TEST(ShouldFire, MB42_WorksWithClassBasedCallbacks) {
  CallbackManager manager;
  manager.add(std::make_shared<EvalEndOnly>());
  EXPECT_TRUE(should_fire(&manager, Event::kEvalEnd));
  EXPECT_FALSE(should_fire(&manager, Event::kEvalStart));
}

// Extension: a registration limited to the first or last rank runs only there; the default runs everywhere.
class StepCounter : public Callback {
 public:
  int steps = 0;
  void on_train_step_end(CallbackContext&) override { ++steps; }
};

TEST_F(CallbackTest, RankFilterLimitsARegistrationToTheFirstOrLastRank) {
  std::vector<std::string> ran;
  manager.register_callback(
      Event::kTrainStepEnd, [&](CallbackContext&) { ran.push_back("all"); }, "all");
  manager.register_callback(
      Event::kTrainStepEnd, [&](CallbackContext&) { ran.push_back("first"); }, "first", RankFilter::kFirst);
  manager.register_callback(
      Event::kTrainStepEnd, [&](CallbackContext&) { ran.push_back("last"); }, "last", RankFilter::kLast);
  auto counter = std::make_shared<StepCounter>();
  manager.add(counter, RankFilter::kLast);

  manager.fire(Event::kTrainStepEnd, ctx);  // alone: rank 0 of 1 is both first and last
  EXPECT_EQ(ran, (std::vector<std::string>{"all", "first", "last"}));
  EXPECT_EQ(counter->steps, 1);

  ran.clear();
  manager.set_rank(0, 4);
  manager.fire(Event::kTrainStepEnd, ctx);
  EXPECT_EQ(ran, (std::vector<std::string>{"all", "first"}));
  EXPECT_EQ(counter->steps, 1);

  ran.clear();
  manager.set_rank(3, 4);
  manager.fire(Event::kTrainStepEnd, ctx);
  EXPECT_EQ(ran, (std::vector<std::string>{"all", "last"}));
  EXPECT_EQ(counter->steps, 2);

  ran.clear();
  manager.set_rank(1, 4);
  manager.fire(Event::kTrainStepEnd, ctx);
  EXPECT_EQ(ran, (std::vector<std::string>{"all"}));
  EXPECT_THROW(manager.set_rank(4, 4), std::invalid_argument);
}

}  // namespace
}  // namespace bridge::training
