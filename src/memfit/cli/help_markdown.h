// The option reference of docs/cli.md, generated from the CLI11 definitions the binary parses
// with, so the reference cannot drift from the options (tests/cli/help_markdown_test.cpp checks
// the file against this output; scripts/cli_docs.sh rewrites it).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Markdown for `app` and every subcommand under it, depth first in the order they were added:
// a heading per command ("Options of `memfit plan`"), its description, and a table of its
// options (names, value type with allowed values, default, description). Hidden options and
// subcommands (group "") are left out, as --help leaves them out.
std::string help_markdown(const CLI::App& app, const std::string& root_name);

// A hidden `--help-markdown` flag on `app` that prints help_markdown(app, root_name) and exits 0
// before the subcommand is required.
void add_help_markdown_flag(CLI::App& app, const std::string& root_name);

}  // namespace memfit::cli
