// The callback core in one include: events, Callback, CallbackContext, CallbackManager, normalize_callbacks and
// should_fire (Megatron-Bridge's training.callbacks module).
#pragma once

#include "training/callback.h"
#include "training/callback_context.h"
#include "training/callback_manager.h"
#include "training/control.h"
#include "training/event.h"
#include "training/state.h"
#include "training/user_state.h"
