// GPT-2 checkpoints: bit-exact round trips, Hugging Face names, shapes and Conv1D transposes,
// Hugging Face name variants, refusals that list the mismatches and change nothing, optimizer
// state, extra files, and interrupted saves that keep the old checkpoint.
#include "memfit/io/checkpoint/model_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/hf/gpt2_hf_config.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "checkpoint_test_util.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using namespace testing;  // ScratchDir, list_dir; checkpoint_test_util.h

ModelConfig tiny(int n_layer = 2, int d_model = 8, int n_head = 2) {
  ModelConfig c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.d_model = d_model;
  c.max_seq_len = 16;
  c.vocab_size = 50;  // padded to 64: 14 padding rows
  c.finalize();
  return c;
}

// AdamW's state without its kernel: two FP32 tensors named "m" and "v" over the layout, and
// optionally a small "q" (i8) that no real optimizer has.
class FakeOptimizer : public Optimizer {
 public:
  FakeOptimizer(const ParamLayout& layout, MemoryPool& pool, std::string name = "adamw",
                bool extra = false)
      : Optimizer(OptimConfig{}, layout, std::nullopt), name_(std::move(name)), extra_(extra) {
    init_state(&pool, name_);
  }
  std::string name() const override { return name_; }

 protected:
  std::vector<StateSpec> whole_state() const override {
    std::vector<StateSpec> s = {{"m", DType::f32, layout_.total()},
                                {"v", DType::f32, layout_.total()}};
    if (extra_) s.push_back({"q", DType::i8, 15});
    return s;
  }
  int64_t state_position(size_t i, int64_t x) const override {
    return i < 2 ? x : (x == layout_.total() ? 15 : 0);
  }
  void update(const Piece&, Tensor&, const Tensor&, float, float) override {
    MEMFIT_THROW(Error, "test", "not stepped here");
  }

 private:
  std::string name_;
  bool extra_;
};

void fill_state(Optimizer& opt, uint32_t seed) {
  for (auto& [n, t] : opt.state()) {
    auto* b = static_cast<uint8_t*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<uint8_t>(i * 13 + seed);
  }
}

TEST(Gpt2Checkpoint, RoundTripIsBitExact) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout), back = make_slab(pool, layout);
  fill(slab, 1);
  fill(back, 2);
  save_checkpoint(root / "ckpt", c, layout, slab);
  EXPECT_EQ(list_dir(root / "ckpt"),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  CheckpointLocation at = load_checkpoint(root / "ckpt", c, layout, back);
  EXPECT_FALSE(at.recovered);
  expect_loaded(c, layout, slab, back);
}

