// libFuzzer target: the checkpoint file reader (utils/torch_pickle.h, which every model_optim_rng.pt and common.pt
// goes through). Any file must load or be refused with std::runtime_error naming it; no other exception, crash or
// leak. What loads must write back and load again to the same file bytes (save, load and save again agree).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "utils/durable_file.h"
#include "utils/torch_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = bridge::fuzz::scratch_dir();
  bridge::fuzz::write_file(dir / "in.pt", std::string_view(reinterpret_cast<const char*>(data), size));
  c10::IValue value;
  try {
    value = bridge::utils::load_torch_pickle(dir / "in.pt");
  } catch (const std::runtime_error&) {
    return 0;
  }
  try {
    bridge::utils::save_torch_pickle(dir / "once.pt", value);
  } catch (const std::runtime_error&) {
    return 0;  // a value of a kind bridge does not write (an object, a tensor of a storage it cannot save)
  }
  bridge::utils::save_torch_pickle(dir / "twice.pt", bridge::utils::load_torch_pickle(dir / "once.pt"));
  FUZZ_CHECK(bridge::utils::read_file(dir / "once.pt") == bridge::utils::read_file(dir / "twice.pt"));
  return 0;
}
