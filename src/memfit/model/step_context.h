// Note [One step description]: a micro-batch's step is written once, as the code that runs it
// (model/transformer_step.cpp for the skeleton, model/gpt2/ and model/llama/ for each family's
// block). That code asks this context for every buffer it touches, saying whether it writes or
// reads it and, on a write, its shape, type and category; then it runs its kernels. The same
// code runs in two modes:
//   planning: the context hands out undefined tensors and records each buffer and each phase's
//   uses; the code returns before its kernels (`if (!ctx.running()) return;`). The step plan
//   (step_plan.h) derives lifetimes and arena offsets from the record, and the planner reads it.
//   running: the context hands out the plan's views into the arenas, checks that the phases come
//   in the recorded order and, for tests, poisons each buffer outside its lifetime, so a use the
//   code does not declare changes the results (tests/model/step_arena_test.cpp).
// So the engine executes what the planner counts: there is no second list to keep in step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/step_observer.h"
#include "memfit/model/step_schedule.h"
#include "memfit/model/tensor_group.h"

namespace memfit {

struct StepPlan;

class StepContext {
 public:
  // Planning: records.
  StepContext() = default;
  // Running: the buffers of `plan`, views[i] being plan.buffers[i] in its arena.
  StepContext(StepPlan plan, std::vector<Tensor> views);
  StepContext(StepContext&&) noexcept;
  StepContext& operator=(StepContext&&) noexcept;
  ~StepContext();

  bool running() const { return plan_ != nullptr; }
  void set_poison(bool on) { poison_ = on; }
  // Running: tell `observer` (null: nobody) each phase entered, each buffer used and each
  // micro-batch finished (step_observer.h). It changes nothing the step computes.
  void set_observer(StepObserver* observer) { observer_ = observer; }
  // Running: called with each phase's index in the plan as the phase is entered, before the
  // step's code reads any weight (ZeRO stage 3 gathers the phase's weights there).
  void set_enter_hook(std::function<void(int phase)> hook) { enter_hook_ = std::move(hook); }
  // The ranks the step's layers are split over (--tp; Note [Tensor parallel]), whose
  // collectives the blocks, the embedding and the LM head issue: one process unless set (the
  // caller keeps it alive). A running context's collectives run on it; planning issues none.
  void set_tensor_group(TensorGroup* group) { group_ = group; }
  TensorGroup& tensor_group() const;

  // Marks the start of the next phase. Running, it throws if that is not the next phase of the
  // plan (or the first: a new micro-batch), poisons dead buffers when asked to, and zeroes the
  // gradient units the phase is the first to write (Note [Gradients by lifetime]).
  void enter(PhaseKind kind, int layer = -1);
  // After the last phase of a micro-batch: poisons what the last phase leaves.
  void finish();

  // A buffer the current phase overwrites before reading it (its old value is dead). Every
  // write of a tag must give the same shape, type and category.
  Tensor write(const std::string& tag, const Shape& shape, DType dtype, Category category);
  // A write of a buffer an earlier phase declared with write(): the same shape, type and
  // category (a restored copy of a compressed activation, whose shape the forward gave).
  Tensor write_again(const std::string& tag);
  // A buffer whose value from an earlier phase the current phase needs (read-modify-write too).
  Tensor read(const std::string& tag);
  // A 1-D f32 workspace buffer of at least `bytes`: planned at the largest size any phase asks
  // for (matmul widening, attention scratch), written by each phase that uses it.
  Tensor scratch(const std::string& tag, size_t bytes);

  // Planning's record: the buffers in the order of their first write, and the phases in order
  // with their uses.
  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  const std::vector<PhaseUses>& schedule() const { return schedule_; }
  // A running context's view of a buffer, for tests and first_non_finite.
  const Tensor& view(const std::string& tag) const;
  const std::vector<Tensor>& views() const { return views_; }
  // The plan a running context runs.
  const StepPlan& plan() const;

 private:
  Tensor use(const std::string& tag, Access access);
  void poison_edges(int ended, int begins);

  // Planning.
  std::vector<BufferSpec> buffers_;
  std::vector<PhaseUses> schedule_;
  // Running.
  std::unique_ptr<StepPlan> plan_;
  std::vector<Tensor> views_;
  int phase_ = -1;
  bool poison_ = false;
  StepObserver* observer_ = nullptr;
  std::function<void(int)> enter_hook_;
  TensorGroup* group_ = nullptr;  // null: one process
  // Running: the plan's gradient units (Note [Gradients by lifetime]), zeroed as each is born.
  std::vector<size_t> grad_units_;
  // Both: tag -> position in buffers_ (planning) or views_ (running).
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace memfit
