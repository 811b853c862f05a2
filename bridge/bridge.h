// The public umbrella header: `#include <bridge/bridge.h>` gives a user everything bridge offers.
#pragma once

#include "bridge/models/gpt_model.h"
#include "training/callbacks.h"
#include "training/config/config_yaml.h"
#include "training/optimizer/optimizer_param_scheduler.h"
#include "training/preflight.h"
#include "training/pretrain.h"
