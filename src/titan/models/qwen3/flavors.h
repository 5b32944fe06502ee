// Built-in model flavors, chosen by name like torchtitan's model registry; all are Qwen3 or
// Qwen3-MoE: the official Qwen3 dims (spec §4.2, "0.6B" ... "235B-A22B"), torchtitan's debug
// models under torchtitan's names ("debugmodel", "debugmodel_moe"), and titan's smaller ones
// ("tiny", "tiny_moe"). The other families have none: they train from a Hugging Face folder.
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
// Every flavor name, in registry order (the small ones first, then by size).
std::vector<std::string> flavor_names();

}  // namespace titan
