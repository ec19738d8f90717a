// The pipeline bubble measured at the runner (issue 43, "Measure"; Note [Pipeline parallel],
// "Interleaved"): `mpirun -n P pipeline_bubble_tool ...` runs a LLaMA's micro-batches through P
// ranks under GPipe, 1F1B or the interleaved schedule (`--pp-virtual V`: V chunk models a rank,
// each the stage model of one of P x V virtual stages, holding its own blocks' parameters), the
// forward and backward of every chunk but no optimizer step, and times each step. Each rank
// also sums the seconds its callbacks compute; the rank busiest is the pipeline's pace, and
// (step - its compute) / its compute is the measured bubble against the ideal, printed beside
// the model's (p - 1)/(V m). One process (P = 1) gives the unpipelined step. Used by
// bench/e2e/parallel_layouts.py's `bubble_interleaved` suite, until `memfit train` runs the
// interleaved schedule itself. Prints one JSON object (rank 0).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/core/scoped_threads.h"
#include "memfit/dist/communicator.h"
#include "memfit/dist/pipeline_runner.h"
#include "memfit/model/transformer.h"

using namespace memfit;

namespace {

struct Args {
  int layers = 8, d_model = 1024, n_head = 16, n_kv_head = 8, ffn = 2816, vocab = 32000;
  int seq = 128, batch = 1, virtual_stages = 1, micro_batches = 4, steps = 4, threads = 1;
  std::string schedule = "1f1b";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--n-layer") a.layers = std::stoi(v);
    else if (k == "--d-model") a.d_model = std::stoi(v);
    else if (k == "--n-head") a.n_head = std::stoi(v);
    else if (k == "--n-kv-head") a.n_kv_head = std::stoi(v);
    else if (k == "--ffn-dim") a.ffn = std::stoi(v);
    else if (k == "--vocab") a.vocab = std::stoi(v);
    else if (k == "--seq-len") a.seq = std::stoi(v);
    else if (k == "--batch") a.batch = std::stoi(v);
    else if (k == "--pp-virtual") a.virtual_stages = std::stoi(v);
    else if (k == "--grad-accum") a.micro_batches = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--pp-schedule") a.schedule = v;
    else MEMFIT_THROW(ConfigError, "pipeline_bubble_tool", "unknown option {}", k);
  }
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::unique_ptr<dist::Communicator> world = dist::make_world_communicator();
  const int P = world->size(), r = world->rank(), V = a.virtual_stages, S = P * V;
  const ScopedThreads threads(a.threads);
  const PipeSchedule schedule = parse_pipe_schedule(a.schedule);
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = a.layers;
  c.d_model = a.d_model;
  c.n_head = a.n_head;
  c.n_kv_head = a.n_kv_head;
  c.ffn_dim = a.ffn;
  c.vocab_size = a.vocab;
  c.max_seq_len = a.seq;
  c.tie_embeddings = false;
  c.finalize();

  MemoryPool pool;
  std::mt19937 rng(7);
  std::vector<Tensor> tokens, targets;
  for (int i = 0; i < a.micro_batches; ++i) {
    tokens.push_back(
        Tensor::empty(pool, {a.batch, a.seq}, DType::i32, Category::staging, "tokens"));
    targets.push_back(
        Tensor::empty(pool, {a.batch, a.seq}, DType::i32, Category::staging, "targets"));
    for (int64_t k = 0; k < int64_t{a.batch} * a.seq; ++k) {
      tokens.back().data<int32_t>()[k] = static_cast<int32_t>(rng() % a.vocab);
      targets.back().data<int32_t>()[k] = static_cast<int32_t>(rng() % a.vocab);
    }
  }
  // This rank's chunks: the stage models of virtual stages c P + r (the whole model alone).
  const std::vector<PipelineStage> stages = split_stages_evenly(c.n_layer, S);
  std::vector<std::unique_ptr<Transformer>> chunks;
  std::vector<PipelineStage> mine;
  for (int k = 0; k < V; ++k) {
    ModelConfig cc = c;
    mine.push_back(stages[static_cast<size_t>(virtual_stage(r, k, P))]);
    if (S > 1) cc.set_pipeline_stage(mine.back());
    chunks.push_back(std::make_unique<Transformer>(cc, pool));
    chunks.back()->init_weights(11);
    chunks.back()->reserve(a.batch, a.seq, ActivationOptions{});
  }
  double busy = 0;
  std::vector<double> step_s;
  {
    dist::PipelineRunner runner(*world, schedule, a.micro_batches,
                                int64_t{a.batch} * a.seq * c.d_model, pool, V);
    const dist::PipelineChunkFns fns{
        [&](int k, int m, std::span<const float> in, std::span<float> out) {
          if (mine[static_cast<size_t>(k)].has_head()) return;  // runs with its backward
          const auto t0 = std::chrono::steady_clock::now();
          Transformer& t = *chunks[static_cast<size_t>(k)];
          t.set_stage_io({in.data(), out.data(), nullptr, nullptr});
          t.forward(tokens[static_cast<size_t>(m)], targets[static_cast<size_t>(m)], false);
          busy += seconds_since(t0);
        },
        [&](int k, int m, std::span<const float> in, std::span<const float> dout,
            std::span<float> din) {
          const auto t0 = std::chrono::steady_clock::now();
          Transformer& t = *chunks[static_cast<size_t>(k)];
          t.set_stage_io({in.data(), nullptr, dout.data(), din.data()});
          t.forward(tokens[static_cast<size_t>(m)], targets[static_cast<size_t>(m)], true);
          t.backward();
          busy += seconds_since(t0);
        }};
    std::vector<double> busy_s;
    for (int i = 0; i < a.steps + 1; ++i) {  // the first step warms up (first touch)
      world->barrier();
      busy = 0;
      const auto t0 = std::chrono::steady_clock::now();
      runner.run_chunks(fns);
      world->barrier();
      if (i == 0) continue;
      step_s.push_back(seconds_since(t0));
      busy_s.push_back(busy);
    }
    std::sort(step_s.begin(), step_s.end());
    std::sort(busy_s.begin(), busy_s.end());
    busy = busy_s[busy_s.size() / 2];
  }
  // The busiest rank's compute: the pipeline's pace.
  std::vector<double> all(static_cast<size_t>(P));
  world->all_gather(&busy, all.data(), std::vector<int64_t>(static_cast<size_t>(P), 1),
                    sizeof(double));
  const double step = step_s[step_s.size() / 2];
  const double most = *std::max_element(all.begin(), all.end());
  if (r == 0) {
    nlohmann::json j{{"pp", P},
                     {"virtual_stages", V},
                     {"schedule", V > 1 ? std::string("interleaved") : a.schedule},
                     {"micro_batches", a.micro_batches},
                     {"median_step_s", step},
                     {"busiest_compute_s", most},
                     {"compute_s", all},
                     {"measured_bubble", most > 0 ? (step - most) / most : 0.0},
                     {"model_bubble", double(P - 1) / (double(V) * a.micro_batches)}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
