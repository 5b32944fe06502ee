// Built-in model flavors: the official Qwen3 dims (spec §4.2) and small debug models, chosen by
// name like torchtitan's model registry ("0.6B", "30B-A3B", "debugmodel").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "titan/models/model_args.h"

namespace titan {

// The flavor's arguments (attn_backend "blockwise"). An unknown name is a titan::Error that
// suggests the closest valid name and lists them all.
const ModelArgs& flavor(std::string_view name);
// The flavor with attention computed by `attn_backend` ("blockwise" or "reference").
ModelArgs flavor(std::string_view name, std::string_view attn_backend);
// Every flavor name, in registry order (debug first, then by size).
std::vector<std::string> flavor_names();

}  // namespace titan
