// Where memfit keeps what it measured about this machine between runs (the planner's
// calibrations, the offload disk's rates): one folder, asked of here by plan/ and offload/ alike.
#pragma once

#include <filesystem>

namespace memfit {

// $MEMFIT_CACHE_DIR, else $XDG_CACHE_HOME/memfit, else $HOME/.cache/memfit, else the temporary
// directory's memfit-cache.
std::filesystem::path calibration_cache_dir();

}  // namespace memfit
