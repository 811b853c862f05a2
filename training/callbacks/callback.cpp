// Callback: the event -> handler table and override detection.
#include "training/callbacks/callback.h"

#include <array>
#include <typeinfo>

#include "utils/type_name.h"
#include "utils/virtual_override.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

// In Event's declaration order; tests check every entry.
constexpr std::array<Callback::Method, kNumEvents> kMethods = {
    &Callback::on_setup_start,        &Callback::on_data_init_start,
    &Callback::on_train_start,        &Callback::on_train_step_start,
    &Callback::on_train_step_end,     &Callback::on_train_end,
    &Callback::on_eval_start,         &Callback::on_eval_step_start,
    &Callback::on_eval_step_end,      &Callback::on_eval_end,
    &Callback::on_test_start,         &Callback::on_test_step_start,
    &Callback::on_test_step_end,      &Callback::on_test_end,
    &Callback::on_checkpoint_save,    &Callback::on_forward_start,
    &Callback::on_forward_end,        &Callback::on_backward_start,
    &Callback::on_backward_end,       &Callback::on_optimizer_step_start,
    &Callback::on_optimizer_step_end, &Callback::on_log,
    &Callback::on_checkpoint_load,    &Callback::on_exception,
};

}  // namespace

void Callback::on_setup_start(CallbackContext&) {}
void Callback::on_data_init_start(CallbackContext&) {}
void Callback::on_train_start(CallbackContext&) {}
void Callback::on_train_step_start(CallbackContext&) {}
void Callback::on_train_step_end(CallbackContext&) {}
void Callback::on_train_end(CallbackContext&) {}
void Callback::on_eval_start(CallbackContext&) {}
void Callback::on_eval_step_start(CallbackContext&) {}
void Callback::on_eval_step_end(CallbackContext&) {}
void Callback::on_eval_end(CallbackContext&) {}
void Callback::on_test_start(CallbackContext&) {}
void Callback::on_test_step_start(CallbackContext&) {}
void Callback::on_test_step_end(CallbackContext&) {}
void Callback::on_test_end(CallbackContext&) {}
void Callback::on_checkpoint_save(CallbackContext&) {}
void Callback::on_forward_start(CallbackContext&) {}
void Callback::on_forward_end(CallbackContext&) {}
void Callback::on_backward_start(CallbackContext&) {}
void Callback::on_backward_end(CallbackContext&) {}
void Callback::on_optimizer_step_start(CallbackContext&) {}
void Callback::on_optimizer_step_end(CallbackContext&) {}
void Callback::on_log(CallbackContext&) {}
void Callback::on_checkpoint_load(CallbackContext&) {}
void Callback::on_exception(CallbackContext&) {}

std::string Callback::name() const { return utils::short_type_name(typeid(*this)); }

std::string Callback::state_key() const { return name(); }
StateDict Callback::state_dict() const { return {}; }
void Callback::load_state_dict(const StateDict&) {}

bool Callback::stateful() const {
  static const Callback kBase;
  return utils::overrides(*this, kBase, &Callback::state_dict) ||
         utils::overrides(*this, kBase, &Callback::load_state_dict);
}

Callback::Method Callback::method_for(Event event) { return kMethods.at(static_cast<std::size_t>(event)); }

bool Callback::overrides(Event event) const {
  static const Callback kBase;
  return utils::overrides(*this, kBase, method_for(event));
}

}  // namespace callbacks
}  // namespace bridge::training