TEST(Gpt2Checkpoint, StoresHuggingFaceNamesShapesAndConv1DLayouts) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout);
  fill(slab, 3);
  save_checkpoint(root / "ckpt", c, layout, slab);
  SafetensorsReader r(root / "ckpt" / "model.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.entries().size(), layout.params().size());
  EXPECT_EQ(r.find("lm_head.weight"), nullptr);
  for (const SafetensorsEntry& e : r.entries()) {
    EXPECT_EQ(e.name.rfind("transformer.", 0), 0u) << e.name;
    EXPECT_EQ(e.dtype, SafetensorsDType::F32) << e.name;
  }
  const int64_t C = c.d_model;
  auto shape = [&](const char* n) { return r.at(n).shape; };
  EXPECT_EQ(shape("transformer.wte.weight"), (std::vector<int64_t>{50, C}));  // no padding rows
  EXPECT_EQ(shape("transformer.wpe.weight"), (std::vector<int64_t>{16, C}));
  EXPECT_EQ(shape("transformer.h.1.ln_1.weight"), (std::vector<int64_t>{C}));
  EXPECT_EQ(shape("transformer.h.0.attn.c_attn.weight"), (std::vector<int64_t>{C, 3 * C}));
  EXPECT_EQ(shape("transformer.h.0.attn.c_attn.bias"), (std::vector<int64_t>{3 * C}));
  EXPECT_EQ(shape("transformer.h.0.attn.c_proj.weight"), (std::vector<int64_t>{C, C}));
  EXPECT_EQ(shape("transformer.h.0.mlp.c_fc.weight"), (std::vector<int64_t>{C, 4 * C}));
  EXPECT_EQ(shape("transformer.h.0.mlp.c_proj.weight"), (std::vector<int64_t>{4 * C, C}));
  EXPECT_EQ(shape("transformer.ln_f.bias"), (std::vector<int64_t>{C}));

  // Conv1D [in, out]: stored[i][o] == memfit's (out, in)[o][i].
  for (const char* name : {"h.1.attn.c_attn.weight", "h.0.mlp.c_proj.weight"}) {
    Tensor mine = layout.view(slab, name);
    const SafetensorsEntry& e = r.at(std::string("transformer.") + name);
    std::vector<float> stored(static_cast<size_t>(e.numel()));
    std::memcpy(stored.data(), r.bytes(e), e.nbytes());
    int64_t out = mine.size(0), in = mine.size(1);
    int bad = 0;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) bad += stored[i * out + o] != mine.data<float>()[o * in + i];
    EXPECT_EQ(bad, 0) << name;
  }
  // wte rows are stored as they are.
  Tensor wte = layout.view(slab, "wte.weight");
  EXPECT_EQ(std::memcmp(r.bytes(r.at("transformer.wte.weight")), wte.raw_data(), 50 * C * 4), 0);

  ModelConfig saved = read_gpt2_config(root / "ckpt" / "config.json");
  EXPECT_EQ(saved.n_layer, 2);
  EXPECT_EQ(saved.vocab_size, 50);
}

TEST(Gpt2Checkpoint, ConvertsBetweenF32AndBf16) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor f = make_slab(pool, layout), b = make_slab(pool, layout, DType::bf16);
  fill(f, 4);
  fill(b, 5);
  save_checkpoint(root / "bf16", c, layout, b);
  SafetensorsReader r(root / "bf16" / "model.safetensors");
  EXPECT_EQ(r.at("transformer.h.0.ln_2.bias").dtype, SafetensorsDType::BF16);
  EXPECT_EQ(
      read_file_to_string(root / "bf16" / "config.json").find("\"bfloat16\"") != std::string::npos,
      true);

  Tensor f2 = make_slab(pool, layout);
  load_checkpoint(root / "bf16", c, layout, f2);  // BF16 stored -> f32 model: exact
  Tensor wte_b = layout.view(b, "wte.weight"), wte_f = layout.view(f2, "wte.weight");
  for (int64_t i = 0; i < c.vocab_size * c.d_model; ++i)
    ASSERT_EQ(wte_f.data<float>()[i], f32_from_bf16(static_cast<uint16_t*>(wte_b.raw_data())[i]));

  save_checkpoint(root / "f32", c, layout, f);
  Tensor b2 = make_slab(pool, layout, DType::bf16);
  load_checkpoint(root / "f32", c, layout, b2);  // F32 stored -> bf16 model: rounded
  Tensor q_f = layout.view(f, "h.1.mlp.c_fc.weight"), q_b = layout.view(b2, "h.1.mlp.c_fc.weight");
  for (int64_t i = 0; i < q_f.numel(); ++i)
    ASSERT_EQ(static_cast<uint16_t*>(q_b.raw_data())[i], bf16_from_f32(q_f.data<float>()[i]));
}

// A Hugging Face style file: no "transformer." prefix, attention-mask buffers, a tied lm_head.
void write_hf_style(const fs::path& file, const ModelConfig& c, const ParamLayout& layout,
                    const Tensor& slab, const Tensor* lm_head_override, const Tensor& mask) {
  SafetensorsWriter w;
  for (const ParamInfo& p : layout.params()) {
    Tensor t = layout.view(slab, p);
    if (p.role == ParamRole::token_embedding) t = t.slice(0, c.vocab_size);
    w.add(p.name, t, std::nullopt, gpt2_is_conv1d(p));
  }
  for (int l = 0; l < c.n_layer; ++l) {
    w.add(fmt::format("h.{}.attn.bias", l), mask);
    w.add(fmt::format("h.{}.attn.masked_bias", l), mask.view(0, {}));
  }
  w.add("lm_head.weight", lm_head_override
                              ? *lm_head_override
                              : layout.view(slab, "wte.weight").slice(0, c.vocab_size));
  w.set_metadata("format", "pt");
  w.write(file);
}

