// "Did you mean" for unknown names: the candidate with the smallest case-insensitive edit
// distance.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace titan {

size_t edit_distance(std::string_view a, std::string_view b);
// The closest candidate ("" when there are none).
std::string closest_name(std::string_view wrong, const std::vector<std::string>& candidates);
// "a, b, c"
std::string join_names(const std::vector<std::string>& names);

}  // namespace titan
