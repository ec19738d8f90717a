// TOML config files for subcommands: every key is one of the subcommand's long options
// (`grad_accum` or `grad-accum` for --grad-accum), the command line wins over the file, and an
// unknown key is an error that names the file, the key and the known ones.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Applies the file's values to the options of `cmd` that were not given on the command line.
// Throws memfit::ConfigError on a parse error (with the file's line), an unknown key, or a value
// of the wrong form (CLI11's conversion error, quoted).
void apply_toml_config(CLI::App& cmd, const std::string& path);

}  // namespace memfit::cli
