// torchtitan's keys that titan accepts without acting on them, each with the reason, so that
// torchtitan's own TOML files start unedited: the run names every such key it was given in one
// start-up line per reason (job_config_unused_keys) instead of refusing it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace titan {

// Why "section.key" (dotted further for nested tables: "quantize.linear.float8.filter_fqns") has
// no effect here; nullptr for a key titan does not know (an error) or implements.
const char* torchtitan_inert_key_reason(std::string_view key);
// Those keys of `section`, without the section ("enable" for [compile]): the names a misspelt
// key is compared with.
std::vector<std::string> torchtitan_inert_keys_in(std::string_view section);

}  // namespace titan
