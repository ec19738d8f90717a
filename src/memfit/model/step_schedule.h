// The phases of one micro-batch's step and how a phase uses a buffer: the vocabulary in which the
// step's code (transformer_step.h) describes itself to the step context (Note [One step
// description]); step_plan.h derives the lifetimes from it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memfit {

enum class PhaseKind : uint8_t {
  embedding,            // tokens -> encoded
  forward,              // block `layer`'s forward
  final_norm,           // the final norm (GPT-2's ln_f, LLaMA's norm)
  lm_head,              // logits, loss and d(norm), chunk by chunk (Note [Fused LM head])
  final_norm_backward,  // d(norm) -> d(residual)
  recompute,            // block `layer`'s forward again, in backward (checkpointing)
  backward,             // block `layer`'s backward
  embedding_backward,   // d(residual) -> d(embedding tables)
};
// The kind's name in the profile's JSON and page: "forward", "lm_head", ...
const char* phase_kind_name(PhaseKind k);
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

}  // namespace memfit