TEST(Gpt2Checkpoint, LoadsHuggingFaceNameVariants) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout), back = make_slab(pool, layout);
  fill(slab, 6);
  Tensor mask = Tensor::empty(pool, {1, 1, 16, 16}, DType::f32, Category::params, "mask");
  fs::create_directories(root / "hf");
  write_hf_style(root / "hf" / "model.safetensors", c, layout, slab, nullptr, mask);
  write_file_atomic(root / "hf" / "config.json", gpt2_config_to_hf_json(c).dump());
  load_checkpoint(root / "hf", c, layout, back);
  expect_loaded(c, layout, slab, back);

  // An lm_head that differs from wte is a different model: refused.
  Tensor other = Tensor::empty(pool, {c.vocab_size, c.d_model}, DType::f32, Category::params, "o");
  write_hf_style(root / "untied.safetensors", c, layout, slab, &other, mask);
  std::string msg =
      error_of([&] { load_weights(root / "untied.safetensors", c, layout, back); });
  expect_contains(msg, {"untied.safetensors", "'lm_head.weight' differs from 'wte.weight'"});
}

TEST(Gpt2Checkpoint, RefusesAMismatchListingTheFirstMismatchesAndChangesNothing) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c2 = tiny(2), c3 = tiny(3), c1 = tiny(1), wide = tiny(2, 16);
  ParamLayout l2(c2), l3(c3), l1(c1), lw(wide);
  Tensor s2 = make_slab(pool, l2);
  fill(s2, 7);
  const fs::path file = root / "two_layers.safetensors";
  save_weights_file(file, c2, l2, s2);

  Tensor s3 = make_slab(pool, l3);
  fill(s3, 8);
  std::string before = bytes(s3);
  std::string msg = error_of([&] { load_weights(file, c3, l3, s3); });
  expect_contains(msg, {file.string(), "does not match the model", "12 mismatches",
                        "missing 'transformer.h.2.ln_1.weight' (8,)",
                        "missing 'transformer.h.2.attn.c_attn.weight' (8, 24)", "and 4 more"});
  EXPECT_EQ(bytes(s3), before);  // nothing was loaded

  Tensor s1 = make_slab(pool, l1);
  msg = error_of([&] { load_weights(file, c1, l1, s1); });
  expect_contains(msg, {"unexpected 'transformer.h.1.ln_1.weight' (8,)"});

  Tensor sw = make_slab(pool, lw);
  msg = error_of([&] { load_weights(file, wide, lw, sw); });
  expect_contains(msg,
                  {"'transformer.wte.weight' has shape (50, 8), expected (50, 16)",
                   "'transformer.h.0.attn.c_attn.weight' has shape (8, 24), expected (16, 48)"});

  // A tensor of the right shape in a type that is not a float.
  SafetensorsWriter w;
  for (const ParamInfo& p : l2.params()) {
    Tensor t = l2.view(s2, p);
    if (p.role == ParamRole::token_embedding) t = t.slice(0, c2.vocab_size);
    if (p.name == "ln_f.bias")
      w.add_raw(gpt2_hf_name(p), SafetensorsDType::I32, {8}, t.raw_data());
    else
      w.add(gpt2_hf_name(p), t, std::nullopt, gpt2_is_conv1d(p));
  }
  w.write(root / "ints.safetensors");
  msg = error_of([&] { load_weights(root / "ints.safetensors", c2, l2, s2); });
  expect_contains(msg, {"1 mismatch:", "'transformer.ln_f.bias' is stored as I32"});
}

