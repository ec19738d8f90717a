// memfit export --hf through the built binary: a trained checkpoint (GPT-2 and LLaMA) exported
// in shards, then loaded with --init-from and saved again, gives the same weights bit for bit;
// the export holds config.json and the weights only; exporting over the checkpoint itself or
// from a missing one exits with 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using test::slurp;

class ExportCommand : public test::BinaryTest {
 protected:
  ExportCommand() : BinaryTest(11) {}
  int run(const std::string& args) const {
    const std::string command = fmt::format("{}/memfit {} > '{}' 2> '{}'", MEMFIT_BINARY_DIR, args,
                                            (dir / "out.txt").string(), (dir / "err.txt").string());
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

TEST_F(ExportCommand, AnExportLoadsWithInitFromAsTheSameWeights) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(model);
    const std::string common = fmt::format(
        "--model {} --vocab 512 --seq-len 32 --batch 2 --threads 1 --eval-every 0 --data '{}'",
        model, (dir / "data").string());
    ASSERT_EQ(run(fmt::format("train {} --steps 3 --save '{}'", common, (dir / "ck").string())), 0)
        << slurp(dir / "err.txt");
    ASSERT_EQ(run(fmt::format("export --hf '{}' '{}' --max-shard-size 100KB", (dir / "hf").string(),
                              (dir / "ck").string())),
              0)
        << slurp(dir / "err.txt");
    EXPECT_NE(slurp(dir / "out.txt").find("model.safetensors.index.json"), std::string::npos)
        << slurp(dir / "out.txt");
    EXPECT_TRUE(fs::exists(dir / "hf" / "config.json"));
    EXPECT_FALSE(fs::exists(dir / "hf" / "optimizer.safetensors"));
    EXPECT_FALSE(fs::exists(dir / "hf" / "trainer_state.json"));
    ASSERT_EQ(run(fmt::format("train {} --steps 0 --init-from '{}' --save '{}'", common,
                              (dir / "hf").string(), (dir / "again").string())),
              0)
        << slurp(dir / "err.txt");
    const std::string before = slurp(dir / "ck" / "model.safetensors");
    ASSERT_FALSE(before.empty());
    EXPECT_TRUE(before == slurp(dir / "again" / "model.safetensors")) << "the weights differ";
    // Not over the checkpoint itself.
    EXPECT_EQ(run(fmt::format("export --hf '{}' '{}'", (dir / "ck").string(), (dir / "ck").string())),
              2);
    EXPECT_NE(slurp(dir / "err.txt").find("is the checkpoint itself"), std::string::npos);
    EXPECT_TRUE(fs::exists(dir / "ck" / "optimizer.safetensors"));
    fs::remove_all(dir / "ck");
    fs::remove_all(dir / "hf");
    fs::remove_all(dir / "again");
  }
}

TEST_F(ExportCommand, AMissingCheckpointExitsWithTwo) {
  EXPECT_EQ(run(fmt::format("export --hf '{}' '{}'", (dir / "hf").string(),
                            (dir / "missing").string())),
            2);
  EXPECT_NE(slurp(dir / "err.txt").find("missing"), std::string::npos) << slurp(dir / "err.txt");
  EXPECT_FALSE(fs::exists(dir / "hf"));
}

}  // namespace
}  // namespace memfit
