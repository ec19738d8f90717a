// memfit prepare: text files to token shards. (Being written: see issue 3.)
#include "memfit/cli/commands.h"
#include "memfit/core/error.h"

namespace memfit::cli {

void add_prepare_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("prepare", "Tokenize text files into training shards");
  cmd->callback([] { MEMFIT_THROW(Error, "prepare", "not built yet"); });
}

}  // namespace memfit::cli