TEST(Gpt2Checkpoint, RefusesACheckpointOfAnotherShape) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig a = tiny(2, 8, 2), b = tiny(2, 8, 4);  // same tensors, different heads
  ParamLayout la(a), lb(b);
  Tensor sa = make_slab(pool, la), sb = make_slab(pool, lb);
  save_checkpoint(root / "ckpt", a, la, sa);
  std::string msg = error_of([&] { load_checkpoint(root / "ckpt", b, lb, sb); });
  expect_contains(msg, {"config.json", "n_head is 2 there, 4 here"});
}

TEST(Gpt2Checkpoint, OptimizerStateRoundTripsBitExactly) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout), back = make_slab(pool, layout);
  fill(slab, 9);
  FakeOptimizer opt(layout, pool, "adamw", true), opt2(layout, pool, "adamw", true);
  fill_state(opt, 1);
  opt.state()[0].second.data<float>()[5] = std::nanf("0x123");  // NaN payloads survive
  opt.set_steps_taken(123);
  CheckpointSaveOptions options;
  options.optimizer = &opt;
  save_checkpoint(root / "ckpt", c, layout, slab, options);

  SafetensorsReader r(root / "ckpt" / "optimizer.safetensors");
  EXPECT_EQ(r.metadata().at("optimizer"), "adamw");
  EXPECT_EQ(r.metadata().at("steps_taken"), "123");
  EXPECT_NE(r.find("adamw.m"), nullptr);
  EXPECT_NE(r.find("adamw.v"), nullptr);
  EXPECT_EQ(r.at("adamw.q").dtype, SafetensorsDType::I8);

  load_checkpoint(root / "ckpt", c, layout, back, &opt2);
  expect_loaded(c, layout, slab, back);
  EXPECT_EQ(opt2.steps_taken(), 123);
  for (size_t i = 0; i < opt.state().size(); ++i)
    EXPECT_EQ(bytes(opt.state()[i].second), bytes(opt2.state()[i].second)) << opt.state()[i].first;
}

TEST(Gpt2Checkpoint, RefusesMismatchedOptimizerStateWithoutLoadingAnything) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout);
  fill(slab, 10);
  FakeOptimizer opt(layout, pool);
  fill_state(opt, 2);
  CheckpointSaveOptions options;
  options.optimizer = &opt;
  save_checkpoint(root / "ckpt", c, layout, slab, options);

  Tensor back = make_slab(pool, layout);
  FakeOptimizer lion(layout, pool, "lion");
  std::string msg = error_of([&] { load_checkpoint(root / "ckpt", c, layout, back, &lion); });
  expect_contains(msg, {"optimizer.safetensors", "holds 'adamw' optimizer state", "uses 'lion'"});
  EXPECT_EQ(bytes(back), std::string(back.nbytes(), '\0'));  // weights not loaded either

  FakeOptimizer more(layout, pool, "adamw", true);
  msg = error_of([&] { load_checkpoint(root / "ckpt", c, layout, back, &more); });
  expect_contains(msg, {"1 mismatch:", "missing 'adamw.q' I8 (15,)"});
  EXPECT_EQ(bytes(back), std::string(back.nbytes(), '\0'));

  ModelConfig bigger = tiny(2, 8);
  bigger.max_seq_len = 32;
  bigger.finalize();
  ParamLayout lb(bigger);
  FakeOptimizer wrong_shape(lb, pool);
  msg =
      error_of([&] { load_optimizer_state(root / "ckpt" / "optimizer.safetensors", wrong_shape); });
  expect_contains(msg, {"'adamw.m' is F32", "expected F32"});
  EXPECT_EQ(bytes(wrong_shape.state()[0].second),
            std::string(wrong_shape.state()[0].second.nbytes(), '\0'));

  fs::remove(root / "ckpt" / "optimizer.safetensors");
  FakeOptimizer fresh(layout, pool);
  msg = error_of([&] { load_checkpoint(root / "ckpt", c, layout, back, &fresh); });
  expect_contains(msg, {"no optimizer.safetensors"});
}

