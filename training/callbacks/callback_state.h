// Callback state in checkpoints: each stateful callback's state_dict() under its state_key(), and the user_state
// entries whose types a checkpoint can hold (numbers, bool, string, tensor, vectors and string-keyed maps of those).
// Values become plain lists and dicts, which PyTorch's weights-only loader opens; loading gives each callback back
// the lists typed again (a list of ints reads back with toIntVector()).
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "training/callbacks/callback_manager.h"

namespace bridge::training {
inline namespace callbacks {

/// {state_key: state_dict} of the manager's stateful callbacks.
c10::IValue save_callback_states(const CallbackManager& manager);

/// Hands each saved state to the callback with the same state_key(); saved keys no callback has are named in one
/// warning, callbacks without saved state keep theirs. `path` names the file in errors.
void load_callback_states(CallbackManager& manager, const c10::IValue& saved, const std::string& path);

/// {key: {"type": "int64", "value": 3}} for every user_state entry of a supported type; the keys of the others
/// are appended to `skipped` (the caller warns once).
c10::IValue save_user_state(const UserState& state, std::vector<std::string>& skipped);

/// Restores the entries save_user_state wrote, each with its C++ type; others in `state` stay as they are.
void load_user_state(UserState& state, const c10::IValue& saved, const std::string& path);

/// `value` with every list and dict made generic (what the pickler writes as plain Python lists and dicts).
c10::IValue to_plain_ivalue(const c10::IValue& value);
/// The reverse for homogeneous lists: ints, doubles, bools, strings or tensors become typed lists again.
c10::IValue to_typed_ivalue(const c10::IValue& value);

}  // namespace callbacks
}  // namespace bridge::training
