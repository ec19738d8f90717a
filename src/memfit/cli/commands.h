// The memfit command's subcommands: each file adds one to the app. main() is the only place
// that catches errors, prints them and picks the exit code.
#pragma once

#include <CLI/CLI.hpp>

#include "memfit/cli/options/train_config.h"

namespace memfit::cli {

// A command that finished its work but must exit non-zero (train stopped by a signal: 128 + its
// number, as a shell reports it). Thrown to main(), which returns `code`.
struct ExitCode {
  int code;
};

// For unsigned options (a seed, a count): CLI11 would wrap "-1" to a huge value, and its own
// NonNegativeNumber prints the largest double as the bound.
inline const CLI::Validator kNonNegative(
    [](const std::string& s) -> std::string {
      return !s.empty() && s.front() == '-' ? "must be 0 or more, got " + s : std::string();
    },
    "", "non-negative");

void add_prepare_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_profile_diff_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_curves_command(CLI::App& app);

// The options of `memfit train` (and of `memfit plan`, which takes the same), into `config`;
// --config names a TOML file of them.
void add_train_options(CLI::App* cmd, TrainConfig& config, std::string& config_file);

}  // namespace memfit::cli
