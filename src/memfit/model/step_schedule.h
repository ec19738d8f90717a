// One micro-batch's step as GPT2 runs it: the ordered phases (the embedding, each block's
// forward, ln_f, the fused LM head, then backward from the top, each recomputed segment just
// before the backward of its last block, down to the embedding's) and, for each phase, the
// activation plan's buffers it touches and how. Lifetimes are derived from this list
// (step_plan.h), never written by hand; GPT2 announces each phase as it enters it and refuses
// to leave this order, and tests/model/gpt2_arena_test.cpp poisons every buffer outside its
// lifetime to check that the list says what gpt2.cpp does (Note [Step arena]).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memfit/model/activation_plan.h"
#include "memfit/model/gpt2_config.h"

namespace memfit {

enum class PhaseKind : uint8_t {
  embedding,           // tokens -> encoded
  forward,             // block `layer`'s forward
  ln_f,                // the final LayerNorm
  lm_head,             // logits, loss and d(ln_f), chunk by chunk (Note [Fused LM head])
  ln_f_backward,       // d(ln_f) -> d(residual)
  recompute,           // block `layer`'s forward again, in backward (checkpointing)
  backward,            // block `layer`'s backward
  embedding_backward,  // d(residual) -> d(wte), d(wpe)
};

struct Phase {
  PhaseKind kind = PhaseKind::embedding;
  int layer = -1;  // forward, recompute and backward; -1 otherwise
  std::string name() const;  // "backward of block 11", "LM head"
  bool operator==(const Phase&) const = default;
};

// What a phase does first with a buffer.
enum class Access : uint8_t {
  write,  // overwrites it before reading it: whatever it held before is dead
  read,   // needs the value an earlier phase left in it (read-modify-write included)
};

struct PhaseUses {
  Phase phase;
  std::vector<std::pair<std::string, Access>> uses;  // tag, first access; each tag once
  // Records a use; a tag already used in this phase keeps its first access.
  void use(const std::string& tag, Access access);
};

std::vector<PhaseUses> gpt2_step_schedule(const GPT2Config& config,
                                          const ActivationOptions& options);

}  // namespace memfit
