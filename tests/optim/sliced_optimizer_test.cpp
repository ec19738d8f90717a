// Which optimizers step a tensor-parallel rank's slices as one process steps the whole model
// (optim/sliced_optimizer.h): the element-wise ones and Adam-mini always (its row-parallel rows
// summed over the group in the update); 8-bit AdamW and Lion where every run of every rank's
// slice is whole 256-value blocks of both tensors, 4-bit AdamW where it is whole 128-value
// blocks (its first moment's), refused naming the parameter otherwise; APOLLO and GaLore
// refused with their reason. (The runs themselves against one
// process: tests/cli/tensor_parallel_test.cpp.)
#include "memfit/optim/sliced_optimizer.h"

#include <gtest/gtest.h>

#include <string>

namespace memfit {
namespace {

ModelConfig split(const std::string& preset, int d_model, int tp, int ffn_dim = 0) {
  ModelConfig c = ModelConfig::preset(preset);
  if (d_model) c.d_model = d_model;
  if (ffn_dim) c.ffn_dim = ffn_dim;
  c.finalize();
  c.set_tensor_parallel(tp);
  return c;
}

std::string refusal(const std::string& optim, const ModelConfig& c) {
  OptimConfig o;
  o.name = optim;
  return sliced_optimizer_refusal(o, c).value_or("");
}

TEST(SlicedOptimizer, ElementWiseOptimizersAndAdamMiniStepAnySlice) {
  for (const char* o : {"adamw", "sgd", "lion", "adam-mini"}) {
    EXPECT_EQ(refusal(o, split("gpt2-tiny", 0, 2)), "") << o;
    EXPECT_EQ(refusal(o, split("llama-tiny", 0, 4)), "") << o;
  }
}

TEST(SlicedOptimizer, EightBitStateWhereTheSlicesCutWholeBlocks) {
  // gpt2-tiny is 96 wide: attn.c_proj's (96, 48) slice is rows of 48 values of the whole.
  const std::string narrow = refusal("adamw8bit", split("gpt2-tiny", 0, 2));
  EXPECT_NE(narrow.find("h.0.attn.c_proj.weight"), std::string::npos) << narrow;
  EXPECT_NE(narrow.find("not whole 256-value quantisation blocks"), std::string::npos) << narrow;
  // 512 wide at --tp 2: every run 256 values or a multiple, from a block of both tensors
  // (LLaMA's down projection too once its MLP is 512 wide; llama-tiny's 256 is rows of 128).
  for (const char* o : {"adamw8bit", "lion8bit"}) {
    EXPECT_EQ(refusal(o, split("gpt2-tiny", 512, 2)), "") << o;
    EXPECT_EQ(refusal(o, split("llama-tiny", 512, 2, 512)), "") << o;
  }
  EXPECT_NE(refusal("adamw8bit", split("llama-tiny", 512, 2)).find("model.layers.0.mlp.down_proj"),
            std::string::npos);
  // ... but not at --tp 4 (the projections' rows of 128 values).
  EXPECT_NE(refusal("lion8bit", split("gpt2-tiny", 512, 4)).find("rank 0's slice"),
            std::string::npos);
}

TEST(SlicedOptimizer, FourBitStateWhereTheSlicesCutWholeFirstMomentBlocks) {
  // 96 wide: attn.c_proj's rows of 48 values of the whole cut its 128-value blocks.
  const std::string narrow = refusal("adamw4bit", split("gpt2-tiny", 0, 2));
  EXPECT_NE(narrow.find("h.0.attn.c_proj.weight"), std::string::npos) << narrow;
  EXPECT_NE(narrow.find("not whole 128-value quantisation blocks"), std::string::npos) << narrow;
  // 256 wide at --tp 2: runs of 128 or a multiple (LLaMA's one key/value head a rank too).
  EXPECT_EQ(refusal("adamw4bit", split("gpt2-tiny", 256, 2)), "");
  EXPECT_EQ(refusal("adamw4bit", split("llama-tiny", 256, 2)), "");
  // llama-tiny's k_proj at --tp 2 and 96 wide: the rank's head (24 x 96) is under 4096 values,
  // f32 state, where the whole (48 x 96) is quantised.
  const std::string small = refusal("adamw4bit", split("llama-tiny", 0, 2));
  EXPECT_NE(small.find("would keep f32 state where one process keeps 4-bit"), std::string::npos)
      << small;
}

TEST(SlicedOptimizer, RefusesProjectionsOfWholeMatricesWithTheReason) {
  const ModelConfig c = split("gpt2-tiny", 512, 2);
  EXPECT_NE(refusal("apollo", c).find("random projection"), std::string::npos);
  EXPECT_NE(refusal("apollo-mini", c).find("random projection"), std::string::npos);
  EXPECT_NE(refusal("galore", c).find("SVD"), std::string::npos);
  EXPECT_NE(refusal("galore8bit", c).find("SVD"), std::string::npos);
}

}  // namespace
}  // namespace memfit
