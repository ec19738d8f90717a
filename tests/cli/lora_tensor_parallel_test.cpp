// LoRA under --tp end to end, through the built binary under mpirun (Note [LoRA], "Under --tp",
// docs/notes/lora.md): the adapters split as their layers' weights (a column-parallel layer's B
// by rows, a row-parallel layer's A by columns, the other matrix whole with its gradient summed
// over the tensor group; a row-parallel adapter's x A^T summed before B). GPT-2 and LLaMA over
// 2 and 4 tensor ranks, with --sp, with --ckpt full, 2 data x 2 tensor ranks, and bf16 give the
// losses, adapter gradient norms and validation losses of one process within 1e-6 relative
// (bf16 within 1e-3): the group's sums add in another order. `memfit plan` is every rank's
// measured peak by category and each step's tensor collectives. --lora-from at --tp 2 starts
// from the whole adapters' slices; a save holds the whole adapters and loads at any layout.
// What is not built is refused naming it. Skips where memfit
// was built without MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "memfit/io/checkpoint/safetensors.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class LoraTensorParallel : public test::MpiBinaryTest {
 protected:
  LoraTensorParallel() : MpiBinaryTest(4646) {}
  // --repeat-batch and a large rate: the adapters learn, so B is not zero after the first step
  // and every matrix's gradient moves the numbers compared.
  std::string args(const std::string& more, int batch = 2) const {
    const bool model = more.find("--model") != std::string::npos;
    const bool seq_len = more.find("--seq-len") != std::string::npos;
    return fmt::format(
        "{}--n-layer 2 {}--batch {} --threads 1 --lr 1e-2 --lora-rank 4 --lora-alpha 8 "
        "--repeat-batch --data '{}' {}",
        model ? "" : "--model gpt2-tiny ", seq_len ? "" : "--seq-len 32 ", batch,
        (dir / "data").string(), more);
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  std::vector<json> train(int ranks, const std::string& more, const std::string& name,
                          int batch = 2) const {
    const fs::path log = dir / (name + ".jsonl");
    EXPECT_EQ(run_memfit("train " + args(more, batch) + fmt::format(" --log '{}'", log.string()),
                         ranks),
              0)
        << name << ": " << test::slurp(dir / "err.txt");
    return lines(log);
  }
  static std::vector<json> numbers(const std::vector<json>& log) {
    std::vector<json> out;
    for (const json& j : log)
      if (j.contains("loss") || j.contains("val_loss")) out.push_back(j);
    return out;
  }
  // Every step's loss and validation loss within `tolerance` relative, its gradient norm within
  // `norm_tolerance` (`tolerance` when negative).
  void expect_close(const std::vector<json>& ref_log, const std::vector<json>& tp_log,
                    const std::string& what, double tolerance = 1e-6,
                    double norm_tolerance = -1) const {
    const std::vector<json> ref = numbers(ref_log), tp = numbers(tp_log);
    EXPECT_EQ(ref.size(), tp.size()) << what;
    int compared = 0;
    double worst = 0;
    for (size_t i = 0; i < std::min(ref.size(), tp.size()); ++i)
      for (const char* key : {"loss", "grad_norm", "val_loss"})
        if (ref[i].contains(key)) {
          ASSERT_TRUE(tp[i].contains(key)) << what << ": " << key << " at line " << i;
          const double a = ref[i][key].get<double>(), b = tp[i][key].get<double>();
          const double tol =
              std::string(key) == "grad_norm" && norm_tolerance >= 0 ? norm_tolerance : tolerance;
          EXPECT_LE(std::abs(a - b), tol * std::abs(a))
              << what << ": " << key << " at line " << i << ": " << b << " against " << a;
          worst = std::max(worst, std::abs(a - b) / std::abs(a));
          ++compared;
        }
    fmt::print("{}: worst relative difference {:.3g} over {} numbers\n", what, worst, compared);
    EXPECT_GE(compared, 8) << what;
  }
  // The loss falls: the adapters learn (a run whose adapters never moved would compare equal).
  static void expect_learns(const std::vector<json>& log, const std::string& what) {
    const std::vector<json> n = numbers(log);
    std::vector<double> loss;
    for (const json& j : n)
      if (j.contains("loss")) loss.push_back(j["loss"].get<double>());
    ASSERT_GE(loss.size(), 2u) << what;
    EXPECT_LT(loss.back(), loss.front()) << what;
  }
  // `memfit plan` and `memfit train --steps 2` with `more` over `ranks` ranks: every world
  // rank's measured peak and bytes by category are its data rank's plan, and each step's tensor
  // collectives (the adapters' sums among them) the planned ones.
  void expect_planned(int ranks, int tp, const std::string& more) const {
    const std::string a = args("--steps 2 " + more);
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size {} --json", a, ranks)), 0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    ASSERT_EQ(plan["per_rank"].size(), size_t(ranks / tp)) << more;
    const auto log = train(ranks, "--steps 2 " + more, "plan");
    json measured;
    int steps = 0;
    for (const json& j : log) {
      if (j.contains("ranks")) measured = j["ranks"];
      if (!j.contains("loss")) continue;
      ++steps;
      for (const auto& [k, bytes] : j["tensor_comm_bytes"].items())
        EXPECT_EQ(bytes, plan["tensor_comm_per_step"].value(k, json())) << k << ", " << more;
    }
    EXPECT_EQ(steps, 2) << more;
    ASSERT_EQ(measured.size(), size_t(ranks)) << "no per-rank peaks in the log";
    for (int q = 0; q < ranks; ++q) {
      const json& p = plan["per_rank"][q / tp];
      EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << more << ", rank " << q;
      for (const char* c :
           {"params", "grads", "optimizer", "activations", "workspace", "comm", "staging"})
        EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << ", " << more << ", rank " << q;
    }
  }
};

