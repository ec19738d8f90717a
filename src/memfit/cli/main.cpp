// memfit: train GPT-2 and LLaMA-family language models larger than the memory they run on.
#include <cstdio>
#include <filesystem>
#include <new>
#include <string>

#include "memfit/cli/commands.h"
#include "memfit/cli/environment.h"
#include "memfit/cli/help_markdown.h"
#include "memfit/cli/version.h"
#include "memfit/core/error.h"
#include "memfit/dist/communicator.h"
#include "memfit/memory/pool.h"

namespace {

// "rank 1: " when this process is one of several ranks (errors say which rank failed).
std::string rank_prefix() {
  return memfit::dist::launched_as_ranks()
             ? "rank " + std::to_string(memfit::dist::launched_rank()) + ": "
             : std::string();
}

// An error on one rank ends every rank (Note [Failures] in docs/notes/zero.md): the others would
// wait for it in their next collective, and this one in MPI_Finalize at exit. Nothing happens
// in one process.
int fail(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  memfit::dist::abort_world(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memfit: train GPT-2 and LLaMA-family language models within a memory budget"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show every subcommand's options");
  app.set_version_flag("--version", memfit::cli::version_text,
                       "Print memfit's version and git commit, the compiler, oneDNN's and "
                       "Highway's versions and this CPU's kernel target, and exit");
  memfit::cli::add_prepare_command(app);
  memfit::cli::add_train_command(app);
  memfit::cli::add_sample_command(app);
  memfit::cli::add_plan_command(app);
  memfit::cli::add_calibrate_command(app);
  memfit::cli::add_export_command(app);
  memfit::cli::add_profile_diff_command(app);
  memfit::cli::add_curves_command(app);
  memfit::cli::add_help_markdown_flag(app, "memfit");  // docs/cli.md
  try {
    memfit::cli::check_environment();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A word that is no command: CLI11 would say only "A subcommand is required".
    if (app.get_subcommands().empty() && !app.remaining().empty() &&
        app.remaining().front().rfind('-', 0) != 0) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({}))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      std::fprintf(stderr, "memfit: '%s' is not a command; the commands are %s (memfit --help)\n",
                   app.remaining().front().c_str(), names.c_str());
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
    return app.exit(e);
  } catch (const memfit::cli::ExitCode& e) {
    return e.code;
  } catch (const memfit::dist::DisagreementError& e) {
    // Every rank found it together and throws it: rank 0 says it once, and all end normally.
    if (memfit::dist::launched_rank() == 0) std::fprintf(stderr, "memfit: %s\n", e.what());
    return 2;
  } catch (const memfit::OutOfMemoryError& e) {
    std::fprintf(stderr, "memfit: %s%s\n", rank_prefix().c_str(), e.what());
    if (!e.advice().empty()) std::fprintf(stderr, "%s\n", e.advice().c_str());
    return fail(3);
  } catch (const memfit::Error& e) {
    std::fprintf(stderr, "memfit: %s%s\n", rank_prefix().c_str(), e.what());
    return fail(2);
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the code did not check first: still the input's fault, with the path named.
    std::fprintf(stderr, "memfit: %s[io] %s\n", rank_prefix().c_str(), e.what());
    return fail(2);
  } catch (const std::bad_alloc& e) {
    std::fprintf(stderr,
                 "memfit: %s[memory] the system refused an allocation outside the pool (%s)\n",
                 rank_prefix().c_str(), e.what());
    return fail(3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memfit: %s%s\n", rank_prefix().c_str(), e.what());
    return fail(1);
  }
  return 0;
}
