// The public umbrella header: `#include <bridge/bridge.h>` gives a user everything bridge offers.
#pragma once

#include "training/callbacks.h"
#include "training/optimizer_param_scheduler.h"
