// memfit: train transformer language models larger than the memory they run on.
#include <cstdio>

#include "memfit/cli/commands.h"
#include "memfit/core/error.h"
#include "memfit/memory/pool.h"

int main(int argc, char** argv) {
  CLI::App app{"memfit: train GPT-2 style language models within a memory budget"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show every subcommand's options");
  memfit::cli::add_prepare_command(app);
  memfit::cli::add_train_command(app);
  memfit::cli::add_sample_command(app);
  memfit::cli::add_plan_command(app);
  memfit::cli::add_calibrate_command(app);
  memfit::cli::add_profile_diff_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const memfit::cli::ExitCode& e) {
    return e.code;
  } catch (const memfit::OutOfMemoryError& e) {
    std::fprintf(stderr, "memfit: %s\n", e.what());
    if (!e.advice().empty()) std::fprintf(stderr, "%s\n", e.advice().c_str());
    return 3;
  } catch (const memfit::Error& e) {
    std::fprintf(stderr, "memfit: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memfit: %s\n", e.what());
    return 1;
  }
  return 0;
}
