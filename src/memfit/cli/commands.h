// The memfit command's subcommands: each file adds one to the app. main() is the only place
// that catches errors, prints them and picks the exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

void add_prepare_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_sample_command(CLI::App& app);

}  // namespace memfit::cli