// Two saves' `file`: the same tensors (names, shapes, types), f32 values within `tolerance` of
// each tensor's largest magnitude (the layouts' sums add in another order).
void expect_same_tensors(const fs::path& a, const fs::path& b, double tolerance) {
  const io::SafetensorsReader x(a), y(b);
  ASSERT_EQ(x.entries().size(), y.entries().size()) << a << " against " << b;
  double worst = 0;
  for (const io::SafetensorsEntry& e : x.entries()) {
    const io::SafetensorsEntry* f = y.find(e.name);
    ASSERT_NE(f, nullptr) << e.name << " missing from " << b;
    ASSERT_EQ(e.shape, f->shape) << e.name;
    ASSERT_EQ(e.nbytes(), f->nbytes()) << e.name;
    const auto* u = reinterpret_cast<const float*>(x.bytes(e));
    const auto* v = reinterpret_cast<const float*>(y.bytes(*f));
    double big = 0, diff = 0;
    for (int64_t i = 0; i < e.numel(); ++i) {
      big = std::max(big, std::abs(double(u[i])));
      diff = std::max(diff, std::abs(double(u[i]) - double(v[i])));
    }
    EXPECT_LE(diff, tolerance * big) << e.name << " in " << a.filename();
    if (big > 0) worst = std::max(worst, diff / big);
  }
  fmt::print("{}: worst relative difference {:.3g}\n", a.filename().string(), worst);
}

constexpr const char* kSteps = "--steps 6 --clip 1 --eval-every 3 --eval-batches 1";

TEST_F(LoraTensorParallel, Gpt2OverTwoAndFourRanksMatchesOneProcess) {
  const auto one = train(0, kSteps, "one");
  expect_learns(one, "one process");
  expect_close(one, train(2, std::string(kSteps) + " --tp 2", "tp2"), "gpt2 --tp 2");
  expect_close(one, train(4, std::string(kSteps) + " --tp 4", "tp4"), "gpt2 --tp 4");
  expect_close(one, train(2, std::string(kSteps) + " --tp 2 --sp", "sp2"), "gpt2 --tp 2 --sp");
  const std::string full = std::string(kSteps) + " --ckpt full";
  expect_close(train(0, full, "one-full"), train(2, full + " --tp 2", "tp2-full"),
               "gpt2 --tp 2 --ckpt full");
  // One target of each half: a column-parallel layer alone, a row-parallel one alone.
  for (const char* t : {"--lora-targets fc", "--lora-targets proj"}) {
    const std::string a = std::string(kSteps) + " " + t;
    expect_close(train(0, a, "one-t"), train(2, a + " --tp 2", "tp2-t"), t);
  }
}

TEST_F(LoraTensorParallel, LlamaOverTwoAndFourRanksMatchesOneProcess) {
  const std::string a = std::string(kSteps) + " --model llama-tiny";
  const auto one = train(0, a, "one");
  expect_learns(one, "llama one process");
  expect_close(one, train(2, a + " --tp 2", "tp2"), "llama --tp 2");
  expect_close(one, train(2, a + " --tp 2 --sp", "sp2"), "llama --tp 2 --sp");
  // llama-tiny's 2 key/value heads over 4 ranks are replicated: the adapters on the others.
  const std::string b = a + " --lora-targets q,o,gate,up,down";
  expect_close(train(0, b, "one-b"), train(4, b + " --tp 4 --sp", "tp4"), "llama --tp 4 --sp");
}

// Two data ranks of two tensor ranks (ZeRO 0: the adapters replicated over the data group, their
// gradients all-reduced there): one process reading the same rows (batch 2 x 2).
TEST_F(LoraTensorParallel, TwoDataRanksOfTwoTensorRanksMatchOneProcess) {
  expect_close(train(0, kSteps, "one", 4), train(4, std::string(kSteps) + " --tp 2", "dp2tp2"),
               "2 data x 2 tensor");
}

