#include "titan/infer/device.h"

#include <filesystem>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/models/hf_config.h"

namespace titan {

void select_inference_device(const std::string& device) {
  try {
    select_backend(device);
  } catch (const Error& e) {
    fail("--device ", device, ": ", e.what());
  }
}

void check_inference_on_device(const std::string& device, const std::string& model_dir,
                               const std::string& adapter) {
  if (parse_device_name(device).kind == DeviceKind::cpu) return;
  const ModelArgs args =
      read_hf_config((std::filesystem::path(model_dir) / "config.json").string());
  const auto refuse = [&](bool asked, const char* what, const char* instead) {
    TITAN_CHECK(!asked, "--device ", device, ": ", what, " is not implemented on CUDA yet (",
                instead, ")");
  };
  refuse(args.is_moe(), "a MoE model (sparse layers)", "use --device cpu");
  refuse(!adapter.empty(), "merging a LoRA adapter at load (--adapter)", "use --device cpu");
}

}  // namespace titan
