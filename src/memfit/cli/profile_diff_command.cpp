// memfit profile-diff A B: two memory profiles (`memfit train --profile`) side by side, from
// their summary.json: the peak by category, the moment of the most live bytes, and the buffers
// that changed (profile/profile_diff.h). --json prints the comparison as one object.
#include <fmt/format.h>

#include "memfit/cli/commands.h"
#include "memfit/profile/profile_diff.h"

namespace memfit::cli {

void add_profile_diff_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "profile-diff", "Compare two memory profiles of memfit train --profile (e.g. --ckpt none "
                      "against --ckpt full)");
  struct Options {
    std::string a, b;
    int rank = 0;
    size_t top = 20;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("A", o->a, "A profile directory (or its summary.json)")->required();
  cmd->add_option("B", o->b, "Another")->required();
  cmd->add_option("--rank", o->rank, "Under MPI: which rank's profile (DIR/rank<r>/)")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_option("--top", o->top, "Changed buffer groups to list")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_flag("--json", o->json, "Print the comparison as JSON");
  cmd->callback([o] {
    const nlohmann::json a = profile::load_summary(o->a, o->rank),
                         b = profile::load_summary(o->b, o->rank);
    const nlohmann::json diff = profile::profile_diff_json(a, b);
    if (o->json)
      fmt::print("{}\n", diff.dump(2));
    else
      fmt::print("{}", profile::profile_diff_text(diff, o->a, o->b, o->top));
  });
}

}  // namespace memfit::cli