// bf16 (the base bf16, the adapters f32): a partial product summed in another order may move an
// activation across a bf16 rounding boundary, and the adapters, moved by Adam from gradients
// that differ so, move more. As over data-parallel ranks (Note [LoRA], "Over data-parallel
// ranks"): losses within 1e-3, gradient norms within 1e-2 of one process (measured 6.9e-4 and
// 4.5e-3).
TEST_F(LoraTensorParallel, Bf16MatchesOneProcess) {
  for (const char* m : {"", " --model llama-tiny"}) {
    const std::string a = std::string(kSteps) + " --precision bf16" + m;
    expect_close(train(0, a, "one"), train(2, a + " --tp 2", "tp2"), std::string("bf16") + m,
                 1e-3, 1e-2);
  }
}

TEST_F(LoraTensorParallel, ThePlanIsEveryRanksMeasuredPeak) {
  expect_planned(2, 2, "--tp 2");
  expect_planned(2, 2, "--tp 2 --sp --model llama-tiny --ckpt full");
  expect_planned(4, 2, "--tp 2 --precision bf16 --model llama-tiny");
  expect_planned(4, 4, "--tp 4 --lora-targets fc,mlp_proj");
}

// --lora-from at --tp 2: each rank's slices of the saved whole adapters, the numbers of one
// process starting from the same files. Trained adapters (B not zero) make the group's sums'
// last bits matter more, and Adam's steps amplify them: within 1e-5 (the first steps within
// 1e-6; measured 2.6e-6 by the sixth).
TEST_F(LoraTensorParallel, StartsFromWholeAdapters) {
  const fs::path saved = dir / "saved";
  train(0, "--steps 3 --save '" + saved.string() + "'", "save");
  const std::string a = fmt::format("{} --init-from '{}' --lora-from '{}'", kSteps,
                                    saved.string(), saved.string());
  expect_close(train(0, a, "one-from"), train(2, a + " --tp 2", "tp2-from"), "--lora-from --tp 2",
               1e-5);
}

// Saves (Note [LoRA], "Under --tp"): a --tp 2 save holds the whole adapters and their
// optimizer state, the tensors one process saves (names, shapes, the base byte for byte); a
// resume at --tp 2 continues its own save bit for bit, and a save at either layout resumes at
// the other, giving the adapters and state of four steps in one go within 1e-4 of each
// tensor's largest value (measured 5e-5: Adam's normalised steps move the small elements of an
// adapter by the gradients' last bits).
TEST_F(LoraTensorParallel, SavesWholeAdaptersThatLoadAtAnyLayout) {
  const std::string a4 = "--steps 4 --clip 1 --eval-every 100", a2 = a4 + " --stop-after 2";
  auto save = [&](int ranks, const std::string& more, const fs::path& to) {
    ASSERT_EQ(run_memfit(fmt::format("train {} --save '{}'", args(more), to.string()), ranks), 0)
        << to << ": " << test::slurp(dir / "err.txt");
  };
  save(0, a4, dir / "one4");
  save(2, a4 + " --tp 2", dir / "tp4");
  save(0, a2, dir / "one2");
  save(2, a2 + " --tp 2", dir / "tp2");
  // At --tp 2 from its own save: byte for byte.
  save(2, fmt::format("{} --tp 2 --resume '{}'", a4, (dir / "tp2").string()), dir / "tp2to4");
  // Across layouts.
  save(2, fmt::format("{} --tp 2 --resume '{}'", a4, (dir / "one2").string()), dir / "one2tp");
  save(0, fmt::format("{} --resume '{}'", a4, (dir / "tp2").string()), dir / "tp2one");
  for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                        "model.safetensors"}) {
    const std::string x = test::slurp(dir / "tp4" / f), y = test::slurp(dir / "tp2to4" / f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == y) << f << " differs after a --tp 2 resume";
    EXPECT_TRUE(test::slurp(dir / "one4" / f).size() == x.size()) << f;
    for (const char* other : {"tp4", "one2tp", "tp2one"})
      expect_same_tensors(dir / "one4" / f, dir / other / f, 1e-4);
  }
  EXPECT_EQ(test::slurp(dir / "one4" / "adapter_config.json"),
            test::slurp(dir / "tp4" / "adapter_config.json"));
}

TEST_F(LoraTensorParallel, RefusesWhatIsNotBuiltNamingIt) {
  auto refused = [&](const std::string& more, const std::string& says) {
    const int code = run_memfit("plan " + args("--steps 2 " + more));
    EXPECT_NE(code, 0) << more;
    const std::string err = test::slurp(dir / "err.txt");
    EXPECT_NE(err.find(says), std::string::npos) << more << ": " << err;
  };
  refused("--world-size 2 --tp 2 --lora-dropout 0.1", "--lora-dropout");
  refused("--world-size 4 --tp 4 --model llama-tiny --lora-targets q,k", "k or v with --tp");
  refused("--world-size 4 --tp 2 --zero 3", "--zero 3");
  refused("--world-size 2 --tp 2 --optim adam-mini", "element-wise");
  refused("--world-size 2 --tp 2 --base-dtype nf4", "several ranks");
  refused("--world-size 2 --pp 2 --lora-dropout 0.1", "--pp 2 and --lora-dropout");
}

}  // namespace
}  // namespace memfit
