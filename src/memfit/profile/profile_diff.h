// `memfit profile-diff A B`: two profiles side by side from their summary.json: the peak by
// category (measured and planned), the moment of the most live bytes, the shares, the live bytes
// per kind of phase, and the buffers that changed, grouped by their tag with the block number
// taken out ("h.*.fch": twelve buffers, one per block), largest change first. For example a run
// with --ckpt none against one with --ckpt full.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/profile/profile_summary.h"  // tag_group

namespace memfit::profile {

// A profile's summary.json: `path` is the file, a --profile directory holding it, or one whose
// rank<rank>/ holds it (a run under MPI). IoError if absent or unreadable, ConfigError naming
// the file if it is not a summary of this version.
nlohmann::json load_summary(const std::filesystem::path& path, int rank = 0);

nlohmann::json profile_diff_json(const nlohmann::json& a, const nlohmann::json& b);
// The printed comparison; `top`: how many changed buffer groups to list.
std::string profile_diff_text(const nlohmann::json& diff, const std::string& name_a,
                              const std::string& name_b, size_t top = 20);

}  // namespace memfit::profile
