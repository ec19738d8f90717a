// Shared by the profile tests: a small model (odd sizes, either family, any checkpoint policy)
// run under a StepRecorder with the pool's event log on: one training micro-batch (forward and
// backward, in a "micro-batch" slice) and one evaluation forward, as the trainer runs them.
#pragma once

#include <chrono>
#include <memory>

#include "../model/gpt2_test_util.h"
#include "memfit/memory/pool.h"
#include "memfit/model/transformer.h"
#include "memfit/profile/step_recorder.h"

namespace memfit::profile_test {

struct RecordedRun {
  MemoryPool pool;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<profile::StepRecorder> recorder;
  int64_t begin = 0, end = 0;  // the window: the training micro-batch and the evaluation

  // grads_in_arena: the gradient slab in the activations arena (Note [Gradients by lifetime]).
  explicit RecordedRun(Family family = Family::gpt2, const char* ckpt = "none",
                       int B = 2, int T = 13, bool grads_in_arena = false) {
    const auto origin = std::chrono::steady_clock::now();
    pool.set_recording(true);
    recorder = std::make_unique<profile::StepRecorder>(origin);
    const ModelConfig config = gpt2_test::odd_config(family);
    model = std::make_unique<Transformer>(config, pool);
    model->init_weights(7);
    ActivationOptions o;
    o.ckpt = CheckpointPolicy::parse(ckpt);
    o.lm_head_chunk = 5;
    o.grads_in_arena = grads_in_arena;
    model->reserve(B, T, o);
    recorder->set_plan(model->step_plan());
    model->set_step_observer(recorder.get());
    gpt2_test::Batch batch(pool, B, T, config.vocab_size, 11);
    recorder->set_step(1);
    begin = recorder->now();
    recorder->begin("step 1", profile::SliceKind::step);
    recorder->begin("micro-batch 1", profile::SliceKind::micro_batch);
    model->forward(batch.tokens, batch.targets, /*training=*/true);
    model->backward();
    recorder->end();
    recorder->begin("evaluation", profile::SliceKind::evaluation);
    recorder->begin("evaluation batch 1", profile::SliceKind::micro_batch);
    model->forward(batch.tokens, batch.targets, /*training=*/false);
    recorder->end();
    recorder->end();
    recorder->end();
    end = recorder->now();
    recorder->stop();
    model->set_step_observer(nullptr);
  }
};

}  // namespace memfit::profile_test
