// libFuzzer harness for TOML config files (cli/config_file.h). The command has one option of
// each kind `memfit train` has (integer, number, string, flag, list, a checked range), so values
// go through CLI11's conversions as they do there; the file is read from disk as --config reads
// it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fuzz/fuzz_util.h"
#include "memfit/cli/config_file.h"
#include "memfit/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  const auto path = fuzz::write_scratch("train.toml", fuzz::as_text(data, size));
  CLI::App cmd("fuzz");
  int steps = 0, batch = 0;
  float lr = 0;
  double clip = 0;
  std::string model, config;
  bool shuffle = false;
  std::vector<std::string> layers;
  int64_t seed = 0;
  cmd.add_option("--steps", steps);
  cmd.add_option("--batch,-b", batch)->check(CLI::Range(1, 4096));
  cmd.add_option("--lr", lr);
  cmd.add_option("--clip", clip);
  cmd.add_option("--model", model)->check(CLI::IsMember({"gpt2", "gpt2-tiny"}));
  cmd.add_option("--seed", seed);
  cmd.add_option("--layers", layers);
  cmd.add_flag("--shuffle,!--no-shuffle", shuffle);
  int grad_accum = 0;
  cmd.add_option("--grad-accum", grad_accum);
  cmd.add_option("--config", config);
  try {
    cli::apply_toml_config(cmd, path.string());
  } catch (const Error&) {
  }
  return 0;
}
