// LoRA dropout (Note [LoRA], "Dropout"): PEFT's y = base(x) + scale B A dropout(x), the mask
// drawn by a counter-based hash of (seed, step, micro-batch, layer, slot, part, element) rather
// than from an RNG's state, so the backward (and a recomputed block) draws the same mask again
// and a --resume continues bit for bit with nothing saved.
#pragma once

#include <cstdint>

#include "memfit/model/param_layout.h"

namespace memfit {

// The dropout of one training micro-batch: probability p (0: off) and its draw
// (lora_dropout_draw). Evaluation and sampling run with p = 0.
struct LoraDropout {
  float p = 0;
  uint64_t draw = 0;
  bool on() const { return p > 0; }
};

// A micro-batch's draw: from the run's seed, the step, the micro-batch's index in it and the
// data-parallel rank (0 in one process), so ranks drop different elements of their rows as one
// process drops different elements of different rows.
uint64_t lora_dropout_draw(uint64_t seed, int64_t step, int64_t micro_batch, int data_rank = 0);
// One adapter's key in that micro-batch: its layer, linear slot and part (q, k, v of a fused
// layer each have their own mask, as PEFT's separate modules do).
uint64_t lora_dropout_key(uint64_t draw, int layer, LinearSlot slot, int part);
// Whether element `index` of the (rows, in) input is kept under `key` at probability p.
bool lora_dropout_keeps(uint64_t key, int64_t index, float p);
// k rows of n, the first being row r0 of the input: dst = src * mask / (1 - p) (0 where dropped).
void lora_dropout_rows(float* dst, const float* src, int64_t r0, int64_t k, int64_t n, float p,
                       uint64_t key);
// The backward's d(input) through the dropout: dst += src * mask / (1 - p), same rows.
void lora_dropout_add_rows(float* dst, const float* src, int64_t r0, int64_t k, int64_t n, float p,
                           uint64_t key);

}  // namespace memfit
