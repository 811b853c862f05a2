// The callbacks in one include (training/callbacks/, namespace bridge::training::callbacks, whose names are also
// bridge::training's): the core (events, Callback, CallbackContext, CallbackManager, control requests,
// normalize_callbacks, should_fire; Megatron-Bridge's training.callbacks module) and the built-in callbacks.
//
//   auto manager = std::make_shared<CallbackManager>();
//   manager->add(std::make_shared<callbacks::EarlyStopping>());  // stops when the validation loss stalls
//   manager->add(std::make_shared<callbacks::ProgressBar>());
//   pretrain(config, gpt_forward_step, manager);
#pragma once

#include "training/callbacks/callback.h"
#include "training/callbacks/callback_context.h"
#include "training/callbacks/callback_manager.h"
#include "training/callbacks/control.h"
#include "training/callbacks/event.h"
#include "training/callbacks/user_state.h"
#include "training/state.h"

// Built-ins.
#include "training/callbacks/divergence_detector.h"
#include "training/callbacks/early_stopping.h"
#include "training/callbacks/expert_load_monitor.h"
#include "training/callbacks/learning_rate_monitor.h"
#include "training/callbacks/memory_monitor.h"
#include "training/callbacks/profiler.h"
#include "training/callbacks/progress_bar.h"
#include "training/callbacks/runtime_estimator.h"
#include "training/callbacks/speed_monitor.h"
#include "training/callbacks/text_generator.h"
#include "training/callbacks/threshold_stopper.h"
#include "training/callbacks/time_limit.h"
