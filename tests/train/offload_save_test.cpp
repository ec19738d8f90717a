// The streamed save in one process (Note [Streamed save] in docs/notes/checkpoints.md): where
// the weights of record are on disk (offloaded master weights, or without master weights the
// offloaded working weights), every save (--save-every and the final one) writes
// model.safetensors from the files, with and without --offload-grads, on GPT-2 (transposed
// Conv1D weights through the save's staging) and LLaMA. Each checkpoint is the same run's in RAM
// byte for byte, and the planned peak by category, the save's staging included, is the
// measured one.
#include <gtest/gtest.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/io/checkpoint/streamed_weights.h"
#include "memfit/plan/memory_plan.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class StreamedSave : public test::TrainerFixture {
 protected:
  struct Offload {
    const char* name;
    bool params, grads;
  };
  // `c` in RAM, then offloaded each way in `ways`: the same checkpoint, and the plan's peak.
  void expect_saves_as_in_ram(TrainConfig c, const std::string& what,
                              const std::vector<Offload>& ways) {
    c.steps = 2;
    c.save_every = 1;  // a save after step 1 and the final one
    c.grad_accum = 1;
    c.eval_every = 0;
    c.save_dir = (dir / "ram").string();
    fs::remove_all(c.save_dir);
    train(c);
    for (const Offload& way : ways) {
      SCOPED_TRACE(what + ", " + way.name);
      TrainConfig o = c;
      o.offload_optimizer = "nvme";
      o.offload_dir = (dir / "offload").string();
      if (way.params) o.offload_params = "nvme";
      if (way.grads) o.offload_grads = "nvme";
      o.save_dir = (dir / "off").string();
      o.log_file = (dir / "off.jsonl").string();
      fs::remove_all(o.save_dir);
      const RunSpec spec = resolve_run(o);
      ASSERT_TRUE(save_streams_weights(spec));
      const PlanReport plan = plan_memory(spec);
      const TrainSummary s = train(o);
      expect_same_checkpoint(dir / "ram", dir / "off");
      int saves = 0;
      for (const auto& line : read_log(dir / "off.jsonl"))
        if (line.contains("saved")) {
          EXPECT_GE(line["save_seconds"].get<double>(), 0.0);
          ++saves;
        }
      EXPECT_EQ(saves, 2);
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
      // The save's staging is planned where the family stores tensors transposed, within the
      // bounds of the set-up's piece, and absent from a run that does not save.
      const int64_t staging = save_staging_elements(spec, plan.step);
      EXPECT_EQ(staging > 0, spec.model.family == Family::gpt2);
      EXPECT_LE(staging, setup_piece_elements(plan.step));
      RunSpec quiet = spec;
      quiet.saves = false;
      EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::staging)] -
                    plan_memory(quiet).by_category[static_cast<size_t>(Category::staging)],
                staging > 0 ? MemoryPool::round_up(static_cast<size_t>(staging) * 4) : 0u);
      EXPECT_FALSE(fs::exists(dir / "offload"));  // the directory the run made goes too
    }
  }
};

// Offloaded FP32 master weights (bf16 with master weights): read from the master file.
TEST_F(StreamedSave, MasterWeightsOffloadedSaveAsInRam) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    TrainConfig c = config(model);
    c.precision = "bf16";
    c.optim.name = "adamw8bit";
    expect_saves_as_in_ram(c, model, {{"optimizer", false, false},
                                      {"optimizer and gradients", false, true},
                                      {"optimizer, weights and gradients", true, true}});
  }
}

// Without master weights the working weights are the weights of record: with them offloaded,
// read from their file (the blocks) and RAM (the embeddings and the tail). Pure bf16 with 8-bit
// AdamW (the headline's configuration) and fp32 (with a ring of one block slot).
TEST_F(StreamedSave, WorkingWeightsOffloadedSaveAsInRam) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    TrainConfig c = config(model);
    c.precision = "bf16";
    c.master_weights = "none";
    c.optim.name = "adamw8bit";
    expect_saves_as_in_ram(c, std::string(model) + " pure bf16",
                           {{"optimizer and weights", true, false},
                            {"optimizer, weights and gradients", true, true}});
    TrainConfig f = config(model);
    f.prefetch_depth = 0;  // a ring of one block: the save reads each block after the last
    expect_saves_as_in_ram(f, std::string(model) + " fp32, --prefetch-depth 0",
                           {{"optimizer, weights and gradients", true, true}});
  }
}

}  // namespace
}  // namespace memfit
