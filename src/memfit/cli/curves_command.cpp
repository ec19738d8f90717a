// memfit curves A.jsonl [B.jsonl ...] -o FILE: training logs (`memfit train --log`) as one
// self-contained page of curves, several runs overlaid (profile/curves_page.h). memfit train
// writes the page of its own log by itself; this command compares runs, or redraws one.
#include <fmt/format.h>

#include "memfit/cli/commands.h"
#include "memfit/profile/curves_page.h"

namespace memfit::cli {

void add_curves_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "curves", "Draw training logs (memfit train --log) as one page: loss, validation loss, "
                "learning rate, gradient norm, tokens/s and memory over the steps, runs overlaid");
  struct Options {
    std::vector<std::string> logs;
    std::string out;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("LOG", o->logs, "JSON-lines logs of memfit train --log, one run each")
      ->required();
  cmd->add_option("-o,--out", o->out,
                  "The page to write (default: beside a single log, its extension replaced by "
                  ".curves.html; for several logs, curves.html here)");
  cmd->callback([o] {
    std::string out = o->out;
    if (out.empty())
      out = o->logs.size() == 1 ? profile::curves_path_for_log(o->logs.front()).string()
                                : std::string("curves.html");
    profile::write_curves_page(o->logs, out);
    fmt::print("memfit curves: {} run{} drawn in {}\n", o->logs.size(),
               o->logs.size() == 1 ? "" : "s", out);
  });
}

}  // namespace memfit::cli