TEST(Gpt2Checkpoint, SavesExtraFilesInTheSameAtomicUnit) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout);
  CheckpointSaveOptions options;
  options.extra_files["trainer_state.json"] = "{\"step\": 42}\n";
  options.write_extra = [](const fs::path& tmp) {
    std::ofstream(tmp / "rng.bin", std::ios::binary) << std::string("\x01\x00\x02", 3);
  };
  save_checkpoint(root / "ckpt", c, layout, slab, options);
  EXPECT_EQ(read_file_to_string(root / "ckpt" / "trainer_state.json"), "{\"step\": 42}\n");
  EXPECT_EQ(read_file_to_string(root / "ckpt" / "rng.bin"), std::string("\x01\x00\x02", 3));
  for (const char* bad : {"../escape.json", "config.json", "", "a/b"}) {
    CheckpointSaveOptions o;
    o.extra_files[bad] = "{}";
    EXPECT_THROW(save_checkpoint(root / "ckpt", c, layout, slab, o), Error) << bad;
  }
  EXPECT_EQ(read_file_to_string(root / "ckpt" / "trainer_state.json"), "{\"step\": 42}\n");
}

TEST(Gpt2Checkpoint, AnInterruptedSaveKeepsTheOldCheckpoint) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor old_w = make_slab(pool, layout), new_w = make_slab(pool, layout);
  Tensor back = make_slab(pool, layout);
  fill(old_w, 11);
  fill(new_w, 12);
  const fs::path dir = root / "ckpt";
  CheckpointSaveOptions with_state;
  with_state.extra_files["trainer_state.json"] = "{\"step\": 1}";
  save_checkpoint(dir, c, layout, old_w, with_state);

  // A failure (here injected after the model file is written) rolls back.
  for (SaveStage stage :
       {SaveStage::model_written, SaveStage::files_written, SaveStage::old_moved_aside}) {
    CheckpointSaveOptions failing;
    failing.extra_files["trainer_state.json"] = "{\"step\": 2}";
    failing.on_stage = [&](SaveStage s) {
      if (s == stage) throw std::runtime_error("injected");
    };
    EXPECT_THROW(save_checkpoint(dir, c, layout, new_w, failing), std::runtime_error);
    load_checkpoint(dir, c, layout, back);
    expect_loaded(c, layout, old_w, back);
    EXPECT_EQ(read_file_to_string(dir / "trainer_state.json"), "{\"step\": 1}");
    EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
  }

  // A crash (a child process dying) between the renames: the loader finds DIR.old and says so.
  for (SaveStage stage : {SaveStage::model_written, SaveStage::old_moved_aside}) {
    pid_t pid = ::fork();
    if (pid == 0) {
      CheckpointSaveOptions crashing;
      crashing.on_stage = [&](SaveStage s) {
        if (s == stage) ::_exit(0);
      };
      try {
        save_checkpoint(dir, c, layout, new_w, crashing);
      } catch (...) {
      }
      ::_exit(2);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fill(back, 99);
    CheckpointLocation at = load_checkpoint(dir, c, layout, back);
    EXPECT_EQ(at.recovered, stage == SaveStage::old_moved_aside);
    if (at.recovered) {
      EXPECT_NE(at.note.find("ckpt.old"), std::string::npos) << at.note;
    }
    expect_loaded(c, layout, old_w, back);
    EXPECT_EQ(read_file_to_string(at.dir / "trainer_state.json"), "{\"step\": 1}");
  }
  // The next save completes and tidies up.
  save_checkpoint(dir, c, layout, new_w);
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
  load_checkpoint(dir, c, layout, back);
  expect_loaded(c, layout, new_w, back);
}

TEST(Gpt2Checkpoint, ExplainsADirectoryWithoutSafetensors) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = tiny();
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout);
  fs::create_directories(root / "hf");
  write_file_atomic(root / "hf" / "config.json", gpt2_config_to_hf_json(c).dump());
  write_file_atomic(root / "hf" / "pytorch_model.bin", std::string_view("PK"));
  std::string msg = error_of([&] { load_checkpoint(root / "hf", c, layout, slab); });
  expect_contains(msg, {"no model.safetensors", "pytorch_model.bin"});
}

}  // namespace
}  // namespace memfit::io
